"""The running task's context, reachable from inside the function by ``current_task()``."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import TYPE_CHECKING

from distsched.errors import Cancelled, LeaseLost

if TYPE_CHECKING:
    from distsched.core import Claim

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "distsched_task", default=None
)


class TaskContext:
    """What a task function may know and watch about its own run."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self._signal = threading.Event()
        self._lease_lost = False
        self._cancel_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_signal: asyncio.Event | None = None

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
        """True once cancellation was requested or the lease was lost: stop soon."""
        return self._signal.is_set()

    @property
    def lease_lost(self) -> bool:
        """True when the worker lost this run's lease: another attempt may be running."""
        return self._lease_lost

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` (``LeaseLost`` when the lease was lost) if signalled."""
        if self._lease_lost:
            raise LeaseLost(f"lease of {self.task_id!r} attempt {self.attempt} was lost")
        if self._signal.is_set():
            raise Cancelled(f"task {self.task_id!r} was cancelled")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancellation signal; True if signalled."""
        return self._signal.wait(timeout)

    async def wait_cancelled_async(self, timeout: float | None = None) -> bool:
        """The ``async def`` flavour of :meth:`wait_cancelled`."""
        event = self._async_signal
        if event is None:
            # Not bound to the worker's loop (a test calling directly): poll the flag.
            return await asyncio.to_thread(self._signal.wait, timeout)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return self._signal.is_set()
        return True

    # -- used by the worker

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._async_signal = asyncio.Event()
        if self._signal.is_set():
            self._async_signal.set()

    def _signal_stop(self, lease_lost: bool = False) -> None:
        if lease_lost:
            self._lease_lost = True
        else:
            self._cancel_requested = True
        self._signal.set()
        if self._loop is not None and self._async_signal is not None:
            self._loop.call_soon_threadsafe(self._async_signal.set)

    @property
    def _cancel_was_requested(self) -> bool:
        return self._cancel_requested


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
