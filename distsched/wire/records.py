"""Every byte layout distsched stores in Redis, in one place.

The Lua scripts write these layouts and this module reads them (or, for the
members the client looks up, builds them the way the scripts do):

- the task record (``tasks`` hash) and state-index members: ``lua/lib/record.lua``;
- the attempt history and per-minute counters: ``lua/lib/history.lua``;
- queue members (``<priority><version><id>``): ``lua/lib/record.lua``; the ranked
  set and the ranked section of fairq: ``lua/lib/ranked.lua``;
- fair-queue members of a keyed task: ``lua/lib/fair.lua``, ``lua/lib/ranked.lua``;
- dependency lists, dependents edges and blocked causes: ``lua/lib/graph.lua``;
- the kept claim of a claim request: ``lua/lib/kept.lua``;
- worker entries (``workers`` hash): written by the client (``encode_worker``) and
  removed by ``lua/leave.lua``;
- a running version's progress (``progress`` hash) and checkpoint (``checkpoints``):
  ``lua/progress.lua``;
- namespace settings (order, aging, payload limit) in ``meta`` and key rates in
  ``fair``: ``lua/order.lua``, ``lua/lib/payload.lua``, ``lua/fairness.lua``.

Change a layout here and in the Lua file named beside it, never one alone.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from distsched import limits
from distsched.errors import InvalidArgument, ScriptError
from distsched.model import (
    WORKER_ALIVE_BEATS,
    AttemptInfo,
    JoinKind,
    JoinRule,
    Order,
    OrderSetting,
    Progress,
    State,
    WorkerInfo,
)
from distsched.tracebacks import exception_line
from distsched.validate import MAX_COST, MAX_MS, PRIORITY_MAX, PRIORITY_MIN
from distsched.wire.payload import _bytes, _text

# --------------------------------------------------------------------------- task record


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
    (
        version,
        attempt,
        max_attempts,
        backoff_ms,
        run_at_ms,
        priority,
        cancel,
        delta,
        remaining,
        optional_remaining,
    ) = ints
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


def _state_or_none(raw: Any, task_id: str) -> State | None:
    if raw is None:
        return None
    try:
        return decode_record(raw, task_id).state
    except ScriptError:  # a corrupt record: its state is unknown
        return None


# The error text of a task that expired (lua/lib/deadline.lua).
EXPIRED_ERROR = "expired: not started by its deadline"


def _error_line(raw: Any) -> str | None:
    if not raw or raw[:1] != b"E":
        return None
    text: str = raw[1:].decode("utf-8", "replace")
    return exception_line(text) if text.strip() else None


# --------------------------------------------------------------------------- attempt history


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


def _minute_of(field_name: Any) -> int | None:
    """The minute of a per-minute counter field ``<minute>:<s|f>``; None for junk."""
    head = _bytes(field_name).split(b":", 1)[0]
    return int(head) if re.fullmatch(rb"-?[0-9]{1,15}", head) else None


# --------------------------------------------------------------------------- queue and ranked set


def queue_member(priority: int, version: int, task_id: str) -> bytes:
    """The queue entry of a task's version (``queue_member`` in ``lua/lib/record.lua``)."""
    return b"%08x%014x" % (PRIORITY_MAX - priority, version) + task_id.encode("utf-8")


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


def ranked_due_ms(score: float, priority: int, aging_ms: int) -> float:
    """The due ms of a ranked-set entry of ``score`` (rank = due - priority * aging,
    ``lua/lib/ranked.lua``)."""
    return score + priority * aging_ms


def ranked_rank_ms(due_ms: float, priority: int, aging_ms: int) -> float:
    """The ranked-set score an entry due at ``due_ms`` gets (``lua/lib/ranked.lua``)."""
    return due_ms - priority * aging_ms


# --------------------------------------------------------------------------- fair queue


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


def fair_entries(prefix: bytes) -> tuple[bytes, bytes]:
    """The ZRANGEBYLEX bounds of every fairq entry of one key, both sections."""
    return b"[" + prefix, b"[" + prefix + b"\xff"


def fair_member_due(prefix: bytes, entry: bytes, member: bytes) -> int | None:
    """The due ms of ``entry`` when it is the fairq entry of queue ``member`` in its
    key's delayed section (prefix, due, member) or ranked section (prefix, ``!``, rank,
    member, due); None for another task's entry or junk."""
    delayed = entry.endswith(member) and len(entry) == len(prefix) + 13 + len(member)
    ranked = entry.startswith(prefix + b"!") and entry[len(prefix) + 18 : -13] == member
    if not (delayed or ranked):
        return None
    return _fairq_entry_due(prefix, entry)


_FAIRQ_MEMBER = re.compile(rb"([0-9a-f]{3})", re.S)


@dataclass(frozen=True)
class FairqEntry:
    """The parts of a fairq member (``fairq_parse`` in ``lua/lib/ranked.lua``)."""

    prefix: bytes
    due_ms: int
    member: bytes
    """The queue member: ``hex8(2^31-1-priority) hex14(version) id``."""
    ranked: bool
    """Whether the entry is in its key's ranked section (priority order)."""

    @property
    def delayed_form(self) -> bytes:
        """The member of the same task in its key's delayed section."""
        return self.prefix + b"%013x" % self.due_ms + self.member


def parse_fairq_member(entry: bytes) -> FairqEntry | None:
    """The parts of a fairq member in either section, None for junk (a member that is
    neither form, or whose queue member names no task)."""
    head = _FAIRQ_MEMBER.match(entry)
    if not head:
        return None
    end = 3 + int(head.group(1), 16)
    prefix, rest = entry[:end], entry[end:]
    if len(prefix) < end:
        return None
    ranked = rest[:1] == b"!"
    due_raw, member = (rest[-13:], rest[18:-13]) if ranked else (rest[:13], rest[13:])
    if (ranked and len(rest) < 18 + 13) or not re.fullmatch(rb"[0-9a-f]{13}", due_raw):
        return None
    if not re.fullmatch(rb"[0-9a-f]{22}.+", member, re.S):
        return None
    return FairqEntry(prefix, int(due_raw, 16), member, ranked)


def _decode_rate(raw: Any) -> tuple[int | None, float | None]:
    """A key's stored rate limit ``<tasks> <interval ms>`` as (tasks, seconds)."""
    if raw is None:
        return None, None
    parts = _text(raw).split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None, None
    return int(parts[0]), int(parts[1]) / 1000.0


def decode_cost(raw: Any) -> int:
    """A task's cost from the costs hash (1 when absent or junk, as ``task_cost`` of
    ``lua/lib/fair.lua`` reads it)."""
    cost = _count_or_none(raw)
    if cost is None or cost < 1:
        return 1
    return min(cost, MAX_COST)


def bucket_units(raw_rate: Any, raw_bucket: Any, now_ms: int) -> float | None:
    """The units in a key's token bucket at ``now_ms``, as ``fair_tokens`` of
    ``lua/lib/fair.lua`` reads them (``tb:<key>`` = ``<units> <ms of the last update>``,
    full while absent); None for a key without a rate."""
    rate, per_s = _decode_rate(raw_rate)
    if rate is None or per_s is None or rate < 1 or per_s <= 0:
        return None
    units, last = float(rate), now_ms
    if raw_bucket is not None:
        parts = _text(raw_bucket).split()
        try:
            if len(parts) == 2:
                units, last = float(parts[0]), int(parts[1])
        except ValueError:
            units, last = float(rate), now_ms
    if now_ms > last:
        units += (now_ms - last) * rate / (per_s * 1000.0)
    return min(units, float(rate))


def _pair_of(reply: Any) -> tuple[bytes, float]:
    """(member, score) of a one-entry ZRANGE ... WITHSCORES reply, in either shape."""
    first = reply[0]
    if isinstance(first, (list, tuple)):
        return _bytes(first[0]), float(first[1])
    return _bytes(first), float(reply[1])


# --------------------------------------------------------------------------- dependencies


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


def decode_deps_list(raw: bytes | None) -> list[tuple[str, str]]:
    """Decode a stored dependency list into ``(kind, id)`` pairs, kind 'r' or 'o', or
    'h' for the hold of a version whose dependencies are still being placed (first), or
    'w' for a waitpoint's wait, its "id" the timeout in ms (first).

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
            if kind not in "rohw" or size == 0 or pos + 4 + size > len(raw):
                break
            out.append((kind, raw[pos + 4 : pos + 4 + size].decode("utf-8")))
        except ValueError:  # UnicodeDecodeError included
            break
        pos += 4 + size
    return out


# --------------------------------------------------------------------------- state index


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

# A ready listing's cursor into fairq (the keyed tasks of a fair namespace) starts with
# this, then the fairq member it stopped at.
FAIRQ_MARK = "^"


def state_index_member(state: State, updated_ms: int, task_id: str) -> bytes:
    """A task's member of the per-state index (``index_member`` in ``lua/lib/record.lua``)."""
    at = min(max(updated_ms, 0), MAX_MS)
    return b"%s%014x" % (_INDEX_CODE[state].encode(), MAX_MS - at) + task_id.encode("utf-8")


def _cursor_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _cursor_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _parse_list_cursor(state: State, cursor: str) -> tuple[int, bytes]:
    """Check a ``tasks`` cursor against its state; (score, member) for the queue and
    leases, (0, member) for the index and fairq."""
    if state in _INDEX_CODE:
        if not _INDEX_CURSOR.fullmatch(cursor) or cursor[0] != _INDEX_CODE[state]:
            raise InvalidArgument("cursor", f"is not a cursor of a {state.value} listing")
        return 0, _cursor_bytes(cursor)
    if state is State.READY and cursor.startswith(FAIRQ_MARK):
        member = _cursor_bytes(cursor[len(FAIRQ_MARK) :])
        if parse_fairq_member(member) is None:
            raise InvalidArgument("cursor", f"is not a cursor of a {state.value} listing")
        return 0, member
    if state is State.READY and cursor.startswith(RANKED_MARK):
        cursor = cursor[len(RANKED_MARK) :]
    found = _RANK_CURSOR.fullmatch(cursor)
    member = _cursor_bytes(found.group(2)) if found else b""
    if not found or (state is State.READY and not re.fullmatch(rb"[0-9a-f]{22}.+", member, re.S)):
        raise InvalidArgument("cursor", f"is not a cursor of a {state.value} listing")
    return int(found.group(1)), member


# --------------------------------------------------------------------------- workers


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
            **({"serves": list(info.serves)} if info.serves else {}),
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
            serves=tuple(str(name) for name in data.get("serves", ())),
        )
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException):
        return None


# --------------------------------------------------------------------------- settings


def _count_or_none(raw: Any) -> int | None:
    """A stored count, or None when absent or junk (the scripts ignore junk the same way)."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def decode_order(raw_order: Any, raw_aging: Any) -> OrderSetting:
    """The order stored in meta (``order``, ``aging_ms``), read as ``lua/lib/ranked.lua`` does."""
    if raw_order is None or _bytes(raw_order) != b"priority":
        return OrderSetting(Order.DEFAULT, 0.0)
    aging = _count_or_none(raw_aging)
    return OrderSetting(Order.PRIORITY, (aging or 0) / 1000.0)


def decode_payload_limit(raw: object) -> int:
    """The payload limit the scripts apply for a stored ``payload_max`` (lib/payload.lua)."""
    stored = _count_or_none(raw)
    limit = stored if stored else limits.DEFAULT_MAX_PAYLOAD_BYTES
    return min(limit, limits.PAYLOAD_CEILING_BYTES)


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


def decode_paused(raw: Any, state: State, version: int) -> float | None:
    """When a task in ``state`` at ``version`` was paused (epoch seconds), from its
    entry of the ``paused`` hash (``<version> <paused at ms>``); None when it is not
    paused: no entry, one of another version, a task not queued, or junk."""
    if raw is None or state not in (State.READY, State.PENDING):
        return None
    fields = _bytes(raw).split(b" ")
    if len(fields) != 2 or not all(f.isdigit() for f in fields) or int(fields[0]) != version:
        return None
    return int(fields[1]) / 1000.0


_PROGRESS = re.compile(rb"^(\d{1,17}) (\d{1,17}) (\d{1,17}) (\S+) (\S+) (.*)$", re.S)


def decode_progress(raw: bytes | None, version: int) -> Progress | None:
    """The progress entry of version ``version`` of a task (lua/progress.lua), None when
    there is none, it belongs to another version, or it does not parse:
    ``<version> <attempt> <updated ms> <fraction|-> <checkpoint bytes|-> <note>``."""
    if not raw:
        return None
    m = _PROGRESS.match(raw)
    if m is None or int(m[1]) != version:
        return None
    try:
        fraction = None if m[4] == b"-" else float(m[4])
        size = None if m[5] == b"-" else int(m[5])
    except ValueError:
        return None
    if fraction is not None and not 0.0 <= fraction <= 1.0:
        return None
    return Progress(
        version=version,
        attempt=int(m[2]),
        fraction=fraction,
        note=m[6].decode("utf-8", "replace"),
        updated_at=int(m[3]) / 1000.0,
        checkpoint_bytes=size,
    )


def checkpoint_bytes(raw: bytes | None, version: int) -> bytes | None:
    """The msgpack bytes of version ``version``'s checkpoint (lua/progress.lua): the
    stored entry is 14 hex digits of its version, then the value; None when there is
    none, it belongs to another version, or it is empty (cleared)."""
    if not raw or len(raw) <= 14 or raw[:14] != b"%014x" % version:
        return None
    return raw[14:]


# --------------------------------------------------------------------------- workflows


@dataclass(frozen=True)
class ParentEntry:
    """A spawned task's field of ``parents`` (lua/lib/workflow.lua)."""

    parent: str
    root: str
    join: str
    flag: str  # 'c' a child, 'w' a child held by a window, 'j' the join
    order: int


_FLAGS = (b"c", b"w", b"j")


def decode_parent_entry(raw: Any) -> ParentEntry | None:
    """The entry of ``parents``, or None (absent, or junk: no entry, as the scripts read it)."""
    if raw is None:
        return None
    data = _bytes(raw)
    fields: list[str] = []
    pos = 0
    try:
        for _ in range(3):
            size = int(data[pos : pos + 3], 16)
            fields.append(data[pos + 3 : pos + 3 + size].decode("utf-8"))
            pos += 3 + size
        flag, order = data[pos : pos + 1], data[pos + 1 :]
        if flag not in _FLAGS or len(order) != 8 or not fields[0] or not fields[1]:
            return None
        return ParentEntry(fields[0], fields[1], fields[2], flag.decode(), int(order, 16))
    except (ValueError, UnicodeDecodeError):
        return None


def encode_parent_entry(entry: ParentEntry) -> bytes:
    """The field of ``parents`` the scripts write for ``entry`` (for tests and readers)."""
    out = b""
    for text in (entry.parent, entry.root, entry.join):
        raw = text.encode("utf-8")
        out += b"%03x" % len(raw) + raw
    return out + entry.flag.encode() + b"%08x" % entry.order


@dataclass(frozen=True)
class JoinEntry:
    """A join's field of ``joins``: its rule and how many of its children ended how."""

    rule: JoinRule
    total: int
    succeeded: int
    failed: int


_JOIN_KINDS = {kind.value: kind for kind in JoinKind}


def decode_join_entry(raw: Any) -> JoinEntry | None:
    """``<kind> <k> <total> <succeeded> <failed> <cursor>`` of ``joins``; None when absent
    or junk."""
    if raw is None:
        return None
    parts = _text(raw).split(" ")
    if len(parts) != 6 or parts[0] not in _JOIN_KINDS:
        return None
    try:
        count, total, succeeded, failed = (int(p) for p in parts[1:5])
    except ValueError:
        return None
    kind = _JOIN_KINDS[parts[0]]
    rule = JoinRule() if kind is JoinKind.ALL else JoinRule(kind, count)
    return JoinEntry(rule, total, succeeded, failed)


def decode_window_entry(raw: Any) -> tuple[int | None, int]:
    """``<window> <holding>`` of ``windows`` (a parent's window and how many of its
    children hold a slot); (None, 0) when absent or junk."""
    if raw is None:
        return None, 0
    try:
        window, holding = (int(p) for p in _text(raw).split(" "))
    except ValueError:
        return None, 0
    return window, holding
