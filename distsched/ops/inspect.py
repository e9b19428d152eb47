"""The operator's read side of a namespace: tasks, listings, counts, keys, workers, clock."""

from __future__ import annotations

import math
from typing import Any

from distsched.errors import InvalidArgument, NotFoundError, ScriptError, Timeout
from distsched.model import (
    STATS_TOP_KEYS,
    BlockedBy,
    DepState,
    Explanation,
    KeyInfo,
    KeyLoad,
    MinuteCount,
    Order,
    OrderSetting,
    Overview,
    Reason,
    State,
    Stats,
    TaskInfo,
    WorkerInfo,
    priority_bucket,
)
from distsched.ops import merges
from distsched.ops import routing as route
from distsched.ops.explain import EXPLAIN_LIMIT, SERVED_LIVE_S
from distsched.ops.listing import Listing
from distsched.ops.protocol import WAIT_MARGIN_MS, WAIT_REFRESH_S, Listen, Op
from distsched.validate import (
    _finite,
    _is_int,
    validate_fair_key,
    validate_task_id,
    validate_wait_timeout,
)
from distsched.wire.calls import MINUTES_KEEP, SERVER_TIME_LUA, _key_reads, status_reads
from distsched.wire.payload import READ_DEPTH, _bytes, _text, decode_payload_trace
from distsched.wire.records import (
    EXPIRED_ERROR,
    _count_or_none,
    _decode_rate,
    _error_first_line,
    _fair_prefix,
    _fairq_entry_due,
    _state_or_none,
    decode_cause,
    decode_dependents,
    decode_deps_list,
    decode_order,
    decode_payload_limit,
    decode_record,
    decode_worker,
    edge_range,
    fair_delayed_member,
    fair_ranked_member,
    member_priority,
    parse_queue_member,
    queue_member,
)
from distsched.wire.replies import (
    _decode_key_info,
    _mapping,
    _pairs,
    blocked_path,
    decode_stats,
    decode_status,
    task_result,
)


class Inspect(Listing):
    """Reads: what a task, a state, a fairness key or the fleet looks like now."""

    # -------------------------------------------------------------- clock

    @route.first
    def server_time(self) -> Op[float]:
        # A plain TIME goes to whichever node the client picks; the one clock that
        # decides due-ness and leases is that of the master holding the namespace's
        # slot, so the call names a namespace key and a cluster client routes it there.
        (reply,) = yield from self.read(("EVAL", SERVER_TIME_LUA, 1, self.keys.meta), atomic=False)
        seconds, micros = reply
        return float(seconds) + float(micros) / 1e6

    @route.first
    def now_ms(self) -> Op[int]:
        """The server's clock (of the namespace's node), in epoch ms."""
        return round((yield from self.server_time()) * 1000)

    # -------------------------------------------------------------- one task

    @route.by_id("task_id")
    def status(self, task_id: str) -> Op[TaskInfo]:
        validate_task_id(task_id)
        k = self.keys
        reads: list[tuple[Any, ...]] = [("HGET", key, task_id) for key in status_reads(k)]
        reads.append(("ZSCORE", k.leases, task_id))
        reads.append(("ZRANGEBYLEX", k.edges, *edge_range(task_id)))
        record, payload, result, deps, cause, history, lease, edges = yield from self.read(*reads)
        blocked_by = None
        if cause:
            walk = blocked_path(task_id, cause)
            try:
                parent = next(walk)
                while True:
                    (raw,) = yield from self.read(("HGET", k.blocked, parent))
                    parent = walk.send(raw)
            except StopIteration as done:
                blocked_by = done.value
            except ValueError:  # a cause with junk in it: the path is unknown
                blocked_by = None
        return decode_status(
            task_id, record, payload, result, lease, deps,
            decode_dependents(task_id, edges), blocked_by, history,
        )  # fmt: skip

    @route.by_id("task_id")
    def wait(self, task_id: str, timeout: float | None, handle: Any) -> Op[TaskInfo]:
        """The task's ``TaskInfo`` once it is terminal; ``Timeout`` after ``timeout``
        seconds (server clock); ``NotFoundError`` for an unknown id.

        A terminal task is answered from one read, writing nothing. Otherwise the id is
        registered in ``waits`` (``ZADD GT``: until when someone waits) *before* the
        state is read again, so a task that ends in between still finds the entry and
        is announced on ``ended``; then the op listens (``Listen``), reads again on
        each notice, and registers and reads again at the latest every ``WAIT_REFRESH_S``.
        """
        validate_task_id(task_id)
        limit = validate_wait_timeout(timeout)
        info = yield from self.status(task_id)
        if info.state.terminal:
            return info
        deadline: float | None = None
        while True:
            now = yield from self.server_time()
            if limit is not None and deadline is None:
                deadline = now + limit
            left = None if deadline is None else max(0.0, deadline - now)
            span = WAIT_REFRESH_S if left is None else min(left, WAIT_REFRESH_S)
            until_ms = int(now * 1000) + math.ceil(span * 1000) + WAIT_MARGIN_MS
            # Idempotent, so sent again like a read while Redis is briefly unavailable.
            yield from self.read(("ZADD", self.keys.waits, "GT", until_ms, task_id), atomic=False)
            info = yield from self.status(task_id)
            if info.state.terminal:
                return info
            if left is not None and left <= 0:
                raise Timeout(task_id, float(limit or 0.0))
            if (yield Listen(handle, span)):
                # Told: the script that ended it removed the entry; read before adding
                # one again, which would then only expire.
                info = yield from self.status(task_id)
                if info.state.terminal:
                    return info

    @route.by_id("task_id")
    def result(self, task_id: str, timeout: float | None, handle: Any) -> Op[Any]:
        """``wait``, then the result of a succeeded task or the error of any other end."""
        info = yield from self.wait(task_id, timeout, handle)
        return task_result(info)

    @route.by_id("task_id")
    def explain(self, task_id: str) -> Op[Explanation]:
        validate_task_id(task_id)
        k = self.keys
        now = yield from self.server_time()
        now_ms = int(now * 1000)
        # Payloads are bounded by max_payload_bytes; results are read only for a failed
        # task (a succeeded one's result may be large and says nothing here).
        record_raw, payload, raw_deps, cause, lease, meta = yield from self.read(
            ("HGET", k.tasks, task_id),
            ("HGET", k.payloads, task_id),
            ("HGET", k.deps, task_id),
            ("HGET", k.blocked, task_id),
            ("ZSCORE", k.leases, task_id),
            ("HMGET", k.meta, "max_running", "count:running", "order", "aging_ms", "fair"),
        )
        if record_raw is None:
            raise NotFoundError(task_id)
        order = decode_order(meta[2], meta[3])
        fair_on = meta[4] is not None and _text(meta[4]) == "1"
        meta = meta[:2]
        rec = decode_record(record_raw, task_id)
        try:
            fn: str | None = decode_payload_trace(rec.payload or payload, READ_DEPTH)[0]
        except ValueError:
            fn = None
        max_running, running = (_count_or_none(value) for value in meta)
        deps_list = decode_deps_list(raw_deps)
        placing = int(bool(deps_list) and deps_list[0][0] == "h")
        deps_list = deps_list[placing:]
        shown = deps_list[:EXPLAIN_LIMIT] if rec.state is State.PENDING else []
        root: str | None = None
        if rec.state is State.BLOCKED and cause:
            try:
                root = decode_cause(cause)[0]
            except ValueError:  # junk in the cause: the path is unknown
                root = None
        member = queue_member(rec.priority, rec.version, task_id)
        queued = rec.state is State.READY
        served = fn is not None and rec.state in (State.READY, State.PENDING)
        reads: list[tuple[Any, ...]] = []
        if rec.state in (State.FAILED, State.CANCELLED):
            reads.append(("HGET", k.results, task_id))
        fair_key: str | None = None
        if queued and fair_on:
            (raw_key,) = yield from self.read(("HGET", k.fairkeys, task_id))
            fair_key = "" if raw_key is None else _text(raw_key)
        if queued and fair_key:
            # A keyed task of a fair namespace: its entry in fairq, behind its key's
            # entries before it (lua/lib/fair.lua), in its key's delayed section or, in
            # the priority order, its ranked section (lua/lib/ranked.lua).
            prefix = _fair_prefix(fair_key)
            aging_ms = round(order.aging_s * 1000)
            fair_member = fair_delayed_member(fair_key, rec.run_at_ms, member)
            ranked_member = fair_ranked_member(
                fair_key, rec.run_at_ms, member, rec.priority, aging_ms
            )
            reads += [
                ("ZSCORE", k.fairq, fair_member),
                ("ZLEXCOUNT", k.fairq, b"[" + prefix, b"(" + fair_member),
                ("ZSCORE", k.fairq, ranked_member),
                ("ZLEXCOUNT", k.fairq, b"[" + prefix, b"(" + ranked_member),
            ]
        elif queued:
            reads += [("ZSCORE", k.queue, member), ("ZRANK", k.queue, member)]
            reads += [("ZSCORE", k.ranked, member), ("ZRANK", k.ranked, member)]
        if served:
            reads.append(("HGET", k.served, fn))
        if shown:
            reads.append(("HMGET", k.tasks, *[dep for _, dep in shown]))
        if root is not None:
            reads += [("HGET", k.tasks, root), ("HGET", k.results, root)]
        replies = list((yield from self.read(*reads))) if reads else []
        error = None
        expired = False
        if rec.state is State.FAILED:
            error = _error_first_line(replies.pop(0))
        elif rec.state is State.CANCELLED:
            error = _error_first_line(replies.pop(0))
            expired = error == EXPIRED_ERROR
        due_at = ahead = None
        if queued:
            score, rank = replies.pop(0), replies.pop(0)
            ranked_score, ranked_rank = replies.pop(0), replies.pop(0)
            aging_ms = round(order.aging_s * 1000)
            if fair_key:
                prefix = _fair_prefix(fair_key)
                if ranked_score is not None:
                    due_at, ahead = rec.run_at_ms / 1000.0, int(ranked_rank)
                elif (
                    score is not None and order.order is Order.PRIORITY and rec.run_at_ms <= now_ms
                ):
                    # Due, not ranked yet (the next claim that visits the key ranks it):
                    # behind the key's ranked entries of a lower rank.
                    mark = fair_ranked_member(fair_key, rec.run_at_ms, b"", rec.priority, aging_ms)
                    (before,) = yield from self.read(
                        ("ZLEXCOUNT", k.fairq, b"[" + prefix + b"!", b"(" + mark)
                    )
                    due_at, ahead = rec.run_at_ms / 1000.0, int(before)
                elif score is not None:
                    due_at, ahead = rec.run_at_ms / 1000.0, int(rank)
                else:
                    # Handed back with a delay: its entry's due time is not run_at. It is
                    # looked for among the key's first EXPLAIN_LIMIT entries.
                    (head,) = yield from self.read(
                        (
                            "ZRANGEBYLEX",
                            k.fairq,
                            b"[" + prefix,
                            b"[" + prefix + b"\xff",
                            "LIMIT",
                            0,
                            EXPLAIN_LIMIT,
                        )
                    )
                    for position, raw_member in enumerate(head):
                        entry = _bytes(raw_member)
                        delayed = entry.endswith(member) and len(entry) == len(prefix) + 13 + len(
                            member
                        )
                        ranked = (
                            entry.startswith(prefix + b"!")
                            and entry[len(prefix) + 18 : -13] == member
                        )
                        due = _fairq_entry_due(prefix, entry)
                        if (delayed or ranked) and due is not None:
                            due_at, ahead = due / 1000.0, position
                            break
            elif ranked_score is not None:
                # In the ready set of the priority order: due, behind the entries ranked
                # before it.
                due_ms = float(ranked_score) + rec.priority * aging_ms
                due_at, ahead = due_ms / 1000.0, int(ranked_rank)
            elif score is not None and order.order is Order.PRIORITY and float(score) <= now_ms:
                # Due, not moved into the ready set yet (the next claim moves it): behind
                # the ready-set entries that rank before it.
                rank_ms = float(score) - rec.priority * aging_ms
                (before,) = yield from self.read(("ZCOUNT", k.ranked, "-inf", f"({rank_ms}"))
                due_at, ahead = float(score) / 1000.0, int(before)
            elif score is not None:
                due_at, ahead = float(score) / 1000.0, int(rank)
        served_at = None
        if served:
            last = _count_or_none(replies.pop(0))
            served_at = None if last is None else last / 1000.0
        deps: list[DepState] = []
        if shown:
            for (kind, dep), raw in zip(shown, replies.pop(0), strict=True):
                deps.append(DepState(dep, _state_or_none(raw, dep), optional=kind == "o"))
        root_state = _state_or_none(replies.pop(0), root) if root is not None else None
        if root is not None:
            root_error = _error_first_line(replies.pop(0))
            expired = root_state is State.CANCELLED and root_error == EXPIRED_ERROR
        blocked_by = None
        if root is not None:
            blocked_by = yield from self._blocked_path(task_id, cause)
        lease_deadline = None if lease is None else float(lease) / 1000.0
        unserved = served and (served_at is None or now - served_at > SERVED_LIVE_S)
        key_running, key_cap, key_rate, key_per_s, key_next_at = 0, None, None, None, None
        if fair_key is not None:
            fields, waiting = yield from self.read(
                (
                    "HMGET",
                    k.fair,
                    f"run:{fair_key}",
                    f"cap:{fair_key}",
                    "cap",
                    f"rate:{fair_key}",
                ),
                ("ZSCORE", k.fairwait, fair_key),
            )
            key_running = _count_or_none(fields[0]) or 0
            key_cap = _count_or_none(fields[1])
            if key_cap is None:
                key_cap = _count_or_none(fields[2])
            key_rate, key_per_s = _decode_rate(fields[3])
            if key_rate is not None and waiting is not None and float(waiting) > now_ms:
                key_next_at = float(waiting) / 1000.0
        reasons: list[Reason] = []
        if rec.state is State.RUNNING:
            reasons.append(Reason.RUNNING)
            if rec.cancel_requested:
                reasons.append(Reason.CANCEL_REQUESTED)
            if lease_deadline is not None and lease_deadline * 1000 < now_ms:
                reasons.append(Reason.LEASE_EXPIRED)
        elif rec.state.terminal:
            reasons.append(Reason(rec.state.value))
            if expired:
                reasons.append(Reason.EXPIRED)
        elif rec.state is State.PENDING:
            if placing:
                reasons.append(Reason.PLACING)
            reasons.append(Reason.WAITING_ON_DEPS)
            if unserved:
                reasons.append(Reason.UNSERVED)
        elif due_at is None:
            reasons.append(Reason.NOT_QUEUED)
        elif due_at > now:
            reasons.append(Reason.NOT_DUE)
            if unserved:
                reasons.append(Reason.UNSERVED)
        else:
            if unserved:
                reasons.append(Reason.UNSERVED)
            if max_running is not None and (running or 0) >= max_running:
                reasons.append(Reason.CAPACITY)
            if key_cap is not None and key_running >= key_cap:
                reasons.append(Reason.KEY_CAPPED)
            if key_next_at is not None:
                reasons.append(Reason.KEY_RATE)
            if ahead:
                reasons.append(Reason.BEHIND)
            elif not {Reason.CAPACITY, Reason.KEY_CAPPED, Reason.KEY_RATE} & set(reasons):
                reasons.append(Reason.NEXT)
        return Explanation(
            task_id=task_id,
            state=rec.state,
            version=rec.version,
            reasons=tuple(reasons),
            server_time=now,
            fn=fn,
            attempt=rec.attempt,
            max_attempts=rec.max_attempts,
            attempts_left=max(0, rec.max_attempts - rec.attempt),
            worker=rec.worker or None,
            lease_deadline=lease_deadline,
            cancel_requested=rec.cancel_requested,
            due_at=due_at,
            ahead=ahead,
            running=running or 0,
            max_running=max_running,
            served_at=served_at,
            remaining=rec.remaining - placing,
            optional_remaining=rec.optional_remaining,
            deps=tuple(deps),
            deps_not_shown=len(deps_list) - len(shown) if rec.state is State.PENDING else 0,
            blocked_by=blocked_by,
            root_state=root_state,
            error=error,
            fair_key=fair_key,
            key_running=key_running,
            key_cap=key_cap,
            key_rate=key_rate,
            key_per_s=key_per_s,
            key_next_at=key_next_at,
            updated_at=rec.updated_ms / 1000.0,
        )

    def _blocked_path(self, task_id: str, cause: Any) -> Op[BlockedBy | None]:
        """The path from a blocked task's root cause, one read per hop, at most
        EXPLAIN_LIMIT hops (a longer chain is cut at the root's end)."""
        walk = blocked_path(task_id, cause)
        try:
            parent = next(walk)
            for _ in range(EXPLAIN_LIMIT):
                (raw,) = yield from self.read(("HGET", self.keys.blocked, parent))
                parent = walk.send(raw)
            # Too long a chain: the rest of it is not read, so the path ends there.
            walk.send(None)
        except StopIteration as done:
            result: BlockedBy = done.value
            return result
        except ValueError:  # a cause with junk in it: the path is unknown
            return None
        return None

    # -------------------------------------------------------------- counts

    @route.striped
    def stats(self) -> Op[Stats]:
        k = self.keys
        meta, entries, leases, ranked, fair_entries = yield from self.read(
            ("HGETALL", k.meta),
            ("ZCARD", k.queue),
            ("ZCARD", k.leases),
            ("ZCARD", k.ranked),
            ("ZCARD", k.fairq),
        )
        # The entries of a fair namespace's keyed tasks count as queue entries.
        queued = int(entries) + int(fair_entries)
        data = decode_stats(_mapping(meta), queued, int(leases), int(ranked))
        fair = _mapping(meta).get(b"fair") or _mapping(meta).get("fair")
        if fair is not None and _text(fair) == "1":
            infos = yield from self.fair_keys(STATS_TOP_KEYS)
            now = yield from self.server_time()
            data["keys"] = [
                KeyLoad(
                    key=info.key,
                    running=info.running,
                    queued=info.queued,
                    cap=info.cap if info.cap is not None else info.default_cap,
                    ready_wait_s=(
                        max(0.0, now - info.head_due_at)
                        if info.head_due_at is not None and info.head_due_at <= now
                        else None
                    ),
                )
                for info in infos
            ]
        return data

    @route.striped
    def overview(self, soon_s: float, scan: int) -> Op[Overview]:
        soon = _finite(soon_s)
        if soon is None or soon < 0:
            raise InvalidArgument("soon_s", "must be a number of seconds >= 0")
        if not _is_int(scan) or scan < 1:
            raise InvalidArgument("scan", "must be an int >= 1")
        data = yield from self.stats()
        now = yield from self.server_time()
        now_ms = int(now * 1000)
        k = self.keys
        aging_ms = round(data["aging_s"] * 1000)
        expired, expiring, due, ranked = yield from self.read(
            ("ZCOUNT", k.leases, "-inf", f"({now_ms}"),
            ("ZCOUNT", k.leases, now_ms, now_ms + int(soon * 1000)),
            ("ZRANGEBYSCORE", k.queue, "-inf", now_ms, "WITHSCORES", "LIMIT", 0, scan),
            ("ZRANGE", k.ranked, 0, scan - 1, "WITHSCORES"),
        )
        # (version, id, priority, due ms) of the first due entries of each set: in the
        # ready set of the priority order the due time is rank + priority * aging.
        entries = [
            (*parse_queue_member(member), member_priority(member), float(score))
            for member, score in _pairs(due)
        ]
        for member, score in _pairs(ranked):
            priority = member_priority(member)
            entries.append(
                (*parse_queue_member(member), priority, float(score) + priority * aging_ms)
            )
        oldest: float | None = None
        by_priority: dict[str, float] = {}
        if entries:
            (records,) = yield from self.read(
                ("HMGET", k.tasks, *[task_id for _, task_id, _, _ in entries])
            )
            for (version, _, priority, due_ms), raw in zip(entries, records, strict=True):
                if raw is None:
                    continue
                try:
                    record = decode_record(raw)
                except ScriptError:  # a corrupt record: claim.lua fails it
                    continue
                if record.state is State.READY and record.version == version:
                    age = max(0.0, now - due_ms / 1000.0)
                    oldest = age if oldest is None else max(oldest, age)
                    bucket = priority_bucket(priority)
                    by_priority[bucket] = max(by_priority.get(bucket, 0.0), age)
        total = data["queue_entries"]
        return Overview(
            **data,
            server_time=now,
            stale_ratio=(data["stale_entries"] / total) if total else 0.0,
            leases_expired=int(expired),
            leases_expiring=int(expiring),
            leases_soon_s=soon,
            oldest_ready_age=oldest,
            oldest_ready_age_by_priority=by_priority,
        )

    @route.every(merge=merges.minutes)
    def throughput(self, minutes: object = 60) -> Op[list[MinuteCount]]:
        if not _is_int(minutes) or not 1 <= minutes <= MINUTES_KEEP:  # type: ignore[operator]
            raise InvalidArgument("minutes", f"must be an int in [1, {MINUTES_KEEP}]")
        count = int(minutes)  # type: ignore[call-overload]
        now = yield from self.server_time()
        current = int(now * 1000) // 60_000
        first = current - count + 1
        fields = [f"{m}:{kind}" for m in range(first, current + 1) for kind in "sf"]
        (values,) = yield from self.read(("HMGET", self.keys.minutes, *fields))
        return [
            MinuteCount(
                minute=(first + i) * 60.0,
                succeeded=_count_or_none(values[2 * i]) or 0,
                failed=_count_or_none(values[2 * i + 1]) or 0,
            )
            for i in range(count)
        ]

    @route.every(merge=merges.by_deadline)
    def leases(self) -> Op[list[tuple[str, float]]]:
        (rows,) = yield from self.read(("ZRANGE", self.keys.leases, 0, -1, "WITHSCORES"))
        return [
            (
                member.decode("utf-8", "replace") if isinstance(member, bytes) else member,
                float(score) / 1000.0,
            )
            for member, score in _pairs(rows)
        ]

    # -------------------------------------------------------------- the namespace

    @route.every(merge=route.any_of)
    def exists(self) -> Op[bool]:
        # One key per command: while a cluster moves the namespace's slot, a command
        # naming several keys is refused (TRYAGAIN) until the move ends, one naming a
        # single key is redirected to wherever that key is.
        counts = yield from self.read(*(("EXISTS", key) for key in self.keys.all_keys()))
        return any(int(count) for count in counts)

    # -------------------------------------------------------------- settings and fairness keys

    @route.first
    def payload_limit(self) -> Op[int]:
        (raw,) = yield from self.read(("HGET", self.keys.meta, "payload_max"))
        return decode_payload_limit(raw)

    @route.first
    def order(self) -> Op[OrderSetting]:
        (fields,) = yield from self.read(("HMGET", self.keys.meta, "order", "aging_ms"))
        return decode_order(fields[0], fields[1])

    @route.every(merge=merges.key_infos)
    def key_info(self, key: str) -> Op[KeyInfo]:
        key = validate_fair_key(key, allow_default=True)
        replies = yield from self.read(*_key_reads(self.keys, key))
        return _decode_key_info(key, replies)

    @route.striped
    def fair_keys(self, limit: int = 100) -> Op[list[KeyInfo]]:
        if not _is_int(limit) or limit < 1:
            raise InvalidArgument("limit", "must be an int >= 1")
        k = self.keys
        ready, waiting, full, settings = yield from self.read(
            ("ZRANGE", k.fairready, 0, limit - 1),
            ("ZRANGE", k.fairwait, 0, limit - 1),
            ("ZRANGE", k.fairfull, 0, limit - 1),
            ("HSCAN", k.fair, 0, "COUNT", limit),
        )
        names: list[str] = [_text(raw) for raw in [*ready, *full, *waiting]]
        page = settings[1] if isinstance(settings, (list, tuple)) else {}
        fields = list(page) if isinstance(page, dict) else list(page)[0::2]
        for raw_field in fields:
            field_name = _text(raw_field)
            for tag in ("cap:", "w:", "run:", "rate:"):
                if field_name.startswith(tag):
                    names.append(field_name[len(tag) :])
        unique = list(dict.fromkeys(names))[:limit]
        if not unique:
            return []
        per_key = [_key_reads(k, name) for name in unique]
        replies = yield from self.read(*[read for reads in per_key for read in reads])
        infos, at = [], 0
        for name, reads in zip(unique, per_key, strict=True):
            infos.append(_decode_key_info(name, replies[at : at + len(reads)]))
            at += len(reads)
        return sorted(infos, key=lambda info: (-info.running, -info.queued, info.key))

    # -------------------------------------------------------------- workers

    @route.first
    def workers(self) -> Op[list[WorkerInfo]]:
        """The registered workers, by id, without those past their drop time."""
        entries = yield from self._read_workers()
        return [
            info for _, info in entries if info is not None and info.seen_ago <= info.drop_after_s
        ]

    def _read_workers(self) -> Op[list[tuple[bytes | str, WorkerInfo | None]]]:
        now = yield from self.server_time()
        (raw,) = yield from self.read(("HGETALL", self.keys.workers))
        entries = sorted(_mapping(raw).items(), key=lambda item: _bytes(item[0]))
        return [(worker_id, decode_worker(worker_id, value, now)) for worker_id, value in entries]
