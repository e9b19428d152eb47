"""The worker: a fixed pool that claims due tasks and runs registered functions (§8).

A :class:`Worker` is made of small parts, one job each, most on a thread of its own:

- :class:`~distsched.worker.consumer.Consumer`, on the thread that calls
  :meth:`Worker.run`: claims at most as many tasks as there are free slots and
  dispatches them, then waits for a wake-up with the server's delay hint as timeout;
  finished tasks whose outcome is still unsent take slots past ``max_unsent``
  (:class:`~distsched.worker.jobs.Slots`), so claims stop while reports stall;
- :class:`~distsched.worker.execution.ThreadPool` (``concurrency`` threads, ``def``
  functions) and :class:`~distsched.worker.execution.LoopPool` (one event loop,
  ``async def`` functions), both through one
  :class:`~distsched.worker.execution.Runner`, which calls the worker's hooks
  (:mod:`distsched.hooks`) around each run and turns the end of any run into its
  report;
- :class:`~distsched.worker.reports.Reporter`: sends outcomes in batches;
- :class:`~distsched.worker.listener.Listener`: the wake-up subscription, and cancel
  requests delivered at once;
- :class:`~distsched.worker.heartbeat.Heartbeat`: leases, cancel and lease-loss
  delivery, the fleet's housekeeping, the announcement of served functions
  (:class:`~distsched.worker.served.ServedFunctions`) and this worker's entry in the
  worker registry (:class:`~distsched.worker.heartbeat.Registration`);
- :class:`~distsched.worker.signals.SignalHandlers`: SIGTERM and SIGINT.

The ``distsched worker`` command logs through a
:class:`~distsched.worker.logs.NonBlockingHandler` (bounded, dropping and counting
what a stalled output cannot take); a ``Worker`` in a program of its own logs
through the handlers that program configured.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from distsched import validate
from distsched.client import Scheduler
from distsched.context import StopReason
from distsched.errors import ClosedError, InvalidArgument
from distsched.hooks import HookChain, validate_hooks
from distsched.metrics import WorkerMetrics
from distsched.model import Duration
from distsched.retention import DEFAULT_WARNING_FRACTION
from distsched.tasks import TaskHandle, Tasks, served_functions
from distsched.worker.common import TRANSIENT
from distsched.worker.consumer import Consumer
from distsched.worker.execution import (
    DEFAULT_TIMEOUT_GRACE_S,
    LoopPool,
    Runner,
    ThreadPool,
    TimeLimits,
)
from distsched.worker.heartbeat import RETENTION_CHECK_S, Heartbeat, Registration, RetentionWatch
from distsched.worker.jobs import Job, Phase, Slots
from distsched.worker.link import WorkerLink
from distsched.worker.listener import Listener
from distsched.worker.logs import redis_location
from distsched.worker.reports import Reporter, ReportKind, outcome_of
from distsched.worker.served import ServedFunctions
from distsched.worker.share import PoolShare
from distsched.worker.signals import SignalHandlers

__all__ = [
    "DEFAULT_TIMEOUT_GRACE_S",
    "DEFAULT_UNSERVED_TIMEOUT_S",
    "Job",
    "Phase",
    "ReportKind",
    "Worker",
    "default_worker_id",
    "outcome_of",
]

log = logging.getLogger("distsched.worker")

# How long a task whose function no live worker serves waits before it fails.
DEFAULT_UNSERVED_TIMEOUT_S = 300.0
# How long the threads get to end once the shutdown is over.
JOIN_S = 1.0
# Unsent outcomes per slot past which a finished task keeps its slot (max_unsent=None).
UNSENT_PER_SLOT = 2


def default_max_unsent(concurrency: int) -> int:
    """The ``max_unsent`` of a worker that was given none."""
    return UNSENT_PER_SLOT * concurrency


def _time_limit(value: object, field: str) -> float | None:
    """A time limit in seconds, as a task carries it (whole ms); None: no limit."""
    ms = validate.timeout_ms(value, field)
    return None if ms is None else ms / 1000.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _seconds(value: object, field: str, *, positive: bool) -> float:
    """``value`` as seconds: a finite number (not a bool), > 0 or >= 0."""
    bound = "> 0" if positive else ">= 0"
    value = validate.as_seconds(value)
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or (value <= 0 if positive else value < 0)
    ):
        raise InvalidArgument(field, f"must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def _pool_bounds(concurrency: object, max_unsent: object) -> int:
    """Checks the pool size and returns ``max_unsent``, its default when None."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise InvalidArgument("concurrency", f"must be an int >= 1, got {concurrency!r}")
    if max_unsent is None:
        return default_max_unsent(concurrency)
    if not isinstance(max_unsent, int) or isinstance(max_unsent, bool) or max_unsent < 0:
        raise InvalidArgument("max_unsent", f"must be an int >= 0 or None, got {max_unsent!r}")
    return max_unsent


def _check_functions(functions: object) -> None:
    if (
        not isinstance(functions, Mapping)
        or not functions
        or not all(isinstance(k, str) and k and callable(v) for k, v in functions.items())
    ):
        # A worker serving nothing would claim every task only to hand it back.
        raise InvalidArgument(
            "functions", "must map at least one non-empty name (str) to a callable"
        )


def _function_time_limits(
    timeouts: object, functions: Mapping[str, object]
) -> dict[str, float | None]:
    """The per-function time limits, each a function the worker serves."""
    if timeouts is None:
        timeouts = {}
    if not isinstance(timeouts, Mapping):
        raise InvalidArgument("timeouts", "must map function names to seconds or None")
    unknown = sorted(str(name) for name in timeouts if name not in functions)
    if unknown:
        raise InvalidArgument("timeouts", f"{unknown[0]!r} is not one of the functions")
    return {name: _time_limit(value, f"timeouts[{name!r}]") for name, value in timeouts.items()}


class Worker:
    """Run registered functions for the tasks of one scheduler's namespace.

    ``functions`` maps the names used in ``schedule(fn=...)`` to callables,
    ``def`` or ``async def``; or is a :class:`~distsched.tasks.Tasks`, a module, or
    task handles, whose handles it serves by their names. At most ``concurrency``
    functions run at once and no more tasks than free slots are ever claimed.

    A task whose function returned keeps its lease (extended by the heartbeat)
    until Redis answered its outcome. Up to ``max_unsent`` such outcomes (default
    ``2 * concurrency``; 0: a slot is free only once its outcome is answered) may
    wait without holding back the claims; past it each takes a slot again, so
    that when reports stall (a blocked log sink, a report call Redis keeps
    refusing) the worker stops claiming and never holds more than ``concurrency
    + max_unsent`` leases.

    ``heartbeat_s`` (default: a third of the lease) is how often leases are
    extended. On shutdown, running functions get ``grace`` seconds to finish;
    then they are signalled to stop (``current_task().cancel_requested``,
    ``worker_stopping``) and get ``cancel_wait`` more seconds.

    A run stopped by the shutdown is not a failure: whatever the function raises
    once the shutdown signalled it (``Cancelled`` from ``raise_if_cancelled()``,
    or any other exception), its task goes back to ready for another worker
    without spending an attempt, or ends cancelled if a cancel was requested. A
    function that returns normally after the signal succeeded.

    A task whose function this worker does not serve is handed back unstarted
    (no attempt spent), due again after a short delay; it fails only when it
    has been due for ``unserved_timeout`` seconds and no live worker of the
    namespace announced that function meanwhile.

    ``metrics`` receives the hooks of :class:`distsched.metrics.WorkerMetrics`.
    ``hooks`` are objects with some of the methods of
    :class:`distsched.hooks.WorkerHooks` (``before_task``, ``after_task``,
    ``on_failure``), called around every run where the function runs; one that
    raises is logged and changes nothing.
    Time limits (README, "Time limits"): a run's limit is its task's ``timeout``, else
    ``timeouts[fn]`` (a function's own limit; None there: no limit for it), else
    ``timeout`` (None: no limit). At the limit the function is asked to stop
    (``current_task().cancel_requested``, ``timed_out``); whatever it does then, the
    attempt fails with ``timed out after N s`` (retried by its task's policy). Still
    running ``timeout_grace`` seconds later, the attempt is reported failed anyway: an
    ``async def`` function is cancelled; a ``def`` function cannot be stopped, so its
    slot stays taken until it returns (``snapshot()["overrunning"]``, logged). With
    ``stop_on_overrun`` (a process under ``distsched worker --processes``) the worker
    then shuts down so that its process can be replaced (``ended_by_overrun``): at once
    for a ``def`` function, after ``timeout_grace`` more for an ``async def`` one that
    did not end on its cancellation.

    ``share``, ``weight`` and ``serves`` are set by :class:`~distsched.worker.pool.
    WorkerPool` for the worker of each namespace it serves: its slots are drawn from the
    pool's, at that weight, and its registry entry lists what the pool serves.

    Every ten minutes the worker compares the memory its namespace's ended tasks will
    take at the current rate and retention with the server's ``maxmemory`` and logs a
    warning above ``memory_warning`` of it (None: never; see
    :meth:`Scheduler.retention_plan`).

    The worker logs on ``distsched.worker`` (a start-up line and a shutdown
    summary at INFO) and one line per task event on ``distsched.worker.tasks``,
    with structured fields (see :mod:`distsched.worker.logs`).
    Every argument is checked here: a bad one raises ``InvalidArgument`` naming it.
    """

    # The executor of ``def`` functions (a subclass may stand in, e.g. in tests).
    thread_pool_class: type[ThreadPool] = ThreadPool
    # What the worker asks of the namespace beyond the public API (a subclass may stand
    # in, e.g. in tests that make those calls fail).
    link_class: type[WorkerLink] = WorkerLink

    def __init__(
        self,
        scheduler: Scheduler,
        functions: Mapping[str, Callable[..., Any]]
        | Tasks
        | ModuleType
        | Sequence[TaskHandle[Any, Any]],
        concurrency: int = 8,
        worker_id: str | None = None,
        heartbeat_s: Duration | None = None,
        grace: Duration = 30.0,
        cancel_wait: Duration = 10.0,
        metrics: WorkerMetrics | None = None,
        unserved_timeout: Duration = DEFAULT_UNSERVED_TIMEOUT_S,
        hooks: Sequence[Any] | None = None,
        timeout: Duration | None = None,
        timeouts: Mapping[str, Duration | None] | None = None,
        timeout_grace: Duration = DEFAULT_TIMEOUT_GRACE_S,
        stop_on_overrun: bool = False,
        max_unsent: int | None = None,
        memory_warning: float | None = DEFAULT_WARNING_FRACTION,
        share: PoolShare | None = None,
        weight: float = 1.0,
        serves: Sequence[str] = (),
    ) -> None:
        max_unsent = _pool_bounds(concurrency, max_unsent)
        if memory_warning is not None and not (
            validate._is_number(memory_warning) and 0 < memory_warning <= 1
        ):
            raise InvalidArgument("memory_warning", "must be a fraction in (0, 1] or None")
        functions = served_functions(functions)
        _check_functions(functions)
        if worker_id is not None:
            validate.validate_worker_id(worker_id)
        if heartbeat_s is not None:
            heartbeat_s = _seconds(heartbeat_s, "heartbeat_s", positive=True)
        if metrics is not None and not isinstance(metrics, WorkerMetrics):
            raise InvalidArgument(
                "metrics", f"must be a WorkerMetrics or None, got {type(metrics).__name__}"
            )
        self.scheduler = scheduler
        self.functions = dict(functions)
        self.concurrency = concurrency
        self.max_unsent = max_unsent
        self.worker_id = worker_id or default_worker_id()
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else scheduler.lease_s / 3.0
        self.grace = _seconds(grace, "grace", positive=False)
        self.cancel_wait = _seconds(cancel_wait, "cancel_wait", positive=False)
        self.unserved_timeout = _seconds(unserved_timeout, "unserved_timeout", positive=False)
        # With none given the hooks are no-ops and the heartbeat reads no namespace stats.
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.hooks = validate_hooks(hooks)
        self.timeout = _time_limit(timeout, "timeout")
        self.timeouts = _function_time_limits(timeouts, self.functions)
        self.timeout_grace = _seconds(timeout_grace, "timeout_grace", positive=False)
        if not isinstance(stop_on_overrun, bool):
            raise InvalidArgument("stop_on_overrun", "must be a bool")
        self.stop_on_overrun = stop_on_overrun
        self._ended_by_overrun = False

        self._ran = False
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stop_grace: float | None = None
        self._wake = threading.Event()
        if not validate._is_number(weight) or not 0 < weight < math.inf:
            raise InvalidArgument("weight", "must be a finite number > 0")
        self._slots = Slots(concurrency, max_unsent, None if share is None else share.changed)
        member = (
            None if share is None else share.join(scheduler.namespace, weight, self._slots.busy)
        )
        link = self.link_class(scheduler)
        self._served = ServedFunctions(link, self.functions, self.unserved_timeout)
        self._reporter = Reporter(link, self._slots, self.metrics, self._served)
        self._registration = Registration(
            link,
            self.worker_id,
            self.functions,
            concurrency,
            self.heartbeat_s,
            self._slots,
            tuple(serves),
        )
        self._heartbeat = Heartbeat(
            scheduler,
            self._slots,
            self.metrics,
            self._served,
            self.heartbeat_s,
            observed=metrics is not None,
            registration=self._registration,
            retention=RetentionWatch(scheduler, memory_warning, RETENTION_CHECK_S),
        )
        self._limits = TimeLimits(
            self._slots, self._reporter, self.metrics, self.timeout_grace, self._overran
        )
        runner = Runner(
            self.functions,
            self._slots,
            self._reporter,
            self.metrics,
            lambda: self._heartbeat.clock_offset,
            HookChain([self.metrics, *self.hooks]),
            self._limits,
            self.timeouts,
            self.timeout,
            link.dependency_results,
        )
        self._threads = self.thread_pool_class(runner, concurrency)
        has_async = any(inspect.iscoroutinefunction(f) for f in self.functions.values())
        self._loop = LoopPool(runner) if has_async else None
        self._listener = Listener(
            link, self._slots, self._wake, self._heartbeat.now, self.worker_id
        )
        self._consumer = Consumer(
            link,
            self.worker_id,
            self.functions,
            self._slots,
            self._reporter,
            self._threads,
            self._loop,
            self.metrics,
            self._stopping,
            self._wake,
            member,
        )
        self._signals = SignalHandlers(
            self.worker_id, self.stop, self._grace_now, lambda: len(self._slots.held())
        )

    # ------------------------------------------------------------------ public

    def run(self) -> None:
        """Claim and run tasks until :meth:`stop` or SIGTERM/SIGINT, then shut down (§8).

        Call it once per worker. Signal handlers are installed only when it runs on
        the main thread, and restored when it returns.
        """
        with self._slots.cond:
            if self._ran:
                raise RuntimeError("a Worker runs once: make a new one to run again")
            self._ran = True
        restore = self._signals.install()
        try:
            self._start()
            try:
                self._consumer.run()
            finally:
                self._shutdown()
                counts = {k: v for k, v in self.counts.items() if v}
                log.info(
                    "worker %s stopped (%s)",
                    self.worker_id,
                    ", ".join(f"{k} {v}" for k, v in counts.items()) or "no tasks",
                    extra={"worker_id": self.worker_id, "counts": counts},
                )
        finally:
            restore()
            self._stopped.set()

    def run_until_idle(self) -> None:
        """:meth:`run` until nothing is left to do here: no task due, none running and
        no outcome unsent. Tasks that become due meanwhile (retries, dependents, fired
        schedules) run too; tasks due later do not. For scripts, batch jobs and tests
        (``distsched.testing``); a worker runs once either way.
        """
        self._consumer.until_idle = True
        self.run()

    def stop(self, grace: float | None = None) -> None:
        """Ask the worker to shut down; running functions get ``grace`` seconds to finish
        (default: the worker's ``grace``)."""
        if grace is not None:
            self._stop_grace = _seconds(grace, "grace", positive=False)
        self._stopping.set()
        self._wake.set()
        with self._slots.cond:
            self._slots.cond.notify_all()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`run` has returned; True if it did within ``timeout``."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> int:
        """How many functions are executing right now."""
        return self._slots.running

    @property
    def peak_running(self) -> int:
        """The most functions that ever executed at once on this worker."""
        return self._slots.peak_running

    @property
    def counts(self) -> dict[str, int]:
        """What happened to the claims: ``claimed``, ``succeeded``, ``failed``,
        ``cancelled``, ``released`` (handed back on shutdown), ``unserved`` (handed
        back: function not served here), and the ``stale`` and ``duplicate`` answers."""
        return self._slots.counts

    def snapshot(self) -> dict[str, int]:
        """One consistent look at the pool: executing, claimed but not started,
        finished with the report still on its way (those still hold their lease; past
        ``max_unsent`` they take slots), free slots, and overrunning: functions still
        running after their attempt was reported timed out (each keeps its slot until it
        returns)."""
        return self._slots.snapshot()

    @property
    def ended_by_overrun(self) -> bool:
        """True when ``stop_on_overrun`` stopped this worker: a ``def`` function outlived
        its time limit's grace, and only the end of its process ends it."""
        return self._ended_by_overrun

    def _overran(self, job: Job) -> None:
        if not self.stop_on_overrun:
            return
        claim = job.claim
        log.error(
            "task %r (%s) attempt %d: its function ignored its time limit; worker %s stops "
            "so that its process is replaced",
            claim.task_id,
            claim.fn,
            claim.attempt,
            self.worker_id,
            extra={"worker_id": self.worker_id, "task_id": claim.task_id},
        )
        self._ended_by_overrun = True
        self.stop()

    # ------------------------------------------------------------------ lifecycle

    def _grace_now(self) -> float:
        return self.grace if self._stop_grace is None else self._stop_grace

    def _start(self) -> None:
        where = redis_location(self.scheduler.client)
        functions = sorted(self.functions)
        log.info(
            "worker %s: namespace %r at %s, concurrency %d, functions: %s",
            self.worker_id,
            self.scheduler.namespace,
            where,
            self.concurrency,
            ", ".join(functions),
            extra={
                "worker_id": self.worker_id,
                "namespace": self.scheduler.namespace,
                "redis": where,
                "concurrency": self.concurrency,
                "functions": functions,
            },
        )
        # Announced before the first claim, so that other workers see at once that
        # these functions are served; the heartbeat retries it when Redis is away.
        try:
            self._served.announce()
        except (ClosedError, *TRANSIENT) as exc:
            log.warning("could not announce the served functions yet: %s", exc)
        except Exception:
            log.exception("announcing the served functions failed")
        try:
            self._registration.write()
        except (ClosedError, *TRANSIENT) as exc:
            log.warning("could not register in the worker registry yet: %s", exc)
        except Exception:
            log.exception("registering in the worker registry failed")
        self._threads.start()
        if self._loop is not None:
            self._loop.start()
        self._reporter.start()
        self._heartbeat.start()
        # Until idle, the claim loop looks again by itself while its tasks run, and
        # heartbeats deliver cancel requests: no subscription to wait on or tear down.
        if not self._consumer.until_idle:
            self._listener.start()

    def _shutdown(self) -> None:
        self._stopping.set()
        grace = self._grace_now()
        # 1. Claimed but not started: hand them back without spending an attempt.
        for job in self._slots.release_unstarted():
            self._reporter.put(job, ReportKind.RELEASE, None)
        # 2. Running: wait for them up to the grace period, 3. then signal them to stop.
        if not self._slots.wait_idle(grace):
            self._slots.signal_all(StopReason.SHUTDOWN)
            if not self._slots.wait_idle(self.cancel_wait):
                log.error("%d task functions did not stop; their leases will expire", self.running)
        # 4. Last: the reporter (once every outcome is sent), heartbeats, the wake-up
        # listener, the event loop and the pool threads.
        self._limits.stop(JOIN_S)
        self._reporter.stop(timeout=max(5.0, self.cancel_wait))
        self._heartbeat.stop(JOIN_S)
        # After the heartbeats, which would write the entry back.
        try:
            self._registration.remove()
        except (ClosedError, *TRANSIENT) as exc:
            log.warning("could not leave the worker registry (housekeeping drops it): %s", exc)
        except Exception:
            log.exception("leaving the worker registry failed")
        self._listener.stop(JOIN_S)
        self._threads.stop(JOIN_S)
        if self._loop is not None:
            self._loop.stop(JOIN_S)
