"""What users receive from the scheduler or pass to it: states, task specs and
views, orders, fairness keys, stats, worker entries and explanations.

Plain values only (enums, frozen dataclasses, TypedDicts, NamedTuples): no I/O, no
validation beyond what a value's own constructor checks, no knowledge of how Redis
stores any of it (that is :mod:`distsched.wire.records`).
"""

from __future__ import annotations

import datetime as _dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, ClassVar, NamedTuple, TypedDict

Duration = float | _dt.timedelta
"""A length of time the API takes: seconds (an int or a float) or a ``datetime.timedelta``."""

# --------------------------------------------------------------------------- tasks


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


class Change(str, enum.Enum):
    """What ``Scheduler.amend``, ``pause_task`` and ``resume_task`` did to a task."""

    APPLIED = "applied"
    """The change was made."""
    UNCHANGED = "unchanged"
    """Nothing to do: the task was paused already (pause), or was not paused (resume)."""
    NOT_QUEUED = "not_queued"
    """Nothing changed: the task is not queued (ready or pending), or for ``max_attempts``
    not queued or running."""
    NOT_FOUND = "not_found"
    """Nothing changed: there is no such task."""
    CONFLICT = "conflict"
    """Nothing changed: the ``version`` given is not the task's current one."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Changed:
    """The answer of ``Scheduler.amend``, ``pause_task`` or ``resume_task``: what was done
    (``change``), and the task's state and version after the call (None when not found)."""

    task_id: str
    change: Change
    state: State | None
    version: int | None

    @property
    def applied(self) -> bool:
        return self.change is Change.APPLIED


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
class Progress:
    """The last progress a running version of a task reported
    (``current_task().report_progress``, ``Scheduler.report_progress``).

    ``fraction`` is in [0, 1] (None when the version saved a checkpoint but reported
    no fraction yet), ``note`` a short text (at most 200 bytes of UTF-8), ``attempt``
    the attempt that reported last, ``updated_at`` when (epoch seconds, server clock),
    and ``checkpoint_bytes`` the size of the version's checkpoint (None: none saved).
    Progress and checkpoint belong to one version: they outlive a crashed or lost
    attempt, and a new version of the task starts without them.
    """

    version: int
    attempt: int
    fraction: float | None
    note: str
    updated_at: float
    checkpoint_bytes: int | None = None


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
    paused: bool = False
    """The task is paused (``Scheduler.pause_task``): queued (ready or pending) but never
    claimed until ``resume_task``. ``remaining`` does not count the pause."""
    paused_at: float | None = None
    """When it was paused (epoch seconds, server clock), None when it is not."""
    progress: Progress | None = None
    """The last progress the task's current version reported (None: none yet)."""
    waitpoint: WaitpointInfo | None = None
    """Set when the task is a waitpoint (``Scheduler.create_waitpoint``): what it waits
    for and when it times out; None for a task workers run."""
    cost: int = 1
    """The units of its fairness key's rate it takes when it starts (``TaskSpec.cost``)."""
    workflow: Workflow | None = None
    """Its parent, workflow root and join when it was spawned (:class:`Spawn`), or for a
    join its rule and progress; None for a task that was not spawned."""

    @property
    def checkpoint_kept(self) -> bool:
        """Whether the current version keeps a checkpoint for its next attempt."""
        return bool(self.progress is not None and self.progress.checkpoint_bytes)


@dataclass(frozen=True)
class DependencyResult:
    """What one dependency of a task holds now (``Scheduler.dependency_results``,
    ``TaskContext.dependency_results``).

    ``state`` is the dependency's current state, None when it is gone (purged or
    forgotten) or its record cannot be read (``error`` then says which); ``version`` is
    its current version. ``result`` is the decoded result of that version when it
    succeeded; ``error`` the error text its last attempt stored (a failure, an expiry)
    or why there is none. ``optional`` says whether the task depends on it optionally.
    """

    task_id: str
    optional: bool
    state: State | None
    version: int | None
    result: Any = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        """True when the dependency succeeded: ``result`` is its result."""
        return self.state is State.SUCCEEDED


@dataclass(frozen=True)
class WaitpointInfo:
    """The waitpoint side of a task (``TaskInfo.waitpoint``).

    A waitpoint is a task no worker runs: it stays ``pending`` until a call from any
    service completes it (``succeeded``, the payload its result) or fails it, or it
    times out (``failed``, error ``timed out waiting for completion``).

    - ``timeout``: seconds it waits for its completion once it awaits nothing else.
    - ``waiting``: True while the current version waits for its completion (its own
      dependencies, if any, all settled); False while they are still awaited, and once
      it ended.
    - ``times_out_at``: epoch seconds (server clock) when it times out, while waiting.
    - ``by``: who completed or failed the current version (the ``by`` of the call),
      None when no call did.
    """

    timeout: float
    waiting: bool
    times_out_at: float | None
    by: str | None = None


@dataclass(frozen=True)
class TaskPage:
    """One page of ``Scheduler.tasks``: the tasks, and the cursor of the next page
    (None when there is no more)."""

    items: tuple[TaskInfo, ...]
    cursor: str | None


@dataclass(frozen=True)
class FailureGroup:
    """Failed tasks that share one error (``Scheduler.failures``).

    ``error`` is the group's key: the error's last line with every number and hex id
    replaced by ``#`` (see :func:`distsched.ops.failures.error_group`); ``sample`` is
    the last line of one member's error as stored; ``examples`` are up to 5 task ids.
    """

    error: str
    count: int
    sample: str
    examples: tuple[str, ...]


@dataclass(frozen=True)
class FailurePage:
    """One page of ``Scheduler.failures``: the failed tasks it examined grouped by
    error (largest group first), how many it examined, and the cursor of the next page
    (None when there is no more). Merge pages with
    :func:`distsched.ops.failures.merge_groups`."""

    groups: tuple[FailureGroup, ...]
    examined: int
    cursor: str | None


@dataclass(frozen=True)
class BulkOutcome:
    """What ``retry_failures`` or ``purge_failures`` did: failed tasks examined, those
    whose error matched, those retried or removed (``done``), and those skipped because
    they moved on meanwhile (or, for a purge, still tell their dependents they ended)."""

    examined: int
    matched: int
    done: int
    skipped: int


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
    - ``waitpoint``: make the task a waitpoint timing out after that many seconds
      (``Scheduler.create_waitpoint``): no worker runs it; it waits, pending, for
      ``Scheduler.complete_waitpoint`` or ``fail_waitpoint`` from any service once its
      own ``deps`` have succeeded. ``fn`` then only labels it (default
      ``distsched.waitpoint``); not with ``debounce``, ``deadline`` or ``ttl``.
    - ``cost``: the units of its fairness key's rate limit the task takes when it starts
      (an int in [1, 10^9], 1 unless given), so that a key's rate counts tokens or
      requests rather than tasks: with ``set_key(key, rate=40_000, per=60)`` a task of
      ``cost=1_200`` starts only once its key's bucket holds 1,200 units. A task given no
      key takes the default key's units. On a key without a rate it changes nothing; a
      cost above the rate its key has when scheduled is refused (``InvalidArgument``),
      since it could never start (README, "Tenants and fairness").
    """

    task_id: str
    fn: str = ""
    _: KW_ONLY
    run_at: float | _dt.datetime | None = None
    priority: int = 0
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    delay: Duration | None = None
    deps: Sequence[str] = ()
    optional_deps: Sequence[str] = ()
    max_attempts: int = 1
    backoff: Duration = 1.0
    allow_unknown: bool = False
    dedupe: bool = False
    dedupe_window: Duration | None = None
    debounce: Duration | None = None
    deadline: float | _dt.datetime | None = None
    ttl: Duration | None = None
    key: str | None = None
    timeout: Duration | None = None
    waitpoint: Duration | None = None
    cost: int = 1


class JoinKind(str, enum.Enum):
    """When the join task of a spawn (:class:`Spawn`) may run."""

    ALL = "all"
    """Every child succeeded (a failed child blocks the join, as any failed dependency)."""
    ANY = "any"
    """One child succeeded; blocked when every child failed."""
    AT_LEAST = "at_least"
    """``count`` children succeeded; blocked once fewer than ``count`` still can."""
    FIRST = "first"
    """``count`` children succeeded; the children not ended then are cancelled."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class JoinRule:
    """A join's rule: :attr:`ALL` (the default), ``JoinRule.any()``,
    ``JoinRule.at_least(k)`` or ``JoinRule.first(n)``."""

    kind: JoinKind = JoinKind.ALL
    count: int = 0
    """The children that must succeed (``at_least`` and ``first``; 1 for ``any``)."""

    ALL: ClassVar[JoinRule]

    @classmethod
    def any(cls) -> JoinRule:
        """Ready when one child succeeded; blocked when every child failed."""
        return cls(JoinKind.ANY, 1)

    @classmethod
    def at_least(cls, k: int) -> JoinRule:
        """Ready when ``k`` children succeeded; blocked once fewer than ``k`` still can."""
        return cls(JoinKind.AT_LEAST, k)

    @classmethod
    def first(cls, n: int) -> JoinRule:
        """Ready when ``n`` children succeeded; the children not ended yet are cancelled."""
        return cls(JoinKind.FIRST, n)

    def __str__(self) -> str:
        if self.kind is JoinKind.ALL or self.kind is JoinKind.ANY:
            return str(self.kind)
        return f"{self.kind} {self.count}"


JoinRule.ALL = JoinRule()


@dataclass(frozen=True)
class Spawn:
    """What a task function returns to end with children (fan-out decided at run time).

    The worker reports the task succeeded and adds ``children`` (each ready at once, or
    at its own ``run_at``/``delay``) and ``join`` (a task that depends on every child and
    runs by ``rule``) in one atomic step, fenced by the attempt: an attempt whose lease
    was lost, or that crashed before reporting, adds nothing, and the next attempt
    spawns again. Give children ids derived from the parent's (``f"{parent}:{i}"``):
    spawned ids must be new, so a spawn can never add a task twice.

    - ``children``: :class:`TaskSpec` values with no ``deps``/``optional_deps`` and no
      ``dedupe``/``debounce``; at most ``MAX_SPAWN_CHILDREN`` (1000).
    - ``join``: the task that runs after the children (no ``deps`` of its own), or None.
    - ``rule``: when the join runs: ``JoinRule.ALL`` (every child succeeded), ``any()``,
      ``at_least(k)`` or ``first(n)`` (the rest cancelled).
    - ``window``: at most this many children are ready or running at once; the others
      wait, in the order given, until an earlier one ends (None: no window).
    - ``result``: the parent's own result (what ``Scheduler.result`` returns).
    """

    children: Sequence[TaskSpec]
    _: KW_ONLY
    join: TaskSpec | None = None
    rule: JoinRule = JoinRule()
    window: int | None = None
    result: Any = None


@dataclass(frozen=True)
class Workflow:
    """Where a spawned task stands in its workflow (``TaskInfo.workflow``).

    ``parent``: the task whose completion spawned it; ``root``: the workflow's first
    task; ``join``: the join of its spawn (None: none, or it is the join). For a join,
    ``rule`` and ``children``/``succeeded``/``failed`` count its children. For a child
    held by a window, ``window_waiting`` is True and ``window_running`` counts the
    children of its parent that hold a slot (``window`` of them at most).
    """

    parent: str
    root: str
    join: str | None = None
    is_join: bool = False
    rule: JoinRule | None = None
    children: int = 0
    succeeded: int = 0
    failed: int = 0
    window: int | None = None
    window_running: int = 0
    window_waiting: bool = False


class Options(TypedDict, total=False):
    """How a task runs, apart from what it calls: the fields of :class:`TaskSpec` but
    ``fn``, ``args`` and ``kwargs`` (a typed task's ``options()`` takes these)."""

    run_at: float | _dt.datetime | None
    priority: int
    delay: Duration | None
    deps: Sequence[str]
    optional_deps: Sequence[str]
    max_attempts: int
    backoff: Duration
    allow_unknown: bool
    dedupe: bool
    dedupe_window: Duration | None
    debounce: Duration | None
    deadline: float | _dt.datetime | None
    ttl: Duration | None
    key: str | None
    timeout: Duration | None
    waitpoint: Duration | None
    cost: int


class TaskOptions(Options, total=False):
    """The keyword options of ``schedule``/``submit``: the fields of :class:`TaskSpec`."""

    fn: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None


@dataclass(frozen=True)
class Admitted:
    """What scheduling one task did: the version that now stands for ``task_id``.

    ``created`` is False when ``dedupe`` kept an existing version (then ``version`` is
    that version, and nothing was written), True when the call wrote a new one.
    """

    task_id: str
    version: int
    created: bool


# --------------------------------------------------------------------------- order and fairness


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


@dataclass(frozen=True)
class KeyInfo:
    """One fairness key of a namespace (``""`` is the default key of tasks given none).

    ``cap`` is its own cap (None: the namespace default ``default_cap`` applies, None: no
    cap); ``weight`` its share of claims; ``running`` the tasks a fair claim started that
    still run; ``queued`` its ready tasks (stale entries included until claims drop them);
    ``turn``: ``"ready"`` (takes turns now), ``"waiting"`` (its head is not due yet),
    ``"capped"`` (at its cap) or ``"idle"`` (no ready work); a key over its rate limit
    (``rate`` units per ``per_s`` seconds, a task taking its ``cost`` of them, 1 unless
    given) is ``"waiting"`` until its head task's units are there; ``units`` holds the
    units available now.
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
    units: int | None = None
    """The units of its rate limit in its bucket now (None: no rate): a task of cost ``c``
    (``TaskSpec.cost``) starts once ``c`` are there, and takes them."""

    @property
    def units_used(self) -> int | None:
        """The units of its rate taken and not refilled yet (``rate - units``; None: no
        rate)."""
        if self.rate is None or self.units is None:
            return None
        return max(0, self.rate - self.units)


class KeyLoad(TypedDict):
    """One fairness key in ``stats()["keys"]``: its running and queued tasks, and how long
    its first queued task has been due (``ready_wait_s``; None when none is due)."""

    key: str
    running: int
    queued: int
    cap: int | None
    ready_wait_s: float | None


# --------------------------------------------------------------------------- stats


STATS_TOP_KEYS = 10
"""How many fairness keys ``stats()`` shows (most running, then most queued)."""


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


class TaskRow(NamedTuple):
    """One task as :meth:`Ops.scan_tasks` lists it: its record, without payload or edges."""

    task_id: str
    state: State
    version: int
    attempt: int
    updated_at: float  # epoch seconds, server clock


class Stats(TypedDict):
    """A namespace at a glance (``Scheduler.stats``)."""

    counts: dict[str, int]
    """Tasks per state (every :class:`State` value is present). ``counts["ready"]`` is
    every queued task, due or not: ``due + scheduled`` (see :func:`stage_counts`)."""
    scheduled: int
    """Of the ready tasks, those not due yet (``run_at`` after the server's now): delayed,
    backing off before a retry, or handed back with a delay. Counted from the queue
    entries scored after now, each count O(log n); while stale entries exist, the first
    100 of them are checked against the task records and the stale ones left out (a
    stale entry further on counts until it is dropped). In a fair namespace only the
    tasks of the first 100 keys with queued work are counted (the tasks of further keys
    count as due)."""
    due: int
    """Of the ready tasks, those due now: ``counts["ready"] - scheduled``."""
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


def stage_counts(stats: Stats) -> dict[str, int]:
    """Tasks per stage as people read them: the state counts, with the ready tasks
    split into ``scheduled`` (not due yet) and ``ready`` (due now), in that order.
    The CLI, the dashboard and the metrics show these."""
    shown: dict[str, int] = {}
    for state, n in stats["counts"].items():
        if state == State.READY.value:
            shown["scheduled"] = stats["scheduled"]
            shown[state] = stats["due"]
        else:
            shown[state] = n
    return shown


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


# --------------------------------------------------------------------------- workers


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
    # A worker of a pool (``WorkerPool``): the namespaces the pool serves, in its order,
    # each ``name:weight`` (weighted) or ``name`` (strict order); () for a plain worker.
    serves: tuple[str, ...] = ()

    def stamped(self, now: float) -> WorkerInfo:
        """This entry as written at server time ``now`` (started then too, if unset)."""
        return replace(
            self, started=self.started or now, last_heartbeat=now, alive=True, seen_ago=0.0
        )

    @property
    def drop_after_s(self) -> float:
        """How long after its last heartbeat the entry is dropped from the registry."""
        return WORKER_DROP_LEASES * max(self.lease_s, self.heartbeat_s)


# --------------------------------------------------------------------------- recurring schedules


@dataclass(frozen=True)
class Fired:
    """What one fire call did: ``moved`` when another caller fired first (or the schedule
    changed), else the tasks created, the slots skipped and the last task created."""

    moved: bool
    created: int
    skipped: int
    last_task: str | None


# --------------------------------------------------------------------------- explain


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
    WAITPOINT = "waitpoint"
    """It is a waitpoint waiting for an external completion (``complete_waitpoint`` or
    ``fail_waitpoint`` from any service); it times out at ``waitpoint_times_out_at``
    (server clock). No worker runs it. Before ``waiting_on_deps``: a waitpoint whose own
    dependencies have not all succeeded yet; its timeout starts after them."""
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
    PAUSED = "paused"
    """It is queued but paused (``Scheduler.pause_task``) since ``paused_at``: no worker
    claims it until ``resume_task``."""
    WINDOW = "window"
    """It is a spawned child waiting for a slot of its parent's window (``workflow``):
    ``window_running`` of its siblings hold one; it becomes ready when one of them ends."""
    KEY_RATE = "key_rate"
    """It is due, but its fairness key used its rate (``key_rate`` units per ``key_per_s``
    seconds, ``key_units`` left): the units its next task takes (its ``cost``, 1 unless
    given) are there at ``key_next_at`` (server clock)."""
    COST_OVER_RATE = "cost_over_rate"
    """Its ``cost`` is more than its fairness key's whole rate (``key_rate`` units, the rate
    lowered after the task was scheduled): it starts only when the key's bucket is full,
    and takes all of it."""

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
    - ``progress``: the last progress the current version reported (any state: a task
      retried after a crash shows how far its last attempt got).
    - ``fair_key`` (a ready task of a fair namespace) and its key's ``key_running``,
      ``key_cap``, ``key_rate`` units per ``key_per_s`` seconds and ``key_units`` (the
      units in its bucket now); ``cost``: the units the task takes when it starts (read
      there, where a key's rate can apply; 1 for other tasks, ``status`` gives any task's).
    - ``error``: a failed task's error on one line: for a traceback, its last
      ``Type: message`` line (the exception raised); for a task that expired
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
    paused_at: float | None = None
    progress: Progress | None = None
    """The last progress the task's current version reported, and the size of the
    checkpoint it keeps (None: neither)."""
    root_error: str | None = None
    """A blocked task's root cause's error line, when that root failed."""
    waitpoint_timeout: float | None = None
    """A waitpoint's timeout (seconds); None for a task workers run."""
    waitpoint_times_out_at: float | None = None
    """When a waitpoint waiting for its completion times out (server clock)."""
    key_units: int | None = None
    cost: int = 1
    workflow: Workflow | None = None
    """Its parent, root and join when it was spawned; a join's rule and progress."""

    @property
    def reason(self) -> Reason:
        """The reason that matters most."""
        return self.reasons[0]
