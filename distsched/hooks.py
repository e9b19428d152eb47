"""Worker hooks: code that runs around every task function, without patching the worker.

A hook is any object with some of the methods of :class:`WorkerHooks` (subclass it to
get no-op defaults for the rest). Pass them as ``Worker(..., hooks=[...])`` or
``distsched worker --hooks module:object``. For each run the worker calls

- ``before_task(ctx)`` just before the function starts,
- ``on_failure(ctx, exc)`` when the function raised and the attempt failed,
- ``after_task(ctx, outcome, result_or_error)`` once it returned or raised,

``ctx`` being the run's :class:`~distsched.context.TaskContext`. They run where the
function runs: on its pool thread for a ``def`` function, in its asyncio task on the
worker's event loop for an ``async def`` one, so context variables and logging context
set in ``before_task`` are seen by the function (and should be reset in
``after_task``). ``before_task`` hooks run in the order given, ``on_failure`` and
``after_task`` in the reverse order, like nested ``with`` blocks. A hook that raises is
logged and skipped: it never stops the worker or changes the task's outcome. Hooks are
plain functions: in an ``async def`` task they run on the event loop, so keep them quick.

:class:`~distsched.metrics.WorkerMetrics` is a ``WorkerHooks`` too (with the worker's
other events), and :class:`distsched.otel.TracingHooks` opens a span per run.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from distsched.context import TaskContext
from distsched.errors import InvalidArgument

log = logging.getLogger("distsched.worker")

HOOK_METHODS = ("before_task", "after_task", "on_failure")


class RunOutcome(str, enum.Enum):
    """How one run of a task function ended, as ``after_task`` is told."""

    SUCCEEDED = "succeeded"
    """The function returned; its value is reported as the result."""
    FAILED = "failed"
    """The function raised: the attempt failed (the task is retried while attempts
    remain)."""
    CANCELLED = "cancelled"
    """The function stopped on a cancellation request: the task ends cancelled."""
    RELEASED = "released"
    """The worker's shutdown stopped the function: the task goes back to ready, no
    attempt spent."""

    def __str__(self) -> str:
        return self.value


class WorkerHooks:
    """Hooks around every run of a task function; each is a no-op here."""

    def before_task(self, ctx: TaskContext) -> None:
        """The function of ``ctx`` is about to start (on the thread or loop that runs it)."""

    def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
        """The function ended: ``result_or_error`` is its return value when ``outcome``
        is ``SUCCEEDED``, else what it raised."""

    def on_failure(self, ctx: TaskContext, exc: BaseException) -> None:
        """The function raised ``exc`` and the attempt failed (before ``after_task``)."""


def validate_hooks(hooks: object) -> list[Any]:
    """``hooks`` as a list: a sequence of objects that each have a hook method."""
    if hooks is None:
        return []
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Sequence):
        raise InvalidArgument("hooks", "must be a list of hook objects (see WorkerHooks)")
    for hook in hooks:
        methods = [getattr(hook, name, None) for name in HOOK_METHODS]
        if not any(callable(method) for method in methods):
            raise InvalidArgument(
                "hooks",
                f"{hook!r} has none of the hook methods {', '.join(HOOK_METHODS)}",
            )
        if any(inspect.iscoroutinefunction(method) for method in methods):
            # Nothing would await it: the hook would silently never run.
            raise InvalidArgument("hooks", f"{hook!r}: hook methods must be plain functions")
    return list(hooks)


class HookChain:
    """Calls every hook's method for one run, logging and skipping any that raises."""

    def __init__(self, hooks: Sequence[Any]) -> None:
        self._before = [h.before_task for h in hooks if _implements(h, "before_task")]
        reverse = list(reversed(hooks))
        self._after = [h.after_task for h in reverse if _implements(h, "after_task")]
        self._failure = [h.on_failure for h in reverse if _implements(h, "on_failure")]

    def __bool__(self) -> bool:
        return bool(self._before or self._after or self._failure)

    def before(self, ctx: TaskContext) -> None:
        for method in self._before:
            _call(method, ctx)

    def after(self, ctx: TaskContext, outcome: RunOutcome, value: Any) -> None:
        if outcome is RunOutcome.FAILED and isinstance(value, BaseException):
            for method in self._failure:
                _call(method, ctx, value)
        for method in self._after:
            _call(method, ctx, outcome, value)


def _implements(hook: Any, name: str) -> bool:
    """Whether ``hook`` has its own method ``name``: WorkerHooks' no-ops (inherited by a
    hook that implements only some methods) would only cost a call per task."""
    if not callable(getattr(hook, name, None)):
        return False
    return getattr(type(hook), name, None) is not getattr(WorkerHooks, name)


def _call(method: Any, ctx: TaskContext, *args: Any) -> None:
    try:
        method(ctx, *args)
    except Exception:
        log.exception(
            "hook %s failed for task %r (ignored)",
            getattr(method, "__qualname__", method),
            ctx.task_id,
        )
