"""The pure core: argument validation, script calls and reply decoding. No I/O.

The sync :class:`~distsched.client.Scheduler` and the asyncio
:class:`~distsched.aio.AsyncScheduler` are thin shells that send the
:class:`Call` values built here and hand the replies back to the decoders.
"""

from __future__ import annotations

import datetime as _dt
import enum
import itertools
import math
import re
import traceback
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar

import msgpack
from redis import exceptions as redis_exceptions

from distsched import limits
from distsched.errors import (
    BusyError,
    ConflictError,
    CycleError,
    InvalidArgument,
    NotFoundError,
    PayloadTooLarge,
    ScriptError,
    TaskBlocked,
    TaskCancelled,
    TaskFailed,
    Unavailable,
    UnknownDependencyError,
)
from distsched.keys import Keys
from distsched.schedules import (
    MAX_BACKFILL_SLOTS,
    Definition,
    validate_name,
)

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
# The most dependency edges one script call settles (see lua/lib/settle.lua); sent as
# ARGV[1] to every script that settles dependents.
PROPAGATE_BUDGET = limits.MAX_PROPAGATE_BUDGET
# A task scheduled with more required dependencies than this is placed in parts of
# at most this many, each its own script call (lua/add_deps.lua), so that no call holds
# Redis for the whole list; it is held (never claimable) until the last part.
PLACE_PART = limits.MAX_EDGES_PER_CALL
DEFAULT_MAX_PAYLOAD_BYTES = limits.DEFAULT_MAX_PAYLOAD_BYTES
# Bounds the time one claim or reap call may spend on lazily deleted entries.
CLAIM_MAX_DROP = 1000
# The most UTF-8 bytes of error text stored for a failed attempt (fail.lua refuses more).
ERROR_MAX_BYTES = limits.MAX_ERROR_BYTES
# Room kept for the line that says how much of a long traceback was cut.
ERROR_CUT_MARK_BYTES = 80
# An idle worker claims again at least this often, so that no task waits longer than
# this for a wake-up that was lost (its worker died, a message was dropped).
IDLE_RECHECK_S = 2.0
# How long an idle registration lasts: a worker that has not claimed again by then is
# gone, and its entry no longer takes wake-ups.
IDLE_MS = int(IDLE_RECHECK_S * 3 * 1000)
# The longest single wait on a timer (threading's own limit is far above any real delay).
MAX_WAIT_S = 3600.0
REAP_BATCH = 1000
# A client waiting for an outcome (``Scheduler.wait``) registers again and re-reads the
# task at least this often: a notice lost with its connection costs at most this long.
WAIT_REFRESH_S = 60.0
# How long a registration outlives the wait it was made for: room for the client to
# come round and register again before housekeeping (reap.lua) drops the entry.
WAIT_MARGIN_MS = 10_000
# The most deadline entries one housekeeping round handles (lua/expire.lua).
EXPIRE_BATCH = 1000
# The error text of a task that expired (lua/lib/deadline.lua).
EXPIRED_ERROR = "expired: not started by its deadline"


class State(str, enum.Enum):
    """A task's state (§2). Values are the lowercase names stored in Redis."""

    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.BLOCKED})


class Outcome(str, enum.Enum):
    """The answer to a report made with a claim's token (§6)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE = "stale"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Claim:
    """A claimed task: the token ``(task_id, version, attempt)`` and what to run.

    ``payload_error`` is set when the stored payload could not be decoded; the
    worker then fails the task with that message instead of running anything.
    """

    task_id: str
    version: int
    attempt: int
    fn: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    priority: int
    run_at: float
    payload_error: str | None = None
    trace: Mapping[str, str] | None = None
    """The producer's W3C trace context (``traceparent``, maybe ``tracestate``), when
    the payload carries one (see ``lua/README.md``, Payload)."""
    key: str | None = None
    """The task's fairness key in a fair namespace (``""``: the default key); None in a
    namespace without keys."""
    timeout: float | None = None
    """The task's own time limit in seconds (its ``timeout`` option), None when it has none:
    the worker then applies the function's or its own (README, "Time limits")."""

    @property
    def token(self) -> tuple[str, int, int]:
        return (self.task_id, self.version, self.attempt)


class WaitReason(str, enum.Enum):
    """Why a claim got fewer tasks than it asked for."""

    EMPTY = "empty"
    """No live task is queued."""
    NOT_DUE = "not_due"
    """The next queued task is not due yet."""
    CAPACITY = "capacity"
    """The namespace's ``max_running`` is reached."""
    FIRE = "fire"
    """A schedule's slot is due: fire it (``Scheduler.fire_due``), then claim again."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Wait:
    """No task could be claimed now.

    ``reason`` says why (a :class:`WaitReason`, equal to its string value);
    ``delay`` is the number of seconds until the next entry is due, or ``None``
    when unknown.
    """

    reason: WaitReason
    delay: float | None


@dataclass(frozen=True)
class AttemptInfo:
    """One ended attempt of a task, as its history keeps it (``TaskInfo.attempts``).

    ``outcome`` is ``succeeded``, ``failed`` (the function raised; the task may have been
    retried), ``lost`` (its lease expired), ``cancelled`` or ``handed_back`` (a worker
    gave the claim back unstarted; no attempt was spent). ``error`` is the last line of
    the stored error (``Type: message``, at most 200 bytes) for ``failed``, ``lease
    expired`` for ``lost``, else None. Times are epoch seconds (server clock).
    """

    version: int
    attempt: int
    worker: str
    started_at: float
    ended_at: float
    outcome: str
    error: str | None


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task (``Scheduler.status``).

    ``placing`` is True while the version is held because its dependencies are being
    placed in parts (it cannot run before the last part); ``deps`` then lists those
    placed so far.
    """

    task_id: str
    state: State
    version: int
    attempt: int
    max_attempts: int
    priority: int
    run_at: float
    backoff: float
    fn: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    cancel_requested: bool
    worker: str | None
    lease_deadline: float | None
    updated_at: float
    error: str | None
    result: Any
    remaining: int = 0
    optional_remaining: int = 0
    deps: tuple[str, ...] = ()
    optional_deps: tuple[str, ...] = ()
    dependents: tuple[str, ...] = ()
    blocked_by: BlockedBy | None = None
    attempts: tuple[AttemptInfo, ...] = ()
    placing: bool = False
    timeout: float | None = None
    """The time limit the task was scheduled with (seconds), None when none: a worker
    then applies the function's or its own default."""


@dataclass(frozen=True)
class TaskPage:
    """One page of ``Scheduler.tasks``: the tasks, and the cursor of the next page
    (None when there is no more)."""

    items: tuple[TaskInfo, ...]
    cursor: str | None


@dataclass(frozen=True)
class MinuteCount:
    """Attempts that ended in one minute (``Scheduler.throughput``): ``minute`` is the
    epoch seconds of the minute's start."""

    minute: float
    succeeded: int
    failed: int


@dataclass(frozen=True)
class BlockedBy:
    """Why a task is blocked: ``root`` failed or was cancelled; ``path`` leads from it here.

    ``path[0]`` is the root and ``path[-1]`` the blocked task; each id is a required
    dependency of the next.
    """

    root: str
    path: tuple[str, ...]


@dataclass(frozen=True)
class TaskSpec:
    """One task to schedule: ``fn(*args, **kwargs)`` as a new version of ``task_id``.

    This is where every task option and its default is defined;
    ``Scheduler.schedule`` and ``submit`` take the same options as keywords.

    - ``run_at``: epoch seconds or an aware ``datetime``; or ``delay`` seconds from
      the server's clock (not both; neither means now).
    - ``priority``: higher runs first among tasks due at the same millisecond.
    - ``deps`` / ``optional_deps``: ids that must succeed / end first.
    - ``max_attempts``, ``backoff``: retries of a function that raised or lost its
      lease; attempt k+1 is due ``backoff * 2**(k-1)`` seconds after attempt k.
    - ``allow_unknown``: wait for dependencies not submitted yet instead of
      raising ``UnknownDependencyError``.
    - ``dedupe``: when a version of ``task_id`` is pending, ready or running, keep it
      and write nothing (the call returns that version); ``dedupe_window`` seconds
      (implies ``dedupe``): also keep a version that ended less than that long ago.
    - ``debounce``: replace a queued version as usual, but never start later than
      ``debounce`` seconds after the first submission of the burst (the first call
      that found no queued version); not with ``dedupe``.
    - ``deadline`` (epoch seconds or an aware ``datetime``) or ``ttl`` (seconds from the
      call, server clock), not both: a version not started by then ends ``cancelled``
      with the error ``expired: not started by its deadline`` (its dependents are blocked
      as for any cancel). A retry or a new version has no deadline unless given again.
    - ``key``: the fairness key (tenant) of the task, any text of 1..256 bytes in UTF-8;
      tasks given none share the default key. Keys take turns at the claims in proportion
      to their weights, each within its concurrency cap (``Scheduler.set_key``; README,
      "Tenants and fairness"). Inside a key, claims follow the namespace's order.
    - ``timeout``: the time limit of each run, in seconds (None: the function's limit at
      the worker, else the worker's default). At the limit the function is asked to stop
      (``current_task().cancel_requested``); after the worker's grace the attempt ends
      failed with ``timed out after N s`` and is retried as any failure (README,
      "Time limits").
    """

    task_id: str
    fn: str = ""
    _: KW_ONLY
    run_at: float | _dt.datetime | None = None
    priority: int = 0
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    delay: float | None = None
    deps: Sequence[str] = ()
    optional_deps: Sequence[str] = ()
    max_attempts: int = 1
    backoff: float = 1.0
    allow_unknown: bool = False
    dedupe: bool = False
    dedupe_window: float | None = None
    debounce: float | None = None
    deadline: float | _dt.datetime | None = None
    ttl: float | None = None
    key: str | None = None
    timeout: float | None = None


class TaskOptions(TypedDict, total=False):
    """The keyword options of ``schedule``/``submit``: the fields of :class:`TaskSpec`."""

    fn: str
    run_at: float | _dt.datetime | None
    priority: int
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    delay: float | None
    deps: Sequence[str]
    optional_deps: Sequence[str]
    max_attempts: int
    backoff: float
    allow_unknown: bool
    dedupe: bool
    dedupe_window: float | None
    debounce: float | None
    deadline: float | _dt.datetime | None
    ttl: float | None
    key: str | None
    timeout: float | None


@dataclass(frozen=True)
class Admitted:
    """What scheduling one task did: the version that now stands for ``task_id``.

    ``created`` is False when ``dedupe`` kept an existing version (then ``version`` is
    that version, and nothing was written), True when the call wrote a new one.
    """

    task_id: str
    version: int
    created: bool


def admission_suffix(spec: TaskSpec) -> str:
    """The option tokens of ``spec``'s schedule-script spec (lua/lib/admit.lua): ''
    when it uses no admission policy, no deadline and no fairness key."""
    return _policy_suffix(spec) + _deadline_suffix(spec) + _key_suffix(spec.key)


MAX_FAIR_KEY_BYTES = 256
"""The longest fairness key, in UTF-8 bytes (``MAX_KEY_BYTES`` in ``lua/lib/admit.lua``)."""


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


def _key_suffix(key: object) -> str:
    if key is None:
        return ""
    return f" key={validate_fair_key(key).encode('utf-8').hex()}"


def _deadline_suffix(spec: TaskSpec) -> str:
    if spec.deadline is None and spec.ttl is None:
        return ""
    if spec.deadline is not None and spec.ttl is not None:
        raise InvalidArgument("ttl", "cannot be combined with deadline")
    if spec.ttl is not None:
        ms = seconds_to_ms(spec.ttl, "ttl", MAX_DELAY_MS)
        if ms < 0:
            raise InvalidArgument("ttl", "must be >= 0 seconds")
        return f" ttl={ms}"
    deadline = spec.deadline
    if isinstance(deadline, _dt.datetime):
        if deadline.tzinfo is None:
            raise InvalidArgument("deadline", "a datetime must be timezone-aware")
        ms = seconds_to_ms(deadline.timestamp(), "deadline")
    else:
        ms = seconds_to_ms(deadline, "deadline")
    if ms < 0:
        raise InvalidArgument("deadline", "must be at or after the epoch")
    return f" deadline={ms}"


def _policy_suffix(spec: TaskSpec) -> str:
    if not isinstance(spec.dedupe, bool):
        raise InvalidArgument("dedupe", "must be a bool")
    dedupe = spec.dedupe or spec.dedupe_window is not None
    if spec.debounce is not None:
        if dedupe:
            raise InvalidArgument("debounce", "cannot be combined with dedupe")
        ms = seconds_to_ms(spec.debounce, "debounce")
        if ms < 0:
            raise InvalidArgument("debounce", "must be >= 0 seconds")
        return f" debounce={ms}"
    if not dedupe:
        return ""
    window = 0
    if spec.dedupe_window is not None:
        window = seconds_to_ms(spec.dedupe_window, "dedupe_window")
        if window < 0:
            raise InvalidArgument("dedupe_window", "must be >= 0 seconds")
    return f" dedupe={window}"


def task_spec(task_id: str, options: Mapping[str, Any]) -> TaskSpec:
    """The :class:`TaskSpec` of ``schedule(task_id, **options)``; unknown options are refused."""
    unknown = sorted(set(options) - set(TaskOptions.__annotations__))
    if unknown:
        raise InvalidArgument(unknown[0], "is not a task option")
    return TaskSpec(task_id, **options)


@dataclass(frozen=True)
class Call:
    """One script invocation: which script, its KEYS and its ARGV."""

    script: str
    keys: list[str]
    args: list[Any] = field(default_factory=list)


# --------------------------------------------------------------------------- validation


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
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


def _finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if not _is_number(value):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond the float range
        return None
    return number if math.isfinite(number) else None


def seconds_to_ms(value: object, field_name: str, limit: int = MAX_MS) -> int:
    """Round a finite number of seconds to whole milliseconds, at most ``limit`` in size."""
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


def cluster_seed(url: str) -> str | None:
    """The plain ``redis://``/``rediss://`` URL of a cluster URL's seed node, else None."""
    for scheme, plain in CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            return plain + url[len(scheme) :]
    return None


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
    return limit


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
    return limit


def decode_payload_limit(raw: object) -> int:
    """The payload limit the scripts apply for a stored ``payload_max`` (lib/payload.lua)."""
    stored = _count_or_none(raw)
    limit = stored if stored else limits.DEFAULT_MAX_PAYLOAD_BYTES
    return min(limit, limits.PAYLOAD_CEILING_BYTES)


def validate_max_running(max_running: object) -> int | None:
    if max_running is None:
        return None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 0:
        raise InvalidArgument("max_running", "must be None or an int >= 0")
    return max_running


class Order(str, enum.Enum):
    """The order in which claims take a namespace's due tasks (``Scheduler.set_order``)."""

    DEFAULT = "default"
    """(due time, -priority, sequence): first due, first served."""
    PRIORITY = "priority"
    """(due time - priority * aging, -priority, sequence) among due tasks: the highest
    priority first, each point of priority worth ``aging`` seconds of waiting."""


@dataclass(frozen=True)
class OrderSetting:
    """A namespace's claim order, and the seconds of waiting one point of priority is worth
    (0.0 in the default order)."""

    order: Order
    aging_s: float


ORDER_AGING_MAX_MS = 1_000_000_000
"""The largest aging accepted (``MAX_AGING_MS`` in ``lua/order.lua``), in ms."""
ORDER_REWRITE_MAX = 100_000
"""The most ready-set entries a change of order or aging rewrites in its one call."""


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


def order_call(keys: Keys, order: Order, aging_ms: int, most: int = ORDER_REWRITE_MAX) -> Call:
    """The order script's call: ``order`` with ``aging_ms`` ms of credit per priority point."""
    return Call("order", keys.for_script("order"), [order.value, aging_ms, most])


FAIR_CAP_MAX = 1_000_000_000
"""The largest per-key cap accepted (``MAX_CAP`` in ``lua/fairness.lua``)."""
FAIR_WEIGHT_MAX = 1_000_000
"""The largest key weight accepted (``MAX_WEIGHT`` in ``lua/fairness.lua``)."""


@dataclass(frozen=True)
class KeyInfo:
    """One fairness key of a namespace (``""`` is the default key of tasks given none).

    ``cap`` is its own cap (None: the namespace default ``default_cap`` applies, None: no
    cap); ``weight`` its share of claims; ``running`` the tasks a fair claim started that
    still run; ``queued`` its ready tasks (stale entries included until claims drop them);
    ``turn``: ``"ready"`` (takes turns now), ``"waiting"`` (its head is not due yet),
    ``"capped"`` (at its cap) or ``"idle"`` (no ready work); a key over its rate limit
    (``rate`` tasks started per ``per_s`` seconds) is ``"waiting"`` for its next token.
    """

    key: str
    cap: int | None
    default_cap: int | None
    weight: int
    running: int
    queued: int
    turn: str
    rate: int | None = None
    per_s: float | None = None
    head_due_at: float | None = None
    """When its first queued entry is due (epoch seconds, server clock); None: none."""


class KeyLoad(TypedDict):
    """One fairness key in ``stats()["keys"]``: its running and queued tasks, and how long
    its first queued task has been due (``ready_wait_s``; None when none is due)."""

    key: str
    running: int
    queued: int
    cap: int | None
    ready_wait_s: float | None


STATS_TOP_KEYS = 10
"""How many fairness keys ``stats()`` shows (most running, then most queued)."""


def _fair_prefix(key: str) -> bytes:
    raw = key.encode("utf-8")
    return b"%03x" % len(raw) + raw


FAIR_DUE_MAX = 2**52 - 1
"""The largest due time a fairq entry encodes (``FAIR_DUE_MAX`` in ``lua/lib/fair.lua``)."""


def _fair_due(due_ms: int) -> int:
    return max(0, min(due_ms, FAIR_DUE_MAX))


def fair_delayed_member(key: str, due_ms: int, member: bytes) -> bytes:
    """A keyed entry of fairq in its key's delayed section (``fairq_delayed_member``)."""
    return _fair_prefix(key) + b"%013x" % _fair_due(due_ms) + member


def _rank_hex(rank: float) -> bytes:
    # As rank_hex in lua/lib/ranked.lua: a sign digit, then 16 hex digits of the size,
    # complemented for a negative rank, so that the text sorts as the number does.
    if rank >= 0:
        return b"1%016x" % int(rank)
    return b"0" + (b"%016x" % int(-rank)).translate(_HEX_FLIP)


_HEX_FLIP = bytes.maketrans(b"0123456789abcdef", b"fedcba9876543210")


def fair_ranked_member(key: str, due_ms: int, member: bytes, priority: int, aging_ms: int) -> bytes:
    """A keyed entry of fairq in its key's ranked section (priority order;
    ``fairq_ranked_member`` in ``lua/lib/ranked.lua``). The rank is computed in floats,
    as the scripts compute it."""
    due = _fair_due(due_ms)
    rank = float(due) - float(priority) * float(aging_ms)
    return _fair_prefix(key) + b"!" + _rank_hex(rank) + member + b"%013x" % due


def _fairq_entry_due(prefix: bytes, entry: bytes) -> int | None:
    """The due ms of one key's fairq entry (either section); None for junk."""
    rest = entry[len(prefix) :]
    raw = rest[-13:] if rest.startswith(b"!") else rest[:13]
    try:
        return int(raw, 16)
    except ValueError:
        return None


def _key_reads(keys: Keys, key: str) -> list[tuple[Any, ...]]:
    """The reads of :func:`_decode_key_info`, for one key."""
    prefix = _fair_prefix(key)
    settings: tuple[Any, ...] = (
        "HMGET",
        keys.fair,
        f"cap:{key}",
        "cap",
        f"w:{key}",
        f"run:{key}",
        f"rate:{key}",
    )
    turns = [
        ("ZSCORE", keys.fairready, key),
        ("ZSCORE", keys.fairwait, key),
        ("ZSCORE", keys.fairfull, key),
    ]
    if key == "":
        # The default key's entries: queue, and in the priority order ranked, whose head
        # is the next claimed (its due time is rank + priority * aging).
        return [
            settings,
            ("ZCARD", keys.queue),
            *turns,
            ("ZRANGE", keys.queue, 0, 0, "WITHSCORES"),
            ("ZCARD", keys.ranked),
            ("ZRANGE", keys.ranked, 0, 0, "WITHSCORES"),
            ("HMGET", keys.meta, "order", "aging_ms"),
        ]
    # A keyed entry's ranked section sorts first: the first entry is the next claimed.
    return [
        settings,
        ("ZLEXCOUNT", keys.fairq, b"[" + prefix, b"[" + prefix + b"\xff"),
        *turns,
        ("ZRANGE", keys.fairq, b"[" + prefix, b"[" + prefix + b"\xff", "BYLEX", "LIMIT", 0, 1),
    ]


def _decode_key_info(key: str, replies: Sequence[Any]) -> KeyInfo:
    fields, queued, ready, waiting, full, head = replies[:6]
    turn = "idle"
    if ready is not None:
        turn = "ready"
    elif waiting is not None:
        turn = "waiting"
    elif full is not None:
        turn = "capped"
    head_due: float | None = None
    total = int(queued)
    if key == "":
        ranked_count, ranked_head, order_fields = replies[6:]
        total += int(ranked_count)
        order = decode_order(order_fields[0], order_fields[1])
        if ranked_head and order.order is Order.PRIORITY:
            member, rank = _pair_of(ranked_head)
            try:
                priority = PRIORITY_MAX - int(member[:8], 16)
            except ValueError:  # junk: no credit, as member_priority in the scripts
                priority = 0
            head_due = (rank + priority * round(order.aging_s * 1000)) / 1000
        elif head:
            head_due = _pair_of(head)[1] / 1000
    elif head:
        due = _fairq_entry_due(_fair_prefix(key), _bytes(head[0]))
        head_due = None if due is None else due / 1000.0
    return KeyInfo(
        key,
        _count_or_none(fields[0]),
        _count_or_none(fields[1]),
        _count_or_none(fields[2]) or 1,
        _count_or_none(fields[3]) or 0,
        total,
        turn,
        *_decode_rate(fields[4]),
        head_due_at=head_due,
    )


def _pair_of(reply: Any) -> tuple[bytes, float]:
    """(member, score) of a one-entry ZRANGE ... WITHSCORES reply, in either shape."""
    first = reply[0]
    if isinstance(first, (list, tuple)):
        return _bytes(first[0]), float(first[1])
    return _bytes(first), float(reply[1])


def _decode_rate(raw: Any) -> tuple[int | None, float | None]:
    """A key's stored rate limit ``<tasks> <interval ms>`` as (tasks, seconds)."""
    if raw is None:
        return None, None
    parts = _text(raw).split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None, None
    return int(parts[0]), int(parts[1]) / 1000.0


def _validate_cap(cap: object) -> int | None:
    if cap is None:
        return None
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= FAIR_CAP_MAX:
        raise InvalidArgument("cap", f"must be None or an int in [0, {FAIR_CAP_MAX}]")
    return cap


FAIR_INTERVAL_MAX_MS = 86_400_000
"""The longest rate-limit interval (a day), in ms."""


def fairness_call(
    keys: Keys,
    kind: str,
    key: str,
    cap: int | None,
    weight: int,
    rate: tuple[int, int] | None = None,
) -> Call:
    """The fairness script's call (``lua/fairness.lua``); ``rate``: (tasks, interval ms)."""
    args: list[Any] = [kind, key, "" if cap is None else cap, weight]
    if rate is not None:
        args += [rate[0], rate[1]]
    return Call("fairness", keys.for_script("fairness"), args)


def _validate_rate(rate: object, per: object) -> tuple[int, int] | None:
    if rate is None:
        return None
    if not _is_int(rate) or not 1 <= rate <= FAIR_CAP_MAX:  # type: ignore[operator]
        raise InvalidArgument("rate", f"must be None or an int in [1, {FAIR_CAP_MAX}]")
    interval = seconds_to_ms(per, "per")
    if not 1 <= interval <= FAIR_INTERVAL_MAX_MS:
        raise InvalidArgument("per", "must be from 1 ms to a day")
    return int(rate), interval  # type: ignore[call-overload]


def decode_order(raw_order: Any, raw_aging: Any) -> OrderSetting:
    """The order stored in meta (``order``, ``aging_ms``), read as ``lua/lib/ranked.lua`` does."""
    if raw_order is None or _bytes(raw_order) != b"priority":
        return OrderSetting(Order.DEFAULT, 0.0)
    aging = _count_or_none(raw_aging)
    return OrderSetting(Order.PRIORITY, (aging or 0) / 1000.0)


PRIORITY_LABELS = ("<0", *(str(p) for p in range(10)), "10-99", "100-999", ">=1000")
"""Every label :func:`priority_bucket` gives, lowest priorities first."""


def priority_bucket(priority: int) -> str:
    """The label a priority is reported under (ready-wait metrics, ``overview``): the
    priority itself for 0 to 9, else one of ``<0``, ``10-99``, ``100-999``, ``>=1000``, so
    that a label set stays small whatever priorities producers use."""
    if priority < 0:
        return "<0"
    if priority < 10:
        return str(priority)
    if priority < 100:
        return "10-99"
    if priority < 1000:
        return "100-999"
    return ">=1000"


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
    if isinstance(run_at, _dt.datetime):
        if run_at.tzinfo is None or run_at.tzinfo.utcoffset(run_at) is None:
            raise InvalidArgument("run_at", "a datetime must be timezone-aware")
        return "at", seconds_to_ms(run_at.timestamp(), "run_at")
    return "at", seconds_to_ms(run_at, "run_at")


def encode_payload(
    fn: object,
    args: object,
    kwargs: object,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    trace: Mapping[str, str] | None = None,
    timeout: int | None = None,
) -> bytes:
    """Encode the payload map ``{"fn", "args", "kwargs"}`` with msgpack, ``trace``
    (the producer's W3C trace context headers) when given, and ``timeout`` (the run's
    time limit in ms, from :func:`timeout_ms`) when given."""
    if not isinstance(fn, str) or not fn:
        raise InvalidArgument("fn", "must be a non-empty str naming a registered function")
    try:
        fn.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("fn", "must be valid UTF-8 (no lone surrogates)") from None
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise InvalidArgument("args", "must be a list or tuple")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise InvalidArgument("kwargs", "must be a mapping")
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgument("kwargs", "keys must be str")
    # Empty args and kwargs are left out: a queued no-op task then costs less memory.
    payload: dict[str, Any] = {"fn": fn}
    if args:
        payload["args"] = list(args)
    if kwargs:
        payload["kwargs"] = dict(kwargs)
    if trace:
        payload["trace"] = dict(trace)
    if timeout is not None:
        payload["timeout"] = timeout
    try:
        data: bytes = msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        bad = "args"
        try:
            msgpack.packb(list(args), use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            bad = "kwargs"
        raise InvalidArgument(bad, f"cannot be encoded with msgpack: {exc}") from None
    if len(data) > max_bytes:
        # Name the part that takes the most room.
        sizes = {
            "fn": len(fn.encode("utf-8")),
            "args": len(msgpack.packb(payload.get("args", []), use_bin_type=True)),
            "kwargs": len(msgpack.packb(payload.get("kwargs", {}), use_bin_type=True)),
        }
        field_name = max(sizes, key=lambda name: sizes[name])
        raise PayloadTooLarge(field_name, f"payload is {len(data)} bytes, limit {max_bytes}")
    # A payload holds at most as many values as it has bytes: only a larger one is counted.
    most = limits.MAX_PAYLOAD_VALUES
    if len(data) > most and payload_values(data) > most:
        args_n, kwargs_n = len(payload.get("args", ())), len(payload.get("kwargs", ()))
        field_name = "args" if args_n >= kwargs_n else "kwargs"
        raise PayloadTooLarge(
            field_name, f"payload has more than {most} msgpack values (MAX_PAYLOAD_VALUES)"
        )
    return data


def payload_values(raw: bytes) -> int:
    """The msgpack values of an encoded payload as the scripts count them (the map
    itself, every key and every value inside it, and one more for each character outside
    ASCII in a string): at most ``len(raw)``, which it replies for a value it cannot read."""
    count = 1

    def text(value: Any) -> int:
        if value.__class__ is str and not value.isascii():
            return len(value) - len(value.encode("ascii", "ignore"))
        return 0

    def items(values: list[Any]) -> list[Any]:
        nonlocal count
        count += len(values) + sum(map(text, values))
        return values

    def pairs(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        nonlocal count
        count += 2 * len(entries) + sum(text(k) + text(v) for k, v in entries)
        return entries

    try:
        msgpack.unpackb(
            raw, raw=False, strict_map_key=False, list_hook=items, object_pairs_hook=pairs
        )
    except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.StackError):
        return len(raw)
    return count


def schedule_values(
    spec: TaskSpec,
    max_payload_bytes: int,
    trace: Mapping[str, str] | None = None,
    hold: bool = False,
) -> list[Any]:
    """Validate one task and return its schedule-script values (see lua/schedule.lua)."""
    task_id = validate_task_id(spec.task_id)
    mode, ms = time_argument(spec.run_at, spec.delay)
    if not _is_int(spec.priority) or not PRIORITY_MIN <= spec.priority <= PRIORITY_MAX:
        raise InvalidArgument("priority", f"must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    if not _is_int(spec.max_attempts) or not 1 <= spec.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument("max_attempts", f"must be an int in [1, {MAX_ATTEMPTS_LIMIT}]")
    backoff = _finite(spec.backoff)
    if backoff is None or not 0 <= backoff <= BACKOFF_MAX_S:
        raise InvalidArgument("backoff", f"must be a number of seconds in [0, {BACKOFF_MAX_S:g}]")
    required = validate_deps(spec.deps, "deps", task_id)
    optional = validate_deps(spec.optional_deps, "optional_deps", task_id)
    both = set(required) & set(optional)
    if both:
        raise InvalidArgument("optional_deps", f"{sorted(both)[0]!r} is also a required dependency")
    if len(required) + len(optional) > MAX_DEPS:
        raise InvalidArgument(
            "deps", f"at most {MAX_DEPS} dependencies per task, required and optional together"
        )
    if len(optional) > limits.MAX_EDGES_PER_CALL:
        # Optional dependencies travel in the task's one schedule call (no part adds them).
        raise InvalidArgument(
            "optional_deps", f"at most {limits.MAX_EDGES_PER_CALL} per task (MAX_EDGES_PER_CALL)"
        )
    if not isinstance(spec.allow_unknown, bool):
        raise InvalidArgument("allow_unknown", "must be a bool")
    limit = timeout_ms(spec.timeout)
    payload = encode_payload(spec.fn, spec.args, spec.kwargs, max_payload_bytes, trace, limit)
    # The fixed fields travel as one argument: fewer arguments to encode per task.
    fields = (
        f"{mode} {ms} {spec.priority} {spec.max_attempts} {seconds_to_ms(spec.backoff, 'backoff')}"
        f" {1 if spec.allow_unknown else 0} {len(required)} {len(optional)}"
        f"{admission_suffix(spec)}{' hold=1' if hold else ''}"
    )
    return [task_id, fields, payload, *required, *optional]


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


# --------------------------------------------------------------------------- calls


def schedule_call(
    keys: Keys,
    specs: Sequence[TaskSpec],
    max_payload_bytes: int,
    trace: Mapping[str, str] | None = None,
    held: Collection[int] = (),
) -> Call:
    """The schedule script's call; the new versions of the specs at the indices ``held``
    stay pending until the last part of their placement (:func:`add_deps_call` with
    ``placing``)."""
    if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
        raise InvalidArgument("specs", "must be a sequence of TaskSpec")
    args: list[Any] = [PROPAGATE_BUDGET, len(specs)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if not isinstance(spec, TaskSpec):
            raise InvalidArgument("specs", f"must hold TaskSpec values, got {type(spec).__name__}")
        values = schedule_values(spec, max_payload_bytes, trace, i in held)
        if values[0] in seen:
            raise InvalidArgument("task_id", f"{values[0]!r} appears twice in one batch")
        seen.add(values[0])
        args.extend(values)
    # The script checks payloads against the same limit (a trailing value).
    args.append(max_payload_bytes)
    return Call(
        "schedule",
        keys.for_script("schedule"),
        args,
    )


def cancel_call(keys: Keys, task_id: object) -> Call:
    return Call("cancel", keys.for_script("cancel"), [PROPAGATE_BUDGET, validate_task_id(task_id)])


def claim_call(
    keys: Keys,
    worker_id: object,
    n: object,
    lease_ms: int,
    listening: bool = False,
    request_id: str | None = None,
) -> Call:
    """The claim script's call; with ``listening`` the caller listens on its own wake
    channel, so a claim that comes up short registers it as idle (lib/idle.lua); with
    ``request_id`` the tokens it claims are kept until the worker's next claim, so that
    they can be handed back if the reply is lost (:meth:`Ops.hand_back_lost_claim`)."""
    if not _is_int(n) or not 1 <= n <= limits.MAX_CLAIM:  # type: ignore[operator]
        raise InvalidArgument("n", f"must be an int in [1, {limits.MAX_CLAIM}] (MAX_CLAIM)")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise InvalidArgument("request_id", "must be a non-empty str or None")
    worker = validate_worker_id(worker_id)
    args: list[Any] = [worker, n, lease_ms, CLAIM_MAX_DROP]
    if listening or request_id is not None:
        args += [keys.worker_channel(worker), IDLE_MS] if listening else ["", 0]
        args.append(request_id or "")
    return Call("claim", keys.for_script("claim"), args)


def decode_kept_claim(raw: bytes) -> tuple[str, list[tuple[str, int, int]]]:
    """The request id and tokens ``(task id, version, attempt)`` the claim script kept."""
    head, _, rest = raw.partition(b"\n")
    tokens: list[tuple[str, int, int]] = []
    while rest:
        version, attempt, size, rest = rest.split(b" ", 3)
        length = int(size)
        tokens.append((rest[:length].decode("utf-8"), int(version), int(attempt)))
        rest = rest[length:]
    return head.decode("utf-8"), tokens


def _token_values(claims: Sequence[Claim]) -> list[Any]:
    values: list[Any] = []
    for claim in claims:
        if not isinstance(claim, Claim):
            raise InvalidArgument("claim", f"must be a Claim, got {type(claim).__name__}")
        validate_task_id(claim.task_id, "claim")
        for number in (claim.version, claim.attempt):
            # A claim built by hand may hold anything; Redis must not be the one to refuse it.
            if not _is_int(number) or not 0 <= number <= MAX_MS:
                raise InvalidArgument("claim", "version and attempt must be ints >= 0")
        values.extend((claim.task_id, claim.version, claim.attempt))
    return values


def heartbeat_call(keys: Keys, claims: Sequence[Claim], lease_ms: int) -> Call:
    return Call(
        "heartbeat", keys.for_script("heartbeat"), [lease_ms, len(claims), *_token_values(claims)]
    )


def encode_result(result: object) -> bytes:
    if result is None:
        return b""
    try:
        data: bytes = msgpack.packb(result, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument("result", f"cannot be encoded with msgpack: {exc}") from None
    return data


def complete_call(
    keys: Keys, reports: Sequence[tuple[Claim, object]], encoded: bool = False
) -> Call:
    args: list[Any] = [PROPAGATE_BUDGET, len(reports)]
    for claim, result in reports:
        args.extend(_token_values([claim]))
        args.append(result if encoded else encode_result(result))
    return Call(
        "complete",
        keys.for_script("complete"),
        args,
    )


def error_text(error: object) -> str:
    """The text stored for a failed attempt, at most ``ERROR_MAX_BYTES`` of UTF-8.

    An exception that was raised keeps its traceback (chained causes included),
    ending with its ``Type: message`` line; one never raised is ``Type: message``.
    A traceback too long for the bound loses its outermost frames first, so the
    frame that raised and the type/message line are always kept.
    """
    if isinstance(error, BaseException):
        if error.__traceback__ is None and error.__cause__ is None and error.__context__ is None:
            return _cut_tail(f"{type(error).__name__}: {_safe_str(error)}", ERROR_MAX_BYTES)
        return _bounded_traceback(error)
    if isinstance(error, str):
        return _cut_tail(error, ERROR_MAX_BYTES)
    raise InvalidArgument("error", "must be a str or an exception")


def _safe_str(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        # A broken __str__ must not lose the failure it describes.
        return "<exception str() failed>"


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _cut_tail(text: str, limit: int) -> str:
    """``text`` as valid UTF-8, its first ``limit`` bytes at most."""
    raw = _utf8(text)
    return raw[:limit].decode("utf-8", "ignore")


def _bounded_traceback(error: BaseException) -> str:
    parts = traceback.format_exception(type(error), error, error.__traceback__)
    whole = "".join(parts).rstrip("\n")
    if len(_utf8(whole)) <= ERROR_MAX_BYTES:
        return _cut_tail(whole, ERROR_MAX_BYTES)
    last = traceback.format_exception_only(type(error), error)
    if parts[-len(last) :] == last:
        frames = parts[: -len(last)]
    else:
        frames, last = parts, [f"{type(error).__name__}: {_safe_str(error)}"]
    # The type/message line comes first in the budget, a huge message cut to a quarter.
    tail = "".join(last).rstrip("\n")
    if len(_utf8(tail)) > ERROR_MAX_BYTES // 4:
        tail = _cut_tail(tail, ERROR_MAX_BYTES // 4 - ERROR_CUT_MARK_BYTES) + " [message cut]"
    budget = ERROR_MAX_BYTES - len(_utf8(tail)) - ERROR_CUT_MARK_BYTES
    kept: list[bytes] = []
    for part in reversed(frames):
        raw = _utf8(part)
        if len(raw) > budget:
            if not kept:
                # One frame larger than the budget: its end, where the raising line is.
                kept.append(raw[len(raw) - budget :])
            break
        kept.append(raw)
        budget -= len(raw)
    body = b"".join(reversed(kept)).decode("utf-8", "ignore")
    cut = len(frames) - len(kept)
    if cut:
        body = f"[the outermost {cut} of {len(frames)} traceback parts cut]\n" + body
    return body + tail


def fail_call(keys: Keys, reports: Sequence[tuple[Claim, object]]) -> Call:
    args: list[Any] = [PROPAGATE_BUDGET, BACKOFF_CAP_MS, len(reports)]
    for claim, error in reports:
        args.extend(_token_values([claim]))
        args.append(error_text(error))
    return Call(
        "fail",
        keys.for_script("fail"),
        args,
    )


def confirm_cancel_call(keys: Keys, claim: Claim) -> Call:
    return Call(
        "confirm_cancel",
        keys.for_script("confirm_cancel"),
        [PROPAGATE_BUDGET, *_token_values([claim])],
    )


def release_call(keys: Keys, claims: Sequence[Claim], delay: object = 0.0) -> Call:
    delay_s = _finite(delay)
    if delay_s is None or delay_s < 0:
        raise InvalidArgument("delay", "must be a finite number of seconds >= 0")
    args = [PROPAGATE_BUDGET, len(claims), *_token_values(claims)]
    if delay_s > 0:
        args.append(max(1, seconds_to_ms(delay_s, "delay", MAX_DELAY_MS)))
    return Call("release", keys.for_script("release"), args)


# reap_call's default target: every expired lease (None is a bad task id, not "all").
_EVERY_LEASE: Any = object()


def reap_call(keys: Keys, task_id: object = _EVERY_LEASE, limit: object = REAP_BATCH) -> Call:
    target = "" if task_id is _EVERY_LEASE else validate_task_id(task_id)
    if not _is_int(limit) or limit < 1:  # type: ignore[operator]
        raise InvalidArgument("limit", "must be an int >= 1")
    return Call(
        "reap",
        keys.for_script("reap"),
        [PROPAGATE_BUDGET, BACKOFF_CAP_MS, limit, target],
    )


def expire_call(keys: Keys, limit: object = EXPIRE_BATCH) -> Call:
    if not _is_int(limit) or limit < 1:  # type: ignore[operator]
        raise InvalidArgument("limit", "must be an int >= 1")
    return Call("expire", keys.for_script("expire"), [PROPAGATE_BUDGET, limit])


def leave_call(keys: Keys, worker_id: object) -> Call:
    worker = validate_worker_id(worker_id)
    return Call("leave", keys.for_script("leave"), [keys.worker_channel(worker), worker])


def propagate_call(keys: Keys, budget: int = PROPAGATE_BUDGET) -> Call:
    return Call("propagate", keys.for_script("propagate"), [budget])


# Per-minute counters (lua/lib/history.lua) kept for a day, plus a margin before the
# workers' housekeeping deletes them, at most MINUTES_TRIM_STEP minutes per round.
MINUTES_KEEP = 1440
MINUTES_MARGIN = 60
MINUTES_TRIM_STEP = 240
# A never-trimmed hash up to this many fields is read once to find its oldest minute.
MINUTES_SCAN = 10_000

DEFAULT_RETENTION_S = 86400.0
DEFAULT_RETENTION_MS = int(DEFAULT_RETENTION_S * 1000)
PURGE_BATCH = 500
# Compaction walks the queue only when stale entries are the majority and at least this many.
COMPACT_MINIMUM = 1000


def purge_call(keys: Keys, limit: int = PURGE_BATCH, retention_s: object = None) -> Call:
    retention = ""
    if retention_s is not None:
        seconds = _finite(retention_s)
        if seconds is None or seconds < 0:
            raise InvalidArgument("retention_s", "must be a number of seconds >= 0")
        retention = str(seconds_to_ms(retention_s, "retention_s"))
    return Call("purge", keys.for_script("purge"), [limit, retention, DEFAULT_RETENTION_MS])


PURGE_TASKS_MAX = 1000


def forget_call(keys: Keys, task_ids: object) -> Call:
    """The forget script's call: remove these terminal tasks now."""
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Sequence):
        raise InvalidArgument("task_ids", "must be a sequence of task ids")
    if len(task_ids) > PURGE_TASKS_MAX:
        raise InvalidArgument("task_ids", f"must hold at most {PURGE_TASKS_MAX} ids")
    ids = [validate_task_id(task_id, "task_ids") for task_id in task_ids]
    return Call("forget", keys.for_script("forget"), [len(ids), *ids])


def compact_call(
    keys: Keys, budget: int = limits.MAX_COMPACT_BUDGET, minimum: int = COMPACT_MINIMUM
) -> Call:
    return Call("compact", keys.for_script("compact"), [budget, minimum])


def retry_call(keys: Keys, task_id: object, cascade: object) -> Call:
    if not isinstance(cascade, bool):
        raise InvalidArgument("cascade", "must be a bool")
    return Call(
        "retry",
        keys.for_script("retry"),
        [PROPAGATE_BUDGET, validate_task_id(task_id), "1" if cascade else "0"],
    )


def add_deps_call(
    keys: Keys,
    task_id: object,
    deps: object,
    allow_unknown: object,
    placing: tuple[int, bool] | None = None,
) -> Call:
    """The add_deps script's call; ``placing`` is (the held version, whether this is the
    last part, which lifts the hold) for a part of a placement."""
    task_id = validate_task_id(task_id)
    ids = validate_deps(deps, "deps", task_id)
    if not ids:
        raise InvalidArgument("deps", "must name at least one dependency")
    if not isinstance(allow_unknown, bool):
        raise InvalidArgument("allow_unknown", "must be a bool")
    mode = "1" if allow_unknown else "0"
    if placing is not None:
        version, last = placing
        mode += f" {version} {'last' if last else 'more'}"
    return Call("add_deps", keys.for_script("add_deps"), [PROPAGATE_BUDGET, task_id, mode, *ids])


# --------------------------------------------------------------------------- replies


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# What stands for an array or map nested too deep to read or show.
CUT_MARK = "…"


def cut_deep(value: Any, depth: int) -> Any:
    """``value`` with every array or map deeper than ``depth`` replaced by ``"…"``;
    ``value`` itself when none is (the walk goes no deeper than ``depth``)."""
    return _rebuilt(value, depth) if _deeper(value, depth) else value


_NESTING = (dict, list, tuple)


def _nested(item: Any) -> list[Any]:
    """The arrays and maps right inside an array or map (map keys included)."""
    if type(item) is dict:
        inside = [k for k in item if type(k) in _NESTING]
        return inside + [v for v in item.values() if type(v) in _NESTING]
    return [v for v in item if type(v) in _NESTING]


def _deeper(value: Any, depth: int) -> bool:
    # A walk with its own stack (the value may nest deeper than Python's recursion
    # limit) that steps only on arrays and maps: exact types, so that an ExtType (a
    # namedtuple) counts as the single value it is.
    if type(value) not in _NESTING:
        return False
    stack = [(value, depth)]
    while stack:
        item, left = stack.pop()
        if left <= 0:
            return True
        stack.extend((child, left - 1) for child in _nested(item))
    return False


def _rebuilt(value: Any, depth: int) -> Any:
    # One frame per level (no comprehensions), and callers keep depth far below the limit.
    if type(value) not in _NESTING:
        return value
    if depth <= 0:
        return CUT_MARK
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[_rebuilt(k, depth - 1)] = _rebuilt(v, depth - 1)
        return out
    items = []
    for v in value:
        items.append(_rebuilt(v, depth - 1))
    return tuple(items) if isinstance(value, tuple) else items


# How deep the values a reader decodes (status, explain, the dashboard) may nest: past
# it an array or map reads as "…", so that no reader of a stored value, nor a repr of
# it, meets Python's recursion limit. A Python producer's msgpack packs at most 511.
READ_DEPTH = 256


# Every byte but those that start a msgpack array or map.
_NOT_CONTAINER_BYTES = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))


def _may_nest(raw: bytes, depth: int) -> bool:
    """Whether ``raw`` may hold arrays or maps nested more than ``depth`` deep: only if
    ``depth`` bytes of it could start one (a count at C speed, where the walk of
    :func:`cut_deep` would visit every item of a large payload)."""
    return len(raw.translate(None, _NOT_CONTAINER_BYTES)) > depth


def unpack_error(exc: BaseException) -> str:
    """Why msgpack could not decode a value, never empty (msgpack's own messages are
    sometimes empty: nesting past its limit raises a bare ``StackError``)."""
    if isinstance(exc, msgpack.exceptions.StackError):
        return "nested deeper than msgpack decodes (1024 arrays or maps; StackError)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def decode_payload(raw: bytes | None) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """Decode a stored payload: ``(fn, args, kwargs)``; see :func:`decode_payload_trace`."""
    fn, args, kwargs, _ = decode_payload_trace(raw)
    return fn, args, kwargs


def decode_payload_trace(
    raw: bytes | None, depth: int | None = None
) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, str] | None]:
    """Decode a stored payload; raises ``ValueError`` describing what is wrong.

    The fourth value is the producer's trace context, or None when the payload has
    none (a ``trace`` that is not a map of strings is ignored, as any unknown key is).
    See :func:`decode_payload_full`.
    """
    fn, args, kwargs, trace, _ = decode_payload_full(raw, depth)
    return fn, args, kwargs, trace


def decode_payload_full(
    raw: bytes | None, depth: int | None = None
) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, str] | None, float | None]:
    """Decode a stored payload: fn, args, kwargs, trace context and time limit (seconds,
    None when the payload has none); raises ``ValueError`` describing what is wrong.

    A nil ``args`` or ``kwargs`` (how JavaScript encoders send ``undefined``) is empty.
    A payload that is a msgpack string is the claim script's reason why the task
    cannot run (a corrupt record): it is raised as the error.

    With ``depth`` (a reader's decoding), arrays and maps nested deeper than it read
    as ``"…"``, however deep the stored payload goes; without it (a worker's), a
    payload msgpack cannot decode raises.
    """
    if not raw:
        raise ValueError("payload is missing")
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.exceptions.StackError as exc:
        if depth is None:
            raise ValueError(f"payload is not msgpack: {unpack_error(exc)}") from None
        try:
            data = msgpack.unpackb(cut_packed(raw, depth), raw=False, strict_map_key=False)
        except Exception as again:
            raise ValueError(f"payload is not msgpack: {unpack_error(again)}") from None
    except Exception as exc:
        raise ValueError(f"payload is not msgpack: {unpack_error(exc)}") from None
    if depth is not None and _may_nest(raw, depth):
        data = cut_deep(data, depth)
    if isinstance(data, str):
        raise ValueError(data)
    if not isinstance(data, dict):
        raise ValueError("payload is not a msgpack map")
    fn, args, kwargs = data.get("fn"), data.get("args"), data.get("kwargs")
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(fn, str) or not fn:
        raise ValueError("payload field 'fn' must be a non-empty string")
    if not isinstance(args, list):
        raise ValueError("payload field 'args' must be an array")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("payload field 'kwargs' must be a map with string keys")
    trace = data.get("trace")
    if not isinstance(trace, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in trace.items()
    ):
        trace = None
    limit = data.get("timeout")
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= TIMEOUT_MAX_MS
    ):
        raise ValueError(
            f"payload field 'timeout' must be an integer number of milliseconds in "
            f"[1, {TIMEOUT_MAX_MS}]"
        )
    return fn, tuple(args), kwargs, trace, None if limit is None else limit / 1000.0


# msgpack heads: first byte -> (bytes of the head, bytes of its length field); a
# fixed-size value's head is the whole value.
_FIXED_SIZES = {
    0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9,
    0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18,
}  # fmt: skip
# Sized values: first byte -> (bytes of the length field, extra head bytes after it).
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
          0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}  # fmt: skip
# Arrays and maps: first byte -> (bytes of the count field, items per count).
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_CUT_PACKED = msgpack.packb(CUT_MARK)


def _head(raw: bytes, pos: int) -> tuple[int, int]:
    """(bytes of the value's head, items inside it: -1 for a value that is no array
    or map, whose head is then the whole value) of the value at ``pos``."""
    if pos >= len(raw):
        raise ValueError("payload ends inside a value")
    b = raw[pos]
    if b <= 0x7F or b >= 0xE0:
        return 1, -1
    if 0x80 <= b <= 0x8F:
        return 1, 2 * (b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return 1, b & 0x0F
    if 0xA0 <= b <= 0xBF:
        return 1 + (b & 0x1F), -1
    if b in _FIXED_SIZES:
        return _FIXED_SIZES[b], -1
    if b in _SIZED:
        width, extra = _SIZED[b]
        return 1 + width + extra + int.from_bytes(raw[pos + 1 : pos + 1 + width], "big"), -1
    if b in _CONTAINERS:
        width, per = _CONTAINERS[b]
        return 1 + width, per * int.from_bytes(raw[pos + 1 : pos + 1 + width], "big")
    raise ValueError(f"byte 0x{b:02x} starts no msgpack value")


def cut_packed(raw: bytes, depth: int) -> bytes:
    """The msgpack value ``raw`` with every array or map nested deeper than ``depth``
    (the outermost is 1) packed as the string ``"…"``: a value too deep for msgpack to
    decode, cut so that it decodes. Walks with its own stack, one step per item."""
    out = bytearray()
    pos = 0
    open_items = [1]  # items still to read in each open array or map, outermost first
    while open_items:
        if open_items[-1] == 0:
            open_items.pop()
            continue
        open_items[-1] -= 1
        size, items = _head(raw, pos)
        if items < 0 or len(open_items) <= depth:
            out += raw[pos : pos + size]
            pos += size
            if items >= 0:
                open_items.append(items)
            continue
        skip = 1  # values left to skip: this array or map, then all it holds
        while skip:
            size, items = _head(raw, pos)
            pos += size
            skip += max(items, 0) - 1
        out += _CUT_PACKED
    if pos > len(raw):
        raise ValueError("payload ends inside a value")
    return bytes(out)


def decode_value(raw: bytes, depth: int = READ_DEPTH) -> Any:
    """A stored msgpack value as a reader sees it: arrays and maps nested deeper than
    ``depth`` read as ``"…"``, however deep the stored value goes."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.exceptions.StackError:
        value = msgpack.unpackb(cut_packed(raw, depth), raw=False, strict_map_key=False)
    return cut_deep(value, depth) if _may_nest(raw, depth) else value


CLAIM_FIELDS = 6


def decode_claim_reply(reply: Sequence[Any]) -> tuple[list[Claim], Wait | None]:
    """Decode the claim script's reply into claims and, when short, why."""
    count, reason, delay_us = int(reply[0]), _text(reply[1]), int(reply[2])
    claims: list[Claim] = []
    # A fair claim's reply ends with the fairness key of each task, in order.
    keys_at = 3 + CLAIM_FIELDS * count
    fair_keys = list(reply[keys_at : keys_at + count])
    for i in range(count):
        base = 3 + CLAIM_FIELDS * i
        task_id, version, attempt, priority, run_at, raw = reply[base : base + CLAIM_FIELDS]
        if isinstance(task_id, bytes):
            try:
                task_id.decode("utf-8")
            except UnicodeDecodeError:
                # claim.lua hands out no such id; were one to come, no report could name
                # it: it is left to its lease, and never stops the other claims.
                continue
        error: str | None = None
        trace: dict[str, str] | None = None
        limit: float | None = None
        try:
            fn, args, kwargs, trace, limit = decode_payload_full(raw)
        except ValueError as exc:
            fn, args, kwargs, error = "", (), {}, str(exc)
        claims.append(
            Claim(
                task_id=_text(task_id),
                version=int(version),
                attempt=int(attempt),
                fn=fn,
                args=args,
                kwargs=kwargs,
                priority=int(priority),
                run_at=int(run_at) / 1000.0,
                payload_error=error,
                trace=trace,
                key=_bytes(fair_keys[i]).decode("utf-8", "replace") if i < len(fair_keys) else None,
                timeout=limit,
            )
        )
    wait = None
    if reason:
        wait = Wait(reason=WaitReason(reason), delay=None if delay_us < 0 else delay_us / 1e6)
    return claims, wait


def decode_outcomes(reply: Sequence[Any]) -> list[Outcome]:
    return [Outcome(_text(v)) for v in reply]


@dataclass(frozen=True)
class Record:
    """The fields of a stored task record (see ``lua/lib/record.lua``)."""

    state: State
    version: int
    attempt: int
    max_attempts: int
    backoff_ms: int
    run_at_ms: int
    priority: int
    cancel_requested: bool
    updated_ms: int
    remaining: int
    optional_remaining: int
    worker: str
    payload: bytes | None = None
    """The payload when the record holds it (small payloads since records are msgpack);
    None when it is in the payloads hash."""


# How the task record stores each state (see lua/lib/record.lua).
_STATE_BY_CODE = {
    "p": State.PENDING,
    "r": State.READY,
    "x": State.RUNNING,
    "s": State.SUCCEEDED,
    "f": State.FAILED,
    "c": State.CANCELLED,
    "b": State.BLOCKED,
}


def decode_record(raw: bytes | str, task_id: str = "") -> Record:
    """Decode a stored record; a record that does not parse raises ``ScriptError``
    naming ``task_id``."""
    try:
        return _decode_record(raw)
    except (KeyError, ValueError, IndexError, TypeError) as exc:
        shown = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise ScriptError(
            f"corrupt task record of {task_id!r}: {shown[:100]!r} ({type(exc).__name__})"
        ) from None


_RECORD_INT = re.compile(r"-?[0-9]{1,16}")  # at most 17 characters, as the scripts read
# The ranges lua/lib/record.lua reads a record with: (lowest, highest) per numeric field.
_RECORD_RANGES = (
    (0, MAX_MS), (0, MAX_MS), (1, MAX_MS), (0, MAX_MS), (-MAX_MS, MAX_MS),
    (PRIORITY_MIN, PRIORITY_MAX), (0, 1), (-2 * MAX_MS, 2 * MAX_MS), (0, MAX_MS), (0, MAX_MS),
)  # fmt: skip


# What the scripts write: twelve msgpack values in a row, the state letter (a one-byte
# string, so the first byte is always this) first. A record that starts otherwise was
# written as text by an earlier version: the same fields joined by "|".
_PACKED_RECORD = b"\xa1"


def _decode_record(raw: bytes | str) -> Record:
    if isinstance(raw, bytes) and raw[:1] == _PACKED_RECORD:
        return _record_of(_packed_fields(raw))
    parts = _text(raw).split("|", 11)
    if len(parts) != 12:
        raise ValueError("not 12 fields")
    for text in parts[1:11]:
        if not _RECORD_INT.fullmatch(text):
            raise ValueError(f"field {text!r} is not an integer")
    return _record_of([parts[0], *(int(text) for text in parts[1:11]), parts[11], None])


def _packed_fields(raw: bytes) -> list[Any]:
    """The twelve values of a msgpack record, then its payload (the bytes after them, or
    None when there are none)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    values = list(itertools.islice(unpacker, 12))
    if len(values) != 12:
        raise ValueError(f"{len(values)} msgpack values, not 12")
    if not isinstance(values[11], str):
        raise ValueError("worker is not a string")
    return [*values, raw[unpacker.tell() :] or None]


def _record_of(fields: list[Any]) -> Record:
    """The record of its fields: state letter, ten integers, worker, then the payload it
    holds (None: none)."""
    state, *ints, worker, payload = fields
    for value, (low, high) in zip(ints, _RECORD_RANGES, strict=True):
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"field {value!r} out of range")
    (version, attempt, max_attempts, backoff_ms, run_at_ms, priority, cancel, delta,
     remaining, optional_remaining) = ints  # fmt: skip
    return Record(
        state=_STATE_BY_CODE[state],
        version=version,
        attempt=attempt,
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        run_at_ms=run_at_ms,
        priority=priority,
        cancel_requested=cancel == 1,
        updated_ms=run_at_ms + delta,
        remaining=remaining,
        optional_remaining=optional_remaining,
        worker=worker,
        payload=payload,
    )


class TaskRow(NamedTuple):
    """One task as :meth:`Ops.scan_tasks` lists it: its record, without payload or edges."""

    task_id: str
    state: State
    version: int
    attempt: int
    updated_at: float  # epoch seconds, server clock


def status_reads(keys: Keys) -> list[str]:
    """The hashes read by ``status`` (HGET of the task id in each), in order."""
    return [keys.tasks, keys.payloads, keys.results, keys.deps, keys.blocked, keys.history]


HISTORY_KEEP = 10
_HISTORY_HEAD = re.compile(rb"(\d+)\|(\d+)\|(-?\d+)\|(-?\d+)\|([a-z_]+)\|(\d+)\|")


def decode_history(raw: Any) -> tuple[AttemptInfo, ...]:
    """The attempts of a stored history (``lua/lib/history.lua``), oldest first.

    Each entry is ``version|attempt|started_ms|ended_ms|outcome|len(worker)|worker|summary``
    and a newline; the summary holds no newline. An entry that does not parse ends the
    list there (junk written by other means).
    """
    if not raw:
        return ()
    data = _bytes(raw)
    out: list[AttemptInfo] = []
    pos = 0
    while pos < len(data):
        head = _HISTORY_HEAD.match(data, pos)
        if not head:
            break
        start = head.end()
        worker_end = start + int(head.group(6))
        if data[worker_end : worker_end + 1] != b"|":
            break
        line_end = data.find(b"\n", worker_end + 1)
        if line_end < 0:
            break
        summary = data[worker_end + 1 : line_end].decode("utf-8", "replace")
        out.append(
            AttemptInfo(
                version=int(head.group(1)),
                attempt=int(head.group(2)),
                worker=data[start:worker_end].decode("utf-8", "replace"),
                started_at=int(head.group(3)) / 1000.0,
                ended_at=int(head.group(4)) / 1000.0,
                outcome=head.group(5).decode(),
                error=summary or None,
            )
        )
        pos = line_end + 1
    return tuple(out)


def member_priority(member: bytes) -> int:
    """The priority a queue entry carries (``member_priority`` in ``lua/lib/ranked.lua``)."""
    head = _bytes(member)[:8]
    try:
        return 0x7FFFFFFF - int(head, 16) if len(head) == 8 else 0
    except ValueError:
        return 0


def parse_queue_member(member: bytes) -> tuple[int, str]:
    """(version, task id) of a queue entry: ``hex8(2^31-1-priority) hex14(version) id``
    (``queue_member`` in ``lua/lib/record.lua``)."""
    return int(member[8:22], 16), member[22:].decode("utf-8", "replace")


def id_prefix(task_id: str) -> bytes:
    """``hex3(len) id``: how edges and causes name a task (see ``lua/lib/graph.lua``)."""
    raw = task_id.encode("utf-8")
    return b"%03x" % len(raw) + raw


def edge_range(task_id: str) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of every edge from ``task_id`` to its dependents."""
    prefix = id_prefix(task_id)
    return b"[" + prefix, b"(" + prefix + b"\xff"


def decode_dependents(task_id: str, members: Sequence[bytes]) -> tuple[str, ...]:
    skip = len(id_prefix(task_id)) + 2  # the prefix, then flag and kind
    # An undecodable member (junk in the edges) shows with replacement characters.
    return tuple(dict.fromkeys(m[skip:].decode("utf-8", "replace") for m in members))


def decode_cause(raw: Any) -> tuple[str, str]:
    """(root, parent) of a stored block cause; ``ValueError`` when it does not parse."""
    size = int(raw[:3], 16)
    if size == 0 or 3 + size >= len(raw):
        raise ValueError("block cause does not parse")
    return raw[3 : 3 + size].decode("utf-8"), raw[3 + size :].decode("utf-8")


def blocked_path(task_id: str, cause: Any) -> Generator[str, Any, BlockedBy]:
    """Follow a blocked task's parents back to its root cause, without I/O.

    Yields each parent id whose stored cause (``blocked`` hash) is needed and takes it
    back through ``send``; returns the ``BlockedBy``. A link that changed since (a task
    on the way got a new version) ends the path there.
    """
    root, parent = decode_cause(cause)
    path, seen = [task_id], {task_id}
    while parent not in seen:
        path.append(parent)
        seen.add(parent)
        if parent == root:
            break
        raw = yield parent
        if not raw:
            break
        parent_root, parent = decode_cause(raw)
        if parent_root != root:
            break
    return BlockedBy(root=root, path=tuple(reversed(path)))


def decode_status(
    task_id: str,
    raw_record: Any,
    raw_payload: Any,
    raw_result: Any,
    lease_score: Any,
    raw_deps: Any = None,
    dependents: tuple[str, ...] = (),
    blocked_by: BlockedBy | None = None,
    raw_history: Any = None,
) -> TaskInfo:
    if raw_record is None:
        raise NotFoundError(task_id)
    rec = decode_record(raw_record, task_id)
    if rec.payload is not None:
        raw_payload = rec.payload
    limit: float | None = None
    try:
        fn: str | None
        fn, args, kwargs, _, limit = decode_payload_full(raw_payload, READ_DEPTH)
    except ValueError:
        fn, args, kwargs = None, (), {}
    deps_list = decode_deps_list(raw_deps)
    placing = int(bool(deps_list) and deps_list[0][0] == "h")
    error: str | None = None
    result: Any = None
    if raw_result:
        kind, body = raw_result[:1], raw_result[1:]
        if kind == b"E":
            error = body.decode("utf-8", "replace")
        elif kind == b"R":
            try:
                result = decode_value(body)
            except Exception as exc:
                error = f"stored result does not decode: {unpack_error(exc)}"
        else:
            error = "stored result does not parse"
    return TaskInfo(
        task_id=task_id,
        state=rec.state,
        version=rec.version,
        attempt=rec.attempt,
        max_attempts=rec.max_attempts,
        priority=rec.priority,
        run_at=rec.run_at_ms / 1000.0,
        backoff=rec.backoff_ms / 1000.0,
        fn=fn,
        args=args,
        kwargs=kwargs,
        cancel_requested=rec.cancel_requested,
        worker=rec.worker or None,
        lease_deadline=None if lease_score is None else float(lease_score) / 1000.0,
        updated_at=rec.updated_ms / 1000.0,
        error=error,
        result=result,
        # The hold counts in the record as one more awaited dependency.
        remaining=rec.remaining - placing,
        optional_remaining=rec.optional_remaining,
        placing=bool(placing),
        deps=tuple(d for kind, d in deps_list if kind == "r"),
        optional_deps=tuple(d for kind, d in deps_list if kind == "o"),
        dependents=dependents,
        blocked_by=blocked_by,
        attempts=decode_history(raw_history),
        timeout=limit,
    )


class Stats(TypedDict):
    """A namespace at a glance (``Scheduler.stats``)."""

    counts: dict[str, int]
    """Tasks per state (every :class:`State` value is present)."""
    queue_entries: int
    """Entries in the queue, live and stale (in the priority order: the delayed set and the
    ready set together)."""
    ranked_entries: int
    """Of them, entries in the ready set of the priority order (0 in the default order)."""
    live_entries: int
    """Queue entries that are a ready task's current version."""
    stale_entries: int
    """Entries left behind by replaced or cancelled tasks, dropped lazily."""
    leases: int
    running: int
    max_running: int | None
    retention_s: float
    sequence: int
    order: str
    """The claim order, ``default`` or ``priority`` (:class:`Order`)."""
    aging_s: float
    """Seconds of waiting one point of priority is worth in the priority order, else 0."""
    keys: list[KeyLoad]
    """In a fair namespace, the ``STATS_TOP_KEYS`` fairness keys with the most running (then
    queued) tasks, among those the namespace's sets hold first; else empty."""


class Overview(Stats):
    """``stats()`` plus what an operator watches, on the server's clock (``Scheduler.overview``)."""

    server_time: float
    stale_ratio: float
    """Stale entries over all queue entries."""
    leases_expired: int
    """Leases whose deadline passed and that are not reaped yet."""
    leases_expiring: int
    """Leases whose deadline falls within the next ``leases_soon_s`` seconds."""
    leases_soon_s: float
    oldest_ready_age: float | None
    """Seconds since the earliest due, live task became due (how far behind the fleet is);
    None when nothing is due."""
    oldest_ready_age_by_priority: dict[str, float]
    """The same per priority bucket (:func:`priority_bucket`), among the entries read;
    buckets with no due live task read are left out."""


class Chores(TypedDict):
    """What one ``housekeeping`` round did."""

    reaped: int
    expired: int
    """Queued tasks ended cancelled because their deadline passed."""
    compacted: int
    purged: int
    trimmed: int
    """Per-minute counter fields deleted (older than ``MINUTES_KEEP`` plus a margin)."""


# A worker counts as alive while its last heartbeat is at most this many of its own
# heartbeat intervals old: one or two slow or failed rounds do not make it look gone.
WORKER_ALIVE_BEATS = 3
# An entry of the worker registry is dropped (by any worker's housekeeping, and from
# every read) once its last heartbeat is older than this many of its leases: by then
# every lease it held has expired and been reaped.
WORKER_DROP_LEASES = 3


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of the namespace as it last registered itself (``Scheduler.workers()``).

    Times are epoch seconds on the Redis server's clock. ``counts`` are the worker's
    claim counters (``claimed``, ``succeeded``, ``failed``, ...) since it started;
    ``running`` is how many functions it was executing at its last heartbeat.
    ``alive`` is False once it missed a few heartbeats in a row (killed, stuck or cut
    off from Redis); a little later its entry is dropped altogether.
    """

    worker_id: str
    host: str
    pid: int
    version: str
    concurrency: int
    functions: tuple[str, ...]
    started: float
    last_heartbeat: float
    running: int
    counts: Mapping[str, int]
    heartbeat_s: float
    lease_s: float
    _: KW_ONLY
    alive: bool = True
    # Seconds since the last heartbeat when the registry was read.
    seen_ago: float = 0.0

    def stamped(self, now: float) -> WorkerInfo:
        """This entry as written at server time ``now`` (started then too, if unset)."""
        return WorkerInfo(
            self.worker_id, self.host, self.pid, self.version, self.concurrency,
            self.functions, self.started or now, now, self.running, self.counts,
            self.heartbeat_s, self.lease_s,
        )  # fmt: skip

    @property
    def drop_after_s(self) -> float:
        """How long after its last heartbeat the entry is dropped from the registry."""
        return WORKER_DROP_LEASES * max(self.lease_s, self.heartbeat_s)


def encode_worker(info: WorkerInfo) -> bytes:
    """The registry value of ``info``: a msgpack map (times in ms)."""
    data: bytes = msgpack.packb(
        {
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "concurrency": info.concurrency,
            "functions": list(info.functions),
            "started_ms": round(info.started * 1000),
            "heartbeat_ms": round(info.last_heartbeat * 1000),
            "running": info.running,
            "counts": dict(info.counts),
            "heartbeat_interval_ms": round(info.heartbeat_s * 1000),
            "lease_ms": round(info.lease_s * 1000),
        },
        use_bin_type=True,
    )
    return data


def decode_worker(worker_id: bytes | str, raw: bytes | str, now: float) -> WorkerInfo | None:
    """A registry entry read at server time ``now``; None when it cannot be read."""
    try:
        data = msgpack.unpackb(_bytes(raw), raw=False)
        heartbeat_s = int(data["heartbeat_interval_ms"]) / 1000.0
        last = int(data["heartbeat_ms"]) / 1000.0
        return WorkerInfo(
            worker_id=_text(worker_id),
            host=str(data["host"]),
            pid=int(data["pid"]),
            version=str(data["version"]),
            concurrency=int(data["concurrency"]),
            functions=tuple(str(name) for name in data["functions"]),
            started=int(data["started_ms"]) / 1000.0,
            last_heartbeat=last,
            running=int(data["running"]),
            counts={str(k): int(v) for k, v in dict(data["counts"]).items()},
            heartbeat_s=heartbeat_s,
            lease_s=int(data["lease_ms"]) / 1000.0,
            alive=now - last <= WORKER_ALIVE_BEATS * heartbeat_s,
            seen_ago=max(0.0, now - last),
        )
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException):
        return None


def decode_stats(
    meta: Mapping[Any, Any], queue_entries: int, leases: int, ranked_entries: int = 0
) -> Stats:
    counts = {state.value: 0 for state in State}
    settings: dict[str, int] = {}
    fields = {_bytes(key): value for key, value in meta.items()}
    order = decode_order(fields.get(b"order"), fields.get(b"aging_ms"))
    for raw_key, raw_value in meta.items():
        key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else raw_key
        try:
            value = int(raw_value)
        except ValueError:  # junk, repaired by the next script call (lib/run.lua)
            continue
        if key.startswith("count:"):
            # A count below 0 is junk (the next script call repairs it): read as 0.
            counts[key[6:]] = max(0, value)
        elif key in ("max_running", "retention_ms", "seq"):
            settings[key] = value
    ready = counts.get(State.READY.value, 0)
    total = queue_entries + ranked_entries
    return Stats(
        counts=counts,
        queue_entries=total,
        ranked_entries=ranked_entries,
        live_entries=ready,
        stale_entries=total - ready,
        leases=leases,
        running=counts.get(State.RUNNING.value, 0),
        max_running=settings.get("max_running"),
        retention_s=settings.get("retention_ms", int(DEFAULT_RETENTION_S * 1000)) / 1000.0,
        sequence=settings.get("seq", 0),
        order=order.order.value,
        aging_s=order.aging_s,
        keys=[],
    )


def decode_id_list(raw: str) -> list[str]:
    """Decode the space-separated hex ids of a script error (see ``hex_id`` in graph.lua)."""
    return [bytes.fromhex(part).decode("utf-8") for part in raw.split()]


def decode_deps_list(raw: bytes | None) -> list[tuple[str, str]]:
    """Decode a stored dependency list into ``(kind, id)`` pairs, kind 'r' or 'o', or
    'h' for the hold of a version whose dependencies are still being placed (first).

    A list with junk in it ends at its first unreadable entry, as in the scripts.
    """
    out: list[tuple[str, str]] = []
    if not raw:
        return out
    pos = 0
    while pos < len(raw):
        kind = chr(raw[pos])
        try:
            size = int(raw[pos + 1 : pos + 4], 16)
            if kind not in "roh" or size == 0 or pos + 4 + size > len(raw):
                break
            out.append((kind, raw[pos + 4 : pos + 4 + size].decode("utf-8")))
        except ValueError:  # UnicodeDecodeError included
            break
        pos += 4 + size
    return out


def translate_error(message: str) -> Exception:
    """Map a script error reply to the exception the API promises."""
    code, _, rest = message.partition(" ")
    if code == "NOTFOUND":
        return NotFoundError(f"no task {rest!r}")
    if code == "CONFLICT":
        what, _, detail = rest.partition(" ")
        if what == "running":
            return ConflictError(f"task {detail!r} is running; it cannot be replaced")
        if what == "not_requested":
            return ConflictError(f"task {detail!r} has no cancellation request")
        if what == "queued":
            return ConflictError(
                f"the ready set (with the keyed tasks of a fair namespace) holds {detail} "
                "entries, more than a change of order rewrites at once; let the workers "
                "drain it first"
            )
        if what == "placed":
            return ConflictError(
                f"task {detail!r} has another version, or its dependencies are all placed"
            )
        if what == "state":
            state, _, task_id = detail.partition(" ")
            return ConflictError(f"task {task_id!r} is {state}")
        return ConflictError(rest)
    if code == "BUSY" and rest.startswith("Redis is busy"):
        # Redis's own: another script is running long. Not this call's fault.
        return Unavailable(message)
    if code == "BUSY":
        return BusyError(f"task {rest!r} is still settling its dependents")
    if code == "CYCLE":
        return CycleError(decode_id_list(rest))
    if code == "UNKNOWN":
        task_id, dep = decode_id_list(rest)
        err = UnknownDependencyError(
            f"task {task_id!r} depends on {dep!r}, which does not exist "
            "(pass allow_unknown=True to wait for it)"
        )
        err.task_id, err.dependency = task_id, dep
        return err
    if code == "BADARG":
        # Only a script can see some bad arguments (add_deps naming a dependency the
        # task already has): they are still bad arguments naming their field (§12).
        field_name, _, detail = rest.partition(" ")
        if field_name == "payload" and detail.endswith("(payload_max)"):
            # Over the namespace's stored limit, lower than this client's own.
            return PayloadTooLarge("payload", detail)
        return InvalidArgument(field_name.rstrip(":"), detail)
    return ScriptError(message)


# --------------------------------------------------------------------------- schedules

FIRE_HEADS = 10
"""The most due schedules one ``fire_due`` call fires."""
FIRE_TRIES = 3


def recur_put_call(keys: Keys, d: Definition, rev: str, next_ms: int | None) -> Call:
    args = ["put", d.name, rev, d.encode(), "" if next_ms is None else next_ms]
    return Call("recur", keys.for_script("recur"), args)


def recur_remove_call(keys: Keys, name: str) -> Call:
    return Call("recur", keys.for_script("recur"), ["remove", validate_name(name)])


def fire_slots_per_call(d: Definition, max_payload_bytes: int) -> int:
    """How many slots of ``d`` one fire call may create: each task stores the payload,
    and a call's payloads are at most ``MAX_PAYLOAD_BYTES_PER_CALL`` (one slot always)."""
    size = len(encode_payload(d.fn, d.args, d.kwargs, max_payload_bytes, timeout=d.timeout_ms))
    return max(1, min(MAX_BACKFILL_SLOTS, limits.MAX_PAYLOAD_BYTES_PER_CALL // size))


def fire_call(
    keys: Keys,
    d: Definition,
    rev: str,
    mode: str,
    slots: Sequence[tuple[int | str, int | str]],
    max_payload_bytes: int,
    expected_ms: int | None = None,
    next_ms: int | None = None,
    missed: int = 0,
) -> Call:
    """The fire script's call (see lua/fire.lua): ``slots`` are (slot ms, run_at ms)."""
    payload = encode_payload(d.fn, d.args, d.kwargs, max_payload_bytes, timeout=d.timeout_ms)
    args: list[Any] = [
        PROPAGATE_BUDGET, d.name, rev, mode,
        "" if expected_ms is None else expected_ms, "" if next_ms is None else next_ms,
        missed, d.overlap.value,
        f"{d.priority} {d.max_attempts} {d.backoff_ms}{_key_suffix(d.key)}", payload,
        max_payload_bytes, len(slots),
    ]  # fmt: skip
    for slot, run_at in slots:
        args += [slot, run_at]
    return Call("fire", keys.for_script("fire"), args)


@dataclass(frozen=True)
class Fired:
    """What one fire call did: ``moved`` when another caller fired first (or the schedule
    changed), else the tasks created, the slots skipped and the last task created."""

    moved: bool
    created: int
    skipped: int
    last_task: str | None


def decode_fired(values: Sequence[Any]) -> Fired:
    outcome, created, skipped, last = values
    return Fired(_text(outcome) == "moved", int(created), int(skipped), _text(last) or None)


def validate_wait_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    seconds = _finite(timeout)
    if seconds is None or seconds < 0:
        raise InvalidArgument("timeout", "must be None or a finite number of seconds >= 0")
    return seconds


def task_result(info: TaskInfo) -> Any:
    """The result of a task that ended: its stored result when it succeeded, else the
    error that says how it ended (``TaskFailed``, ``TaskCancelled``, ``TaskBlocked``)."""
    if info.state is State.SUCCEEDED:
        if info.error is not None:
            # decode_status says why the stored result cannot be read.
            raise ScriptError(f"task {info.task_id!r} succeeded, but {info.error}")
        return info.result
    if info.state is State.FAILED:
        raise TaskFailed(info.task_id, info.error, info)
    if info.state is State.CANCELLED:
        raise TaskCancelled(info.task_id, info)
    if info.state is State.BLOCKED:
        cause = info.blocked_by
        root = cause.root if cause else None
        raise TaskBlocked(info.task_id, root, cause.path if cause else None, info)
    raise InvalidArgument("info", f"task {info.task_id!r} has not ended ({info.state})")


def decode_ended(data: bytes | str) -> str | None:
    """The task id of a notice on the ``ended`` channel (``<state> <id>``), or None."""
    raw = _bytes(data)
    _, sep, task_id = raw.partition(b" ")
    if not sep:
        return None
    try:
        return task_id.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------- operations
#
# Every public operation of the schedulers is a generator here: it yields the
# requests it needs (script calls, or plain commands sent together) and receives
# each reply through ``send`` (a refused script call arrives as a thrown error).
# The sync and asyncio shells only drive these generators over their connections,
# so the logic of an operation is written once, whatever the I/O model.

T = TypeVar("T")


@dataclass(frozen=True)
class Commands:
    """Plain Redis commands sent together; ``atomic`` wraps them in MULTI/EXEC."""

    commands: tuple[tuple[Any, ...], ...]
    atomic: bool = True


@dataclass(frozen=True)
class Sleep:
    """Pause before the next request (a retry after Redis was briefly unavailable)."""

    seconds: float


@dataclass(frozen=True)
class Listen:
    """Wait up to ``seconds`` for a notice that the task watched by ``handle`` ended.

    ``handle`` is what the shell made for this wait in its one shared subscription to
    the ``ended`` channel; the reply is True when a notice (or a reconnection, after
    which notices may have been lost) came, False when the time ran out.
    """

    handle: Any
    seconds: float


Request = Call | Commands | Sleep | Listen
Op = Generator[Request, Any, T]

# Pauses between tries of a read while Redis is briefly unavailable (a failover or a
# slot migration takes about this long); reads are idempotent, so they are retried.
READ_RETRY_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

# Errors that say "not now" rather than "not this": the call may succeed if sent again.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis_exceptions.ConnectionError,  # BusyLoadingError included
    redis_exceptions.TimeoutError,
    redis_exceptions.TryAgainError,
    redis_exceptions.ClusterDownError,  # MasterDownError included
    redis_exceptions.ReadOnlyError,
    redis_exceptions.AskError,  # MovedError included: redirects the client did not follow
    redis_exceptions.SlotNotCoveredError,
    # The cluster client gave up following redirections ("TTL exhausted"): a slot on
    # the move, or a failover, outlasted its tries.
    redis_exceptions.ClusterError,
    # The cluster client could reach no node ("no node reachable"), or lost its slot map.
    redis_exceptions.RedisClusterException,
)


def failure(exc: Exception) -> Failure:
    """The error a refused or failed request raises inside its operation.

    Transient errors become :class:`~distsched.errors.Unavailable`; a script's own
    error reply becomes the exception the API promises for it; anything else (an ACL
    refusal, a wrong password among them) is raised as redis-py raised it.
    """
    kept_as_is = (
        Unavailable,
        redis_exceptions.NoPermissionError,
        redis_exceptions.AuthenticationError,
        redis_exceptions.AuthorizationError,
    )
    if isinstance(exc, kept_as_is):
        # The operator's business, not a passing fault: keep redis-py's own exception.
        return Failure(exc)
    if isinstance(exc, TRANSIENT_ERRORS):
        error = Unavailable(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return Failure(error)
    if isinstance(exc, redis_exceptions.ResponseError):
        return Failure(translate_error(str(exc)))
    return Failure(exc)


@dataclass(frozen=True)
class Failure:
    """A script's error reply, translated, to be raised inside the operation."""

    error: Exception


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


def advance(op: Op[T], reply: Any) -> Request | Done[T]:
    """Give ``op`` the reply to its last request; return its next request or its result."""
    try:
        if isinstance(reply, Failure):
            return op.throw(reply.error)
        return op.send(reply)
    except StopIteration as stop:
        return Done(stop.value)


def placed_in_parts(specs: object) -> list[int]:
    """The indices of the specs of a batch placed in parts: those with more required
    dependencies than one part. Invalid values are not: the one call refuses them."""
    if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
        return []
    wide = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, TaskSpec):
            continue
        lists = (spec.deps, spec.optional_deps)
        if any(isinstance(x, (str, bytes)) or not isinstance(x, Sequence) for x in lists):
            continue
        # The first part and every optional dependency travel in the schedule call.
        first = max(0, PLACE_PART - len(spec.optional_deps))
        if first < len(spec.deps) and len(spec.deps) + len(spec.optional_deps) <= MAX_DEPS:
            wide.append(i)
    return wide


def _first_call_edges(spec: TaskSpec) -> int:
    """The dependencies ``spec`` sends in its schedule call (a task placed in parts sends
    its first part there); 0 for lists the call itself refuses."""
    lists = (spec.deps, spec.optional_deps)
    if any(isinstance(x, (str, bytes)) or not isinstance(x, Sequence) for x in lists):
        return 0
    required, optional = len(spec.deps), len(spec.optional_deps)
    if required + optional <= MAX_DEPS:
        required = min(required, max(0, PLACE_PART - optional))
    return required + optional


def call_payloads(call: Call) -> list[bytes]:
    """The payloads a schedule call carries, in order."""
    args, payloads, pos = call.args, [], 2
    for _ in range(int(args[1])):
        fields = str(args[pos + 1]).split(" ")
        payloads.append(args[pos + 2])
        pos += 3 + int(fields[6]) + int(fields[7])
    return payloads


def payload_weights(call: Call) -> list[tuple[int, int]]:
    """(bytes, values) of each payload a schedule call carries, in order: the values are
    counted only when the bytes of the call (each payload's bound on its values) exceed
    ``MAX_PAYLOAD_VALUES_PER_CALL``."""
    payloads = call_payloads(call)
    sizes = [len(p) for p in payloads]
    if sum(sizes) <= limits.MAX_PAYLOAD_VALUES_PER_CALL:
        return list(zip(sizes, sizes, strict=True))
    return [(len(p), payload_values(p)) for p in payloads]


def schedule_batches(
    specs: Sequence[TaskSpec], sizes: Sequence[tuple[int, int]] | None = None
) -> list[list[int]]:
    """The positions of ``specs`` in schedule calls that each keep within the scripts'
    caps (``MAX_TASKS_PER_CALL`` tasks, ``MAX_EDGES_PER_CALL`` dependencies and, with
    ``sizes`` their payloads' (bytes, values) from :func:`payload_weights`,
    ``MAX_PAYLOAD_BYTES_PER_CALL`` and ``MAX_PAYLOAD_VALUES_PER_CALL``): one list (every
    position, in order) when the batch fits one call. Otherwise the batch's own
    dependencies come first, so that each call finds the tasks its tasks depend on."""
    if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
        return [[]]
    edges = [_first_call_edges(s) if isinstance(s, TaskSpec) else 0 for s in specs]
    weights = [w for w, _ in sizes] if sizes is not None else [0] * len(specs)
    values = [v for _, v in sizes] if sizes is not None else [0] * len(specs)
    if (
        len(specs) <= limits.MAX_TASKS_PER_CALL
        and sum(edges) <= limits.MAX_EDGES_PER_CALL
        and sum(weights) <= limits.MAX_PAYLOAD_BYTES_PER_CALL
        and sum(values) <= limits.MAX_PAYLOAD_VALUES_PER_CALL
    ):
        return [list(range(len(specs)))]
    at: dict[object, int] = {}
    for i, spec in enumerate(specs):
        if isinstance(spec, TaskSpec) and isinstance(spec.task_id, str):
            at.setdefault(spec.task_id, i)

    def inside(i: int) -> list[int]:
        spec = specs[i]
        if not isinstance(spec, TaskSpec) or not edges[i]:
            return []
        return [at[d] for d in (*spec.deps, *spec.optional_deps) if d in at]

    # Depth-first, dependencies before dependents (a cycle is left for the scripts).
    order: list[int] = []
    state = [0] * len(specs)
    for root in range(len(specs)):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, iter(inside(root)))]
        while stack:
            node, deps = stack[-1]
            nxt = next((d for d in deps if not state[d]), None)
            if nxt is None:
                stack.pop()
                state[node] = 2
                order.append(node)
            else:
                state[nxt] = 1
                stack.append((nxt, iter(inside(nxt))))
    batches: list[list[int]] = [[]]
    used = carried = walked = 0
    for i in order:
        full = len(batches[-1]) >= limits.MAX_TASKS_PER_CALL
        over = used + edges[i] > limits.MAX_EDGES_PER_CALL
        heavy = carried + weights[i] > limits.MAX_PAYLOAD_BYTES_PER_CALL
        many = walked + values[i] > limits.MAX_PAYLOAD_VALUES_PER_CALL
        if batches[-1] and (full or over or heavy or many):
            batches.append([])
            used = carried = walked = 0
        batches[-1].append(i)
        used += edges[i]
        carried += weights[i]
        walked += values[i]
    return batches


def decode_schedule_reply(specs: Sequence[TaskSpec], values: Sequence[Any]) -> list[Admitted]:
    """The :class:`Admitted` of each task from schedule.lua's own values: the versions,
    then, when a spec had an admission option, one letter per task (``n`` new, ``k`` kept)."""
    n = len(specs)
    if len(values) == n + 1:
        flags = _text(values[n])
    elif len(values) == n:
        flags = "n" * n
    else:
        raise ScriptError(f"schedule: {len(values)} values for {n} tasks")
    if len(flags) != n:
        raise ScriptError(f"schedule: {len(flags)} admission flags for {n} tasks")
    return [
        Admitted(spec.task_id, int(v), flag != "k")
        for spec, v, flag in zip(specs, values[:n], flags, strict=True)
    ]


def split_reply(script: str, reply: Sequence[Any]) -> tuple[int, list[Any]]:
    """(ids still propagating, the script's own values) of a script reply.

    Every script replies with the number of propagation jobs left first (0 for those
    that never propagate), so no transition can leave its dependents unsettled unseen.
    """
    if not reply:
        raise ScriptError(f"{script}: empty reply")
    return int(reply[0]), list(reply[1:])


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def _pairs(reply: Sequence[Any]) -> list[tuple[Any, Any]]:
    """``[(member, score), ...]`` of a WITHSCORES reply, flat or already paired."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(m, s) for m, s in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


def _mapping(reply: Any) -> Mapping[Any, Any]:
    """A HGETALL reply as a mapping, whether the client paired it or not."""
    if isinstance(reply, Mapping):
        return reply
    return dict(_pairs(reply))


def _one(command: tuple[Any, ...]) -> Commands:
    return Commands((command,), atomic=False)


# Reports (complete, fail, heartbeat, release) one script call carries: a longer list is
# sent in parts, each within the scripts' cap.
REPORTS_PER_CALL = limits.MAX_REPORTS_PER_CALL


def _parts(items: Sequence[T]) -> list[Sequence[T]]:
    return [items[i : i + REPORTS_PER_CALL] for i in range(0, len(items), REPORTS_PER_CALL)]


# TIME as seen by the node that owns KEYS[1] (the script does not touch the key).
SERVER_TIME_LUA = "return redis.call('TIME')"


# --------------------------------------------------------------------------- listing
#
# ``Ops.tasks`` lists one state without scanning the namespace: pending and terminal
# tasks from the per-state index (the ``states`` sorted set, newest first), ready tasks
# from the queue (due order), running tasks from the leases (lease deadline order).

TASKS_LIMIT_MAX = 1000
# Index entries one ``tasks`` call examines at most, as a multiple of its limit: stale
# entries and, with an ``fn`` filter, tasks of other functions count against it.
TASKS_BUDGET_FACTOR = 10
# With an fn filter, entries are read at least this many at a time.
TASKS_FILTER_CHUNK = 100

_INDEX_CODE = {
    State.PENDING: "p",
    State.SUCCEEDED: "s",
    State.FAILED: "f",
    State.CANCELLED: "c",
    State.BLOCKED: "b",
}
_INDEX_CURSOR = re.compile(r"[psfcb][0-9a-f]{14}.+", re.S)
_RANK_CURSOR = re.compile(r"(-?[0-9]{1,20}):(.+)", re.S)
# A ready listing's cursor into the ready set of the priority order starts with this.
RANKED_MARK = "~"


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


def state_index_member(state: State, updated_ms: int, task_id: str) -> bytes:
    """A task's member of the per-state index (``index_member`` in ``lua/lib/record.lua``)."""
    at = min(max(updated_ms, 0), MAX_MS)
    return b"%s%014x" % (_INDEX_CODE[state].encode(), MAX_MS - at) + task_id.encode("utf-8")


def _cursor_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _cursor_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class _Entry(NamedTuple):
    task_id: str
    member: bytes
    score: int | None
    cursor: str


def _match_entry(state: State, entry: _Entry, rec: Record) -> bool:
    """Whether an index, queue or lease entry is the task's current one."""
    if state is State.READY:
        return rec.state is State.READY and int(entry.member[8:22], 16) == rec.version
    if state is State.RUNNING:
        return rec.state is State.RUNNING
    return entry.member == state_index_member(rec.state, rec.updated_ms, entry.task_id)


# --------------------------------------------------------------------------- explain
#
# What ``Ops.explain`` answers. Every read it makes is bounded, whatever the size of the
# namespace: no scan of the tasks, at most EXPLAIN_LIMIT dependency states and
# EXPLAIN_LIMIT hops of a blocked task's path.

EXPLAIN_LIMIT = 50
# Every worker announces the functions it serves this often (the ``served`` hash).
SERVED_ANNOUNCE_S = 20.0
# A function counts as served while an announcement is at most this old (three
# periods: a worker is not taken for gone because one or two announcements failed).
SERVED_LIVE_S = 3 * SERVED_ANNOUNCE_S


class Reason(str, enum.Enum):
    """Why a task is not running (or that it is), as ``Scheduler.explain`` finds it."""

    RUNNING = "running"
    """It runs: ``worker`` holds its lease until ``lease_deadline``."""
    CANCEL_REQUESTED = "cancel_requested"
    """It runs, and its function was asked to stop."""
    LEASE_EXPIRED = "lease_expired"
    """It runs, but its lease deadline passed: the next reap retries or fails it."""
    SUCCEEDED = "succeeded"
    """It ran and succeeded."""
    FAILED = "failed"
    """It failed (``error``) and has no attempt left."""
    CANCELLED = "cancelled"
    """It was cancelled."""
    EXPIRED = "expired"
    """It was cancelled because it was not started by its deadline (after ``cancelled``);
    or, after ``blocked``, its root cause was."""
    BLOCKED = "blocked"
    """A required dependency chain failed or was cancelled (``blocked_by``)."""
    PLACING = "placing"
    """It is held: its dependencies are being placed in parts (a task scheduled with more
    than ``PLACE_PART`` of them), and it cannot run before the last part. A hold that
    stays means the submission stopped part way: schedule the task again (or cancel it)."""
    WAITING_ON_DEPS = "waiting_on_deps"
    """It is pending: ``remaining`` required (and ``optional_remaining`` optional)
    dependencies have not finished (``deps`` lists their states)."""
    NOT_DUE = "not_due"
    """It is queued and due at ``due_at`` (server clock), later than now."""
    UNSERVED = "unserved"
    """No live worker announced its function in the last ``SERVED_LIVE_S`` seconds."""
    CAPACITY = "capacity"
    """It is due, but ``running`` has reached the namespace's ``max_running``."""
    BEHIND = "behind"
    """It is due, with ``ahead`` queue entries before it."""
    NEXT = "next"
    """It is due and first in line: the next claim by a worker with a free slot takes it."""
    NOT_QUEUED = "not_queued"
    """It is ready but its queue entry is missing (data changed outside distsched)."""
    KEY_CAPPED = "key_capped"
    """It is due, but its fairness key ``fair_key`` runs ``key_running`` tasks, its cap
    ``key_cap``."""
    KEY_RATE = "key_rate"
    """It is due, but its fairness key used its rate (``key_rate`` tasks per ``key_per_s``
    seconds): its next token comes at ``key_next_at`` (server clock)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DepState:
    """A dependency of a pending task and its state (None: no record, or none readable)."""

    task_id: str
    state: State | None
    optional: bool = False


@dataclass(frozen=True)
class Explanation:
    """Why a task is not running (``Scheduler.explain``), read on the server's clock.

    ``reasons`` holds every reason found, the one that matters most first. Times are
    epoch seconds of the Redis server's clock, as ``server_time`` is.

    - ``attempts_left``: attempts not started yet (``max_attempts - attempt``).
    - ``due_at``, ``ahead`` (a ready task): when its queue entry is due, and how many
      queue entries come before it. ``ahead`` counts stale entries too (left by
      replaced or cancelled tasks, dropped when they reach the head), so it is at most
      the number of tasks that will be claimed first.
    - ``running`` / ``max_running``: the namespace's running tasks and bound (None: none).
    - ``served_at``: when a worker last announced the task's function (None: never;
      read for pending and ready tasks only).
    - ``deps`` (a pending task): the states of its first ``EXPLAIN_LIMIT`` dependencies
      in the order given, and ``deps_not_shown`` the number of the rest.
    - ``blocked_by``, ``root_state`` (a blocked task): the root cause, the path from it
      (at most ``EXPLAIN_LIMIT`` hops read: a longer path starts after its root), and
      the root's state now.
    - ``error``: a failed task's error, first line only; for a task that expired
      (cancelled, not started by its deadline), ``expired: not started by its deadline``.
    """

    task_id: str
    state: State
    version: int
    reasons: tuple[Reason, ...]
    server_time: float
    fn: str | None
    attempt: int
    max_attempts: int
    attempts_left: int
    worker: str | None
    lease_deadline: float | None
    cancel_requested: bool
    due_at: float | None
    ahead: int | None
    running: int
    max_running: int | None
    served_at: float | None
    remaining: int
    optional_remaining: int
    deps: tuple[DepState, ...]
    deps_not_shown: int
    blocked_by: BlockedBy | None
    root_state: State | None
    error: str | None
    updated_at: float
    fair_key: str | None = None
    key_running: int = 0
    key_cap: int | None = None
    key_rate: int | None = None
    key_per_s: float | None = None
    key_next_at: float | None = None

    @property
    def reason(self) -> Reason:
        """The reason that matters most."""
        return self.reasons[0]


def queue_member(priority: int, version: int, task_id: str) -> bytes:
    """The queue entry of a task's version (``queue_member`` in ``lua/lib/record.lua``)."""
    return b"%08x%014x" % (PRIORITY_MAX - priority, version) + task_id.encode("utf-8")


def _count_or_none(raw: Any) -> int | None:
    """A stored count, or None when absent or junk (the scripts ignore junk the same way)."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _minute_of(field_name: Any) -> int | None:
    """The minute of a per-minute counter field ``<minute>:<s|f>``; None for junk."""
    head = _bytes(field_name).split(b":", 1)[0]
    return int(head) if re.fullmatch(rb"-?[0-9]{1,15}", head) else None


def _state_or_none(raw: Any, task_id: str) -> State | None:
    if raw is None:
        return None
    try:
        return decode_record(raw, task_id).state
    except ScriptError:  # a corrupt record: its state is unknown
        return None


def _error_first_line(raw: Any) -> str | None:
    if not raw or raw[:1] != b"E":
        return None
    text: str = raw[1:].decode("utf-8", "replace")
    return text.strip().splitlines()[0] if text.strip() else None


def _parse_list_cursor(state: State, cursor: str) -> tuple[int, bytes]:
    """Check a ``tasks`` cursor against its state; (score, member) for the queue and
    leases, (0, member) for the index."""
    if state in _INDEX_CODE:
        if not _INDEX_CURSOR.fullmatch(cursor) or cursor[0] != _INDEX_CODE[state]:
            raise InvalidArgument("cursor", f"is not a cursor of a {state.value} listing")
        return 0, _cursor_bytes(cursor)
    if state is State.READY and cursor.startswith(RANKED_MARK):
        cursor = cursor[len(RANKED_MARK) :]
    found = _RANK_CURSOR.fullmatch(cursor)
    member = _cursor_bytes(found.group(2)) if found else b""
    if not found or (state is State.READY and not re.fullmatch(rb"[0-9a-f]{22}.+", member, re.S)):
        raise InvalidArgument("cursor", f"is not a cursor of a {state.value} listing")
    return int(found.group(1)), member


def _listed_info(
    state: State,
    entry: _Entry,
    raw_record: Any,
    raw_payload: Any,
    raw_result: Any,
    raw_deps: Any,
    raw_history: Any,
    fn: str | None,
) -> TaskInfo | None:
    """The TaskInfo of a listed entry, or None when the entry is stale (the task moved
    on, or its record cannot be read) or its function is not ``fn``."""
    if raw_record is None:
        return None
    try:
        rec = decode_record(raw_record, entry.task_id)
    except ScriptError:
        return None
    if not _match_entry(state, entry, rec):
        return None
    lease = entry.score if state is State.RUNNING else None
    info = decode_status(
        entry.task_id, raw_record, raw_payload, raw_result, lease, raw_deps,
        raw_history=raw_history,
    )  # fmt: skip
    if fn is not None and info.fn != fn:
        return None
    return info
