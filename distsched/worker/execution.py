"""Running task functions: a thread pool for ``def``, an event loop for ``async def``."""

from __future__ import annotations

import asyncio
import enum
import heapq
import inspect
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from distsched import model
from distsched.context import DependencyReader, StopReason, _reset_current, _set_current
from distsched.errors import InvalidArgument
from distsched.hooks import HookChain, RunOutcome
from distsched.metrics import WorkerMetrics
from distsched.wire import payload
from distsched.worker.jobs import Job, Slots
from distsched.worker.reports import Raised, Reporter, ReportKind, Returned, outcome_of

log = logging.getLogger("distsched.worker")

# How long a function that reached its time limit gets to stop before its attempt is
# reported failed anyway (``Worker(timeout_grace=...)``).
DEFAULT_TIMEOUT_GRACE_S = 5.0


# The outcome of a run as the hooks are told, by the report it makes.
_RUN_OUTCOME = {
    ReportKind.COMPLETE: RunOutcome.SUCCEEDED,
    ReportKind.SPAWN: RunOutcome.SUCCEEDED,
    ReportKind.FAIL: RunOutcome.FAILED,
    ReportKind.CONFIRM_CANCEL: RunOutcome.CANCELLED,
    ReportKind.RELEASE: RunOutcome.RELEASED,
}


class _Ended(NamedTuple):
    kind: ReportKind
    value: object
    duration: float
    encoded: bool


class _Stage(enum.Enum):
    RUNNING = "running"
    ENDED = "ended"  # the function ended first: its run reports as usual
    FORCED = "forced"  # the grace ran out first: the attempt was reported timed out
    LATE = "late"  # forced, then the function ended


# What the watchdog does when an entry of its heap is due.
_LIMIT, _GRACE, _CANCELLED = 0, 1, 2


class _Watch:
    """One run with a time limit, as the watchdog follows it."""

    __slots__ = ("job", "limit", "loop", "stage", "started", "task")

    def __init__(
        self,
        job: Job,
        limit: float,
        task: asyncio.Task[Any] | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.job = job
        self.limit = limit
        self.started = time.monotonic()
        self.task = task
        self.loop = loop
        self.stage = _Stage.RUNNING


class TimeLimits:
    """The watchdog of the runs that have a time limit: one thread, started with the
    first such run, waking at the next limit or grace.

    At a run's limit its function is signalled (``StopReason.TIMEOUT``); when it is still
    running ``grace`` seconds later, its attempt is reported failed (``timed out after
    N s``) and its slot stays taken until the function returns (``Slots.overran``); an
    ``async def`` function is also cancelled. ``on_overrun`` is then told of a ``def``
    function at once, of an ``async def`` one still running ``grace`` seconds after its
    cancellation (one that blocks the loop, or swallows ``CancelledError``): the worker
    stops for good there in a supervised process, which ends such a function.
    """

    def __init__(
        self,
        slots: Slots,
        reporter: Reporter,
        metrics: WorkerMetrics,
        grace: float,
        on_overrun: Callable[[Job], None] | None = None,
    ) -> None:
        self.slots = slots
        self.reporter = reporter
        self.metrics = metrics
        self.grace = grace
        self.on_overrun = on_overrun
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int, _Watch]] = []
        # Entries of the heap whose run ended: dropped when the heap is mostly them, so
        # that quick runs under a long limit do not pile up until their limits.
        self._dead = 0
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(
        self,
        job: Job,
        limit: float,
        task: asyncio.Task[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> _Watch:
        """Follow the run of ``job`` from now on, ``limit`` seconds at most."""
        watch = _Watch(job, limit, task, loop)
        with self._cond:
            heapq.heappush(self._heap, (watch.started + limit, next(self._order), _LIMIT, watch))
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._loop, name="distsched-time-limits", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watch

    def finish(self, watch: _Watch) -> bool:
        """The function ended: True when its run reports as usual, False when its attempt
        was already reported timed out (the function outlived its grace)."""
        with self._cond:
            if watch.stage is _Stage.FORCED:
                watch.stage = _Stage.LATE
                return False
            watch.stage = _Stage.ENDED
            self._dead += 1
            if self._dead > 64 and 2 * self._dead > len(self._heap):
                self._heap = [e for e in self._heap if e[3].stage is _Stage.RUNNING]
                heapq.heapify(self._heap)
                self._dead = 0
            return True

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._wait_due():
                    return
                due = self._advance()
            if due is not None:
                self._act(*due)

    def _wait_due(self) -> bool:
        """Wait, holding the lock, until the earliest step is due; False once stopped."""
        while not self._stopped:
            wait = self._heap[0][0] - time.monotonic() if self._heap else None
            if wait is not None and wait <= 0:
                break
            self._cond.wait(wait)
        return not self._stopped

    def _advance(self) -> tuple[int, _Watch] | None:
        """Take the due step off the heap (lock held) and queue the watch's next one;
        None when the run it watched has ended meanwhile."""
        now = time.monotonic()
        _, _, step, watch = heapq.heappop(self._heap)
        if step == _CANCELLED:
            if watch.stage is not _Stage.FORCED:
                return None  # it ended on its cancellation
        elif watch.stage is not _Stage.RUNNING:
            self._dead -= 1
            return None
        elif step == _GRACE:
            watch.stage = _Stage.FORCED
            # Taken before a late return of the function can give it back.
            self.slots.overran(watch.job)
            if watch.task is not None:
                entry = (now + self.grace, next(self._order), _CANCELLED, watch)
                heapq.heappush(self._heap, entry)
        else:
            due = watch.started + watch.limit + self.grace
            heapq.heappush(self._heap, (due, next(self._order), _GRACE, watch))
        return step, watch

    def _act(self, step: int, watch: _Watch) -> None:
        """What a due step does, outside the lock."""
        try:
            if step == _LIMIT:
                watch.job.ctx._signal_stop(StopReason.TIMEOUT)
            elif step == _GRACE:
                self._force(watch)
            elif self.on_overrun is not None:
                self.on_overrun(watch.job)
        except Exception:
            # Whatever one run brings, the other runs keep their watchdog.
            log.exception("time limit of task %r failed", watch.job.claim.task_id)

    def _force(self, watch: _Watch) -> None:
        job, claim = watch.job, watch.job.claim
        is_async = watch.task is not None
        log.warning(
            "task %r (%s) attempt %d: its function did not stop within %g s of its time "
            "limit (%g s): the attempt is reported failed; %s",
            claim.task_id,
            claim.fn,
            claim.attempt,
            self.grace,
            watch.limit,
            "the function is cancelled"
            if is_async
            else "its slot stays taken until the function returns",
            extra={"task_id": claim.task_id, "fn": claim.fn, "attempt": claim.attempt},
        )
        duration = time.monotonic() - watch.started
        try:
            self.metrics.on_finished(claim, duration)
        except Exception:
            log.exception("metrics hook on_finished failed")
        self.reporter.put(job, ReportKind.FAIL, job.ctx.timeout_error, duration)
        if watch.task is not None and watch.loop is not None:
            watch.loop.call_soon_threadsafe(watch.task.cancel)
        elif self.on_overrun is not None:
            self.on_overrun(job)


class Runner:
    """What every run goes through, whichever executor runs it: the slot, the task
    context, the metrics and hooks, the time limit, and the one rule that turns its
    end into a report."""

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]],
        slots: Slots,
        reporter: Reporter,
        metrics: WorkerMetrics,
        clock_offset: Callable[[], float],
        hooks: HookChain | None = None,
        limits: TimeLimits | None = None,
        timeouts: Mapping[str, float | None] | None = None,
        default_timeout: float | None = None,
        dependencies: DependencyReader | None = None,
    ) -> None:
        self.functions = functions
        # How a run's context reads its dependencies' results (the worker's link).
        self.dependencies = dependencies
        self.slots = slots
        self.reporter = reporter
        self.metrics = metrics
        self.hooks = hooks if hooks is not None else HookChain([])
        # No hook method to call (the default): the run skips the hook chain.
        self._hooked = bool(self.hooks)
        self._clock_offset = clock_offset
        self.limits = limits
        self.timeouts = dict(timeouts or {})
        self.default_timeout = default_timeout

    def time_limit(self, claim: model.Claim) -> float | None:
        """The limit of a run: the task's own, else its function's, else the default."""
        if claim.timeout is not None:
            return claim.timeout
        if claim.fn in self.timeouts:
            return self.timeouts[claim.fn]
        return self.default_timeout

    def run_sync(self, job: Job) -> None:
        """Run a ``def`` function on the calling pool thread."""
        if not self.slots.begin(job):
            return
        fn = self.functions[job.claim.fn]
        job.ctx._link = self.reporter.link
        job.ctx._dependencies = self.dependencies
        token = _set_current(job.ctx)
        try:
            started = self._started(job)
            watch = self._watch(job)
            try:
                value = fn(*job.claim.args, **job.claim.kwargs)
                if value is not None and inspect.isawaitable(value):
                    # An async callable not detected as such (e.g. a partial).
                    value = asyncio.run(_await(value))
                result: Returned | Raised = Returned(value)
            except BaseException as exc:  # any failure of user code is reported
                result = Raised(exc)
            if watch is not None and not self._finish(job, watch):
                return
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
        job.ctx._link = self.reporter.link
        job.ctx._dependencies = self.dependencies
        _set_current(job.ctx)  # this asyncio task's own context: nothing to reset
        started = self._started(job)
        watch = self._watch(job, asyncio.current_task(), loop)
        try:
            result: Returned | Raised = Returned(await fn(*job.claim.args, **job.claim.kwargs))
        except BaseException as exc:
            # CancelledError included: left unreported, the task would sit until its lease
            # lapsed and then be retried as if the worker had vanished.
            result = Raised(exc)
        if watch is not None and not self._finish(job, watch):
            return
        self._report(job, self._ended(job, started, result))

    def _watch(
        self,
        job: Job,
        task: asyncio.Task[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> _Watch | None:
        limit = self.time_limit(job.claim)
        if limit is None or self.limits is None:
            return None
        job.ctx._time_limit = limit
        return self.limits.watch(job, limit, task, loop)

    def _finish(self, job: Job, watch: _Watch) -> bool:
        """False for a function that returned after its attempt was reported timed out:
        its slot is free now, and nothing else happens (the report is made)."""
        if self.limits is None or self.limits.finish(watch):
            return True
        claim = job.claim
        log.warning(
            "task %r (%s) attempt %d: its function returned %.1f s after its time limit; "
            "its slot is free again",
            claim.task_id,
            claim.fn,
            claim.attempt,
            time.monotonic() - watch.started - watch.limit,
            extra={"task_id": claim.task_id, "fn": claim.fn, "attempt": claim.attempt},
        )
        if self._hooked:
            self.hooks.after(job.ctx, RunOutcome.FAILED, TimeoutError(job.ctx.timeout_error))
        self.slots.overrun_ended()
        return False

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
        if job.ctx.timed_out and kind is ReportKind.FAIL:
            told = TimeoutError(value)
        encoded = False
        if kind is ReportKind.COMPLETE:
            # Encoded here, so that the hooks hear of a result that cannot be stored as
            # the failure it becomes.
            try:
                value, encoded = payload.encode_result(value), True
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
