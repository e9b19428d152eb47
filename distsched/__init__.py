"""distsched: a Redis-based distributed task scheduler."""

from distsched.client import Scheduler
from distsched.context import TaskContext, current_task
from distsched.core import Admitted, Claim, Outcome, State, TaskInfo, TaskSpec, Wait
from distsched.schedules import Catchup, Overlap, Schedule
from distsched.worker import Worker

__all__ = [
    "Admitted",
    "Catchup",
    "Claim",
    "Outcome",
    "Overlap",
    "Schedule",
    "Scheduler",
    "State",
    "TaskContext",
    "TaskInfo",
    "TaskSpec",
    "Wait",
    "Worker",
    "current_task",
]
__version__ = "0.1.0"
