"""The script calls: one builder per Lua script, each validating its arguments
and returning a :class:`Call` (script name, keys, argv) without sending anything.

Also here: the bounds a call's arguments stay within (dependency edges settled per
call, reports per call, claim drops), and the splitting of a long batch of tasks
or reports into calls that each stay within the scripts' caps.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from distsched import limits
from distsched.errors import InvalidArgument
from distsched.keys import Keys
from distsched.model import Claim, JoinKind, JoinRule, Order, Spawn, TaskSpec
from distsched.schedules import MAX_BACKFILL_SLOTS, Definition, validate_name
from distsched.validate import (
    BACKOFF_CAP_MS,
    BACKOFF_MAX_S,
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY_MS,
    MAX_DEPS,
    MAX_MS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PURGE_TASKS_MAX,
    WAITPOINT_FN,
    _finite,
    _is_int,
    instant_seconds,
    seconds_to_ms,
    time_argument,
    timeout_ms,
    validate_cost,
    validate_dependency_ids,
    validate_deps,
    validate_fair_key,
    validate_fraction,
    validate_note,
    validate_task_id,
    validate_waitpoint_by,
    validate_worker_id,
    waitpoint_timeout_ms,
)
from distsched.wire.payload import encode_payload, encode_result, error_text, payload_values
from distsched.wire.records import _fair_prefix

T = TypeVar("T")


# The most dependency edges one script call settles (see lua/lib/settle.lua); sent as
# ARGV[1] to every script that settles dependents.
PROPAGATE_BUDGET = limits.MAX_PROPAGATE_BUDGET
# A task scheduled with more required dependencies than this is placed in parts of
# at most this many, each its own script call (lua/add_deps.lua), so that no call holds
# Redis for the whole list; it is held (never claimable) until the last part.
PLACE_PART = limits.MAX_EDGES_PER_CALL
# Bounds the time one claim or reap call may spend on lazily deleted entries.
CLAIM_MAX_DROP = 1000
# An idle worker claims again at least this often, so that no task waits longer than
# this for a wake-up that was lost (its worker died, a message was dropped).
IDLE_RECHECK_S = 2.0
# How long an idle registration lasts: a worker that has not claimed again by then is
# gone, and its entry no longer takes wake-ups.
IDLE_MS = int(IDLE_RECHECK_S * 3 * 1000)
REAP_BATCH = 1000
# The most deadline entries one housekeeping round handles (lua/expire.lua).
EXPIRE_BATCH = 1000


@dataclass(frozen=True)
class Call:
    """One script invocation: which script, its KEYS and its ARGV."""

    script: str
    keys: list[str]
    args: list[Any] = field(default_factory=list)


# --------------------------------------------------------------------------- scheduling


def admission_suffix(spec: TaskSpec) -> str:
    """The option tokens of ``spec``'s schedule-script spec (lua/lib/admit.lua): ''
    when it uses no admission policy, no deadline, no fairness key, no wait and no cost."""
    return (
        _policy_suffix(spec)
        + _deadline_suffix(spec)
        + _key_suffix(spec.key)
        + _wait_suffix(spec)
        + _cost_suffix(spec.cost)
    )


def _wait_suffix(spec: TaskSpec) -> str:
    """A waitpoint's option (lua/lib/admit.lua): wait=<timeout ms>."""
    if spec.waitpoint is None:
        return ""
    ms = waitpoint_timeout_ms(spec.waitpoint)
    for name in ("debounce", "deadline", "ttl"):
        if getattr(spec, name) is not None:
            raise InvalidArgument(name, "cannot be combined with waitpoint")
    if len(spec.deps) > PLACE_PART:
        raise InvalidArgument("deps", f"a waitpoint takes at most {PLACE_PART} dependencies")
    return f" wait={ms}"


def _cost_suffix(cost: object) -> str:
    # A cost of 1 travels as none: the wire of a task without a cost is unchanged.
    units = validate_cost(cost)
    return "" if units == 1 else f" cost={units}"


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
    ms = seconds_to_ms(instant_seconds(spec.deadline, "deadline"), "deadline")
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


def _plain_values(
    spec: TaskSpec, max_payload_bytes: int, trace: Mapping[str, str] | None
) -> tuple[str, str, bytes]:
    """Validate what every task has and return (task id, the spec's first five fields,
    payload): the whole of a plain task (:func:`is_plain`)."""
    task_id = validate_task_id(spec.task_id)
    mode, ms = time_argument(spec.run_at, spec.delay)
    if not _is_int(spec.priority) or not PRIORITY_MIN <= spec.priority <= PRIORITY_MAX:
        raise InvalidArgument("priority", f"must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    if not _is_int(spec.max_attempts) or not 1 <= spec.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument("max_attempts", f"must be an int in [1, {MAX_ATTEMPTS_LIMIT}]")
    backoff = _finite(spec.backoff)
    if backoff is None or not 0 <= backoff <= BACKOFF_MAX_S:
        raise InvalidArgument("backoff", f"must be a number of seconds in [0, {BACKOFF_MAX_S:g}]")
    limit = timeout_ms(spec.timeout)
    # A waitpoint's fn only labels it: no worker runs it.
    fn = spec.fn or (WAITPOINT_FN if spec.waitpoint is not None else spec.fn)
    payload = encode_payload(fn, spec.args, spec.kwargs, max_payload_bytes, trace, limit)
    fields = (
        f"{mode} {ms} {spec.priority} {spec.max_attempts} {seconds_to_ms(spec.backoff, 'backoff')}"
    )
    return task_id, fields, payload


def schedule_values(
    spec: TaskSpec,
    max_payload_bytes: int,
    trace: Mapping[str, str] | None = None,
    hold: bool = False,
) -> list[Any]:
    """Validate one task and return its schedule-script values (see lua/schedule.lua)."""
    task_id, fields, payload = _plain_values(spec, max_payload_bytes, trace)
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
    # The fixed fields travel as one argument: fewer arguments to encode per task.
    fields += (
        f" {1 if spec.allow_unknown else 0} {len(required)} {len(optional)}"
        f"{admission_suffix(spec)}{' hold=1' if hold else ''}"
    )
    return [task_id, fields, payload, *required, *optional]


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


def is_plain(spec: object) -> bool:
    """Whether ``spec`` is a plain task, which :func:`enqueue_call` can take: no
    dependency and no option (dedupe, debounce, deadline, ttl, key, waitpoint, cost)."""
    return (
        type(spec) is TaskSpec
        and type(spec.deps) is tuple
        and not spec.deps
        and type(spec.optional_deps) is tuple
        and not spec.optional_deps
        and spec.allow_unknown is False
        and spec.dedupe is False
        and spec.dedupe_window is None
        and spec.debounce is None
        and spec.deadline is None
        and spec.ttl is None
        and spec.key is None
        and spec.waitpoint is None
        and type(spec.cost) is int
        and spec.cost == 1
    )


def enqueue_call(
    keys: Keys,
    specs: Sequence[TaskSpec],
    max_payload_bytes: int,
    trace: Mapping[str, str] | None = None,
) -> Call:
    """The enqueue script's call (``lua/enqueue.lua``) for plain specs (:func:`is_plain`),
    checked as :func:`schedule_call` checks them."""
    args: list[Any] = [len(specs)]
    seen: set[str] = set()
    for spec in specs:
        task_id, fields, payload = _plain_values(spec, max_payload_bytes, trace)
        if task_id in seen:
            raise InvalidArgument("task_id", f"{task_id!r} appears twice in one batch")
        seen.add(task_id)
        args += (task_id, fields, payload)
    args.append(max_payload_bytes)
    return Call("enqueue", keys.for_script("enqueue"), args)


def _version_arg(version: object) -> str:
    """The optional version an in-place change is fenced by ('' for the current one)."""
    if version is None:
        return ""
    if not _is_int(version) or not 0 <= version <= MAX_MS:
        raise InvalidArgument("version", f"must be an int in [0, {MAX_MS}] or None")
    return str(version)


def amend_call(
    keys: Keys,
    task_id: object,
    *,
    priority: object = None,
    run_at: object = None,
    delay: object = None,
    max_attempts: object = None,
    version: object = None,
) -> Call:
    """The amend script's call (``lua/amend.lua``): change a task's priority, due time
    (``run_at`` or ``delay``, as ``schedule`` takes them) or ``max_attempts`` in place."""
    task_id = validate_task_id(task_id)
    fenced = _version_arg(version)
    if priority is not None and (
        not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        raise InvalidArgument("priority", f"must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    mode, ms = "", ""
    if run_at is not None or delay is not None:
        mode, when = time_argument(run_at, delay)
        ms = str(when)
    if max_attempts is not None and (
        not _is_int(max_attempts) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidArgument("max_attempts", f"must be an int in [1, {MAX_ATTEMPTS_LIMIT}]")
    if priority is None and not mode and max_attempts is None:
        raise InvalidArgument("priority", "give priority, run_at, delay or max_attempts")
    priority_arg = "" if priority is None else str(priority)
    attempts_arg = "" if max_attempts is None else str(max_attempts)
    args = [task_id, fenced, priority_arg, mode, ms, attempts_arg]
    return Call("amend", keys.for_script("amend"), args)


def pause_call(keys: Keys, action: str, task_id: object, version: object = None) -> Call:
    """The pause script's call (``lua/pause.lua``): ``action`` 'pause' or 'resume'."""
    if action not in ("pause", "resume"):
        raise InvalidArgument("action", "must be 'pause' or 'resume'")
    args = [action, validate_task_id(task_id), _version_arg(version)]
    return Call("pause", keys.for_script("pause"), args)


def cancel_call(keys: Keys, task_id: object) -> Call:
    return Call("cancel", keys.for_script("cancel"), [PROPAGATE_BUDGET, validate_task_id(task_id)])


# --------------------------------------------------------------------------- order and fairness


ORDER_REWRITE_MAX = 100_000
"""The most ready-set entries a change of order or aging rewrites in its one call."""


def order_call(keys: Keys, order: Order, aging_ms: int, most: int = ORDER_REWRITE_MAX) -> Call:
    """The order script's call: ``order`` with ``aging_ms`` ms of credit per priority point."""
    return Call("order", keys.for_script("order"), [order.value, aging_ms, most])


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
        f"tb:{key}",
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


# --------------------------------------------------------------------------- workers


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
    if not _is_int(n) or not 1 <= n <= limits.MAX_CLAIM:
        raise InvalidArgument("n", f"must be an int in [1, {limits.MAX_CLAIM}] (MAX_CLAIM)")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise InvalidArgument("request_id", "must be a non-empty str or None")
    worker = validate_worker_id(worker_id)
    args: list[Any] = [worker, n, lease_ms, CLAIM_MAX_DROP]
    if listening or request_id is not None:
        args += [keys.worker_channel(worker), IDLE_MS] if listening else ["", 0]
        args.append(request_id or "")
    return Call("claim", keys.for_script("claim"), args)


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


def progress_call(
    keys: Keys,
    claim: Claim,
    fraction: object = None,
    note: object = "",
    checkpoint: bytes | None = None,
) -> Call:
    """The progress script's call for ``claim``'s attempt: a progress report (``fraction``
    not None, with ``note``) and/or a checkpoint (``checkpoint`` not None: its msgpack
    bytes, b"" to clear it)."""
    token = _token_values([claim])
    note = validate_note(note)
    if fraction is None:
        if note:
            raise InvalidArgument("note", "must come with a fraction")
        if checkpoint is None:
            raise InvalidArgument("fraction", "a fraction or a checkpoint is needed")
        fraction_text = ""
    else:
        fraction_text = format(validate_fraction(fraction), ".17g")
    args: list[Any] = [*token, fraction_text, note]
    if checkpoint is None:
        args.append("0")
    else:
        if len(checkpoint) > limits.MAX_CHECKPOINT_BYTES:
            raise InvalidArgument(
                "checkpoint",
                f"must be at most {limits.MAX_CHECKPOINT_BYTES} bytes as msgpack "
                f"(MAX_CHECKPOINT_BYTES), got {len(checkpoint)}",
            )
        args += ["1", checkpoint]
    return Call("progress", keys.for_script("progress"), args)


def encode_checkpoint(value: object) -> bytes:
    """A checkpoint value as stored: msgpack, like a result (b"" for None)."""
    try:
        return encode_result(value)
    except InvalidArgument as exc:
        raise InvalidArgument("checkpoint", str(exc).partition(": ")[2]) from None


def heartbeat_call(keys: Keys, claims: Sequence[Claim], lease_ms: int) -> Call:
    return Call(
        "heartbeat", keys.for_script("heartbeat"), [lease_ms, len(claims), *_token_values(claims)]
    )


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


def finish_call(
    keys: Keys,
    reports: Sequence[tuple[Claim, object]],
    claim: Call,
    encoded: bool = False,
) -> Call:
    """The finish script's call (``lua/finish.lua``): ``reports`` as :func:`complete_call`
    sends them, then the arguments of ``claim`` (a :func:`claim_call`)."""
    if claim.script != "claim":
        raise InvalidArgument("claim", "must be a claim call")
    done = complete_call(keys, reports, encoded)
    return Call("finish", keys.for_script("finish"), [*done.args, *claim.args])


def _spawned_values(spec: object, field_name: str, max_payload_bytes: int) -> list[Any]:
    """One spawned task's values (lua/spawn.lua): a TaskSpec with no dependencies and no
    dedupe or debounce (a spawned id is always new)."""
    if not isinstance(spec, TaskSpec):
        raise InvalidArgument(field_name, f"must hold TaskSpec values, got {type(spec).__name__}")
    if spec.deps or spec.optional_deps:
        raise InvalidArgument(
            f"{field_name}.deps",
            "a spawned task has no dependencies of its own (the join depends on every child)",
        )
    if spec.dedupe or spec.dedupe_window is not None or spec.debounce is not None:
        raise InvalidArgument(f"{field_name}.dedupe", "a spawned task is always new")
    return schedule_values(spec, max_payload_bytes)


def _join_rule(spawn: Spawn, n: int) -> str:
    """The join rule as spawn.lua takes it ('' without a join)."""
    rule = spawn.rule
    if not isinstance(rule, JoinRule) or not isinstance(rule.kind, JoinKind):
        raise InvalidArgument(
            "rule", "must be a JoinRule (JoinRule.ALL, .any(), .at_least(k), .first(n))"
        )
    if spawn.join is None:
        if rule != JoinRule():
            raise InvalidArgument("rule", "needs a join task")
        return ""
    if rule.kind is JoinKind.ALL or rule.kind is JoinKind.ANY:
        return str(rule.kind)
    if not _is_int(rule.count) or not 1 <= rule.count <= n:
        raise InvalidArgument("rule", f"{rule.kind} needs a count in [1, number of children]")
    return f"{rule.kind} {rule.count}"


def spawn_call(keys: Keys, claim: Claim, spawn: object, max_payload_bytes: int) -> Call:
    """spawn.lua's call: ``claim`` succeeds with ``spawn`` (:class:`Spawn`)."""
    if not isinstance(spawn, Spawn):
        raise InvalidArgument("spawn", f"must be a Spawn, got {type(spawn).__name__}")
    children = spawn.children
    if isinstance(children, (str, bytes)) or not isinstance(children, Sequence):
        raise InvalidArgument("children", "must be a sequence of TaskSpec")
    if not 1 <= len(children) <= limits.MAX_SPAWN_CHILDREN:
        raise InvalidArgument(
            "children",
            f"must hold 1 to {limits.MAX_SPAWN_CHILDREN} tasks per spawn (MAX_SPAWN_CHILDREN)",
        )
    args: list[Any] = [PROPAGATE_BUDGET, *_token_values([claim])]
    args.append(encode_result(spawn.result))
    args.append(_join_rule(spawn, len(children)))
    window = spawn.window
    if window is not None and (not _is_int(window) or not 1 <= window <= len(children)):
        raise InvalidArgument("window", "must be None or an int in [1, number of children]")
    args.append(window or 0)
    args.append(len(children))
    seen = {claim.task_id}
    specs = [*children, *([spawn.join] if spawn.join is not None else [])]
    for i, spec in enumerate(specs):
        name = "join" if i == len(children) else "children"
        values = _spawned_values(spec, name, max_payload_bytes)
        if values[0] in seen:
            what = "is the parent's own id" if values[0] == claim.task_id else "appears twice"
            raise InvalidArgument(f"{name}.task_id", f"{values[0]!r} {what}")
        seen.add(values[0])
        args.extend(values)
    args.append(max_payload_bytes)
    return Call("spawn", keys.for_script("spawn"), args)


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
    if not _is_int(limit) or limit < 1:
        raise InvalidArgument("limit", "must be an int >= 1")
    return Call(
        "reap",
        keys.for_script("reap"),
        [PROPAGATE_BUDGET, BACKOFF_CAP_MS, limit, target],
    )


WAITPOINT_ACTIONS = ("complete", "fail")


def waitpoint_call(
    keys: Keys,
    action: str,
    task_id: object,
    version: object = None,
    value: object = None,
    by: object = "",
) -> Call:
    """The waitpoint script's call (lua/waitpoint.lua): ``complete`` with ``value`` as
    its payload (any msgpack-encodable value, None for none), ``fail`` with ``value`` as
    its error text, for ``version`` (None: the current one); or ``arm`` its timer."""
    task = validate_task_id(task_id)
    if action == "arm":
        return Call("waitpoint", keys.for_script("waitpoint"), [PROPAGATE_BUDGET, "arm", task])
    if action not in WAITPOINT_ACTIONS:
        raise InvalidArgument("action", "must be complete or fail")
    if version is not None and (not _is_int(version) or not 1 <= version <= MAX_MS):
        raise InvalidArgument("version", "must be None or an int >= 1")
    data: bytes | str
    if action == "complete":
        try:
            data = encode_result(value)
        except InvalidArgument:
            raise InvalidArgument("payload", "cannot be encoded with msgpack") from None
    else:
        if not isinstance(value, str) or not value.strip():
            raise InvalidArgument("error", "must be a non-empty str")
        data = error_text(value)
    return Call(
        "waitpoint",
        keys.for_script("waitpoint"),
        [
            PROPAGATE_BUDGET,
            action,
            task,
            "" if version is None else version,
            data,
            validate_waitpoint_by(by),
        ],
    )


def expire_call(keys: Keys, limit: object = EXPIRE_BATCH) -> Call:
    if not _is_int(limit) or limit < 1:
        raise InvalidArgument("limit", "must be an int >= 1")
    return Call("expire", keys.for_script("expire"), [PROPAGATE_BUDGET, limit])


def leave_call(keys: Keys, worker_id: object) -> Call:
    worker = validate_worker_id(worker_id)
    return Call("leave", keys.for_script("leave"), [keys.worker_channel(worker), worker])


def propagate_call(keys: Keys, budget: int = PROPAGATE_BUDGET) -> Call:
    return Call("propagate", keys.for_script("propagate"), [budget])


# --------------------------------------------------------------------------- housekeeping


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


# ------------------------------------------------------------------ retries and dependencies


def retry_call(keys: Keys, task_id: object, cascade: object) -> Call:
    if not isinstance(cascade, bool):
        raise InvalidArgument("cascade", "must be a bool")
    return Call(
        "retry",
        keys.for_script("retry"),
        [PROPAGATE_BUDGET, validate_task_id(task_id), "1" if cascade else "0"],
    )


def dep_results_call(
    keys: Keys, task_id: object, ids: object = None, version: object = None
) -> Call:
    """The dep_results script's call: the results of ``task_id``'s dependencies (all of
    them, or the ``ids`` given), fenced by ``version`` when given (a running attempt's)."""
    task_id = validate_task_id(task_id)
    asked = validate_dependency_ids(ids)
    if version is not None and (not _is_int(version) or not 1 <= version <= MAX_MS):
        raise InvalidArgument("version", "must be None or a task version (an integer >= 1)")
    head = [task_id, "" if version is None else version]
    if asked is None:
        return Call("dep_results", keys.for_script("dep_results"), [*head, 0])
    return Call("dep_results", keys.for_script("dep_results"), [*head, len(asked), *asked])


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


def status_reads(keys: Keys) -> list[str]:
    """The hashes read by ``status`` (HGET of the task id in each), in order."""
    return [
        keys.tasks,
        keys.payloads,
        keys.results,
        keys.deps,
        keys.blocked,
        keys.history,
        keys.paused,
        keys.progress,
        keys.costs,
    ]


# --------------------------------------------------------------------------- recurring schedules


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
    tagged: bool = False,
) -> Call:
    """The fire script's call (see lua/fire.lua): ``slots`` are (slot ms, run_at ms);
    ``tagged``: the slots' task ids are ``{<name>}@<slot ms>`` (a striped namespace,
    :func:`~distsched.schedules.tags_slot_ids`), else ``<name>@<slot ms>``."""
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
    if tagged:
        args.append("tagged")
    return Call("fire", keys.for_script("fire"), args)


# --------------------------------------------------------------------------- batches


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
    """(bytes, values) of each payload a schedule or enqueue call carries, in order: the
    values are counted only when the bytes of the call (each payload's bound on its
    values) exceed ``MAX_PAYLOAD_VALUES_PER_CALL``."""
    payloads = call.args[3::3] if call.script == "enqueue" else call_payloads(call)
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
    return _cut_batches(_dependencies_first(specs, edges), edges, weights, values)


def _dependencies_first(specs: Sequence[object], edges: list[int]) -> list[int]:
    """The positions of ``specs``, depth-first, each task's dependencies inside the batch
    before it (a cycle is left for the scripts)."""
    at: dict[object, int] = {}
    for i, spec in enumerate(specs):
        if isinstance(spec, TaskSpec) and isinstance(spec.task_id, str):
            at.setdefault(spec.task_id, i)

    def inside(i: int) -> list[int]:
        spec = specs[i]
        if not isinstance(spec, TaskSpec) or not edges[i]:
            return []
        return [at[d] for d in (*spec.deps, *spec.optional_deps) if d in at]

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
    return order


def _cut_batches(
    order: list[int], edges: list[int], weights: list[int], values: list[int]
) -> list[list[int]]:
    """``order`` cut into calls, a new one wherever the next task would pass a cap."""
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


# Reports (complete, fail, heartbeat, release) one script call carries: a longer list is
# sent in parts, each within the scripts' cap.
REPORTS_PER_CALL = limits.MAX_REPORTS_PER_CALL


def _parts(items: Sequence[T]) -> list[Sequence[T]]:
    return [items[i : i + REPORTS_PER_CALL] for i in range(0, len(items), REPORTS_PER_CALL)]


# The namespace's clock as seen by the node that owns KEYS[1], its meta hash: the
# server's TIME moved forward by the test clock (meta clock_ms, see lua/lib/run.lua).
# The server's memory section, from the node that holds the key named (INFO needs the
# user's right to it, inside a script too).
MEMORY_INFO_LUA = "return redis.call('INFO', 'memory')"
SERVER_TIME_LUA = """local t = redis.call('TIME')
local n = tonumber(redis.call('HGET', KEYS[1], 'clock_ms'))
if not n or n < 0 or n ~= math.floor(n) or n > 2199023255552 then n = 0 end
return { tonumber(t[1]) + math.floor(n / 1000), tonumber(t[2]) + (n % 1000) * 1000 }"""
