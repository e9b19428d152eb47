"""Running task functions: a thread pool for ``def``, an event loop for ``async def``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from distsched import core
from distsched.context import _reset_current, _set_current
from distsched.errors import InvalidArgument
from distsched.hooks import HookChain, RunOutcome
from distsched.metrics import WorkerMetrics
from distsched.worker.jobs import Job, Slots
from distsched.worker.reports import Raised, Reporter, ReportKind, Returned, outcome_of

log = logging.getLogger("distsched.worker")


# The outcome of a run as the hooks are told, by the report it makes.
_RUN_OUTCOME = {
    ReportKind.COMPLETE: RunOutcome.SUCCEEDED,
    ReportKind.FAIL: RunOutcome.FAILED,
    ReportKind.CONFIRM_CANCEL: RunOutcome.CANCELLED,
    ReportKind.RELEASE: RunOutcome.RELEASED,
}


class _Ended(NamedTuple):
    kind: ReportKind
    value: object
    duration: float
    encoded: bool


class Runner:
    """What every run goes through, whichever executor runs it: the slot, the task
    context, the metrics and hooks, and the one rule that turns its end into a report."""

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]],
        slots: Slots,
        reporter: Reporter,
        metrics: WorkerMetrics,
        clock_offset: Callable[[], float],
        hooks: HookChain | None = None,
    ) -> None:
        self.functions = functions
        self.slots = slots
        self.reporter = reporter
        self.metrics = metrics
        self.hooks = hooks if hooks is not None else HookChain([])
        # No hook method to call (the default): the run skips the hook chain.
        self._hooked = bool(self.hooks)
        self._clock_offset = clock_offset

    def run_sync(self, job: Job) -> None:
        """Run a ``def`` function on the calling pool thread."""
        if not self.slots.begin(job):
            return
        fn = self.functions[job.claim.fn]
        token = _set_current(job.ctx)
        try:
            started = self._started(job)
            try:
                value = fn(*job.claim.args, **job.claim.kwargs)
                if value is not None and inspect.isawaitable(value):
                    # An async callable not detected as such (e.g. a partial).
                    value = asyncio.run(_await(value))
                result: Returned | Raised = Returned(value)
            except BaseException as exc:  # any failure of user code is reported
                result = Raised(exc)
            ended = self._ended(job, started, result)
        finally:
            _reset_current(token)
        self._report(job, ended)

    async def run_async(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        """Run an ``async def`` function as a task of the worker's event loop."""
        if not self.slots.begin(job):
            return
        fn = self.functions[job.claim.fn]
        job.ctx._bind_loop(loop)
        _set_current(job.ctx)  # this asyncio task's own context: nothing to reset
        started = self._started(job)
        try:
            result: Returned | Raised = Returned(await fn(*job.claim.args, **job.claim.kwargs))
        except BaseException as exc:
            # CancelledError included: left unreported, the task would sit until its lease
            # lapsed and then be retried as if the worker had vanished.
            result = Raised(exc)
        self._report(job, self._ended(job, started, result))

    def _started(self, job: Job) -> float:
        wait = time.time() + self._clock_offset() - job.claim.run_at
        try:
            self.metrics.on_started(job.claim, wait)
        except Exception:
            # A hook that fails on one task's data must not take the pool thread with it.
            log.exception("metrics hook on_started failed")
        if self._hooked:
            self.hooks.before(job.ctx)
        return time.monotonic()

    def _ended(self, job: Job, started: float, result: Returned | Raised) -> _Ended:
        """The run's report, its duration, and the hooks told; still where it ran."""
        duration = time.monotonic() - started
        kind, value = outcome_of(job.ctx, result)
        told = result.value if isinstance(result, Returned) else result.error
        encoded = False
        if kind is ReportKind.COMPLETE:
            # Encoded here, so that the hooks hear of a result that cannot be stored as
            # the failure it becomes.
            try:
                value, encoded = core.encode_result(value), True
            except InvalidArgument as exc:
                kind, value, told = ReportKind.FAIL, f"result not storable: {exc}", exc
        if self._hooked:
            self.hooks.after(job.ctx, _RUN_OUTCOME[kind], told)
        return _Ended(kind, value, duration, encoded)

    def _report(self, job: Job, ended: _Ended) -> None:
        # The slot is free first: the report may land (and the job be let go) at once.
        # The job is held, and heartbeated, until then.
        self.slots.end(job)
        try:
            self.metrics.on_finished(job.claim, ended.duration)
        except Exception:
            log.exception("metrics hook on_finished failed")
        self.reporter.put(job, ended.kind, ended.value, ended.duration, ended.encoded)


class ThreadPool:
    """``concurrency`` threads running ``def`` functions, one job at a time each."""

    def __init__(self, runner: Runner, concurrency: int) -> None:
        self.runner = runner
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"distsched-pool-{i}", daemon=True)
            for i in range(concurrency)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def submit_many(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._queue.put(job)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self.execute(job)
            except Exception:
                # Whatever one task brings, the pool keeps its threads.
                log.exception("running task %r failed outside its function", job.claim.task_id)

    def execute(self, job: Job) -> None:
        """Run one job on this pool thread."""
        self.runner.run_sync(job)

    def stop(self, timeout: float) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout)


class LoopPool:
    """One thread with an event loop running ``async def`` functions."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distsched-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def submit(self, job: Job) -> None:
        self.submit_many([job])

    def submit_many(self, jobs: list[Job]) -> None:
        """Start ``jobs`` as tasks of the loop: one thread-safe wake-up for them all."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start, jobs)

    def _start(self, jobs: list[Job]) -> None:
        loop = self._loop
        assert loop is not None
        for job in jobs:
            task = loop.create_task(self.runner.run_async(job, loop))
            # The loop keeps only weak references to its tasks.
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        eager = getattr(asyncio, "eager_task_factory", None)
        if eager is not None:
            # Python 3.12+: a run starts at once, in the call that makes its task, and
            # one that never suspends (no real waiting) ends without a trip through
            # the loop's queue.
            loop.set_task_factory(eager)
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                # close() alone leaves the default executor's threads (asyncio.to_thread)
                # running past run(); join them here.
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def stop(self, timeout: float) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


async def _await(awaitable: Any) -> Any:
    return await awaitable
