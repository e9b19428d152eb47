"""Listings of a namespace's tasks, page by page, without scanning the namespace.

``tasks`` lists one state: pending and terminal tasks from the per-state index (the
``states`` sorted set, newest first), ready tasks from the ready set of the priority
order, then the queue (due order), then, in a fair namespace, fairq (the tasks of
fairness keys other than the default one), running tasks from the leases (lease deadline
order). ``scan_tasks`` walks every record. ``paused`` lists the paused tasks from the
``paused`` hash.
"""

from __future__ import annotations

from typing import Any

from distsched.errors import InvalidArgument, ScriptError
from distsched.model import State, TaskInfo, TaskPage, TaskRow
from distsched.ops import merges
from distsched.ops import routing as route
from distsched.ops.base import Base
from distsched.ops.protocol import Op, _one
from distsched.validate import _is_int, list_state, tasks_limit
from distsched.wire.payload import _bytes
from distsched.wire.records import (
    _INDEX_CODE,
    FAIRQ_MARK,
    RANKED_MARK,
    _cursor_bytes,
    _cursor_text,
    _parse_list_cursor,
    decode_record,
    parse_fairq_member,
)
from distsched.wire.replies import (
    TASKS_BUDGET_FACTOR,
    TASKS_FILTER_CHUNK,
    _Entry,
    _listed_info,
    _mapping,
    _match_entry,
    _pairs,
    decode_status,
)

# Paused tasks one ``paused`` call lists (per stripe): by default, and at most.
PAUSED_LIST_DEFAULT = 100
PAUSED_LIST_MAX = 1000


class Listing(Base):
    """Pages of tasks by state, and a scan over every task record."""

    @route.striped
    def scan_tasks(self, cursor: int, count: int) -> Op[tuple[int, list[TaskRow]]]:
        if not _is_int(cursor) or cursor < 0:
            raise InvalidArgument("cursor", "must be an int >= 0")
        if not _is_int(count) or count < 1:
            raise InvalidArgument("count", "must be an int >= 1")
        (reply,) = yield _one(("HSCAN", self.keys.tasks, cursor, "COUNT", count))
        next_cursor, fields = reply
        rows = []
        for raw_id, raw in _mapping(fields).items():
            try:
                record = decode_record(raw)
            except ScriptError:  # a corrupt record has no row; status() names it
                continue
            updated_at = record.updated_ms / 1000.0
            task_id = raw_id.decode("utf-8", "replace") if isinstance(raw_id, bytes) else raw_id
            row = TaskRow(task_id, record.state, record.version, record.attempt, updated_at)
            rows.append(row)
        return int(next_cursor), rows

    @route.striped
    def failed_errors(
        self, cursor: str | None, count: int
    ) -> Op[tuple[list[tuple[str, str | None]], str | None]]:
        """The next ``count`` entries of the failed index after ``cursor`` (newest
        first): ``(task_id, error text or None)`` of those still failed, and the cursor
        of the next batch (None at the end). Three commands of O(log N + count), an
        error being at most ``MAX_ERROR_BYTES``."""
        if cursor is not None:
            if not isinstance(cursor, str):
                raise InvalidArgument("cursor", "must be a str or None")
            _parse_list_cursor(State.FAILED, cursor)
        entries, exhausted = yield from self._list_entries(State.FAILED, cursor, count)
        if not entries:
            return [], None
        ids = [e.task_id for e in entries]
        records, results = yield from self.read(
            ("HMGET", self.keys.tasks, *ids), ("HMGET", self.keys.results, *ids)
        )
        out: list[tuple[str, str | None]] = []
        for entry, raw_record, raw_result in zip(entries, records, results, strict=True):
            if raw_record is None:
                continue
            try:
                rec = decode_record(raw_record, entry.task_id)
            except ScriptError:
                continue
            if not _match_entry(State.FAILED, entry, rec):
                continue  # the task moved on since it failed: its entry is stale
            error = None
            if raw_result and _bytes(raw_result)[:1] == b"E":
                error = _bytes(raw_result)[1:].decode("utf-8", "replace")
            out.append((entry.task_id, error))
        return out, None if exhausted else entries[-1].cursor

    @route.every(merge=merges.by_paused_at)
    def paused_tasks(self, limit: object = PAUSED_LIST_DEFAULT) -> Op[list[TaskInfo]]:
        """The paused tasks (at most ``limit`` per stripe), longest paused first: read from
        the ``paused`` hash with ``HSCAN``, examining at most ``TASKS_BUDGET_FACTOR`` x
        ``limit`` entries (left-over entries of versions no longer queued are passed
        over, so a namespace with many of them may list fewer)."""
        if not _is_int(limit) or not 1 <= limit <= PAUSED_LIST_MAX:
            raise InvalidArgument("limit", f"must be an int in [1, {PAUSED_LIST_MAX}]")
        k = self.keys
        budget = limit * TASKS_BUDGET_FACTOR
        ids: dict[str, None] = {}
        cursor: Any = 0
        while len(ids) < budget:
            (reply,) = yield from self.read(
                ("HSCAN", k.paused, cursor, "COUNT", min(budget, 500)), atomic=False
            )
            cursor, flat = reply
            for field in _mapping(flat):
                ids.setdefault(_bytes(field).decode("utf-8", "replace"), None)
            if int(cursor) == 0:
                break
        found: list[TaskInfo] = []
        names = list(ids)[:budget]
        for start in range(0, len(names), 500):
            part = names[start : start + 500]
            reads = [
                ("HMGET", key, *part)
                for key in (k.tasks, k.payloads, k.results, k.deps, k.history, k.paused)
            ]
            records, payloads, results, deps, history, paused = yield from self.read(*reads)
            for i, task_id in enumerate(part):
                if records[i] is None:
                    continue
                try:
                    info = decode_status(
                        task_id,
                        records[i],
                        payloads[i],
                        results[i],
                        None,
                        deps[i],
                        raw_history=history[i],
                        raw_paused=paused[i],
                    )
                except ScriptError:  # a record that cannot be read: status names it
                    continue
                if info.paused:
                    found.append(info)
        return merges.by_paused_at([found])[:limit]

    @route.striped
    def tasks(
        self, state: object, fn: object = None, limit: object = 50, cursor: object = None
    ) -> Op[TaskPage]:
        st, fn_name, want_items, after = _list_args(state, fn, limit, cursor)
        budget = want_items * TASKS_BUDGET_FACTOR
        examined = 0
        items: list[TaskInfo] = []
        position = after
        while len(items) < want_items and examined < budget:
            chunk = _chunk_size(want_items - len(items), fn_name, budget - examined)
            entries, exhausted = yield from self._list_entries(st, position, chunk)
            examined += max(len(entries), 1)
            looked = yield from self._fill(st, entries, fn_name, items, want_items)
            if looked:
                position = entries[looked - 1].cursor
            if len(items) >= want_items:
                # A full page ends the listing when it took the last entry there is.
                if looked == len(entries) and exhausted:
                    position = None
                break
            if exhausted:
                position = None
                break
        return TaskPage(tuple(items), position)

    def _fill(
        self,
        st: State,
        entries: list[_Entry],
        fn: str | None,
        items: list[TaskInfo],
        want_items: int,
    ) -> Op[int]:
        """Add the listed tasks of ``entries`` to ``items`` until it holds ``want_items``;
        how many entries were looked at."""
        if not entries:
            return 0
        k = self.keys
        ids = [e.task_id for e in entries]
        reads = [("HMGET", key, *ids) for key in (k.tasks, k.payloads, k.results)]
        reads += [("HMGET", key, *ids) for key in (k.deps, k.history, k.paused, k.costs)]
        records, payloads, results, deps, history, paused, costs = yield from self.read(*reads)
        for i, entry in enumerate(entries):
            if not entry.task_id:
                continue  # a junk or doubled fairq entry: passed over, nothing to list
            info = _listed_info(
                st,
                entry,
                records[i],
                payloads[i],
                results[i],
                deps[i],
                history[i],
                fn,
                paused[i],
                costs[i],
            )
            if info is not None:
                items.append(info)
                if len(items) >= want_items:
                    return i + 1
        return len(entries)

    def _list_entries(
        self, state: State, position: str | None, want: int
    ) -> Op[tuple[list[_Entry], bool]]:
        """The next ``want`` entries of a state's listing after ``position``, and whether
        the listing ends within them (one more is read to tell)."""
        k = self.keys
        if state in _INDEX_CODE:
            code = _INDEX_CODE[state].encode()
            low = b"(" + _cursor_bytes(position) if position else b"[" + code
            high = b"(" + bytes([code[0] + 1])
            (members,) = yield from self.read(
                ("ZRANGEBYLEX", k.states, low, high, "LIMIT", 0, want + 1), atomic=False
            )
            entries = [
                _Entry(
                    _bytes(m)[15:].decode("utf-8", "replace"),
                    _bytes(m),
                    None,
                    _cursor_text(_bytes(m)),
                )
                for m in members[:want]
            ]
            return entries, len(members) <= want
        if state is State.READY:
            return (yield from self._list_ready(position, want))
        return (yield from self._list_sorted(k.leases, state, position, want, ""))

    def _list_ready(self, position: str | None, want: int) -> Op[tuple[list[_Entry], bool]]:
        """``_list_entries`` of the ready tasks: the ready set of the priority order first
        (claim order; empty in the default order), then the queue (due order), then the
        keyed tasks of a fair namespace (fairq: key by key, each in its claim order). A
        cursor into the ready set starts with RANKED_MARK, one into fairq with FAIRQ_MARK."""
        k = self.keys
        sections = (k.ranked, k.queue, k.fairq)
        if not position or position.startswith(RANKED_MARK):
            first = 0
        elif position.startswith(FAIRQ_MARK):
            first = 2
        else:
            first = 1
        entries: list[_Entry] = []
        for i in range(first, len(sections)):
            after = position if i == first else None
            if i == 0:
                after = after[len(RANKED_MARK) :] if after else None
                got, done = yield from self._list_sorted(
                    k.ranked, State.READY, after, want - len(entries), RANKED_MARK
                )
            elif i == 1:
                got, done = yield from self._list_sorted(
                    k.queue, State.READY, after, want - len(entries), ""
                )
            else:
                got, done = yield from self._list_fairq(after, want - len(entries))
            entries += got
            if not done:
                return entries, False
            if len(entries) >= want and i + 1 < len(sections):
                # A full page: the listing ends here when the sections after hold nothing.
                later = sections[i + 1 :]
                sizes = yield from self.read(*(("ZCARD", key) for key in later), atomic=False)
                return entries, not any(int(n) for n in sizes)
        return entries, True

    def _list_fairq(self, position: str | None, want: int) -> Op[tuple[list[_Entry], bool]]:
        """``_list_entries`` of fairq, in member order (``(`` after the cursor's member, so
        the cursor's entry may have left). An entry of a key's ranked section whose task
        also has its delayed entry is passed over: the task is listed at that one. Junk
        members are passed over too (an entry with no task id, which lists nothing)."""
        k = self.keys
        low = b"(" + _parse_list_cursor(State.READY, position)[1] if position else b"-"
        (members,) = yield from self.read(
            ("ZRANGEBYLEX", k.fairq, low, b"+", "LIMIT", 0, want + 1), atomic=False
        )
        raw = [_bytes(m) for m in members[:want]]
        parsed = [parse_fairq_member(m) for m in raw]
        twins = [p.delayed_form for p in parsed if p is not None and p.ranked]
        doubled: set[bytes] = set()
        if twins:
            (scores,) = yield from self.read(("ZMSCORE", k.fairq, *twins), atomic=False)
            doubled = {t for t, sc in zip(twins, scores, strict=True) if sc is not None}
        entries = []
        for member, part in zip(raw, parsed, strict=True):
            text = FAIRQ_MARK + _cursor_text(member)
            if part is None or (part.ranked and part.delayed_form in doubled):
                entries.append(_Entry("", b"", None, text))
                continue
            task_id = part.member[22:].decode("utf-8", "replace")
            entries.append(_Entry(task_id, part.member, None, text))
        return entries, len(members) <= want

    def _list_sorted(
        self, key: str, state: State, position: str | None, want: int, mark: str
    ) -> Op[tuple[list[_Entry], bool]]:
        """``_list_entries`` of one sorted set (queue, ready set or leases); cursors get
        ``mark`` in front."""
        start, after = 0, None
        if position:
            after = _parse_list_cursor(state, position)
            score, member = after
            rank, now_score, below = yield from self.read(
                ("ZRANK", key, member),
                ("ZSCORE", key, member),
                ("ZCOUNT", key, "-inf", f"({score}"),
            )
            if rank is not None and now_score is not None and int(float(now_score)) == score:
                start, after = int(rank) + 1, None
            else:
                # The cursor's entry left (claimed, ended): go on from where it stood.
                start = int(below)
        read = want
        while True:
            (rows,) = yield from self.read(
                ("ZRANGE", key, start, start + read, "WITHSCORES"), atomic=False
            )
            pairs = [(_bytes(m), int(float(sc))) for m, sc in _pairs(rows)]
            exhausted = len(pairs) <= read
            pairs = pairs[:read]
            if after is not None:
                # Entries of the cursor's score that sorted before it are still there:
                # pass them, reading twice as many each time.
                before = sum((sc, m) <= after for m, sc in pairs)
                if before == len(pairs) and not exhausted:
                    start, read = start + len(pairs), read * 2
                    continue
                kept = [(m, sc) for m, sc in pairs if (sc, m) > after]
                exhausted = exhausted and len(kept) <= want
                pairs = kept[:want]
            break
        entries = []
        for member, score in pairs:
            task_id = (member[22:] if state is State.READY else member).decode("utf-8", "replace")
            text = f"{mark}{score}:{_cursor_text(member)}"
            entries.append(_Entry(task_id, member, score, text))
        return entries, exhausted


def _list_args(
    state: object, fn: object, limit: object, cursor: object
) -> tuple[State, str | None, int, str | None]:
    """The arguments of ``tasks``, checked in order: the state, the function name, the
    page size and the cursor."""
    st = list_state(state)
    if fn is not None and (not isinstance(fn, str) or not fn):
        raise InvalidArgument("fn", "must be a non-empty str or None")
    want_items = tasks_limit(limit)
    if cursor is not None:
        if not isinstance(cursor, str):
            raise InvalidArgument("cursor", "must be a str or None")
        _parse_list_cursor(st, cursor)
    return st, fn, want_items, cursor


def _chunk_size(missing: int, fn: str | None, left: int) -> int:
    """How many entries to read next: what the page misses, at least a filter chunk when
    filtering by function, at most what the budget has left."""
    chunk = missing if fn is None else max(missing, TASKS_FILTER_CHUNK)
    return min(chunk, left)
