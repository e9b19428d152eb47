"""Schedules (recurring tasks): their definitions and slot times, with no I/O.

A schedule fires a task at each of its *slots*: every ``interval`` seconds from an
anchor, or at each time a cron expression names in a time zone. The workers fire the
due slots themselves (``lua/fire.lua``), each slot exactly once; this module computes
which slots are due, which were missed, and what comes next.

Cron time zones follow one rule at daylight-saving changes: a wall time that does not
exist (in the gap when clocks go forward) fires at the first instant after the gap,
and a wall time that happens twice (when clocks go back) fires once, at its first
occurrence. Several wall times that land on the same instant fire once.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import msgpack

from distsched.errors import InvalidArgument, MissingExtraError
from distsched.keys import hash_tag
from distsched.model import Duration
from distsched.validate import (
    BACKOFF_MAX_S,
    MAX_ATTEMPTS_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TIMEOUT_MAX_MS,
    _is_int,
    as_seconds,
    instant_seconds,
    timeout_ms,
    validate_fair_key,
)
from distsched.wire.payload import encode_payload

MAX_NAME_BYTES = 256
"""A schedule name is 1 to 256 bytes of UTF-8 (its slot tasks are ``<name>@<ms>``)."""
MAX_INTERVAL_S = 366 * 86400.0
MIN_INTERVAL_S = 0.001
MAX_FIRE_SLOTS = 100
"""The most slots one fire call creates; a longer catch-up goes on in further calls."""
MAX_BACKFILL_SLOTS = 1000
"""The most slots one ``backfill`` call creates."""
MISSED_SCAN = 100_000
"""Cron slots older than the catch-up window are counted one by one up to this many per
round; beyond it the count is a lower bound and the round skips to the window."""
DEFAULT_CATCHUP_WINDOW_S = 3600.0
MAX_MS = 2**53 - 1
CRON_EXTRA = "pip install 'distsched[cron]'"


class Overlap(str, enum.Enum):
    """What a slot does while the schedule's previous run is still queued or running."""

    SKIP = "skip"
    """Create nothing for this slot (counted as skipped)."""
    BUFFER_ONE = "buffer_one"
    """While the previous run runs, one new run waits for it; more slots are skipped."""
    BUFFER_ALL = "buffer_all"
    """Every slot's run waits for the one before it."""
    CANCEL_PREVIOUS = "cancel_previous"
    """Cancel the queued previous run, or ask the running one to stop; then start."""
    ALLOW = "allow"
    """Start regardless: runs may overlap."""

    def __str__(self) -> str:
        return self.value


class Catchup(str, enum.Enum):
    """Which missed slots within the catch-up window fire after an outage."""

    ALL = "all"
    LATEST = "latest"

    def __str__(self) -> str:
        return self.value


class ScheduleOptions(TypedDict, total=False):
    """The keyword options of ``add_schedule`` (see :class:`Schedule` for each)."""

    cron: str | None
    tz: str
    interval: Duration | None
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    priority: int
    max_attempts: int
    backoff: Duration
    start: float | _dt.datetime | None
    end: float | _dt.datetime | None
    jitter: Duration
    paused: bool
    overlap: Overlap | str
    catchup: Catchup | str
    catchup_window: Duration
    key: str | None
    timeout: Duration | None


@dataclass(frozen=True)
class Schedule:
    """A schedule and how it has fired (``Scheduler.schedules``, ``get_schedule``).

    - ``cron`` (5 fields, or 6 with seconds first) in time zone ``tz``, or ``interval``
      seconds: one of the two. Interval slots are ``start`` (or the time the schedule
      was added, plus one interval) plus whole intervals.
    - ``start``/``end``: epoch seconds bounding the slots (``None``: unbounded).
    - ``jitter``: each slot's task is due up to that many seconds after the slot
      (a fixed pseudo-random amount per slot).
    - ``overlap``: an :class:`Overlap` policy; ``catchup`` and ``catchup_window``: after
      an outage, the slots of the last ``catchup_window`` seconds fire (``all`` of them,
      or only the ``latest``); the others are counted in ``missed``.
    - ``key``: the fairness key (tenant) of every task it fires (``None``: the default
      key), as ``Scheduler.schedule``'s ``key``.
    - ``timeout``: the time limit in seconds of every task it fires (``None``: the
      function's or the worker's limit), as ``Scheduler.schedule``'s ``timeout``.
    - ``next_fire``: the next slot (epoch seconds), ``None`` while paused or ended.
    - ``fired``, ``skipped``, ``missed``: tasks created, slots skipped by the overlap
      policy, slots not fired; ``last_task``: the id of the last run it started.
    """

    name: str
    fn: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    priority: int
    max_attempts: int
    backoff: float
    cron: str | None
    tz: str
    interval: float | None
    start: float | None
    end: float | None
    jitter: float
    paused: bool
    overlap: Overlap
    catchup: Catchup
    catchup_window: float
    next_fire: float | None = None
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    last_task: str | None = None
    key: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Definition:
    """A validated schedule definition, as stored (times in ms)."""

    name: str
    fn: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    priority: int
    max_attempts: int
    backoff_ms: int
    cron: str | None
    tz: str
    interval_ms: int | None
    anchor_ms: int
    start_ms: int | None
    end_ms: int | None
    jitter_ms: int
    paused: bool
    overlap: Overlap
    catchup: Catchup
    window_ms: int
    key: str | None = None
    timeout_ms: int | None = None

    def encode(self) -> bytes:
        data = {
            "v": 1, "fn": self.fn, "args": list(self.args), "kwargs": self.kwargs,
            "priority": self.priority, "max_attempts": self.max_attempts,
            "backoff_ms": self.backoff_ms, "cron": self.cron, "tz": self.tz,
            "interval_ms": self.interval_ms, "anchor_ms": self.anchor_ms,
            "start_ms": self.start_ms, "end_ms": self.end_ms, "jitter_ms": self.jitter_ms,
            "paused": self.paused, "overlap": self.overlap.value, "catchup": self.catchup.value,
            "window_ms": self.window_ms,
        }  # fmt: skip
        if self.key is not None:  # absent without one: definitions stored before read alike
            data["key"] = self.key
        if self.timeout_ms is not None:  # absent without one, as key
            data["timeout_ms"] = self.timeout_ms
        packed: bytes = msgpack.packb(data, use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, name: str, raw: bytes) -> Definition:
        """The stored definition of ``name``; ``ValueError`` when it cannot be read."""
        try:
            d = msgpack.unpackb(raw, raw=False)
            return cls(
                name=name,
                fn=str(d["fn"]),
                args=tuple(d["args"]),
                kwargs=dict(d["kwargs"]),
                priority=int(d["priority"]),
                max_attempts=int(d["max_attempts"]),
                backoff_ms=int(d["backoff_ms"]),
                cron=d["cron"],
                tz=str(d["tz"]),
                interval_ms=d["interval_ms"],
                anchor_ms=int(d["anchor_ms"]),
                start_ms=d["start_ms"],
                end_ms=d["end_ms"],
                jitter_ms=int(d["jitter_ms"]),
                paused=bool(d["paused"]),
                overlap=Overlap(d["overlap"]),
                catchup=Catchup(d["catchup"]),
                window_ms=int(d["window_ms"]),
                key=None if d.get("key") is None else str(d["key"]),
                timeout_ms=_stored_timeout(d.get("timeout_ms")),
            )
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(
                f"schedule {name!r}: stored definition cannot be read: {exc}"
            ) from None

    def replace(self, **changes: Any) -> Definition:
        return dataclasses.replace(self, **changes)

    def timetable(self) -> Timetable:
        return Timetable(self)

    def info(self, next_ms: int | None, state: FiringState) -> Schedule:
        def sec(ms: int | None) -> float | None:
            return None if ms is None else ms / 1000.0

        return Schedule(
            name=self.name,
            fn=self.fn,
            args=self.args,
            kwargs=self.kwargs,
            priority=self.priority,
            max_attempts=self.max_attempts,
            backoff=self.backoff_ms / 1000.0,
            cron=self.cron,
            tz=self.tz,
            interval=sec(self.interval_ms),
            start=sec(self.start_ms),
            end=sec(self.end_ms),
            jitter=self.jitter_ms / 1000.0,
            paused=self.paused,
            overlap=self.overlap,
            catchup=self.catchup,
            catchup_window=self.window_ms / 1000.0,
            next_fire=sec(next_ms),
            fired=state.fired,
            skipped=state.skipped,
            missed=state.missed,
            last_task=state.last or None,
            key=self.key,
            timeout=sec(self.timeout_ms),
        )

    def jitter_for(self, slot_ms: int) -> int:
        """The slot's jitter (ms): fixed per slot, so every worker computes the same."""
        if self.jitter_ms <= 0:
            return 0
        digest = hashlib.blake2b(f"{self.name}@{slot_ms}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % (self.jitter_ms + 1)


@dataclass(frozen=True)
class FiringState:
    """The stored firing state of a schedule (``rev|fired|skipped|missed|last``)."""

    rev: str = ""
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    last: str = ""

    @classmethod
    def decode(cls, raw: bytes | str | None) -> FiringState:
        if raw is None:
            return cls()
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        parts = text.split("|", 4)
        try:
            return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4])
        except (IndexError, ValueError):
            return cls()


# --------------------------------------------------------------------------- validation


def _stored_timeout(value: object) -> int | None:
    """A stored definition's time limit (ms); ``ValueError`` when no task could carry it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= TIMEOUT_MAX_MS:
        raise ValueError(f"timeout_ms must be an int in [1, {TIMEOUT_MAX_MS}], got {value!r}")
    return value


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument("name", "must be a non-empty str")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("name", "must be valid UTF-8 (no lone surrogates)") from None
    if size > MAX_NAME_BYTES:
        raise InvalidArgument("name", f"must be at most {MAX_NAME_BYTES} bytes in UTF-8")
    return name


def tags_slot_ids(name: str, stripes: int) -> bool:
    """Whether the task ids of ``name``'s slots are ``{<name>}@<slot ms>`` rather than
    ``<name>@<slot ms>``: in a striped namespace, for a name without a ``{tag}`` of its
    own, so that every slot's task maps to the schedule's stripe, the stripe of its name
    (docs, "Recurring tasks", striped namespaces). A name with a tag keeps it in every
    slot id; a name with a ``}`` and no tag cannot be given one and is refused."""
    if stripes == 1:
        return False
    raw = name.encode("utf-8", "surrogatepass")
    if hash_tag(name) != raw:
        return False
    if "}" in name:
        raise InvalidArgument(
            "name",
            (
                f"{name!r} has a '}}' but no {{tag}}: in a striped namespace a schedule's "
                "slot tasks share the stripe of its name, so its name needs a {tag} "
                "(e.g. '{reports}daily') or no braces"
            ),
        )
    return True


def slot_task_id(name: str, slot_ms: int, stripes: int = 1) -> str:
    """The task id of ``name``'s slot at ``slot_ms`` in a namespace of ``stripes``."""
    prefix = "{" + name + "}" if tags_slot_ids(name, stripes) else name
    return f"{prefix}@{slot_ms}"


def _seconds(value: object, field_name: str, lo: float, hi: float) -> float:
    value = as_seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(field_name, "must be a number of seconds")
    if not lo <= value <= hi:
        raise InvalidArgument(field_name, f"must be within [{lo:g}, {hi:g}] seconds")
    return float(value)


def instant_ms(value: object, field_name: str) -> int | None:
    """Epoch ms of ``value`` (epoch seconds or an aware datetime); None stays None."""
    if value is None:
        return None
    ms = round(instant_seconds(value, field_name) * 1000)
    if abs(ms) > MAX_MS:
        raise InvalidArgument(field_name, "out of range")
    return ms


def zone(tz: object) -> _dt.tzinfo:
    """The ``zoneinfo`` time zone named ``tz``, or ``InvalidArgument('tz')``."""
    import zoneinfo

    if not isinstance(tz, str) or not tz:
        raise InvalidArgument("tz", "must be an IANA time zone name such as 'Europe/Madrid'")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument("tz", f"unknown time zone {tz!r}") from None


def cronsim_class() -> Any:
    try:
        from cronsim import CronSim
    except ImportError:
        raise MissingExtraError(
            f"cron schedules need the optional 'cron' extra: {CRON_EXTRA}"
        ) from None
    return CronSim


def validate_cron(expr: object) -> str:
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidArgument("cron", "must be a cron expression such as '0 9 * * MON-FRI'")
    cron = cronsim_class()
    from cronsim import CronSimError

    try:
        next(iter(cron(expr, _dt.datetime(2000, 1, 1))))
    except (CronSimError, StopIteration) as exc:
        raise InvalidArgument("cron", f"{expr!r}: {exc or 'never matches'}") from None
    return expr


def _timing(options: Mapping[str, Any]) -> tuple[str | None, int | None, object]:
    """A schedule's cron expression or interval (ms), exactly one of them, and its zone."""
    cron_expr, interval = options.get("cron"), options.get("interval")
    if (cron_expr is None) == (interval is None):
        raise InvalidArgument("cron", "give either cron or interval, not both")
    tz_name = options.get("tz", "UTC")
    zone(tz_name)
    if interval is None:
        return validate_cron(cron_expr), None, tz_name
    interval_ms = round(_seconds(interval, "interval", MIN_INTERVAL_S, MAX_INTERVAL_S) * 1000)
    if interval_ms < 1:
        raise InvalidArgument("interval", "must be at least 1 ms")
    return None, interval_ms, tz_name


def _attempts(options: Mapping[str, Any]) -> tuple[int, int, float]:
    """The priority, max_attempts and backoff of each task a schedule fires."""
    priority = options.get("priority", 0)
    if not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidArgument("priority", f"must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    max_attempts = options.get("max_attempts", 1)
    if not _is_int(max_attempts) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument("max_attempts", f"must be an int in [1, {MAX_ATTEMPTS_LIMIT}]")
    backoff = _seconds(options.get("backoff", 1.0), "backoff", 0.0, BACKOFF_MAX_S)
    return priority, max_attempts, backoff


def _span(options: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """When a schedule starts and ends firing (epoch ms; None: no bound)."""
    start_ms = instant_ms(options.get("start"), "start")
    end_ms = instant_ms(options.get("end"), "end")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InvalidArgument("end", "must not be before start")
    return start_ms, end_ms


def _policy(options: Mapping[str, Any]) -> tuple[bool, Overlap, Catchup]:
    """Whether a schedule is paused, and what it does on overlap and on missed slots."""
    paused = options.get("paused", False)
    if not isinstance(paused, bool):
        raise InvalidArgument("paused", "must be a bool")
    try:
        overlap = Overlap(options.get("overlap", Overlap.SKIP))
    except ValueError:
        choices = ", ".join(o.value for o in Overlap)
        raise InvalidArgument("overlap", f"must be one of {choices}") from None
    try:
        catchup = Catchup(options.get("catchup", Catchup.LATEST))
    except ValueError:
        raise InvalidArgument("catchup", "must be 'all' or 'latest'") from None
    return paused, overlap, catchup


def definition(name: object, fn: object, now_ms: int, options: Mapping[str, Any]) -> Definition:
    """Validate ``add_schedule(name, fn, **options)``; ``now_ms`` anchors an interval."""
    unknown = sorted(set(options) - set(ScheduleOptions.__annotations__))
    if unknown:
        raise InvalidArgument(unknown[0], "is not a schedule option")
    name = validate_name(name)
    cron_expr, interval_ms, tz_name = _timing(options)
    args = options.get("args", ())
    kwargs = options.get("kwargs")
    encode_payload(fn, args, kwargs)  # raises naming fn, args or kwargs
    priority, max_attempts, backoff = _attempts(options)
    start_ms, end_ms = _span(options)
    jitter = _seconds(options.get("jitter", 0.0), "jitter", 0.0, MAX_INTERVAL_S)
    paused, overlap, catchup = _policy(options)
    window = _seconds(
        options.get("catchup_window", DEFAULT_CATCHUP_WINDOW_S), "catchup_window", 0.0, 2**40
    )
    key = options.get("key")
    if key is not None:
        key = validate_fair_key(key)
    limit_ms = timeout_ms(options.get("timeout"), "timeout")
    anchor = start_ms if start_ms is not None else now_ms + (interval_ms or 0)
    return Definition(
        name=name,
        fn=str(fn),
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        priority=priority,
        max_attempts=max_attempts,
        backoff_ms=round(backoff * 1000),
        cron=cron_expr,
        tz=str(tz_name),
        interval_ms=interval_ms,
        anchor_ms=anchor,
        start_ms=start_ms,
        end_ms=end_ms,
        jitter_ms=round(jitter * 1000),
        paused=paused,
        overlap=overlap,
        catchup=catchup,
        window_ms=round(window * 1000),
        key=key,
        timeout_ms=limit_ms,
    )


# --------------------------------------------------------------------------- slot times

_UTC = _dt.timezone.utc


def _wall_to_ms(wall: _dt.datetime, tz: _dt.tzinfo) -> int:
    """The instant (epoch ms) of local wall time ``wall`` by the DST rule of this module."""
    first = wall.replace(tzinfo=tz, fold=0)
    if first.astimezone(_UTC).astimezone(tz).replace(tzinfo=None) == wall:
        return round(first.timestamp() * 1000)  # exists; at its first occurrence if repeated
    # In a gap: the first instant after it, found between the two readings of the wall time.
    lo = math.floor(wall.replace(tzinfo=tz, fold=1).timestamp())
    hi = math.ceil(first.timestamp())
    if lo > hi:
        lo, hi = hi, lo
    after = _dt.datetime.fromtimestamp(hi, tz).utcoffset()
    while lo < hi:
        mid = (lo + hi) // 2
        if _dt.datetime.fromtimestamp(mid, tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid + 1
    return lo * 1000


class Timetable:
    """The slot times (epoch ms) of one schedule, within its start and end."""

    def __init__(self, d: Definition) -> None:
        self.d = d
        self.tz = zone(d.tz) if d.cron is not None else _UTC

    def _raw_after(self, t_ms: int) -> int:
        """The first slot strictly after ``t_ms``, ignoring start and end."""
        d = self.d
        if d.interval_ms is not None:
            if t_ms < d.anchor_ms:
                return d.anchor_ms
            return d.anchor_ms + ((t_ms - d.anchor_ms) // d.interval_ms + 1) * d.interval_ms
        cron = cronsim_class()
        # The instant of a wall time never decreases as the wall time grows, and the
        # local time of t maps to t or earlier: the next slot is a wall time after it.
        # One mapped to t or earlier (the first occurrence of an hour that t is the second
        # occurrence of) is passed over.
        local = _dt.datetime.fromtimestamp(t_ms // 1000, self.tz).replace(tzinfo=None)
        for wall in cron(d.cron, local):
            ms = _wall_to_ms(wall, self.tz)
            if ms > t_ms:
                return ms
        raise AssertionError("unreachable: cron iterators do not end")  # pragma: no cover

    def after(self, t_ms: int) -> int | None:
        """The first slot strictly after ``t_ms`` (and not before start), or None past end."""
        d = self.d
        if d.start_ms is not None and t_ms < d.start_ms:
            t_ms = d.start_ms - 1
        slot = self._raw_after(t_ms)
        if d.end_ms is not None and slot > d.end_ms:
            return None
        return slot

    def at_or_after(self, t_ms: int) -> int | None:
        return self.after(t_ms - 1)

    def iterate(self, t_ms: int) -> Iterator[int]:
        """The slots at or after ``t_ms``, in order."""
        slot = self.at_or_after(t_ms)
        while slot is not None:
            yield slot
            slot = self.after(slot)


@dataclass(frozen=True)
class FirePlan:
    """What one fire call does: the slots to create (slot ms, run_at ms), how many were
    missed, and the next fire time after them (None: the schedule has ended)."""

    slots: list[tuple[int, int]]
    missed: int
    next_ms: int | None


def plan_fire(d: Definition, due_ms: int, now_ms: int, limit: int = MAX_FIRE_SLOTS) -> FirePlan:
    """The slots from ``due_ms`` (the stored next fire time) up to ``now_ms``."""
    table = d.timetable()
    window_start = now_ms - d.window_ms
    missed = 0
    slot = table.at_or_after(due_ms)
    # Slots older than the catch-up window are counted, not fired.
    if slot is not None and slot < window_start:
        slot, missed = _into_window(d, table, slot, window_start)
    if d.catchup is Catchup.ALL:
        due, slot = _due_slots(table, slot, now_ms, limit)
        return FirePlan(_jittered(d, due), missed, slot)
    latest: int | None = None
    if d.interval_ms is not None and slot is not None:
        # However many slots are due, the latest is found by arithmetic, not one by one.
        slot, latest, skipped = _latest_by_interval(table, d.interval_ms, d.end_ms, slot, now_ms)
        missed += skipped
    slot, latest, skipped = _latest_slot(table, slot, now_ms, latest)
    missed += skipped
    return FirePlan(_jittered(d, [] if latest is None else [latest]), missed, slot)


def _into_window(
    d: Definition, table: Timetable, slot: int, window_start: int
) -> tuple[int | None, int]:
    """The first slot from ``slot`` (before the catch-up window) that is within the
    window, and how many slots were missed before it (counted up to ``MISSED_SCAN``
    one by one for cron)."""
    if d.interval_ms is not None:
        last = window_start - 1 if d.end_ms is None else min(window_start - 1, d.end_ms)
        return table.at_or_after(window_start), (last - slot) // d.interval_ms + 1
    missed = 0
    after: int | None = slot
    while after is not None and after < window_start and missed < MISSED_SCAN:
        missed += 1
        after = table.after(after)
    if after is not None and after < window_start:
        after = table.at_or_after(window_start)
    return after, missed


def _due_slots(
    table: Timetable, slot: int | None, now_ms: int, limit: int
) -> tuple[list[int], int | None]:
    """Catch-up ``all``: the due slots from ``slot``, at most ``limit``, and the next one."""
    due: list[int] = []
    while slot is not None and slot <= now_ms and len(due) < limit:
        due.append(slot)
        slot = table.after(slot)
    return due, slot


def _latest_by_interval(
    table: Timetable, interval_ms: int, end_ms: int | None, slot: int, now_ms: int
) -> tuple[int | None, int | None, int]:
    """Catch-up ``latest`` on an interval: the slot after the latest due one, the latest
    due one (None: none is due), and how many due slots before it were missed."""
    last = now_ms if end_ms is None else min(now_ms, end_ms)
    if slot > last:
        return slot, None, 0
    count = (last - slot) // interval_ms + 1
    latest = slot + (count - 1) * interval_ms
    return table.after(latest), latest, count - 1


def _latest_slot(
    table: Timetable, slot: int | None, now_ms: int, latest: int | None
) -> tuple[int | None, int | None, int]:
    """Catch-up ``latest``, one slot at a time from ``slot``: the next slot, the latest
    due one, and how many due slots it passed over."""
    missed = 0
    while slot is not None and slot <= now_ms:
        if latest is not None:
            missed += 1
        latest = slot
        slot = table.after(slot)
    return slot, latest, missed


def _jittered(d: Definition, due: list[int]) -> list[tuple[int, int]]:
    return [(s, s + d.jitter_for(s)) for s in due]


def backfill_slots(d: Definition, start_ms: int, end_ms: int, limit: int) -> list[int]:
    """The slots within ``[start_ms, end_ms]``, at most ``limit``."""
    out: list[int] = []
    for slot in d.timetable().iterate(start_ms):
        if slot > end_ms or len(out) >= limit:
            break
        out.append(slot)
    return out
