"""What each dashboard page shows, read through the :class:`~distsched.client.Scheduler`.

Every function here makes a bounded number of Redis round trips, whatever the
number of tasks in the namespace: lists (leases included) are read a page at a
time, and the graph around a task stops after ``GRAPH_LIMIT`` tasks. Nothing here
writes. What a task page shows is bounded whatever the task holds: its lists a page at a
time, its ids, worker and error cut (the full text has its own link), its payload shown
without recursion (:func:`show_value`): a value read from Redis may have been written by
another language or by hand (a msgpack extension, arrays nested thousands deep, strings of
megabytes), and nothing here recurses, raises on such a value, or builds more text than
it was asked for.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import redis

from distsched import views
from distsched.client import Scheduler
from distsched.errors import DependencyResultsTooLarge, InvalidArgument, NotFoundError
from distsched.model import (
    DependencyResult,
    Explanation,
    MinuteCount,
    Overview,
    State,
    TaskInfo,
    TaskPage,
    WorkerInfo,
)
from distsched.ops.explain import SERVED_LIVE_S
from distsched.retention import RetentionPlan
from distsched.text import error_summary, jsonable, size
from distsched.validate import MAX_TASK_ID_BYTES

# The throughput charts: the last hour by minute, the last day by DAY_BUCKET minutes.
DAY_MINUTES = 1440
DAY_BUCKET = 15
# Tasks per page of a list.
PAGE_SIZE = 50
# Tasks read around one task for its graph, and the lookups the walk may make for it.
GRAPH_LIMIT = 40
LOOKUP_BUDGET = 3 * GRAPH_LIMIT
# Characters of a payload or result shown before "show all".
PREVIEW_CHARS = 2000
# The overview reads the retention plan at most this often, from this many ended tasks.
PLAN_EVERY_S = 60.0
PLAN_SAMPLE = 16
# Leases that expire within this many seconds count as "expiring soon".
SOON_S = 10.0
# A task page lists dependencies, dependents and attempts a page at a time.
LIST_PAGE = 100
# Dependencies whose state and result the task page shows (one bounded read).
DEP_RESULTS_SHOWN = 20
ATTEMPTS_PAGE = 20
# Characters of an id, a function name or a worker id shown before it is cut (the full
# text has its own link); of an error; of an error summed up on one line; of the end of an
# error read to sum it up.
ID_CHARS = 200
ERROR_CHARS = 16_384
SUMMARY_CHARS = 300
TAIL_CHARS = 65_536
# Arrays and maps shown inside each other before the rest is elided ("[…]").
MAX_DEPTH = 64

log = logging.getLogger("distsched.dashboard")


def js(value: Any) -> str:
    """A value as JSON text for people (non-ASCII kept, bytes shown as text)."""
    return json.dumps(jsonable(value), ensure_ascii=False, indent=None)


@dataclass(frozen=True)
class OverviewPage:
    overview: Overview
    workers: list[WorkerInfo]
    # The last day, one entry per minute, oldest first.
    minutes: list[MinuteCount]
    # The memory ended tasks take and will take (None where the user may not read it).
    plan: RetentionPlan | None = None

    @property
    def hour(self) -> list[MinuteCount]:
        return self.minutes[-60:]

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if w.alive)

    @property
    def slots(self) -> int:
        return sum(w.concurrency for w in self.workers if w.alive)


class PlanCache:
    """The namespace's retention plan, read at most once every ``PLAN_EVERY_S``: it
    changes slowly and costs a sample of reads, which the polled overview need not pay
    every few seconds."""

    def __init__(self) -> None:
        self._plan: RetentionPlan | None = None
        self._read_at = -math.inf

    def get(self, scheduler: Scheduler) -> RetentionPlan | None:
        if time.monotonic() - self._read_at >= PLAN_EVERY_S:
            self._read_at = time.monotonic()
            try:
                self._plan = scheduler.retention_plan(PLAN_SAMPLE)
            except redis.exceptions.NoPermissionError:
                self._plan = None  # a tenant's user without HSTRLEN
        return self._plan


def overview(scheduler: Scheduler, plans: PlanCache | None = None) -> OverviewPage:
    return OverviewPage(
        scheduler.overview(soon_s=SOON_S),
        scheduler.workers(),
        scheduler.throughput(DAY_MINUTES),
        None if plans is None else plans.get(scheduler),
    )


def overview_json(page: OverviewPage) -> dict[str, Any]:
    ov = page.overview
    return {
        "counts": dict(ov["counts"]),
        "scheduled": ov["scheduled"],
        "due": ov["due"],
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
        "memory": None if page.plan is None else dataclasses.asdict(page.plan),
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


class Unreadable(Exception):
    """A task whose stored record cannot be read at all (written by other means)."""

    def __init__(self, task_id: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cut(str(cause), SUMMARY_CHARS)}")
        self.task_id = task_id


@dataclass(frozen=True)
class Slice:
    """One page of a list shown on a task page: ``items`` from ``offset`` of ``total``."""

    items: tuple[Any, ...]
    offset: int
    total: int
    size: int

    @property
    def paged(self) -> bool:
        return self.total > self.size

    @property
    def prev(self) -> int | None:
        return None if self.offset == 0 else max(0, self.offset - self.size)

    @property
    def next(self) -> int | None:
        end = self.offset + self.size
        return end if end < self.total else None


def slice_of(items: Sequence[Any], offset: int, size: int) -> Slice:
    """The page of ``items`` from ``offset`` (kept inside the list)."""
    offset = min(max(0, offset), max(0, len(items) - 1))
    return Slice(tuple(items[offset : offset + size]), offset, len(items), size)


@dataclass(frozen=True)
class TaskDetail:
    info: TaskInfo
    # None when the explanation could not be read; ``problems`` says why.
    explanation: Explanation | None
    hood: views.Neighbourhood
    offsets: Mapping[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    # What the first DEP_RESULTS_SHOWN dependencies hold, as the task reads them.
    dep_results: Mapping[str, DependencyResult] = field(default_factory=dict)

    @property
    def now(self) -> float:
        return time.time() if self.explanation is None else self.explanation.server_time

    @property
    def waitpoint(self) -> str | None:
        """What a waitpoint waits for, on one line; None for a task workers run."""
        if self.info.waitpoint is None:
            return None
        return views.waitpoint_text(self.info, self.now)

    @property
    def lease_left(self) -> float | None:
        deadline = self.info.lease_deadline
        if self.explanation is not None:
            deadline = self.explanation.lease_deadline
        return None if deadline is None else deadline - self.now

    @property
    def payload_size(self) -> int | None:
        """Bytes of the task's payload as msgpack (as stored, give or take the encoder);
        None when it cannot be packed again (nested deeper than msgpack packs)."""
        info = self.info
        try:
            packed = msgpack.packb(
                {"fn": info.fn, "args": list(info.args), "kwargs": info.kwargs},
                use_bin_type=True,
                default=str,
            )
        except (ValueError, TypeError, OverflowError, RecursionError):
            return None
        return len(packed)

    def listed(self, name: str) -> Slice:
        """One page of ``deps``, ``optional_deps``, ``dependents`` or ``attempts``."""
        items: Sequence[Any] = getattr(self.info, name)
        size = ATTEMPTS_PAGE if name == "attempts" else LIST_PAGE
        return slice_of(items, self.offsets.get(name, 0), size)

    @property
    def blocked_dependents(self) -> list[str]:
        """The tasks read around this one that its failure or cancellation blocked."""
        hood = self.hood
        return [
            d
            for d in hood.descendants
            if (info := hood.tasks.get(d)) is not None
            and info.state is State.BLOCKED
            and info.blocked_by is not None
            and info.blocked_by.root == hood.task_id
        ]


class _Budgeted:
    """A scheduler whose ``status`` answers at most ``LOOKUP_BUDGET`` lookups, then
    ``NotFoundError``: the walk keeps to its limit only while the ids it is given name
    tasks, and edges to removed tasks (or junk) must not make a page read 100k of them.
    An id no task can have (too long) is not found either, rather than ending the walk."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.left = LOOKUP_BUDGET

    def status(self, task_id: str) -> TaskInfo:
        if self.left <= 0:
            raise NotFoundError(task_id)
        self.left -= 1
        try:
            return self.scheduler.status(task_id)
        except InvalidArgument:  # an id no task can have (junk in a stored list)
            raise NotFoundError(task_id) from None


# The lists of a task page that are shown a page at a time (their offset in the query).
PAGED = ("deps", "optional_deps", "dependents", "attempts")


def task(
    scheduler: Scheduler, task_id: str, offsets: Mapping[str, int] | None = None
) -> TaskDetail:
    """One task with its explanation and graph; ``NotFoundError`` for an unknown id,
    ``InvalidArgument`` for an id no task can have, ``Unreadable`` for a record that does
    not decode. An explanation or graph that cannot be read is left out and said so."""
    try:
        info = scheduler.status(task_id)
    except (NotFoundError, InvalidArgument, redis.RedisError):
        raise
    except Exception as exc:  # stored by other means: say what, do not fail the page
        log.warning("dashboard: task %r does not decode", task_id[:SUMMARY_CHARS], exc_info=True)
        raise Unreadable(task_id, exc) from None
    problems: list[str] = []
    explanation: Explanation | None = None
    try:
        explanation = scheduler.explain(task_id)
    except (NotFoundError, redis.RedisError):
        raise
    except Exception as exc:
        log.warning("dashboard: no explanation of %r", task_id[:SUMMARY_CHARS], exc_info=True)
        problems.append(f"why: could not be read ({type(exc).__name__})")
    try:
        hood = views.walk(cast(Scheduler, _Budgeted(scheduler)), task_id, limit=GRAPH_LIMIT)
        # The walk read the task again: show one snapshot, the latest.
        info = hood.root
    except (NotFoundError, redis.RedisError):
        raise
    except Exception as exc:
        log.warning("dashboard: no graph around %r", task_id[:SUMMARY_CHARS], exc_info=True)
        problems.append(f"graph: could not be read ({type(exc).__name__})")
        hood = views.Neighbourhood(task_id=task_id, limit=GRAPH_LIMIT, tasks={task_id: info})
    shown = [*info.deps, *info.optional_deps][:DEP_RESULTS_SHOWN]
    results: dict[str, DependencyResult] = {}
    try:
        results = scheduler.dependency_results(task_id, shown) if shown else {}
    except (NotFoundError, redis.RedisError):
        raise
    except DependencyResultsTooLarge:
        problems.append("dependency results: too large to show here (distsched dep-results)")
    except Exception as exc:  # a new version meanwhile, a result stored by other means
        problems.append(f"dependency results: could not be read ({type(exc).__name__})")
    return TaskDetail(info, explanation, hood, dict(offsets or {}), tuple(problems), results)


def value_preview(value: Any, limit: int = PREVIEW_CHARS) -> tuple[str, str]:
    """``(preview, size)`` of a stored value shown as JSON: at most ``limit`` characters
    whatever it holds (any nesting, msgpack extensions); ``size`` says how much more."""
    shown = show_value(value, limit)
    if shown.cut:
        return shown.text + "\u2026", f"more than {limit:,} characters: cut"
    return shown.text, size(len(shown.text.encode("utf-8", "surrogatepass")))


def short(text: object, limit: int = ID_CHARS) -> str:
    """An id, function name or worker id as shown: cut to ``limit`` characters."""
    return str(cut(text, limit))


def is_cut(text: object, limit: int = ID_CHARS) -> bool:
    return cut(text, limit).cut


def error_title(error: str | None) -> str:
    """A stored error on one line, at most ``SUMMARY_CHARS`` characters: a traceback's
    end is what says what happened, so a huge one is summed up from its last part."""
    if not error:
        return ""
    return short(error_summary(error[-TAIL_CHARS:]), SUMMARY_CHARS)


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


# --------------------------------------------------------------------------- values

_EPOCH = _dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class Cut:
    """A text as shown: ``text`` is at most the limit asked; ``total`` counts the whole."""

    text: str
    total: int

    @property
    def cut(self) -> bool:
        return len(self.text) < self.total

    def __str__(self) -> str:
        return self.text + ("\u2026" if self.cut else "")


def cut(text: object, limit: int) -> Cut:
    """``text`` (None: empty) cut to ``limit`` characters."""
    s = "" if text is None else text if isinstance(text, str) else str(text)
    return Cut(s[:limit], len(s))


def linkable(task_id: str) -> bool:
    """Whether a page can be asked for ``task_id`` (a longer id, stored by other means,
    names no task that can be looked up)."""
    return len(task_id) <= MAX_TASK_ID_BYTES and (
        len(task_id.encode("utf-8", "surrogatepass")) <= MAX_TASK_ID_BYTES
    )


def _number(value: float | None) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if -(10**50) < value < 10**50 else f"{float(value):.6g}"
    return json.dumps(value) if math.isfinite(value) else str(value)


def _raw_text(value: bytes | bytearray | memoryview, room: int) -> str:
    """Bytes as a JSON string when they are UTF-8, else as ``{"hex": ...}``."""
    raw = bytes(value[: room + 4])
    try:
        return json.dumps(raw.decode("utf-8"), ensure_ascii=False)
    except UnicodeDecodeError:
        return '{"hex": "' + raw[: room // 2 + 1].hex() + '"}'


def _timestamp(value: msgpack.Timestamp) -> str:
    try:
        day = _EPOCH + _dt.timedelta(seconds=value.seconds)
        when = f"{day:%Y-%m-%dT%H:%M:%S}.{value.nanoseconds:09d}Z"
    except (ValueError, OverflowError):  # outside the years 1 to 9999
        when = f"{value.seconds} s {value.nanoseconds} ns after the epoch"
    return f"Timestamp({when})"


def _repr(value: Any, room: int) -> str:
    try:
        return repr(value)[: room + 1]
    except Exception:  # a repr that fails: its type is what is known
        return f"<{type(value).__name__}>"


def _scalar(value: Any, room: int) -> str:
    """One value that holds no other, as JSON-like text of at most about ``room`` chars."""
    if value is None or isinstance(value, (bool, int, float)):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value[: room + 1], ensure_ascii=False)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _raw_text(value, room)
    if isinstance(value, msgpack.Timestamp):
        return _timestamp(value)
    if isinstance(value, msgpack.ExtType):
        return f"ExtType({value.code}, {bytes(value.data[: room // 2 + 1]).hex()})"
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return _repr(value, room)


@dataclass
class _Open:
    """A list or map being written: its remaining items, and how many were written."""

    items: Iterator[Any]
    is_map: bool
    close: str
    written: int = 0


def _pieces(value: Any, room: int) -> Iterator[str]:
    """The text of ``value`` in pieces, depth first, without recursion."""
    stack: list[_Open] = []
    current: Any = value
    while True:
        if isinstance(current, msgpack.ExtType):  # a tuple, but one value
            yield _scalar(current, room)
        elif isinstance(current, (list, tuple, dict)) and len(stack) >= MAX_DEPTH:
            yield "{\u2026}" if isinstance(current, dict) else "[\u2026]"
        elif isinstance(current, (list, tuple)):
            stack.append(_Open(iter(current), False, "]"))
            yield "["
        elif isinstance(current, dict):
            stack.append(_Open(iter(current.items()), True, "}"))
            yield "{"
        else:
            yield _scalar(current, room)
        # The next value: the next item of the innermost open list or map.
        while stack:
            top = stack[-1]
            item: Any = next(top.items, _END)
            if item is _END:
                stack.pop()
                yield top.close
                continue
            if top.written:
                yield ", "
            top.written += 1
            if top.is_map:
                key, current = item
                yield _scalar(key, room)
                yield ": "
            else:
                current = item
            break
        else:
            return


_END = object()


def show_value(data: Any, limit: int) -> Cut:
    """``data`` as JSON-like text cut to ``limit`` characters; ``total`` is ``limit + 1``
    when the text was longer (the rest is not built, so its length is not known)."""
    out: list[str] = []
    length = 0
    for piece in _pieces(data, limit):
        out.append(piece)
        length += len(piece)
        if length > limit:
            return Cut("".join(out)[:limit], limit + 1)
    return Cut("".join(out), length)


# --------------------------------------------------------------------------- served functions


def state_counts(scheduler: Scheduler) -> dict[str, int]:
    """The number of tasks in each state (the tabs of the task lists)."""
    counts = scheduler.stats()["counts"]
    return {state.value: int(counts.get(state.value, 0)) for state in State}


def unserved(scheduler: Scheduler, fns: Iterable[str | None]) -> frozenset[str]:
    """Which of ``fns`` no live worker serves: none announced it in the namespace's
    ``served`` hash within ``SERVED_LIVE_S`` (the rule ``explain`` reports as
    ``unserved``). Two round trips, whatever the number of names (a page's worth)."""
    names = sorted({fn for fn in fns if fn})
    if not names:
        return frozenset()
    now = scheduler.server_time()
    raw = scheduler.client.hmget(scheduler.keys.served, names)
    out = set()
    for name, value in zip(names, cast(list[Any], raw), strict=True):
        try:
            last = int(value) / 1000.0 if value is not None else None
        except ValueError:  # junk written by other means: not an announcement
            last = None
        if last is None or now - last > SERVED_LIVE_S:
            out.add(name)
    return frozenset(out)


# The states whose tasks wait for a worker to claim them: a badge says when none can.
QUEUED = frozenset({State.PENDING, State.READY})
