"""The answers of every stripe of a namespace made one: the merges of ``@every`` routes."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from distsched.model import Chores, KeyInfo, MinuteCount, TaskInfo


def key_infos(infos: Sequence[KeyInfo]) -> KeyInfo:
    """One key's settings (stripe 0's) with its running and queued tasks of every stripe."""
    first = infos[0]
    heads = [i.head_due_at for i in infos if i.head_due_at is not None]
    return dataclasses.replace(
        first,
        running=sum(i.running for i in infos),
        queued=sum(i.queued for i in infos),
        head_due_at=min(heads) if heads else None,
    )


def by_deadline(lists: Sequence[list[tuple[str, float]]]) -> list[tuple[str, float]]:
    """Leases of every stripe, soonest deadline first."""
    return list(heapq.merge(*lists, key=lambda item: item[1]))


def minutes(parts: Sequence[list[MinuteCount]]) -> list[MinuteCount]:
    """Per-minute counts of every stripe added up, minute by minute (stripe 0's minutes)."""
    merged = parts[0]
    for part in parts[1:]:
        by_minute = {m.minute: m for m in part}
        merged = [
            dataclasses.replace(
                m,
                succeeded=m.succeeded + by_minute[m.minute].succeeded,
                failed=m.failed + by_minute[m.minute].failed,
            )
            if m.minute in by_minute
            else m
            for m in merged
        ]
    return merged


def chores(parts: Sequence[Chores]) -> Chores:
    """The housekeeping of every stripe, added up."""
    return Chores(
        reaped=sum(p["reaped"] for p in parts),
        expired=sum(p["expired"] for p in parts),
        compacted=sum(p["compacted"] for p in parts),
        purged=sum(p["purged"] for p in parts),
        trimmed=sum(p["trimmed"] for p in parts),
    )


def by_paused_at(parts: Sequence[list[TaskInfo]]) -> list[TaskInfo]:
    """Paused tasks of several stripes as one list, longest paused first (then by id)."""
    every = [info for part in parts for info in part]
    return sorted(every, key=lambda info: (info.paused_at or 0.0, info.task_id))
