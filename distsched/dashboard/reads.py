"""What each dashboard page shows, read through the :class:`~distsched.client.Scheduler`.

Every function here makes a bounded number of Redis round trips, whatever the
number of tasks in the namespace: lists (leases included) are read a page at a
time, and the graph around a task stops after ``GRAPH_LIMIT`` tasks. Nothing here
writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack

from distsched import views
from distsched.client import Scheduler
from distsched.core import (
    Explanation,
    MinuteCount,
    Overview,
    State,
    TaskInfo,
    TaskPage,
    WorkerInfo,
)
from distsched.text import error_summary, jsonable, preview, size

# The throughput charts: the last hour by minute, the last day by DAY_BUCKET minutes.
DAY_MINUTES = 1440
DAY_BUCKET = 15
# Tasks per page of a list.
PAGE_SIZE = 50
# Tasks read around one task for its graph.
GRAPH_LIMIT = 40
# Characters of a payload or result shown before "show all".
PREVIEW_CHARS = 2000
# Leases that expire within this many seconds count as "expiring soon".
SOON_S = 10.0


def js(value: Any) -> str:
    """A value as JSON text for people (non-ASCII kept, bytes shown as text)."""
    return json.dumps(jsonable(value), ensure_ascii=False, indent=None)


@dataclass(frozen=True)
class OverviewPage:
    overview: Overview
    workers: list[WorkerInfo]
    # The last day, one entry per minute, oldest first.
    minutes: list[MinuteCount]

    @property
    def hour(self) -> list[MinuteCount]:
        return self.minutes[-60:]

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if w.alive)

    @property
    def slots(self) -> int:
        return sum(w.concurrency for w in self.workers if w.alive)


def overview(scheduler: Scheduler) -> OverviewPage:
    return OverviewPage(
        scheduler.overview(soon_s=SOON_S),
        scheduler.workers(),
        scheduler.throughput(DAY_MINUTES),
    )


def overview_json(page: OverviewPage) -> dict[str, Any]:
    ov = page.overview
    return {
        "counts": dict(ov["counts"]),
        "queue_entries": ov["queue_entries"],
        "live_entries": ov["live_entries"],
        "stale_entries": ov["stale_entries"],
        "stale_ratio": ov["stale_ratio"],
        "running": ov["running"],
        "max_running": ov["max_running"],
        "leases": ov["leases"],
        "leases_expired": ov["leases_expired"],
        "leases_expiring": ov["leases_expiring"],
        "leases_soon_s": ov["leases_soon_s"],
        "oldest_ready_age": ov["oldest_ready_age"],
        "retention_s": ov["retention_s"],
        "server_time": ov["server_time"],
        "workers": len(page.workers),
        "workers_alive": page.workers_alive,
        "slots": page.slots,
        "hour": _totals(page.hour),
        "day": _totals(page.minutes),
        # Empty unless the namespace is fair (README "Tenants and fairness").
        "keys": [dict(load) for load in ov["keys"]],
    }


def _totals(minutes: list[MinuteCount]) -> dict[str, int]:
    return {
        "succeeded": sum(m.succeeded for m in minutes),
        "failed": sum(m.failed for m in minutes),
    }


@dataclass(frozen=True)
class TaskDetail:
    info: TaskInfo
    explanation: Explanation
    hood: views.Neighbourhood

    @property
    def now(self) -> float:
        return self.explanation.server_time

    @property
    def lease_left(self) -> float | None:
        deadline = self.explanation.lease_deadline
        return None if deadline is None else deadline - self.now

    @property
    def payload_size(self) -> int:
        """Bytes of the task's payload as msgpack (as stored, give or take the encoder)."""
        info = self.info
        packed = msgpack.packb(
            {"fn": info.fn, "args": list(info.args), "kwargs": info.kwargs},
            use_bin_type=True,
            default=str,
        )
        return len(packed)

    @property
    def blocked_dependents(self) -> list[str]:
        """The tasks read around this one that its failure or cancellation blocked."""
        hood = self.hood
        return [
            d
            for d in hood.descendants
            if (info := hood.tasks[d]) is not None
            and info.state is State.BLOCKED
            and info.blocked_by is not None
            and info.blocked_by.root == hood.task_id
        ]


def task(scheduler: Scheduler, task_id: str) -> TaskDetail:
    """One task with its explanation and graph; ``NotFoundError`` for an unknown id."""
    info = scheduler.status(task_id)
    explanation = scheduler.explain(task_id)
    hood = views.walk(scheduler, task_id, limit=GRAPH_LIMIT)
    # The walk read the task again: show one snapshot, the latest.
    return TaskDetail(hood.root if hood.root else info, explanation, hood)


def value_preview(value: Any, limit: int | None = PREVIEW_CHARS) -> tuple[str, str]:
    """``(preview, size)`` of a value shown as JSON."""
    text = js(value)
    return preview(text, limit), size(len(text.encode("utf-8", "surrogatepass")))


def error_title(error: str | None) -> str:
    return error_summary(error) if error else ""


@dataclass(frozen=True)
class LeasesPage:
    page: TaskPage
    now: float  # server clock
    total: int

    def left(self, info: TaskInfo) -> float | None:
        return None if info.lease_deadline is None else info.lease_deadline - self.now


def leases(scheduler: Scheduler, cursor: str | None) -> LeasesPage:
    """One page of the running tasks, the soonest lease deadline first."""
    page = scheduler.tasks(State.RUNNING, limit=PAGE_SIZE, cursor=cursor)
    return LeasesPage(page, scheduler.server_time(), scheduler.stats()["leases"])


def task_list(scheduler: Scheduler, state: State, fn: str | None, cursor: str | None) -> TaskPage:
    """One page of the tasks in ``state`` (of function ``fn``), from ``cursor``."""
    return scheduler.tasks(state, fn=fn, limit=PAGE_SIZE, cursor=cursor)
