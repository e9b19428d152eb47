"""The running task's context, reachable from inside the function by ``current_task()``."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from distsched.errors import Cancelled, LeaseLost
from distsched.model import Outcome
from distsched.wire.replies import dependency_value

if TYPE_CHECKING:
    from distsched.model import Claim, DependencyResult

# How a context reads its dependencies' results: (task id, version, ids or None for
# all) -> entries by id. The worker gives each run one (its link to the namespace).
DependencyReader = Callable[[str, int, "Sequence[str] | None"], "dict[str, DependencyResult]"]


class ProgressLink(Protocol):
    """What a context needs to report progress and keep checkpoints: the worker's link
    to its namespace (:class:`distsched.worker.link.WorkerLink`)."""

    def report_progress(self, claim: Claim, fraction: float, note: str) -> Outcome: ...

    def save_checkpoint(self, claim: Claim, value: object) -> Outcome: ...

    def checkpoint(self, claim: Claim) -> Any: ...


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "distsched_task", default=None
)


class StopReason(enum.Enum):
    """Why a running function was asked to stop."""

    CANCEL = "cancel"  # cancellation of the task was requested
    LEASE_LOST = "lease_lost"  # the worker no longer holds the task's lease
    SHUTDOWN = "shutdown"  # the worker is shutting down and the grace period is over
    TIMEOUT = "timeout"  # the run reached its time limit


# Guards the lazy creation of a context's signal event against a signal sent meanwhile.
_SIGNAL_LOCK = threading.Lock()


class TaskContext:
    """What a task function may know and watch about its own run."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        # Made on first use: most runs never wait for a signal, and an Event (a lock
        # and a condition) per task is a measurable part of a no-op task's cost.
        self._signal_event: threading.Event | None = None
        self._reasons: set[StopReason] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_signal: asyncio.Event | None = None
        # The run's time limit in seconds (None: none), set by the worker at the start.
        self._time_limit: float | None = None
        # How progress and checkpoints reach Redis, set by the worker at the start.
        self._link: ProgressLink | None = None
        # The checkpoint as this run knows it: read at its first use, then what it saved.
        self._checkpoint: Any = None
        self._checkpoint_read = False
        # Reads the dependencies' results; set by the worker that runs the task.
        self._dependencies: DependencyReader | None = None

    @property
    def task_id(self) -> str:
        return self.claim.task_id

    @property
    def version(self) -> int:
        return self.claim.version

    @property
    def attempt(self) -> int:
        """1 on the first run; deliveries are at-least-once, so functions must be idempotent."""
        return self.claim.attempt

    @property
    def cancel_requested(self) -> bool:
        """True once the function should stop soon: cancellation was requested, the
        lease was lost, the run reached its time limit, or the worker is shutting down
        and its grace period is over."""
        return bool(self._reasons)

    @property
    def time_limit(self) -> float | None:
        """This run's time limit in seconds (the task's ``timeout``, else the function's,
        else the worker's default), None when it has none."""
        return self._time_limit

    @property
    def timed_out(self) -> bool:
        """True once the run reached its time limit: whatever the function does now, the
        attempt ends failed with ``timed out after N s``."""
        return StopReason.TIMEOUT in self._reasons

    @property
    def _signal(self) -> threading.Event:
        event = self._signal_event
        if event is None:
            with _SIGNAL_LOCK:
                if self._signal_event is None:
                    self._signal_event = threading.Event()
                    if self._reasons:
                        self._signal_event.set()
                event = self._signal_event
        return event

    @property
    def lease_lost(self) -> bool:
        """True when the worker lost this run's lease: another attempt may be running."""
        return StopReason.LEASE_LOST in self._reasons

    @property
    def worker_stopping(self) -> bool:
        """True when the worker's shutdown asked this function to stop.

        A run that stops on it is not a failure: the task goes back to ready for
        another worker without spending an attempt (unless a cancel was requested).
        """
        return StopReason.SHUTDOWN in self._reasons

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` (``LeaseLost`` when the lease was lost) if signalled."""
        if self.lease_lost:
            raise LeaseLost(f"lease of {self.task_id!r} attempt {self.attempt} was lost")
        if StopReason.CANCEL in self._reasons:
            raise Cancelled(f"task {self.task_id!r} was cancelled")
        if self.timed_out:
            raise Cancelled(f"task {self.task_id!r} {self.timeout_error}")
        if self._reasons:
            raise Cancelled(f"task {self.task_id!r} was stopped: the worker is shutting down")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancellation signal; True if signalled."""
        return self._signal.wait(timeout)

    async def wait_cancelled_async(self, timeout: float | None = None) -> bool:
        """The ``async def`` flavour of :meth:`wait_cancelled`."""
        if self._loop is None:
            # Not bound to the worker's loop (a test calling directly): poll the flag.
            return await asyncio.to_thread(self._signal.wait, timeout)
        event = self._async_signal
        if event is None:
            # Made on first use, on the loop; a signal sent meanwhile is seen here.
            with _SIGNAL_LOCK:
                event = self._async_signal = asyncio.Event()
                if self._reasons:
                    event.set()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return bool(self._reasons)
        return True

    # -- progress and checkpoints

    def report_progress(self, fraction: float, note: str = "") -> None:
        """Tell waiters, ``status`` and the dashboard how far this run got: ``fraction``
        in [0, 1] and a short ``note`` (at most 200 bytes of UTF-8). One Redis call,
        fenced by this attempt's token: raises ``LeaseLost`` (nothing written) when
        another attempt owns the task now, ``InvalidArgument`` for a bad value. It does
        not extend the lease: the worker's heartbeat does that."""
        self._fenced(self._need_link().report_progress(self.claim, fraction, note))

    def save_checkpoint(self, value: object) -> None:
        """Keep ``value`` (any msgpack value, at most 64 KiB encoded; None clears it)
        for the next attempt of this version of the task, which reads it as
        :attr:`checkpoint`: a run that crashes or loses its lease can then resume after
        its last finished step. Fenced like :meth:`report_progress` (``LeaseLost``)."""
        self._fenced(self._need_link().save_checkpoint(self.claim, value))
        self._checkpoint, self._checkpoint_read = value, True

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved by an attempt of this version (this one included),
        None when none was: read from Redis at its first use (a blocking call; in an
        ``async def`` function use :meth:`checkpoint_async`)."""
        if not self._checkpoint_read:
            self._checkpoint = self._need_link().checkpoint(self.claim)
            self._checkpoint_read = True
        return self._checkpoint

    async def report_progress_async(self, fraction: float, note: str = "") -> None:
        """The ``async def`` flavour of :meth:`report_progress` (the call runs in a thread)."""
        await asyncio.to_thread(self.report_progress, fraction, note)

    async def save_checkpoint_async(self, value: object) -> None:
        """The ``async def`` flavour of :meth:`save_checkpoint`."""
        await asyncio.to_thread(self.save_checkpoint, value)

    async def checkpoint_async(self) -> Any:
        """The ``async def`` flavour of :attr:`checkpoint`."""
        if self._checkpoint_read:
            return self._checkpoint
        return await asyncio.to_thread(lambda: self.checkpoint)

    def _need_link(self) -> ProgressLink:
        if self._link is None:
            raise RuntimeError("progress and checkpoints need a task run by a distsched worker")
        return self._link

    def _fenced(self, outcome: Outcome) -> None:
        if outcome is Outcome.STALE:
            self._signal_stop(StopReason.LEASE_LOST)
            raise LeaseLost(
                f"task {self.task_id!r} attempt {self.attempt} is no longer the running attempt"
            )

    def dependency_results(self, ids: Sequence[str] | None = None) -> dict[str, DependencyResult]:
        """What this task's dependencies hold now, by id, read in one atomic call.

        Every dependency (required and optional, in the order they were given), or only
        ``ids``. Each entry (:class:`~distsched.model.DependencyResult`) says the
        dependency's state and its result when it succeeded, or the error it ended with:
        an optional dependency that failed is there, marked failed. The result is that
        of the dependency's current version. One read takes at most 1000 dependencies
        (``limits.MAX_DEP_RESULTS``) whose results hold at most 2 MiB together
        (``limits.MAX_DEP_RESULT_BYTES``); beyond either it raises
        ``DependencyResultsTooLarge`` and reads nothing: read by ``ids`` in parts. An id
        that is not one of this task's dependencies raises ``NotADependencyError``.
        """
        read = self._dependencies
        if read is None:
            raise RuntimeError(
                "this task context has no namespace to read from: "
                "dependency results are read inside a task run by a distsched Worker"
            )
        return read(self.task_id, self.version, None if ids is None else list(ids))

    def dependency_result(self, dep_id: str) -> Any:
        """The result of dependency ``dep_id`` (read alone, whatever its size).

        Raises ``TaskFailed``, ``TaskCancelled`` or ``TaskBlocked`` when it ended so
        (an optional dependency may have), ``DependencyUnavailable`` when it has no
        result now (a new version of it has not ended, or it was purged), and
        ``NotADependencyError`` when this task does not depend on it.
        """
        return dependency_value(self.dependency_results([dep_id])[dep_id])

    async def dependency_results_async(
        self, ids: Sequence[str] | None = None
    ) -> dict[str, DependencyResult]:
        """The ``async def`` flavour of :meth:`dependency_results` (the read runs on a
        thread, so the event loop goes on meanwhile)."""
        return await asyncio.to_thread(self.dependency_results, ids)

    async def dependency_result_async(self, dep_id: str) -> Any:
        """The ``async def`` flavour of :meth:`dependency_result`."""
        return await asyncio.to_thread(self.dependency_result, dep_id)

    @property
    def timeout_error(self) -> str:
        """The error of an attempt that reached its time limit: ``timed out after N s``."""
        return timeout_error(self._time_limit or 0.0)

    # -- used by the worker

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _signal_stop(self, reason: StopReason) -> None:
        with _SIGNAL_LOCK:
            self._reasons.add(reason)
            event, async_event = self._signal_event, self._async_signal
        if event is not None:
            event.set()
        if self._loop is not None and async_event is not None:
            self._loop.call_soon_threadsafe(async_event.set)

    @property
    def _cancel_was_requested(self) -> bool:
        return StopReason.CANCEL in self._reasons


def timeout_error(limit: float) -> str:
    """``timed out after N s``: the error recorded for a run that reached its limit."""
    return f"timed out after {limit:g} s"


def current_task() -> TaskContext:
    """The context of the task function running in this thread or asyncio task.

    Raises ``LookupError`` outside a task function.
    """
    ctx = _current.get()
    if ctx is None:
        raise LookupError("current_task() called outside a distsched task function")
    return ctx


def _set_current(ctx: TaskContext | None) -> contextvars.Token[TaskContext | None]:
    return _current.set(ctx)


def _reset_current(token: contextvars.Token[TaskContext | None]) -> None:
    _current.reset(token)
