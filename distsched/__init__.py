"""distsched: a Redis-based distributed task scheduler."""

import re as _re

import redis as _redis

# The oldest redis-py distsched runs with (pyproject.toml says the same): earlier ones
# lack the asyncio cluster's sharded pub/sub, and would fail at a less helpful import.
REDIS_PY_MIN = (8, 0)


def _require_redis_py(version: str) -> None:
    # The leading digits of the first two parts: "8.1rc1" reads as 8.1, and "8" as 8.0.
    first_two = [*version.split("."), "0"][:2]
    parts = tuple(int(_re.sub(r"\D.*", "", part) or 0) for part in first_two)
    if parts < REDIS_PY_MIN:
        wanted = ".".join(map(str, REDIS_PY_MIN))
        raise ImportError(
            f"distsched needs redis-py {wanted} or later, found {version}: "
            f"pip install 'redis>={wanted}'"
        )


_require_redis_py(_redis.__version__)

from distsched.client import Scheduler  # noqa: E402
from distsched.context import TaskContext, current_task  # noqa: E402
from distsched.errors import (  # noqa: E402
    BusyError,
    Cancelled,
    ClosedError,
    ConflictError,
    CycleError,
    DependencyResultsTooLarge,
    DependencyUnavailable,
    DistschedError,
    InvalidArgument,
    LeaseLost,
    LeaseLostError,
    MissingExtraError,
    NotADependencyError,
    NotFoundError,
    PayloadTooLarge,
    ScriptError,
    TaskBlocked,
    TaskCancelled,
    TaskError,
    TaskFailed,
    Timeout,
    Unavailable,
    UnknownDependencyError,
)
from distsched.model import (  # noqa: E402
    Admitted,
    Change,
    Changed,
    Claim,
    DependencyResult,
    Duration,
    JoinRule,
    Outcome,
    Progress,
    Spawn,
    State,
    TaskInfo,
    TaskSpec,
    Wait,
)
from distsched.schedules import Catchup, Overlap, Schedule  # noqa: E402
from distsched.tasks import AsyncTask, Task, Tasks  # noqa: E402
from distsched.version import __version__  # noqa: E402
from distsched.worker import Worker  # noqa: E402
from distsched.worker.pool import WorkerPool  # noqa: E402

__all__ = [
    "Admitted",
    "AsyncTask",
    "BusyError",
    "Cancelled",
    "Catchup",
    "Change",
    "Changed",
    "Claim",
    "ClosedError",
    "ConflictError",
    "CycleError",
    "DependencyResult",
    "DependencyResultsTooLarge",
    "DependencyUnavailable",
    "DistschedError",
    "Duration",
    "InvalidArgument",
    "JoinRule",
    "LeaseLost",
    "LeaseLostError",
    "MissingExtraError",
    "NotADependencyError",
    "NotFoundError",
    "Outcome",
    "Overlap",
    "PayloadTooLarge",
    "Progress",
    "Schedule",
    "Scheduler",
    "ScriptError",
    "Spawn",
    "State",
    "Task",
    "TaskBlocked",
    "TaskCancelled",
    "TaskContext",
    "TaskError",
    "TaskFailed",
    "TaskInfo",
    "TaskSpec",
    "Tasks",
    "Timeout",
    "Unavailable",
    "UnknownDependencyError",
    "Wait",
    "Worker",
    "WorkerPool",
    "__version__",
    "current_task",
]
