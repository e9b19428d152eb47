"""Why a task is where it is: the reads and reasoning behind ``explain``.

Every read made here is bounded, whatever the size of the namespace: no scan of
the tasks, at most :data:`EXPLAIN_LIMIT` dependency states and
:data:`EXPLAIN_LIMIT` hops of a blocked task's path. Stored members are built and
read through :mod:`distsched.wire.records`, never by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from distsched.errors import NotFoundError
from distsched.keys import Keys
from distsched.model import (
    BlockedBy,
    DepState,
    Explanation,
    Order,
    OrderSetting,
    Progress,
    Reason,
    State,
    Workflow,
)
from distsched.ops.protocol import Op
from distsched.validate import validate_task_id
from distsched.wire.payload import READ_DEPTH, _bytes, _text, decode_payload_trace
from distsched.wire.records import (
    EXPIRED_ERROR,
    Record,
    _count_or_none,
    _decode_rate,
    _error_line,
    _fair_prefix,
    _state_or_none,
    bucket_units,
    decode_cause,
    decode_cost,
    decode_deps_list,
    decode_order,
    decode_paused,
    decode_progress,
    decode_record,
    fair_delayed_member,
    fair_entries,
    fair_member_due,
    fair_ranked_member,
    queue_member,
    ranked_due_ms,
    ranked_rank_ms,
)

EXPLAIN_LIMIT = 50
# Every worker announces the functions it serves this often (the ``served`` hash).
SERVED_ANNOUNCE_S = 20.0
# A function counts as served while an announcement is at most this old (three
# periods: a worker is not taken for gone because one or two announcements failed).
SERVED_LIVE_S = 3 * SERVED_ANNOUNCE_S


class ExplainReads(Protocol):
    """What :func:`explain_task` needs of the operations object that runs it."""

    @property
    def keys(self) -> Keys: ...

    def server_time(self) -> Op[float]: ...

    def read(self, *commands: tuple[Any, ...], atomic: bool = True) -> Op[list[Any]]: ...

    def _blocked_path(self, task_id: str, cause: Any) -> Op[BlockedBy | None]: ...

    def _workflow(self, raw_parent: Any, raw_join: Any, state: State) -> Op[Workflow | None]: ...


@dataclass(frozen=True)
class _Task:
    """What the first round of reads says of the task."""

    task_id: str
    now: float
    rec: Record
    fn: str | None
    order: OrderSetting
    fair_on: bool
    max_running: int | None
    running: int | None
    placing: int
    """1 while the task is still being placed in parts (its deps list starts ``h``)."""
    wait_ms: int | None
    """A waitpoint's timeout in ms (its deps list starts ``w``); None for other tasks."""
    deps: list[tuple[str, str]]
    cause: Any
    root: str | None
    lease: Any
    paused_at: float | None = None
    """When the task was paused (``Scheduler.pause_task``), None when it is not."""
    progress: Progress | None = None

    @property
    def now_ms(self) -> int:
        return int(self.now * 1000)

    @property
    def aging_ms(self) -> int:
        return round(self.order.aging_s * 1000)

    @property
    def queued(self) -> bool:
        """Whether the task has a queue entry to find: ready and not paused."""
        return self.rec.state is State.READY and self.paused_at is None

    @property
    def held(self) -> int:
        """The awaited dependencies the record counts beyond the real ones: the hold of a
        placement, a waitpoint's wait, and the pause of a pending task."""
        paused = int(self.paused_at is not None and self.rec.state is State.PENDING)
        return self.placing + paused + (self.wait_ms is not None)

    @property
    def served(self) -> bool:
        """Whether the served hash is read: a pending or ready task of a known function
        (a waitpoint's only labels it: no worker runs it)."""
        return (
            self.fn is not None
            and self.wait_ms is None
            and self.rec.state in (State.READY, State.PENDING)
        )

    @property
    def waiting_for_completion(self) -> bool:
        """A waitpoint whose current version awaits only its completion."""
        rec = self.rec
        return (
            self.wait_ms is not None
            and rec.state is State.PENDING
            and rec.remaining <= 1
            and rec.optional_remaining <= 0
        )

    @property
    def shown(self) -> list[tuple[str, str]]:
        return self.deps[:EXPLAIN_LIMIT] if self.rec.state is State.PENDING else []

    @property
    def member(self) -> bytes:
        return queue_member(self.rec.priority, self.rec.version, self.task_id)


@dataclass(frozen=True)
class _KeyState:
    """A fairness key's running tasks, cap and rate, as explain reports them."""

    running: int = 0
    cap: int | None = None
    rate: int | None = None
    per_s: float | None = None
    next_at: float | None = None
    units: int | None = None


# (due_at, ahead) of a ready task's queue entry; (None, None) when it has none.
_Place = tuple[float | None, int | None]


def explain_task(ops: ExplainReads, task_id: str) -> Op[Explanation]:
    """The :class:`Explanation` of ``task_id``: a few bounded rounds of reads."""
    validate_task_id(task_id)
    now = yield from ops.server_time()
    task = yield from _read_task(ops, task_id, now)
    fair_key, cost = yield from _read_fair_key(ops, task)
    reads = _second_reads(ops.keys, task, fair_key)
    # Its workflow entries (lib/workflow.lua) travel last in the same round.
    reads += [("HGET", ops.keys.parents, task_id), ("HGET", ops.keys.joins, task_id)]
    answers = yield from ops.read(*reads)
    raw_parent, raw_join = answers[-2:]
    replies = iter(answers[:-2])
    error, expired = _ended_error(task.rec, replies)
    place: _Place = (None, None)
    if task.paused_at is not None and task.rec.state is State.READY:
        place = (task.rec.run_at_ms / 1000.0, None)
    if task.queued:
        entries = [next(replies) for _ in range(4)]
        place = yield from _queue_place(ops, task, fair_key, entries)
    served_at = _served_at(next(replies)) if task.served else None
    deps = _dep_states(task.shown, next(replies)) if task.shown else ()
    root_state = blocked_by = root_error = None
    if task.root is not None:
        root_state = _state_or_none(next(replies), task.root)
        root_error = _error_line(next(replies))
        expired = root_state is State.CANCELLED and root_error == EXPIRED_ERROR
        blocked_by = yield from ops._blocked_path(task_id, task.cause)
    key = yield from _read_key_state(ops, fair_key, task.now_ms)
    unserved = task.served and (served_at is None or now - served_at > SERVED_LIVE_S)
    lease_deadline = None if task.lease is None else float(task.lease) / 1000.0
    reasons = _reasons(task, place, unserved, key, lease_deadline, expired, cost)
    rec = task.rec
    workflow = yield from ops._workflow(raw_parent, raw_join, rec.state)
    if workflow is not None and workflow.window_waiting:
        # Held by its parent's window, not by a dependency.
        reasons = [Reason.WINDOW if r is Reason.WAITING_ON_DEPS else r for r in reasons]
    return Explanation(
        task_id=task_id,
        state=rec.state,
        version=rec.version,
        reasons=tuple(reasons),
        server_time=now,
        fn=task.fn,
        attempt=rec.attempt,
        max_attempts=rec.max_attempts,
        attempts_left=max(0, rec.max_attempts - rec.attempt),
        worker=rec.worker or None,
        lease_deadline=lease_deadline,
        cancel_requested=rec.cancel_requested,
        due_at=place[0],
        ahead=place[1],
        running=task.running or 0,
        max_running=task.max_running,
        served_at=served_at,
        remaining=max(0, rec.remaining - task.held),
        optional_remaining=rec.optional_remaining,
        deps=tuple(deps),
        deps_not_shown=len(task.deps) - len(task.shown) if rec.state is State.PENDING else 0,
        blocked_by=blocked_by,
        root_state=root_state,
        error=error,
        fair_key=fair_key,
        key_running=key.running,
        key_cap=key.cap,
        key_rate=key.rate,
        key_per_s=key.per_s,
        key_next_at=key.next_at,
        key_units=key.units,
        cost=cost,
        workflow=workflow,
        updated_at=rec.updated_ms / 1000.0,
        paused_at=task.paused_at,
        progress=task.progress,
        root_error=root_error if root_state is State.FAILED else None,
        waitpoint_timeout=None if task.wait_ms is None else task.wait_ms / 1000.0,
        waitpoint_times_out_at=(
            (rec.updated_ms + (task.wait_ms or 0)) / 1000.0 if task.waiting_for_completion else None
        ),
    )


# --------------------------------------------------------------------------- reads


def _read_task(ops: ExplainReads, task_id: str, now: float) -> Op[_Task]:
    # Payloads are bounded by max_payload_bytes; results are read only for a failed
    # task (a succeeded one's result may be large and says nothing here).
    k = ops.keys
    record_raw, payload, raw_deps, cause, lease, meta, paused, progress = yield from ops.read(
        ("HGET", k.tasks, task_id),
        ("HGET", k.payloads, task_id),
        ("HGET", k.deps, task_id),
        ("HGET", k.blocked, task_id),
        ("ZSCORE", k.leases, task_id),
        ("HMGET", k.meta, "max_running", "count:running", "order", "aging_ms", "fair"),
        ("HGET", k.paused, task_id),
        ("HGET", k.progress, task_id),
    )
    if record_raw is None:
        raise NotFoundError(task_id)
    order = decode_order(meta[2], meta[3])
    rec = decode_record(record_raw, task_id)
    fn = _fn_of(rec, payload)
    deps = decode_deps_list(raw_deps)
    placing = int(bool(deps) and deps[0][0] == "h")
    wait_ms = int(deps[0][1]) if deps and deps[0][0] == "w" and deps[0][1].isdigit() else None
    lead = placing or int(bool(deps) and deps[0][0] == "w")
    return _Task(
        task_id=task_id,
        now=now,
        rec=rec,
        fn=fn,
        order=order,
        fair_on=meta[4] is not None and _text(meta[4]) == "1",
        max_running=_count_or_none(meta[0]),
        running=_count_or_none(meta[1]),
        placing=placing,
        wait_ms=wait_ms,
        deps=deps[lead:],
        cause=cause,
        root=_root_of(rec, cause),
        lease=lease,
        paused_at=decode_paused(paused, rec.state, rec.version),
        progress=decode_progress(progress, rec.version),
    )


def _fn_of(rec: Record, payload: Any) -> str | None:
    try:
        fn: str = decode_payload_trace(rec.payload or payload, READ_DEPTH)[0]
    except ValueError:
        return None
    return fn


def _root_of(rec: Record, cause: Any) -> str | None:
    """The root cause of a blocked task; None for another state or junk in the cause
    (then the path is unknown)."""
    if rec.state is not State.BLOCKED or not cause:
        return None
    try:
        return decode_cause(cause)[0]
    except ValueError:
        return None


def _read_fair_key(ops: ExplainReads, task: _Task) -> Op[tuple[str | None, int]]:
    """A ready task's fairness key in a fair namespace ('' for the default key) and its
    cost (units of its key's rate; 1 elsewhere, where no rate applies)."""
    if not (task.queued and task.fair_on):
        return None, 1
    raw_key, raw_cost = yield from ops.read(
        ("HGET", ops.keys.fairkeys, task.task_id), ("HGET", ops.keys.costs, task.task_id)
    )
    return ("" if raw_key is None else _text(raw_key)), decode_cost(raw_cost)


def _second_reads(k: Keys, task: _Task, fair_key: str | None) -> list[tuple[Any, ...]]:
    """Every read the first round calls for, in the order the replies are consumed."""
    reads: list[tuple[Any, ...]] = []
    if task.rec.state in (State.FAILED, State.CANCELLED):
        reads.append(("HGET", k.results, task.task_id))
    if task.queued:
        reads += _fair_entry_reads(k, task, fair_key) if fair_key else _entry_reads(k, task)
    if task.served:
        reads.append(("HGET", k.served, task.fn))
    if task.shown:
        reads.append(("HMGET", k.tasks, *[dep for _, dep in task.shown]))
    if task.root is not None:
        reads += [("HGET", k.tasks, task.root), ("HGET", k.results, task.root)]
    return reads


def _entry_reads(k: Keys, task: _Task) -> list[tuple[Any, ...]]:
    """(score, rank) of the task's entry in the queue, then in the ranked set."""
    member = task.member
    return [
        ("ZSCORE", k.queue, member),
        ("ZRANK", k.queue, member),
        ("ZSCORE", k.ranked, member),
        ("ZRANK", k.ranked, member),
    ]


def _fair_entry_reads(k: Keys, task: _Task, fair_key: str) -> list[tuple[Any, ...]]:
    # A keyed task of a fair namespace: its entry in fairq, behind its key's entries
    # before it, in its key's delayed section or, in the priority order, its ranked
    # section.
    rec = task.rec
    low = fair_entries(_fair_prefix(fair_key))[0]
    delayed = fair_delayed_member(fair_key, rec.run_at_ms, task.member)
    ranked = fair_ranked_member(fair_key, rec.run_at_ms, task.member, rec.priority, task.aging_ms)
    return [
        ("ZSCORE", k.fairq, delayed),
        ("ZLEXCOUNT", k.fairq, low, b"(" + delayed),
        ("ZSCORE", k.fairq, ranked),
        ("ZLEXCOUNT", k.fairq, low, b"(" + ranked),
    ]


def _ended_error(rec: Record, replies: Iterator[Any]) -> tuple[str | None, bool]:
    """(the error line, whether the task expired) of a failed or cancelled task."""
    if rec.state not in (State.FAILED, State.CANCELLED):
        return None, False
    error = _error_line(next(replies))
    return error, rec.state is State.CANCELLED and error == EXPIRED_ERROR


def _served_at(raw: Any) -> float | None:
    last = _count_or_none(raw)
    return None if last is None else last / 1000.0


def _dep_states(shown: list[tuple[str, str]], raws: Sequence[Any]) -> list[DepState]:
    return [
        DepState(dep, _state_or_none(raw, dep), optional=kind == "o")
        for (kind, dep), raw in zip(shown, raws, strict=True)
    ]


def _read_key_state(ops: ExplainReads, fair_key: str | None, now_ms: int) -> Op[_KeyState]:
    if fair_key is None:
        return _KeyState()
    fields, waiting = yield from ops.read(
        (
            "HMGET",
            ops.keys.fair,
            f"run:{fair_key}",
            f"cap:{fair_key}",
            "cap",
            f"rate:{fair_key}",
            f"tb:{fair_key}",
        ),
        ("ZSCORE", ops.keys.fairwait, fair_key),
    )
    cap = _count_or_none(fields[1])
    if cap is None:
        cap = _count_or_none(fields[2])
    rate, per_s = _decode_rate(fields[3])
    next_at = None
    if rate is not None and waiting is not None and float(waiting) > now_ms:
        next_at = float(waiting) / 1000.0
    units = bucket_units(fields[3], fields[4], now_ms)
    whole = None if units is None else math.floor(units + 1e-9)
    return _KeyState(_count_or_none(fields[0]) or 0, cap, rate, per_s, next_at, whole)


# --------------------------------------------------------------------------- queue place


def _queue_place(
    ops: ExplainReads, task: _Task, fair_key: str | None, entries: list[Any]
) -> Op[_Place]:
    """Where a ready task's entry waits, from the replies of its entry reads."""
    if fair_key:
        return (yield from _fair_place(ops, task, fair_key, entries))
    return (yield from _plain_place(ops, task, entries))


def _plain_place(ops: ExplainReads, task: _Task, entries: list[Any]) -> Op[_Place]:
    score, rank, ranked_score, ranked_rank = entries
    rec = task.rec
    if ranked_score is not None:
        # In the ready set of the priority order: due, behind the entries ranked before it.
        due_ms = ranked_due_ms(float(ranked_score), rec.priority, task.aging_ms)
        return due_ms / 1000.0, int(ranked_rank)
    if score is None:
        return None, None
    if task.order.order is Order.PRIORITY and float(score) <= task.now_ms:
        # Due, not moved into the ready set yet (the next claim moves it): behind the
        # ready-set entries that rank before it.
        rank_ms = ranked_rank_ms(float(score), rec.priority, task.aging_ms)
        (before,) = yield from ops.read(("ZCOUNT", ops.keys.ranked, "-inf", f"({rank_ms}"))
        return float(score) / 1000.0, int(before)
    return float(score) / 1000.0, int(rank)


def _fair_place(ops: ExplainReads, task: _Task, fair_key: str, entries: list[Any]) -> Op[_Place]:
    score, rank, ranked_score, ranked_rank = entries
    rec = task.rec
    due_at = rec.run_at_ms / 1000.0
    if ranked_score is not None:
        return due_at, int(ranked_rank)
    if score is None:
        return (yield from _fair_delayed_place(ops, task, fair_key))
    if task.order.order is Order.PRIORITY and rec.run_at_ms <= task.now_ms:
        # Due, not ranked yet (the next claim that visits the key ranks it): behind the
        # key's ranked entries of a lower rank.
        low = fair_entries(_fair_prefix(fair_key))[0] + b"!"
        mark = fair_ranked_member(fair_key, rec.run_at_ms, b"", rec.priority, task.aging_ms)
        (before,) = yield from ops.read(("ZLEXCOUNT", ops.keys.fairq, low, b"(" + mark))
        return due_at, int(before)
    return due_at, int(rank)


def _fair_delayed_place(ops: ExplainReads, task: _Task, fair_key: str) -> Op[_Place]:
    # Handed back with a delay: its entry's due time is not run_at. It is looked for
    # among the key's first EXPLAIN_LIMIT entries.
    prefix = _fair_prefix(fair_key)
    low, high = fair_entries(prefix)
    (head,) = yield from ops.read(
        ("ZRANGEBYLEX", ops.keys.fairq, low, high, "LIMIT", 0, EXPLAIN_LIMIT)
    )
    for position, raw_member in enumerate(head):
        due = fair_member_due(prefix, _bytes(raw_member), task.member)
        if due is not None:
            return due / 1000.0, position
    return None, None


# --------------------------------------------------------------------------- reasons


def _reasons(
    task: _Task,
    place: _Place,
    unserved: bool,
    key: _KeyState,
    lease_deadline: float | None,
    expired: bool,
    cost: int = 1,
) -> list[Reason]:
    """Every reason found, the one that matters most first."""
    state = task.rec.state
    due_at, ahead = place
    if state is State.RUNNING:
        return _running_reasons(task, lease_deadline)
    if state.terminal:
        return [Reason(state.value), *([Reason.EXPIRED] if expired else [])]
    also_unserved = [Reason.UNSERVED] if unserved else []
    if task.paused_at is not None:
        # Paused: held back whatever else holds it; what else would, after.
        if state is State.PENDING:
            placing = [Reason.PLACING] if task.placing else []
            waiting = [Reason.WAITING_ON_DEPS] if task.rec.remaining > task.held else []
            return [Reason.PAUSED, *placing, *waiting, *also_unserved]
        not_due = [Reason.NOT_DUE] if due_at is not None and due_at > task.now else []
        return [Reason.PAUSED, *not_due, *also_unserved]
    if state is State.PENDING:
        if task.waiting_for_completion:
            return [Reason.WAITPOINT]
        placing = [Reason.PLACING] if task.placing else []
        waitpoint = [Reason.WAITPOINT] if task.wait_ms is not None else []
        return [*placing, *waitpoint, Reason.WAITING_ON_DEPS, *also_unserved]
    if due_at is None:
        return [Reason.NOT_QUEUED]
    over = [Reason.COST_OVER_RATE] if key.rate is not None and cost > key.rate else []
    if due_at > task.now:
        return [Reason.NOT_DUE, *also_unserved, *over]
    return [*also_unserved, *_due_reasons(task, ahead, key), *over]


def _running_reasons(task: _Task, lease_deadline: float | None) -> list[Reason]:
    reasons = [Reason.RUNNING]
    if task.rec.cancel_requested:
        reasons.append(Reason.CANCEL_REQUESTED)
    if lease_deadline is not None and lease_deadline * 1000 < task.now_ms:
        reasons.append(Reason.LEASE_EXPIRED)
    return reasons


def _due_reasons(task: _Task, ahead: int | None, key: _KeyState) -> list[Reason]:
    """What holds a due entry back: capacity, its key's cap or rate, entries ahead."""
    reasons: list[Reason] = []
    if task.max_running is not None and (task.running or 0) >= task.max_running:
        reasons.append(Reason.CAPACITY)
    if key.cap is not None and key.running >= key.cap:
        reasons.append(Reason.KEY_CAPPED)
    if key.next_at is not None:
        reasons.append(Reason.KEY_RATE)
    if ahead:
        reasons.append(Reason.BEHIND)
    elif not reasons:
        reasons.append(Reason.NEXT)
    return reasons
