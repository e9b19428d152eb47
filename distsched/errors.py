"""Exceptions raised by distsched."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError


class DistschedError(Exception):
    """Base class of every distsched error."""


class InvalidArgument(DistschedError, ValueError):
    """A bad argument. ``field`` names it; nothing was written to Redis."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PayloadTooLarge(InvalidArgument):
    """The encoded payload exceeds the scheduler's ``max_payload_bytes``."""


class Unavailable(DistschedError, RedisConnectionError):
    """Redis could not serve the call now; try again.

    Raised for a lost connection, a timeout, a failover in progress (``CLUSTERDOWN``,
    ``MASTERDOWN``, a read-only replica), a slot being migrated (``TRYAGAIN``) or a
    server still loading its data. A ``schedule`` whose reply was lost may have been
    applied: sending it again at worst writes a newer version of the same task, never
    a second runnable copy; a repeated report is answered ``duplicate``. It is a
    ``redis.exceptions.ConnectionError`` too, so code that catches that keeps working.
    """


class ConflictError(DistschedError):
    """The operation is not legal in the task's current state (e.g. replacing a running task)."""


class NotFoundError(DistschedError, LookupError):
    """No task with this id exists in the namespace."""


class ClosedError(DistschedError):
    """The scheduler was closed."""


class LeaseLostError(DistschedError):
    """The claim's token is no longer current: its lease was reaped or the task replaced."""


class CycleError(DistschedError):
    """A dependency cycle; ``path`` is the concrete cycle, first id repeated last."""

    def __init__(self, path: list[str]) -> None:
        super().__init__("dependency cycle: " + " -> ".join(path))
        self.path = path


class UnknownDependencyError(DistschedError):
    """A dependency names a task that does not exist (closed graph).

    ``task_id`` is the task being submitted, ``dependency`` the missing id.
    """

    task_id: str = ""
    dependency: str = ""


class BusyError(DistschedError):
    """A task's dependents are still being told that it ended; retried transparently."""


class ScriptError(DistschedError):
    """A script refused its input or found a corrupt record."""


class Cancelled(DistschedError):
    """Raised inside a task function by ``raise_if_cancelled()``; ends the task as cancelled."""


class LeaseLost(Cancelled):
    """Raised by ``raise_if_cancelled()`` when the worker lost the task's lease."""


class MissingExtraError(DistschedError, ImportError):
    """An optional extra that a feature needs is not installed (the message names it)."""


class Timeout(DistschedError, TimeoutError):
    """``Scheduler.wait``/``result`` gave up: the task had not ended within ``timeout``.

    The task is untouched and may still end later; ``task_id`` names it.
    """

    def __init__(self, task_id: str, timeout: float) -> None:
        super().__init__(f"task {task_id!r} did not end within {timeout:g}s")
        self.task_id = task_id
        self.timeout = timeout


class TaskError(DistschedError):
    """Base of the errors ``Scheduler.result`` raises for a task that did not succeed.

    ``task_id`` names the task and ``info`` is its final ``TaskInfo``.
    """

    def __init__(self, message: str, task_id: str, info: Any = None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.info = info


class TaskFailed(TaskError):
    """The task failed.

    ``traceback`` is the error text its last attempt stored (the remote traceback,
    ending with its ``Type: message`` line), ``error`` that last line; the message
    holds the whole text.
    """

    def __init__(self, task_id: str, traceback: str | None, info: Any = None) -> None:
        text = traceback or "(no error text stored)"
        super().__init__(f"task {task_id!r} failed:\n{text}", task_id, info)
        self.traceback = text
        lines = [line for line in text.splitlines() if line.strip()]
        self.error = lines[-1] if lines else text


class TaskCancelled(TaskError):
    """The task was cancelled before it ended any other way."""

    def __init__(self, task_id: str, info: Any = None) -> None:
        super().__init__(f"task {task_id!r} was cancelled", task_id, info)


class TaskBlocked(TaskError):
    """The task can never run: a required dependency failed, was cancelled or blocked.

    ``root`` is the task that failed or was cancelled, ``path`` the ids from it to this
    task (each a required dependency of the next); both are None when unknown.
    """

    def __init__(
        self,
        task_id: str,
        root: str | None,
        path: tuple[str, ...] | None,
        info: Any = None,
    ) -> None:
        if root is None:
            because = "a dependency did not succeed"
        else:
            because = f"{root!r} did not succeed (path: {' -> '.join(path or (root,))})"
        super().__init__(f"task {task_id!r} is blocked: {because}", task_id, info)
        self.root = root
        self.path = path


class NotADependencyError(InvalidArgument):
    """A task asked for the result of a task it does not depend on.

    A task reads only the results of its own dependencies (those of its current
    version); ``task_id`` is the task, ``dependency`` the id it asked for.
    """

    def __init__(self, task_id: str, dependency: str) -> None:
        super().__init__("ids", f"{dependency!r} is not a dependency of task {task_id!r}")
        self.task_id = task_id
        self.dependency = dependency


class DependencyResultsTooLarge(DistschedError):
    """One read of dependency results would be over its bounds; nothing was read.

    ``what`` is ``"deps"`` (the task has more dependencies than one read takes,
    ``limits.MAX_DEP_RESULTS``) or ``"bytes"`` (the results asked for hold more bytes
    than one read takes, ``limits.MAX_DEP_RESULT_BYTES``); ``amount`` is how many there
    are and ``limit`` the bound. Read fewer dependencies by id per call instead.
    """

    def __init__(self, task_id: str, what: str, amount: int, limit: int) -> None:
        if what == "deps":
            detail = (
                f"task {task_id!r} has {amount} dependencies, more than one read takes "
                f"({limit}, MAX_DEP_RESULTS): read them by id, at most {limit} per call"
            )
        else:
            detail = (
                f"the results asked for of task {task_id!r}'s dependencies hold {amount} "
                f"bytes, more than one read takes ({limit}, MAX_DEP_RESULT_BYTES): read "
                "fewer of them by id per call"
            )
        super().__init__(detail)
        self.task_id = task_id
        self.what = what
        self.amount = amount
        self.limit = limit


class DependencyUnavailable(DistschedError):
    """A dependency has no result to read: it has not ended (a new version of it runs
    or waits), or it is gone (purged or forgotten), or its record cannot be read.

    ``dependency`` is its id and ``state`` what it is now (a ``State`` name,
    ``"missing"`` or ``"corrupt"``).
    """

    def __init__(self, dependency: str, state: str) -> None:
        if state == "missing":
            why = "no longer exists (purged or forgotten)"
        elif state == "corrupt":
            why = "has a task record that cannot be read"
        else:
            why = f"has no result: its current version is {state}"
        super().__init__(f"dependency {dependency!r} {why}")
        self.dependency = dependency
        self.state = state
