"""Argument limits and the validators of what users pass in.

Each ``validate_*`` function takes an untrusted value and either returns it in the
form the rest of the package uses (milliseconds, a checked id) or raises
:class:`~distsched.errors.InvalidArgument` naming the argument. The limits mirror
those the Lua scripts enforce (``lua/lib/limits.lua``, ``lua/lib/payload.lua``), so a
call that passes here is not refused there for its arguments.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from distsched import limits
from distsched.errors import InvalidArgument
from distsched.model import Order, State, TaskOptions, TaskSpec

PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
MAX_TASK_ID_BYTES = 512
MAX_MS = 2**53 - 1
MAX_DELAY_MS = 2**52
BACKOFF_MAX_S = 3600.0
# The longest time limit of one run of a task (30 days; ``MAX_TIMEOUT_MS`` in
# lua/lib/payload.lua): longer runs need none at all.
TIMEOUT_MAX_MS = 2_592_000_000
# The longest wait between two attempts, whatever the backoff and attempt (§6); sent to
# the scripts that end attempts (fail.lua, reap.lua).
BACKOFF_CAP_MS = 3_600_000
MAX_ATTEMPTS_LIMIT = 1_000_000
# The most dependencies of one task, required and optional together (lua/lib/limits.lua).
MAX_DEPS = limits.MAX_DEPS_PER_TASK
DEFAULT_MAX_PAYLOAD_BYTES = limits.DEFAULT_MAX_PAYLOAD_BYTES


MAX_FAIR_KEY_BYTES = 256
"""The longest fairness key, in UTF-8 bytes (``MAX_KEY_BYTES`` in ``lua/lib/admit.lua``)."""

MAX_COST = 1_000_000_000
"""The most units of its key's rate one task may take (``MAX_TASK_COST`` in
``lua/lib/admit.lua``, ``MAX_COST`` in ``lua/lib/fair.lua``); the highest rate is as large."""


def validate_cost(cost: object) -> int:
    """A task's cost: an int in [1, ``MAX_COST``] (units of its fairness key's rate)."""
    if not isinstance(cost, int) or isinstance(cost, bool) or not 1 <= cost <= MAX_COST:
        raise InvalidArgument("cost", f"must be an int in [1, {MAX_COST}], got {cost!r}")
    return cost


def validate_fair_key(key: object, *, allow_default: bool = False) -> str:
    """A fairness key: a str of 1..256 UTF-8 bytes ('' for the default key when allowed)."""
    if not isinstance(key, str):
        raise InvalidArgument("key", f"must be a str, got {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("key", "must be valid UTF-8 (no lone surrogates)") from None
    if size == 0 and not allow_default:
        raise InvalidArgument("key", "must not be empty (leave it out for the default key)")
    if size > MAX_FAIR_KEY_BYTES:
        raise InvalidArgument("key", f"must be at most {MAX_FAIR_KEY_BYTES} bytes in UTF-8")
    return key


_TASK_OPTIONS = frozenset(TaskOptions.__annotations__)


def task_spec(task_id: str, options: Mapping[str, Any]) -> TaskSpec:
    """The :class:`TaskSpec` of ``schedule(task_id, **options)``; unknown options are refused."""
    if not _TASK_OPTIONS.issuperset(options):
        unknown = sorted(set(options) - _TASK_OPTIONS)
        raise InvalidArgument(unknown[0], "is not a task option")
    return TaskSpec(task_id, **options)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_task_id(task_id: object, field_name: str = "task_id") -> str:
    if not isinstance(task_id, str):
        raise InvalidArgument(field_name, f"must be a str, got {type(task_id).__name__}")
    if not task_id:
        raise InvalidArgument(field_name, "must not be empty")
    try:
        size = len(task_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(field_name, "must be valid UTF-8 (no lone surrogates)") from None
    if size > MAX_TASK_ID_BYTES:
        raise InvalidArgument(field_name, f"must be at most {MAX_TASK_ID_BYTES} bytes in UTF-8")
    return task_id


def validate_worker_id(worker_id: object) -> str:
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidArgument("worker_id", "must be a non-empty str")
    try:
        size = len(worker_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("worker_id", "must be valid UTF-8") from None
    if size > limits.MAX_WORKER_ID_BYTES:
        raise InvalidArgument(
            "worker_id", f"must be at most {limits.MAX_WORKER_ID_BYTES} bytes in UTF-8"
        )
    return worker_id


# datetime cannot represent later instants; an epoch beyond it is most likely
# milliseconds given where seconds were expected.
MAX_EPOCH_S = _dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=_dt.timezone.utc).timestamp()


def as_seconds(value: object) -> object:
    """A ``timedelta`` as its seconds (a float); any other value as it is, checked by
    the caller. Every duration the API takes is seconds or a ``timedelta``."""
    return value.total_seconds() if isinstance(value, _dt.timedelta) else value


def check_epoch(seconds: float, field: str) -> float:
    """Refuse an epoch outside the years 1 to 9999: most likely milliseconds."""
    if not math.isfinite(seconds):
        raise InvalidArgument(field, f"must be a finite number of epoch seconds, got {seconds}")
    if abs(seconds) > MAX_EPOCH_S:
        side = "after the year 9999" if seconds > 0 else "before the year 1"
        raise InvalidArgument(
            field,
            f"{seconds:.15g} epoch seconds is {side}; if that is milliseconds, "
            f"use {seconds / 1000:.3f} (milliseconds / 1000)",
        )
    return seconds


def instant_seconds(value: object, field_name: str) -> float:
    """Epoch seconds of an instant: a number of epoch seconds or an aware ``datetime``.
    A ``timedelta`` (a duration, not an instant) and an epoch that reads as
    milliseconds are refused, naming ``field_name``."""
    if isinstance(value, _dt.timedelta):
        raise InvalidArgument(
            field_name, "is an instant (epoch seconds or an aware datetime), not a timedelta"
        )
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise InvalidArgument(field_name, "a datetime must be timezone-aware")
        return value.timestamp()
    if not _is_number(value):
        raise InvalidArgument(
            field_name, f"must be epoch seconds or an aware datetime, got {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except OverflowError:
        raise InvalidArgument(field_name, "is out of range") from None
    return check_epoch(seconds, field_name)


def validate_fraction(fraction: object) -> float:
    """A progress fraction: a finite number in [0, 1] (not a bool), as a float."""
    if not _is_number(fraction) or not (
        math.isfinite(float(fraction)) and 0.0 <= float(fraction) <= 1.0
    ):
        raise InvalidArgument("fraction", "must be a number in [0, 1]")
    return float(fraction)


def validate_note(note: object) -> str:
    """A progress note: a str of at most ``MAX_PROGRESS_NOTE_BYTES`` bytes of UTF-8."""
    if not isinstance(note, str):
        raise InvalidArgument("note", f"must be a str, got {type(note).__name__}")
    try:
        size = len(note.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("note", "must be valid UTF-8 (no lone surrogates)") from None
    if size > limits.MAX_PROGRESS_NOTE_BYTES:
        raise InvalidArgument(
            "note",
            f"must be at most {limits.MAX_PROGRESS_NOTE_BYTES} bytes in UTF-8, got {size}",
        )
    return note


def _finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number (not a bool) or a ``timedelta``,
    else None."""
    value = as_seconds(value)
    if not _is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        return None
    return number if math.isfinite(number) else None


def seconds_to_ms(value: object, field_name: str, limit: int = MAX_MS) -> int:
    """Round a finite number of seconds (or a ``timedelta``) to whole milliseconds, at
    most ``limit`` in size."""
    value = as_seconds(value)
    if not _is_number(value):
        raise InvalidArgument(field_name, f"must be a number, got {type(value).__name__}")
    seconds = _finite(value)
    if seconds is None:
        raise InvalidArgument(field_name, "must be finite")
    # Checked before the product, which overflows for the largest floats.
    if abs(seconds) > limit / 1000.0 + 1:
        raise InvalidArgument(field_name, "is out of range")
    ms = math.floor(seconds * 1000.0 + 0.5)
    if abs(ms) > limit:
        raise InvalidArgument(field_name, "is out of range")
    return int(ms)


def timeout_ms(value: object, field_name: str = "timeout") -> int | None:
    """A time limit in seconds as whole milliseconds in [1, ``TIMEOUT_MAX_MS``]; None
    (no limit) stays None."""
    if value is None:
        return None
    seconds = _finite(value)
    top = TIMEOUT_MAX_MS / 1000.0
    if seconds is None or not 0 < seconds <= top:
        raise InvalidArgument(
            field_name,
            f"must be a number of seconds in [0.001, {top:.0f}] or None (no limit), got {value!r}",
        )
    ms = math.floor(seconds * 1000.0 + 0.5)
    if ms < 1:
        raise InvalidArgument(field_name, f"must be at least 0.001 seconds, got {value!r}")
    return int(ms)


def validate_lease(lease_s: object) -> int:
    """Return the lease length in ms for a positive number of seconds."""
    seconds = _finite(lease_s)
    if seconds is None or seconds <= 0:
        raise InvalidArgument("lease_s", "must be a positive, finite number of seconds")
    return max(1, seconds_to_ms(lease_s, "lease_s"))


# A Redis Cluster is named by one seed node under its own scheme; the client finds the rest.
CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}
URL_SCHEMES = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)


# One seed of a cluster URL: a host name, an IPv4 address or a bracketed IPv6 one, with
# an optional port.
_SEED = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(:[0-9]{1,5})?")


def cluster_seeds(url: str) -> list[str] | None:
    """The plain ``redis://``/``rediss://`` URL of each seed node of a cluster URL, else
    None. Several seeds go comma-separated where one host would
    (``redis+cluster://user:pw@h1:7000,h2:7000/0?opt=1``); each gets the user
    information, path and query of the URL."""
    for scheme, plain in CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            end = min((i for i in map(rest.find, "/?#") if i != -1), default=len(rest))
            userinfo, at, hosts = rest[:end].rpartition("@")
            prefix = plain + userinfo + at
            seeds = hosts.split(",")
            for seed in seeds:
                if not _SEED.fullmatch(seed):
                    raise InvalidArgument(
                        "url", f"each seed of a cluster URL is host or host:port, got {seed!r}"
                    )
            return [prefix + seed + rest[end:] for seed in seeds]
    return None


def cluster_seed(url: str) -> str | None:
    """The plain URL of a cluster URL's first seed node, else None."""
    seeds = cluster_seeds(url)
    return None if seeds is None else seeds[0]


def validate_url(url: object) -> str:
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        raise InvalidArgument(
            "url",
            "must be a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        )
    seed = cluster_seed(url)
    if seed is not None:
        database = seed.partition("://")[2].partition("?")[0].partition("/")[2].strip("/")
        if database not in ("", "0"):
            raise InvalidArgument("url", "a Redis Cluster has only database 0")
    elif not url.startswith("unix://"):
        # redis-py quietly uses database 0 when the path is not a number.
        database = url.partition("://")[2].partition("?")[0].partition("#")[0]
        database = database.partition("/")[2].strip("/")
        if database and not database.isdigit():
            raise InvalidArgument("url", f"the database must be a number, got {database!r}")
    return url


def validate_max_payload_bytes(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidArgument("max_payload_bytes", "must be an int >= 1")
    return int(limit)


def validate_payload_limit(limit: object) -> int | None:
    """A namespace's payload limit: None (the default) or an int in
    [1, ``PAYLOAD_CEILING_BYTES``]."""
    if limit is None:
        return None
    ceiling = limits.PAYLOAD_CEILING_BYTES
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= ceiling:
        raise InvalidArgument(
            "payload_max", f"must be None or an int in [1, {ceiling}] (PAYLOAD_CEILING_BYTES)"
        )
    return int(limit)


def validate_max_running(max_running: object) -> int | None:
    if max_running is None:
        return None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 0:
        raise InvalidArgument("max_running", "must be None or an int >= 0")
    return max_running


ORDER_AGING_MAX_MS = 1_000_000_000
"""The largest aging accepted (``MAX_AGING_MS`` in ``lua/order.lua``), in ms."""


def validate_order(order: object, aging: object) -> tuple[Order, int]:
    """(order, aging in ms) of ``set_order``."""
    if isinstance(order, Order):
        chosen = order
    else:
        try:
            chosen = Order(order)
        except ValueError:
            raise InvalidArgument("order", "must be 'default' or 'priority'") from None
    if chosen is Order.DEFAULT:
        return chosen, 0
    seconds = _finite(aging)
    if seconds is None or seconds < 0 or round(seconds * 1000) > ORDER_AGING_MAX_MS:
        raise InvalidArgument(
            "aging", f"must be a number of seconds in [0, {ORDER_AGING_MAX_MS // 1000}]"
        )
    return chosen, round(seconds * 1000)


FAIR_CAP_MAX = 1_000_000_000
"""The largest per-key cap accepted (``MAX_CAP`` in ``lua/fairness.lua``)."""
FAIR_WEIGHT_MAX = 1_000_000
"""The largest key weight accepted (``MAX_WEIGHT`` in ``lua/fairness.lua``)."""


def _validate_cap(cap: object) -> int | None:
    if cap is None:
        return None
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= FAIR_CAP_MAX:
        raise InvalidArgument("cap", f"must be None or an int in [0, {FAIR_CAP_MAX}]")
    return cap


FAIR_INTERVAL_MAX_MS = 86_400_000
"""The longest rate-limit interval (a day), in ms."""


def _validate_rate(rate: object, per: object) -> tuple[int, int] | None:
    if rate is None:
        return None
    if not _is_int(rate) or not 1 <= rate <= FAIR_CAP_MAX:
        raise InvalidArgument("rate", f"must be None or an int in [1, {FAIR_CAP_MAX}]")
    interval = seconds_to_ms(per, "per")
    if not 1 <= interval <= FAIR_INTERVAL_MAX_MS:
        raise InvalidArgument("per", "must be from 1 ms to a day")
    return int(rate), interval


def time_argument(run_at: object, delay: object) -> tuple[str, int]:
    """Return the (mode, ms) pair of the schedule script for ``run_at``/``delay``."""
    if run_at is not None and delay is not None:
        raise InvalidArgument("delay", "give run_at or delay, not both")
    if delay is not None:
        # The server adds its clock (under 2**52 ms until the year 144,683), and the sum
        # must stay an exact number of milliseconds.
        return "in", seconds_to_ms(delay, "delay", MAX_DELAY_MS)
    if run_at is None:
        return "in", 0
    return "at", seconds_to_ms(instant_seconds(run_at, "run_at"), "run_at")


def validate_deps(value: object, field_name: str, task_id: str) -> list[str]:
    """A list of distinct dependency ids, none of them ``task_id`` itself."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(field_name, "must be a sequence of task ids")
    ids: list[str] = []
    for dep in value:
        ids.append(validate_task_id(dep, field_name))
    if len(ids) > MAX_DEPS:
        raise InvalidArgument(field_name, f"at most {MAX_DEPS} dependencies per task")
    if len(set(ids)) != len(ids):
        dup = next(d for d in ids if ids.count(d) > 1)
        raise InvalidArgument(field_name, f"{dup!r} is listed twice")
    if task_id in ids:
        raise InvalidArgument(field_name, f"{task_id!r} cannot depend on itself")
    return ids


def validate_dependency_ids(value: object) -> list[str] | None:
    """The dependency ids whose results one read asks for (None: every dependency):
    1 to ``MAX_DEP_RESULTS`` distinct task ids."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument("ids", "must be None or a sequence of task ids")
    ids = [validate_task_id(dep, "ids") for dep in value]
    if not ids:
        raise InvalidArgument("ids", "must name at least one dependency (None reads them all)")
    if len(ids) > limits.MAX_DEP_RESULTS:
        raise InvalidArgument(
            "ids", f"at most {limits.MAX_DEP_RESULTS} ids per read (MAX_DEP_RESULTS)"
        )
    seen: set[str] = set()
    for dep in ids:
        if dep in seen:
            raise InvalidArgument("ids", f"{dep!r} is listed twice")
        seen.add(dep)
    return ids


PURGE_TASKS_MAX = 1000


def validate_wait_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    seconds = _finite(timeout)
    if seconds is None or seconds < 0:
        raise InvalidArgument("timeout", "must be None or a finite number of seconds >= 0")
    return seconds


TASKS_LIMIT_MAX = 1000


def list_state(state: object) -> State:
    """The :class:`State` ``tasks`` lists, from a State or its name."""
    if isinstance(state, State):
        return state
    if isinstance(state, str):
        try:
            return State(state)
        except ValueError:
            pass
    names = ", ".join(s.value for s in State)
    raise InvalidArgument("state", f"must be one of {names}, got {state!r}")


def tasks_limit(limit: object) -> int:
    """The page size ``tasks`` lists: an int in [1, TASKS_LIMIT_MAX]."""
    if not _is_int(limit) or not 1 <= limit <= TASKS_LIMIT_MAX:
        raise InvalidArgument("limit", f"must be an int in [1, {TASKS_LIMIT_MAX}]")
    return int(limit)


# The longest a waitpoint waits for its completion (lua/lib/deadline.lua, MAX_WAIT_MS): a year.
WAITPOINT_TIMEOUT_MAX_MS = 31_536_000_000
# The label of a waitpoint's payload when none is given: no worker ever runs it.
WAITPOINT_FN = "distsched.waitpoint"


def waitpoint_timeout_ms(value: object) -> int:
    """A waitpoint's timeout in seconds as whole milliseconds in [1, a year]."""
    ms = seconds_to_ms(value, "waitpoint", WAITPOINT_TIMEOUT_MAX_MS)
    if ms < 1:
        raise InvalidArgument("waitpoint", "timeout must be at least 1 ms")
    return ms


def validate_waitpoint_by(by: object) -> str:
    """Who completes or fails a waitpoint: '' or text of at most 256 bytes in UTF-8."""
    if not isinstance(by, str):
        raise InvalidArgument("by", f"must be a str, got {type(by).__name__}")
    if not by:
        return by
    try:
        size = len(by.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("by", "must be valid UTF-8") from None
    if size > limits.MAX_WORKER_ID_BYTES:
        raise InvalidArgument("by", f"must be at most {limits.MAX_WORKER_ID_BYTES} bytes in UTF-8")
    return by
