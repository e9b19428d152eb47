"""How much memory the ended tasks a namespace keeps will take: the retention plan.

Each ended task stays in Redis for the namespace's retention (24 hours unless set), with
its record, payload, outcome, recent report tokens, attempt history and two index
entries. At a steady rate of endings the namespace therefore holds about

    bytes per ended task x endings per second x retention in seconds

for its ended tasks alone. :class:`RetentionPlan` gives each factor, measured: the bytes
from a sample of the newest ended tasks (the lengths Redis stores, plus the bookkeeping
each hash field and sorted-set member costs), the rate from the endings of the last ten
minutes, and, where the user may read ``INFO``, the server's ``used_memory`` and
``maxmemory`` to compare the projection with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

# Endings counted for the rate: those of the last ten minutes (fewer when the first
# ending is younger).
RATE_WINDOW_S = 600.0
# Ended tasks whose stored lengths are read for the bytes per task (the newest ones).
SAMPLE = 64
# What Redis spends on one hash field and one sorted-set member besides the bytes of
# the field's name and value (or of the member), measured on Redis 7 with jemalloc:
# hashes and sorted sets of more than 128 entries are hash tables (and a skiplist).
HASH_FIELD_OVERHEAD = 64
ZSET_MEMBER_OVERHEAD = 72
# The per-state index member is ``<state letter><14 hex digits><space><id>``.
STATE_MEMBER_EXTRA = 16
# The warning threshold a worker and ``distsched stats`` use unless told otherwise.
DEFAULT_WARNING_FRACTION = 0.8


@dataclass(frozen=True)
class RetentionPlan:
    """The memory the namespace's ended tasks take now and will take at today's rate.

    ``bytes_per_ended_task`` is None while no task has ended. ``used_memory`` and
    ``maxmemory`` are None where the user may not read ``INFO`` (a tenant with the
    documented rights) or the server does not say; ``maxmemory`` is 0 where no limit
    is set. ``fraction_of_maxmemory`` is the projection over ``maxmemory`` (None
    without a limit or a projection).
    """

    retention_s: float
    ended_kept: int
    ended_per_s: float
    bytes_per_ended_task: float | None
    kept_bytes: int
    projected_bytes: int
    used_memory: int | None
    maxmemory: int | None
    fraction_of_maxmemory: float | None

    def over(self, fraction: float) -> bool:
        """True when the projection exceeds ``fraction`` of ``maxmemory``."""
        return self.fraction_of_maxmemory is not None and self.fraction_of_maxmemory > fraction


def bytes_of_task(task_id: str, lengths: Sequence[int]) -> int:
    """The bytes one ended task takes: the stored lengths of its hash fields (record,
    payload, outcome, ...; 0 where it has none) with their bookkeeping, and its members
    of the ``finished`` and per-state indexes."""
    name = len(task_id.encode())
    fields = sum(name + n + HASH_FIELD_OVERHEAD for n in lengths if n)
    indexes = 2 * (name + ZSET_MEMBER_OVERHEAD) + STATE_MEMBER_EXTRA
    return fields + indexes


def plan(
    retention_s: float,
    ended_kept: int,
    recent: int,
    span_s: float,
    sizes: Sequence[int],
    memory: tuple[int, int] | None,
) -> RetentionPlan:
    """The plan from what was read: ``recent`` endings over the last ``span_s`` seconds,
    the byte sizes of a sample of ended tasks, and ``(used_memory, maxmemory)``."""
    rate = recent / span_s if span_s > 0 else 0.0
    per_task = sum(sizes) / len(sizes) if sizes else None
    kept = round((per_task or 0.0) * ended_kept)
    projected = round((per_task or 0.0) * rate * retention_s)
    used, limit = memory if memory is not None else (None, None)
    fraction = projected / limit if limit and per_task is not None else None
    return RetentionPlan(
        retention_s=retention_s,
        ended_kept=ended_kept,
        ended_per_s=rate,
        bytes_per_ended_task=per_task,
        kept_bytes=kept,
        projected_bytes=projected,
        used_memory=used,
        maxmemory=limit,
        fraction_of_maxmemory=fraction,
    )


def merge(parts: Sequence[RetentionPlan]) -> RetentionPlan:
    """The plans of a namespace's stripes as one: counts, rates and bytes added up; the
    memory of the server whose share of its ``maxmemory`` is the largest."""
    ended = sum(p.ended_kept for p in parts)
    sized = [p for p in parts if p.bytes_per_ended_task is not None]
    per_task = (
        sum(p.kept_bytes for p in sized) / sum(p.ended_kept for p in sized)
        if sized and sum(p.ended_kept for p in sized)
        else (sized[0].bytes_per_ended_task if sized else None)
    )
    fullest = max(parts, key=lambda p: p.fraction_of_maxmemory or 0.0)
    return dataclasses.replace(
        fullest,
        ended_kept=ended,
        ended_per_s=sum(p.ended_per_s for p in parts),
        bytes_per_ended_task=per_task,
        kept_bytes=sum(p.kept_bytes for p in parts),
        projected_bytes=sum(p.projected_bytes for p in parts),
    )


def parse_memory(info: object) -> tuple[int, int] | None:
    """``(used_memory, maxmemory)`` from the text of ``INFO memory`` (None if absent)."""
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(
        line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#")
    )
    try:
        return int(fields["used_memory"]), int(fields["maxmemory"])
    except (KeyError, ValueError):
        return None
