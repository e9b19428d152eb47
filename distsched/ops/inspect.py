"""The operator's read side of a namespace: tasks, listings, counts, keys, workers, clock."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from redis.exceptions import NoPermissionError

from distsched import retention
from distsched.errors import DistschedError, InvalidArgument, NotFoundError, ScriptError, Timeout
from distsched.model import (
    STATS_TOP_KEYS,
    BlockedBy,
    Claim,
    Explanation,
    KeyInfo,
    KeyLoad,
    MinuteCount,
    OrderSetting,
    Overview,
    Progress,
    State,
    Stats,
    TaskInfo,
    WorkerInfo,
    Workflow,
    priority_bucket,
)
from distsched.ops import merges
from distsched.ops import routing as route
from distsched.ops.explain import EXPLAIN_LIMIT, explain_task
from distsched.ops.listing import Listing
from distsched.ops.protocol import WAIT_MARGIN_MS, WAIT_REFRESH_S, Listen, Op
from distsched.ops.served import live_functions
from distsched.retention import RetentionPlan
from distsched.validate import (
    _finite,
    _is_int,
    validate_fair_key,
    validate_task_id,
    validate_wait_timeout,
)
from distsched.wire.calls import (
    DEFAULT_RETENTION_MS,
    MEMORY_INFO_LUA,
    MINUTES_KEEP,
    SERVER_TIME_LUA,
    _key_reads,
    status_reads,
)
from distsched.wire.payload import _bytes, _text, decode_value
from distsched.wire.records import (
    _count_or_none,
    checkpoint_bytes,
    decode_dependents,
    decode_join_entry,
    decode_order,
    decode_parent_entry,
    decode_payload_limit,
    decode_progress,
    decode_record,
    decode_window_entry,
    decode_worker,
    edge_range,
    member_priority,
    parse_queue_member,
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

# Fairness keys whose not-yet-due tasks ``stats`` counts apart (one ZLEXCOUNT each); the
# tasks of further keys count as due. The keys are read from the sets of keys with queued
# work, 100 of each at most.
SCHEDULED_FAIR_KEYS = 100
# Queue entries not due yet that ``stats`` checks against the task records, while the
# namespace has stale entries: the stale ones among them are not counted as scheduled.
SCHEDULED_SCAN = 100
# The largest due time a fairq member holds (FAIR_DUE_MAX in lua/lib/fair.lua).
FAIR_DUE_MAX = 2**52 - 1


class _ProgressSeen:
    """A wait's progress callback, called once per progress it has not seen yet."""

    def __init__(self, callback: Callable[[Progress], object] | None) -> None:
        self.callback = callback
        self.last: Progress | None = None

    def check(self, info: TaskInfo) -> None:
        if self.callback is not None and info.progress is not None and info.progress != self.last:
            self.last = info.progress
            self.callback(info.progress)


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
        reads.append(("HGET", k.parents, task_id))
        reads.append(("HGET", k.joins, task_id))
        (
            record,
            payload,
            result,
            deps,
            cause,
            history,
            paused,
            progress,
            cost,
            lease,
            edges,
            parent,
            join,
        ) = yield from self.read(*reads)
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
        info = decode_status(
            task_id,
            record,
            payload,
            result,
            lease,
            deps,
            decode_dependents(task_id, edges),
            blocked_by,
            history,
            paused,
            progress,
            cost,
        )
        workflow = yield from self._workflow(parent, join, info.state)
        return info if workflow is None else replace(info, workflow=workflow)

    def _workflow(self, raw_parent: Any, raw_join: Any, state: State) -> Op[Workflow | None]:
        """Where a task stands in its workflow (its parent, root and join; a join's rule
        and progress; a windowed child's window), from its ``parents`` and ``joins``
        entries; None for a task that was not spawned."""
        entry = decode_parent_entry(raw_parent)
        if entry is None:
            return None
        rule = decode_join_entry(raw_join)
        window, running = None, 0
        if entry.flag == "w":
            (raw_window,) = yield from self.read(("HGET", self.keys.windows, entry.parent))
            window, running = decode_window_entry(raw_window)
        return Workflow(
            parent=entry.parent,
            root=entry.root,
            join=entry.join or None,
            is_join=entry.flag == "j",
            rule=rule.rule if rule else None,
            children=rule.total if rule else 0,
            succeeded=rule.succeeded if rule else 0,
            failed=rule.failed if rule else 0,
            window=window,
            window_running=running,
            window_waiting=entry.flag == "w" and window is not None and state is State.PENDING,
        )

    @route.by_id("task_id")
    def wait(
        self,
        task_id: str,
        timeout: object,
        handle: Any,
        on_progress: Callable[[Progress], object] | None = None,
    ) -> Op[TaskInfo]:
        """The task's ``TaskInfo`` once it is terminal; ``Timeout`` after ``timeout``
        seconds (server clock); ``NotFoundError`` for an unknown id.

        A terminal task is answered from one read, writing nothing. Otherwise the id is
        registered in ``waits`` (``ZADD GT``: until when someone waits) *before* the
        state is read again, so a task that ends in between still finds the entry and
        is announced on ``ended``; then the op listens (``Listen``), reads again on
        each notice, and registers and reads again at the latest every ``WAIT_REFRESH_S``.

        ``on_progress`` is called with each new ``Progress`` a read finds while the task
        has not ended (lua/progress.lua announces each report on ``ended`` while the id
        is in ``waits``, so a report wakes the wait as an end does).
        """
        validate_task_id(task_id)
        limit = validate_wait_timeout(timeout)
        if on_progress is not None and not callable(on_progress):
            raise InvalidArgument("on_progress", "must be callable or None")
        info = yield from self.status(task_id)
        if info.state.terminal:
            return info
        seen = _ProgressSeen(on_progress)
        seen.check(info)
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
            seen.check(info)
            if left is not None and left <= 0:
                raise Timeout(task_id, float(limit or 0.0))
            if (yield Listen(handle, span)):
                # Told: the script that ended it removed the entry; read before adding
                # one again, which would then only expire. (A progress notice leaves
                # the entry: adding it again changes nothing.)
                info = yield from self.status(task_id)
                if info.state.terminal:
                    return info
                seen.check(info)

    @route.by_id("task_id")
    def progress(self, task_id: str) -> Op[Progress | None]:
        """The last progress of ``task_id``'s current version, None when it reported
        none; ``NotFoundError`` for an unknown id."""
        validate_task_id(task_id)
        record, raw = yield from self.read(
            ("HGET", self.keys.tasks, task_id), ("HGET", self.keys.progress, task_id)
        )
        if record is None:
            raise NotFoundError(task_id)
        return decode_progress(raw, decode_record(record, task_id).version)

    @route.by_id("claim", route.task_id_of)
    def checkpoint(self, claim: Claim) -> Op[Any]:
        """The last checkpoint saved by an attempt of ``claim``'s version (None: none)."""
        if not isinstance(claim, Claim):
            raise InvalidArgument("claim", f"must be a Claim, got {type(claim).__name__}")
        validate_task_id(claim.task_id, "claim")
        (raw,) = yield from self.read(("HGET", self.keys.checkpoints, claim.task_id))
        stored = checkpoint_bytes(raw, claim.version)
        return None if stored is None else decode_value(stored)

    @route.by_id("task_id")
    def result(
        self,
        task_id: str,
        timeout: object,
        handle: Any,
        on_progress: Callable[[Progress], object] | None = None,
    ) -> Op[Any]:
        """``wait``, then the result of a succeeded task or the error of any other end."""
        info = yield from self.wait(task_id, timeout, handle, on_progress)
        return task_result(info)

    @route.by_id("task_id")
    def explain(self, task_id: str) -> Op[Explanation]:
        return (yield from explain_task(self, task_id))

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
        now = yield from self.server_time()
        now_ms = int(now * 1000)
        top = SCHEDULED_FAIR_KEYS - 1
        meta, entries, leases, ranked, fair_entries, later, *fair_sets = yield from self.read(
            ("HGETALL", k.meta),
            ("ZCARD", k.queue),
            ("ZCARD", k.leases),
            ("ZCARD", k.ranked),
            ("ZCARD", k.fairq),
            # Entries not due yet: those of the queue scored after now (the default key's
            # in a fair namespace), then each fairness key's delayed section of fairq.
            ("ZCOUNT", k.queue, f"({now_ms}", "+inf"),
            ("ZRANGE", k.fairready, 0, top),
            ("ZRANGE", k.fairwait, 0, top),
            ("ZRANGE", k.fairfull, 0, top),
        )
        later = int(later)
        # The entries of a fair namespace's keyed tasks count as queue entries.
        queued = int(entries) + int(fair_entries)
        data = decode_stats(_mapping(meta), queued, int(leases), int(ranked), later)
        if later and data["stale_entries"] > 0:
            later -= yield from self._stale_later(now_ms)
        if int(fair_entries):
            later += yield from self._fair_later(fair_sets, now_ms)
        scheduled = max(0, min(data["counts"][State.READY.value], later))
        data["scheduled"] = scheduled
        data["due"] = data["counts"][State.READY.value] - scheduled
        fair = _mapping(meta).get(b"fair") or _mapping(meta).get("fair")
        if fair is not None and _text(fair) == "1":
            infos = yield from self.fair_keys(STATS_TOP_KEYS)
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

    def _stale_later(self, now_ms: int) -> Op[int]:
        """How many of the first ``SCHEDULED_SCAN`` queue entries not due yet are stale
        (a replaced or ended version): one ZRANGEBYSCORE and one HMGET, read only while
        the namespace has stale entries."""
        (rows,) = yield from self.read(
            ("ZRANGEBYSCORE", self.keys.queue, f"({now_ms}", "+inf", "LIMIT", 0, SCHEDULED_SCAN)
        )
        entries = [parse_queue_member(member) for member in rows]
        if not entries:
            return 0
        (records,) = yield from self.read(
            ("HMGET", self.keys.tasks, *[task_id for _, task_id in entries])
        )
        stale = 0
        for (version, _), raw in zip(entries, records, strict=True):
            try:
                record = None if raw is None else decode_record(raw)
            except ScriptError:  # a corrupt record: claim.lua fails it, not a queued task
                record = None
            if record is None or record.state is not State.READY or record.version != version:
                stale += 1
        return stale

    def _fair_later(self, key_sets: list[Any], now_ms: int) -> Op[int]:
        """fairq entries not due yet, of the first ``SCHEDULED_FAIR_KEYS`` fairness keys
        with queued work: one ZLEXCOUNT (O(log N)) per key."""
        names = list(dict.fromkeys(_bytes(raw) for rows in key_sets for raw in rows))
        names = names[:SCHEDULED_FAIR_KEYS]
        if not names:
            return 0
        after = b"%013x" % min(max(now_ms + 1, 0), FAIR_DUE_MAX)
        counts = yield from self.read(
            *(
                ("ZLEXCOUNT", self.keys.fairq, b"[" + p + after, b"(" + p + b"g")
                for p in (b"%03x" % len(name) + name for name in names)
            )
        )
        return sum(int(n) for n in counts)

    @route.striped
    def overview(self, soon_s: object, scan: int) -> Op[Overview]:
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

    @route.every(merge=retention.merge)
    def retention_plan(self, sample: object = retention.SAMPLE) -> Op[RetentionPlan]:
        if not _is_int(sample) or not 1 <= sample <= retention.SAMPLE:
            raise InvalidArgument("sample", f"must be an int in [1, {retention.SAMPLE}]")
        k = self.keys
        now_ms = yield from self.now_ms()
        since = now_ms - int(retention.RATE_WINDOW_S * 1000)
        setting, kept, recent, first, newest = yield from self.read(
            ("HGET", k.meta, "retention_ms"),
            ("ZCARD", k.finished),
            ("ZCOUNT", k.finished, since, "+inf"),
            ("ZRANGEBYSCORE", k.finished, since, "+inf", "WITHSCORES", "LIMIT", 0, 1),
            ("ZRANGE", k.finished, -int(sample), -1),
        )
        ids = [_text(i) for i in newest]
        hashes = (k.tasks, k.payloads, k.results, k.done, k.history)
        lengths = yield from self.read(*(("HSTRLEN", h, i) for i in ids for h in hashes))
        sizes = [
            retention.bytes_of_task(i, lengths[n * len(hashes) : (n + 1) * len(hashes)])
            for n, i in enumerate(ids)
        ]
        span_ms = now_ms - float(_pairs(first)[0][1]) if first else 0.0
        retention_ms = _count_or_none(setting)
        return retention.plan(
            retention_s=(retention_ms if retention_ms is not None else DEFAULT_RETENTION_MS) / 1000,
            ended_kept=int(kept),
            recent=int(recent),
            # A rate over at least a second: endings a moment old say little of a rate.
            span_s=max(span_ms, 1000.0) / 1000 if recent else 0.0,
            sizes=sizes,
            memory=(yield from self._memory()),
        )

    def _memory(self) -> Op[tuple[int, int] | None]:
        """``(used_memory, maxmemory)`` of the namespace's server, or None where the user
        may not read ``INFO`` (or the server cannot run it from a script)."""
        try:
            (info,) = yield from self.read(
                ("EVAL", MEMORY_INFO_LUA, 1, self.keys.meta), atomic=False
            )
        except (NoPermissionError, DistschedError):
            return None
        return retention.parse_memory(info)

    @route.every(merge=merges.minutes)
    def throughput(self, minutes: object = 60) -> Op[list[MinuteCount]]:
        if not _is_int(minutes) or not 1 <= minutes <= MINUTES_KEEP:
            raise InvalidArgument("minutes", f"must be an int in [1, {MINUTES_KEEP}]")
        count = int(minutes)
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
        now_ms = yield from self.now_ms()
        replies = yield from self.read(*_key_reads(self.keys, key))
        return _decode_key_info(key, replies, now_ms)

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
        now_ms = yield from self.now_ms()
        per_key = [_key_reads(k, name) for name in unique]
        replies = yield from self.read(*[read for reads in per_key for read in reads])
        infos, at = [], 0
        for name, reads in zip(unique, per_key, strict=True):
            infos.append(_decode_key_info(name, replies[at : at + len(reads)], now_ms))
            at += len(reads)
        return sorted(infos, key=lambda info: (-info.running, -info.queued, info.key))

    # -------------------------------------------------------------- workers

    @route.first
    def live_functions(self) -> Op[frozenset[str]]:
        """The functions live workers announced (``served`` hash, within
        ``SERVED_LIVE_S``): one HGETALL of a hash of one field per function name."""
        now = yield from self.server_time()
        (raw,) = yield from self.read(("HGETALL", self.keys.served))
        return live_functions(_mapping(raw), now)

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
