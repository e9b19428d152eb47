"""Failed tasks grouped by their error, and a group retried or removed in bounded steps.

Nothing is counted by the scripts: the groups are read from the failed index (the
``states`` sorted set), a bounded batch per call, and the caller pages with a cursor
(:func:`failures`). Counting in the scripts would have to follow every way a task
enters or leaves the failed state (a report, a lost lease, an unserved function, a
retry, a new version, a purge, retention) and normalise errors in Lua; reading in
pages needs nothing new in Redis and is exact for what it reads.

An error's group (:func:`error_group`) is its last line that holds more than blanks
(for a traceback, ``Type: message``), with blanks collapsed, every hex id of 8 or
more characters that holds a digit (a UUID, a hash) and every number replaced by
``#``, cut at 200 characters; no error at all is the group ``(no error)``. So
``KeyError: 'user-17'`` and ``KeyError: 'user-4242'`` are one group, ``KeyError:
'user-#'``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.model import BulkOutcome, FailureGroup, FailurePage
from distsched.ops.namespace import Ops
from distsched.ops.protocol import Op
from distsched.ops.stripes import StripedOps
from distsched.validate import _is_int

# Failed tasks one call of ``failures`` (or one step of a bulk walk) reads at most: the
# index range, the records and the errors (at most MAX_ERROR_BYTES each) of this many.
FAILURES_BATCH_MAX = 500
FAILURES_BATCH_DEFAULT = 200
# Task ids kept as examples of each group.
GROUP_EXAMPLES = 5
# The longest group key, as the attempt history cuts an error's summary.
GROUP_MAX_CHARS = 200
NO_ERROR = "(no error)"

_HEX_ID = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-fA-F-]*[0-9])[0-9a-fA-F][0-9a-fA-F-]{7,}")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def error_group(error: str | None) -> str:
    """The group of an error text: its last non-blank line, blanks collapsed, hex ids
    and numbers replaced by ``#``, at most 200 characters (``(no error)`` for none)."""
    if error is None:
        return NO_ERROR
    lines = [line for line in error.splitlines() if line.strip()]
    if not lines:
        return NO_ERROR
    line = " ".join(lines[-1].split())
    line = _NUMBER.sub("#", _HEX_ID.sub("#", line))
    return line[:GROUP_MAX_CHARS]


def error_pattern(error: object) -> str:
    """The group an operator names: a group key as listed, or any error line of the
    group (it is grouped the same way)."""
    if not isinstance(error, str) or not error.strip():
        raise InvalidArgument("error", "must be a non-empty str (an error group as listed)")
    return error_group(error)


def batch_size(batch: object, name: str = "batch") -> int:
    if not _is_int(batch) or not 1 <= batch <= FAILURES_BATCH_MAX:
        raise InvalidArgument(name, f"must be an int in [1, {FAILURES_BATCH_MAX}]")
    return int(batch)


def merge_groups(groups: Iterable[FailureGroup]) -> tuple[FailureGroup, ...]:
    """Groups of several pages as one list: counts added, examples kept up to 5 (in
    the order met), largest group first (then by error)."""
    merged: dict[str, FailureGroup] = {}
    for g in groups:
        have = merged.get(g.error)
        if have is None:
            merged[g.error] = g
            continue
        examples = (have.examples + g.examples)[:GROUP_EXAMPLES]
        merged[g.error] = FailureGroup(g.error, have.count + g.count, have.sample, examples)
    return tuple(sorted(merged.values(), key=lambda g: (-g.count, g.error)))


def failures(ops: StripedOps, cursor: object, count: object) -> Op[FailurePage]:
    """The next ``count`` failed tasks after ``cursor``, grouped by error."""
    n = batch_size(count, "count")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidArgument("cursor", "must be a str or None")
    rows, following = yield from ops.failed_errors(cursor, n)
    groups: dict[str, FailureGroup] = {}
    for task_id, error in rows:
        key = error_group(error)
        have = groups.get(key)
        if have is None:
            sample = error_group(None) if error is None else _last_line(error)
            groups[key] = FailureGroup(key, 1, sample, (task_id,))
        else:
            examples = have.examples
            if len(examples) < GROUP_EXAMPLES:
                examples = (*examples, task_id)
            groups[key] = FailureGroup(key, have.count + 1, have.sample, examples)
    return FailurePage(merge_groups(groups.values()), len(rows), following)


def _last_line(error: str) -> str:
    lines = [line for line in error.splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:1000] if lines else NO_ERROR


def _bulk_args(error: object, batch: object, limit: object) -> tuple[str, int, int | None]:
    key = error_pattern(error)
    n = batch_size(batch)
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise InvalidArgument("limit", "must be an int >= 1 or None")
    return key, n, None if limit is None else int(limit)


def retry_failures(
    ops: StripedOps, error: object, cascade: bool, batch: object, limit: object
) -> Op[BulkOutcome]:
    """Retry every failed task whose error is in group ``error``, ``batch`` failed
    tasks read per step and one retry script per match; at most ``limit`` matches."""
    key, n, most = _bulk_args(error, batch, limit)
    examined = matched = done = skipped = 0
    cursor: str | None = None
    while True:
        rows, cursor = yield from ops.failed_errors(cursor, n)
        examined += len(rows)
        for task_id, text in rows:
            if error_group(text) != key:
                continue
            if most is not None and matched >= most:
                return BulkOutcome(examined, matched, done, skipped)
            matched += 1
            try:
                yield from ops.call(Ops.retry, task_id, cascade)
                done += 1
            except (ConflictError, NotFoundError):
                skipped += 1  # it moved on since the batch was read
        if cursor is None or (most is not None and matched >= most):
            return BulkOutcome(examined, matched, done, skipped)


def purge_failures(ops: StripedOps, error: object, batch: object, limit: object) -> Op[BulkOutcome]:
    """Remove now every failed task whose error is in group ``error``, ``batch``
    failed tasks read per step and one removal script per step; at most ``limit``."""
    key, n, most = _bulk_args(error, batch, limit)
    examined = matched = done = 0
    cursor: str | None = None
    while True:
        rows, cursor = yield from ops.failed_errors(cursor, n)
        examined += len(rows)
        ids = [task_id for task_id, text in rows if error_group(text) == key]
        if most is not None:
            ids = ids[: most - matched]
        matched += len(ids)
        if ids:
            done += yield from ops.call(Ops.purge_tasks, ids)
        if cursor is None or (most is not None and matched >= most):
            return BulkOutcome(examined, matched, done, matched - done)
