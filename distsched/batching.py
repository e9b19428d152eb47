"""Batching producers: many concurrent ``schedule`` calls sent as one script call.

A service that enqueues one task per request pays one round trip per task. A
:class:`BatchingProducer` (threads) or :class:`AsyncBatchingProducer` (asyncio) sends
the calls that arrive while a batch is in flight together, as the next batch: an idle
producer sends a call at once, a busy one sends larger batches, so a call waits at most
for the batch before its own (and ``window_s`` more, when given). Each caller returns
once its own task is written, with its own version or its own error.

A batch is one atomic script call when it fits one (``MAX_TASKS_PER_CALL`` tasks and
the payload caps): its tasks are written together or not at all. When the batch is
refused for what one of its tasks is (a bad argument, a running id, an unknown
dependency, a cycle), its tasks are sent again one at a time, so that each caller gets
what its own task alone would get. A task id given twice waits for the next batch, so
calls for one id are applied in the order they arrived.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from distsched import limits
from distsched.errors import (
    BusyError,
    ClosedError,
    ConflictError,
    CycleError,
    InvalidArgument,
    UnknownDependencyError,
)
from distsched.model import Admitted, TaskSpec
from distsched.validate import task_spec

F = TypeVar("F")


class Admits(Protocol):
    """What a batching producer needs of its scheduler (``Scheduler``)."""

    def admit_many(self, specs: Sequence[TaskSpec]) -> list[Admitted]: ...


class AdmitsAsync(Protocol):
    """What an asyncio batching producer needs of its scheduler (``AsyncScheduler``)."""

    async def admit_many(self, specs: Sequence[TaskSpec]) -> list[Admitted]: ...


# Refusals that name one task of a batch: the batch is sent again one task at a time.
ONE_TASKS_FAULT = (InvalidArgument, ConflictError, UnknownDependencyError, CycleError, BusyError)


def _window(window_s: float) -> float:
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)):
        raise InvalidArgument("window_s", "must be a number of seconds")
    if not 0 <= window_s <= 1:
        raise InvalidArgument("window_s", "must be in [0, 1] seconds")
    return float(window_s)


def _most(max_tasks: int) -> int:
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int):
        raise InvalidArgument("max_tasks", "must be an int")
    if not 1 <= max_tasks <= limits.MAX_TASKS_PER_CALL:
        raise InvalidArgument("max_tasks", f"must be in [1, {limits.MAX_TASKS_PER_CALL}]")
    return max_tasks


@dataclass
class Waiting(Generic[F]):
    """One caller's task and where its outcome goes."""

    spec: TaskSpec
    done: F
    since: float = field(default_factory=time.monotonic)


def next_batch(queue: deque[Waiting[F]], most: int) -> list[Waiting[F]]:
    """Take the next batch off the front of ``queue``: at most ``most`` tasks, ending
    before a task id already in it."""
    batch: list[Waiting[F]] = []
    ids: set[str] = set()
    while queue and len(batch) < most:
        task_id = queue[0].spec.task_id
        if task_id in ids:
            break
        ids.add(task_id)
        batch.append(queue.popleft())
    return batch


Outcome = Admitted | BaseException


def deliver(
    specs: list[TaskSpec],
) -> Generator[list[TaskSpec], list[Admitted] | BaseException, list[Outcome]]:
    """The outcome of each task of a batch: yields the specs to send together, receives
    their :class:`Admitted` or the error of that send."""
    sent = yield specs
    if not isinstance(sent, BaseException):
        return list(sent)
    if not isinstance(sent, ONE_TASKS_FAULT) or len(specs) == 1:
        # The batch as a whole: every task shares the error (a batch is atomic).
        return [sent] * len(specs)
    outcomes: list[Outcome] = []
    for spec in specs:
        one = yield [spec]
        outcomes.append(one if isinstance(one, BaseException) else one[0])
    return outcomes


class Settles(Protocol):
    """Where one caller's outcome goes: a ``concurrent.futures`` or an asyncio future."""

    def done(self) -> bool: ...

    def set_result(self, result: Admitted, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


def settle(batch: Sequence[Waiting[Any]], outcomes: list[Outcome]) -> None:
    """Give each caller of ``batch`` its outcome (a caller gone already is skipped)."""
    for waiting, outcome in zip(batch, outcomes, strict=True):
        done: Settles = waiting.done
        if done.done():
            continue  # its caller was cancelled
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)


class BatchingProducer:
    """``schedule`` from many threads, sent in batches (module docs).

    Made by :meth:`Scheduler.batching`. Thread-safe; ``close()`` (or leaving ``with``)
    sends what was accepted and stops. Its scheduler stays open: close it after.
    """

    def __init__(self, scheduler: Admits, window_s: float = 0.0, max_tasks: int = 500) -> None:
        self.scheduler = scheduler
        self.window_s = _window(window_s)
        self.max_tasks = _most(max_tasks)
        self._queue: deque[Waiting[Future[Admitted]]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="distsched-batching", daemon=True)
        self._thread.start()

    def admit(self, task_id: str, **options: Any) -> Admitted:
        """``Scheduler.admit``, sent with the calls of other threads."""
        spec = task_spec(task_id, options)
        done: Future[Admitted] = Future()
        with self._cond:
            if self._closing:
                raise ClosedError("the batching producer is closed")
            self._queue.append(Waiting(spec, done))
            self._cond.notify()
        return done.result()

    def schedule(self, task_id: str, **options: Any) -> int:
        """``Scheduler.schedule``, sent with the calls of other threads."""
        return self.admit(task_id, **options).version

    def close(self) -> None:
        """Send every call already accepted, then stop; later calls raise ``ClosedError``."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def __enter__(self) -> BatchingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> list[Waiting[Future[Admitted]]] | None:
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            if self.window_s > 0:
                until = self._queue[0].since + self.window_s
                while len(self._queue) < self.max_tasks and not self._closing:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            return next_batch(self._queue, self.max_tasks)

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            steps = deliver([w.spec for w in batch])
            specs = next(steps)
            while True:
                sent: list[Admitted] | BaseException
                try:
                    sent = self.scheduler.admit_many(specs)
                except Exception as exc:  # each caller gets its own outcome
                    sent = exc
                try:
                    specs = steps.send(sent)
                except StopIteration as stop:
                    outcomes: list[Outcome] = stop.value
                    break
            settle(batch, outcomes)


class AsyncBatchingProducer:
    """``schedule`` from many coroutines, sent in batches (module docs).

    Made by :meth:`AsyncScheduler.batching`, in the event loop it is used from;
    ``await close()`` (or leaving ``async with``) sends what was accepted and stops.
    """

    def __init__(self, scheduler: AdmitsAsync, window_s: float = 0.0, max_tasks: int = 500) -> None:
        self.scheduler = scheduler
        self.window_s = _window(window_s)
        self.max_tasks = _most(max_tasks)
        self._queue: deque[Waiting[asyncio.Future[Admitted]]] = deque()
        self._closing = False
        self._sender: asyncio.Task[None] | None = None

    async def admit(self, task_id: str, **options: Any) -> Admitted:
        """``AsyncScheduler.admit``, sent with the calls of other coroutines."""
        if self._closing:
            raise ClosedError("the batching producer is closed")
        spec = task_spec(task_id, options)
        done: asyncio.Future[Admitted] = asyncio.get_running_loop().create_future()
        self._queue.append(Waiting(spec, done))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._run(), name="distsched-batching")
        return await done

    async def schedule(self, task_id: str, **options: Any) -> int:
        """``AsyncScheduler.schedule``, sent with the calls of other coroutines."""
        return (await self.admit(task_id, **options)).version

    async def close(self) -> None:
        """Send every call already accepted, then stop; later calls raise ``ClosedError``."""
        self._closing = True
        if self._sender is not None:
            await self._sender

    async def __aenter__(self) -> AsyncBatchingProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self) -> None:
        # Calls made while this task starts, or while a batch is in flight, join the next.
        await asyncio.sleep(0)
        while self._queue:
            if self.window_s > 0:
                left = self._queue[0].since + self.window_s - time.monotonic()
                if left > 0 and len(self._queue) < self.max_tasks:
                    await asyncio.sleep(left)
            batch = next_batch(self._queue, self.max_tasks)
            steps = deliver([w.spec for w in batch])
            specs = next(steps)
            while True:
                sent: list[Admitted] | BaseException
                try:
                    sent = await self.scheduler.admit_many(specs)
                except Exception as exc:  # each caller gets its own outcome
                    sent = exc
                try:
                    specs = steps.send(sent)
                except StopIteration as stop:
                    outcomes: list[Outcome] = stop.value
                    break
            settle(batch, outcomes)
