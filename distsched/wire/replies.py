"""Decoders of script and command replies into the values of
:mod:`distsched.model`, and :func:`translate_error`, which turns a script's
refusal text into the matching :mod:`distsched.errors` exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, NamedTuple

from distsched import limits
from distsched.errors import (
    BusyError,
    ConflictError,
    CycleError,
    DependencyResultsTooLarge,
    DependencyUnavailable,
    InvalidArgument,
    NotADependencyError,
    NotFoundError,
    PayloadTooLarge,
    ScriptError,
    TaskBlocked,
    TaskCancelled,
    TaskFailed,
    Unavailable,
    UnknownDependencyError,
)
from distsched.model import (
    Admitted,
    AttemptInfo,
    BlockedBy,
    Change,
    Changed,
    Claim,
    DependencyResult,
    Fired,
    KeyInfo,
    Order,
    Outcome,
    State,
    Stats,
    TaskInfo,
    TaskSpec,
    Wait,
    WaitpointInfo,
    WaitReason,
)
from distsched.validate import PRIORITY_MAX
from distsched.wire.calls import DEFAULT_RETENTION_S
from distsched.wire.payload import (
    READ_DEPTH,
    _bytes,
    _text,
    decode_payload_full,
    decode_value,
    unpack_error,
)
from distsched.wire.records import (
    Record,
    _count_or_none,
    _decode_rate,
    _fair_prefix,
    _fairq_entry_due,
    _pair_of,
    bucket_units,
    decode_cause,
    decode_cost,
    decode_deps_list,
    decode_history,
    decode_order,
    decode_paused,
    decode_progress,
    decode_record,
    state_index_member,
)


def _decode_key_info(key: str, replies: Sequence[Any], now_ms: int | None = None) -> KeyInfo:
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
        units=None if now_ms is None else _whole_units(bucket_units(fields[4], fields[5], now_ms)),
    )


def _whole_units(units: float | None) -> int | None:
    # A fraction of a unit starts nothing: shown rounded down, as a claim counts it.
    return None if units is None else math.floor(units + 1e-9)


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
    raw_paused: Any = None,
    raw_progress: Any = None,
    raw_cost: Any = None,
) -> TaskInfo:
    if raw_record is None:
        raise NotFoundError(task_id)
    rec = decode_record(raw_record, task_id)
    paused_at = decode_paused(raw_paused, rec.state, rec.version)
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
    result, error = stored_outcome(raw_result)
    attempts = decode_history(raw_history)
    waitpoint = _waitpoint_of(rec, deps_list, attempts)
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
        # The hold, and the pause of a pending task, count in the record as one more
        # awaited dependency each.
        # The hold, a waitpoint's wait and the pause of a pending task count in the
        # record as one more awaited dependency each.
        remaining=max(
            0,
            rec.remaining
            - placing
            - (waitpoint is not None)
            - (paused_at is not None and rec.state is State.PENDING),
        ),
        optional_remaining=rec.optional_remaining,
        placing=bool(placing),
        deps=tuple(d for kind, d in deps_list if kind == "r"),
        optional_deps=tuple(d for kind, d in deps_list if kind == "o"),
        dependents=dependents,
        blocked_by=blocked_by,
        attempts=attempts,
        timeout=limit,
        paused=paused_at is not None,
        paused_at=paused_at,
        progress=decode_progress(raw_progress, rec.version),
        waitpoint=waitpoint,
        cost=decode_cost(raw_cost),
    )


def decode_change(task_id: str, values: Sequence[Any]) -> Changed:
    """The reply of ``amend.lua`` or ``pause.lua``: outcome, state, version."""
    outcome, state, version = (_text(v) for v in values)
    return Changed(
        task_id,
        Change(outcome),
        State(state) if state else None,
        int(version) if version else None,
    )


def _waitpoint_of(
    rec: Record, deps_list: list[tuple[str, str]], attempts: tuple[AttemptInfo, ...]
) -> WaitpointInfo | None:
    """The waitpoint side of a task whose dependency list leads with the wait
    (lua/lib/deadline.lua), None for any other task."""
    if not deps_list or deps_list[0][0] != "w" or not deps_list[0][1].isdigit():
        return None
    timeout_ms = int(deps_list[0][1])
    waiting = rec.state is State.PENDING and rec.remaining <= 1 and rec.optional_remaining <= 0
    by = next(
        (a.worker or None for a in attempts if a.version == rec.version and a.attempt == 1),
        None,
    )
    return WaitpointInfo(
        timeout=timeout_ms / 1000.0,
        waiting=waiting,
        times_out_at=(rec.updated_ms + timeout_ms) / 1000.0 if waiting else None,
        by=by,
    )


def decode_stats(
    meta: Mapping[Any, Any],
    queue_entries: int,
    leases: int,
    ranked_entries: int = 0,
    later_entries: int = 0,
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
    # An entry left behind by a replaced version counts until it is dropped, hence the cap.
    scheduled = max(0, min(ready, later_entries))
    return Stats(
        counts=counts,
        scheduled=scheduled,
        due=ready - scheduled,
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


def translate_error(message: str) -> Exception:
    """Map a script error reply to the exception the API promises."""
    code, _, rest = message.partition(" ")
    if code == "BUSY" and rest.startswith("Redis is busy"):
        # Redis's own: another script is running long. Not this call's fault.
        return Unavailable(message)
    translate = _SCRIPT_ERRORS.get(code)
    return ScriptError(message) if translate is None else translate(rest)


def _conflict(rest: str) -> Exception:
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
    if what == "version":
        return ConflictError(f"task {detail!r} has another version now")
    if what == "waitpoint":
        return ConflictError(f"task {detail!r} is not a waitpoint")
    if what == "dependencies":
        return ConflictError(
            f"waitpoint {detail!r} still waits for its own dependencies; it can be "
            "completed or failed once they have succeeded"
        )
    if what == "exists":
        (task_id,) = decode_id_list(detail)
        return ConflictError(f"task {task_id!r} exists already: a spawn adds only new tasks")
    if what == "state":
        state, _, task_id = detail.partition(" ")
        return ConflictError(f"task {task_id!r} is {state}")
    return ConflictError(rest)


def _unknown_dependency(rest: str) -> Exception:
    task_id, dep = decode_id_list(rest)
    err = UnknownDependencyError(
        f"task {task_id!r} depends on {dep!r}, which does not exist "
        "(pass allow_unknown=True to wait for it)"
    )
    err.task_id, err.dependency = task_id, dep
    return err


def _bad_argument(rest: str) -> Exception:
    # Only a script can see some bad arguments (add_deps naming a dependency the task
    # already has): they are still bad arguments naming their field (§12).
    field_name, _, detail = rest.partition(" ")
    if field_name == "payload" and detail.endswith("(payload_max)"):
        # Over the namespace's stored limit, lower than this client's own.
        return PayloadTooLarge("payload", detail)
    return InvalidArgument(field_name, detail)


def _not_found(rest: str) -> Exception:
    return NotFoundError(f"no task {rest!r}")


def _busy(rest: str) -> Exception:
    return BusyError(f"task {rest!r} is still settling its dependents")


def _cycle(rest: str) -> Exception:
    return CycleError(decode_id_list(rest))


def _not_a_dependency(rest: str) -> Exception:
    task_id, dep = decode_id_list(rest)
    return NotADependencyError(task_id, dep)


def _too_big(rest: str) -> Exception:
    what, amount, hex_task = rest.split(" ")
    [task_id] = decode_id_list(hex_task)
    limit = limits.MAX_DEP_RESULTS if what == "deps" else limits.MAX_DEP_RESULT_BYTES
    return DependencyResultsTooLarge(task_id, what, int(amount), limit)


# The error code a script's refusal starts with -> the exception it raises.
_SCRIPT_ERRORS: dict[str, Callable[[str], Exception]] = {
    "NOTFOUND": _not_found,
    "CONFLICT": _conflict,
    "BUSY": _busy,
    "CYCLE": _cycle,
    "UNKNOWN": _unknown_dependency,
    "BADARG": _bad_argument,
    "NOTDEP": _not_a_dependency,
    "TOOBIG": _too_big,
}


def decode_fired(values: Sequence[Any]) -> Fired:
    outcome, created, skipped, last = values
    return Fired(_text(outcome) == "moved", int(created), int(skipped), _text(last) or None)


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


def decode_dep_results(values: Sequence[Any]) -> tuple[int, dict[str, DependencyResult]]:
    """dep_results.lua's own values: the task's version, and each dependency's entry by
    id, in the order of the reply (the order the dependencies were given)."""
    version, count, *rest = values
    if len(rest) != 5 * int(count):
        raise ScriptError(f"dep_results: {len(rest)} values for {count} dependencies")
    entries: dict[str, DependencyResult] = {}
    for at in range(0, len(rest), 5):
        raw_id, kind, raw_state, dep_version, stored = rest[at : at + 5]
        dep = _text(raw_id)
        entries[dep] = _dependency_entry(
            dep, _text(kind) == "o", _text(raw_state), int(dep_version), _bytes(stored)
        )
    return int(version), entries


def _dependency_entry(
    dep: str, optional: bool, state_name: str, version: int, stored: bytes
) -> DependencyResult:
    if state_name in _GONE:
        return DependencyResult(dep, optional, None, None, None, _GONE[state_name])
    result, error = stored_outcome(stored)
    return DependencyResult(dep, optional, State(state_name), version, result, error)


# What a dependency entry without a state says, by dep_results.lua's word for it.
_GONE = {
    "missing": "no such task (purged or forgotten)",
    "corrupt": "its task record cannot be read",
}


def decode_finish_reply(
    reports: int, values: Sequence[Any]
) -> tuple[list[Outcome], list[Claim], Wait | None]:
    """finish.lua's own values: the outcome of each of its ``reports``, then what its claim
    got (as :func:`decode_claim_reply`)."""
    if len(values) < reports + 3:
        raise ScriptError(f"finish: {len(values)} values for {reports} reports and a claim")
    claims, wait = decode_claim_reply(values[reports:])
    return decode_outcomes(values[:reports]), claims, wait


def stored_outcome(raw: bytes | None) -> tuple[Any, str | None]:
    """(result, error) of a ``results`` entry: ``R`` + msgpack result, ``E`` + error
    text; a result that does not decode or an entry that does not parse is an error."""
    if not raw:
        return None, None
    kind, body = raw[:1], raw[1:]
    if kind == b"E":
        return None, body.decode("utf-8", "replace")
    if kind == b"R":
        try:
            return decode_value(body), None
        except Exception as exc:
            return None, f"stored result does not decode: {unpack_error(exc)}"
    return None, "stored result does not parse"


def dependency_value(entry: DependencyResult) -> Any:
    """The result of a dependency that succeeded, else the error that says why there is
    none: ``TaskFailed``, ``TaskCancelled``, ``TaskBlocked`` for one that ended so,
    ``DependencyUnavailable`` for one that has not ended or is gone."""
    state = entry.state
    if state is State.SUCCEEDED:
        if entry.error is not None:
            raise ScriptError(f"dependency {entry.task_id!r} succeeded, but {entry.error}")
        return entry.result
    if state is State.FAILED:
        raise TaskFailed(entry.task_id, entry.error)
    if state is State.CANCELLED:
        raise TaskCancelled(entry.task_id)
    if state is State.BLOCKED:
        raise TaskBlocked(entry.task_id, None, None)
    if state is None:
        gone = "corrupt" if entry.error == _GONE["corrupt"] else "missing"
        raise DependencyUnavailable(entry.task_id, gone)
    raise DependencyUnavailable(entry.task_id, state.value)


def decode_ended(data: bytes | str) -> str | None:
    """The task id of a notice on the ``ended`` channel (``<state> <id>``, or
    ``progress <id>`` from lua/progress.lua), or None."""
    raw = _bytes(data)
    _, sep, task_id = raw.partition(b" ")
    if not sep:
        return None
    try:
        return task_id.decode("utf-8")
    except UnicodeDecodeError:
        return None


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


def decode_enqueue_reply(specs: Sequence[TaskSpec], values: Sequence[Any]) -> list[Admitted] | str:
    """The :class:`Admitted` of each task from enqueue.lua's own values, or why the tasks
    must go to schedule.lua instead (``'settings'`` or ``'tasks'``; nothing was written)."""
    if len(values) == 2 and isinstance(values[0], (bytes, str)):
        if _text(values[0]) != "schedule":
            raise ScriptError(f"enqueue: unexpected reply {values!r}")
        return _text(values[1])
    if len(values) != len(specs):
        raise ScriptError(f"enqueue: {len(values)} values for {len(specs)} tasks")
    return [Admitted(spec.task_id, int(v), True) for spec, v in zip(specs, values, strict=True)]


def split_reply(script: str, reply: Sequence[Any]) -> tuple[int, list[Any]]:
    """(ids still propagating, the script's own values) of a script reply.

    Every script replies with the number of propagation jobs left first (0 for those
    that never propagate), so no transition can leave its dependents unsettled unseen.
    """
    if not reply:
        raise ScriptError(f"{script}: empty reply")
    return int(reply[0]), list(reply[1:])


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


# Index entries one ``tasks`` call examines at most, as a multiple of its limit: stale
# entries and, with an ``fn`` filter, tasks of other functions count against it.
TASKS_BUDGET_FACTOR = 10
# With an fn filter, entries are read at least this many at a time.
TASKS_FILTER_CHUNK = 100


# ``Ops.tasks`` lists one state without scanning the namespace: pending and terminal
# tasks from the per-state index (the ``states`` sorted set, newest first), ready tasks
# from the queue (due order), running tasks from the leases (lease deadline order).


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


def _listed_info(
    state: State,
    entry: _Entry,
    raw_record: Any,
    raw_payload: Any,
    raw_result: Any,
    raw_deps: Any,
    raw_history: Any,
    fn: str | None,
    raw_paused: Any = None,
    raw_cost: Any = None,
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
        entry.task_id,
        raw_record,
        raw_payload,
        raw_result,
        lease,
        raw_deps,
        raw_history=raw_history,
        raw_paused=raw_paused,
        raw_cost=raw_cost,
    )
    if fn is not None and info.fn != fn:
        return None
    return info
