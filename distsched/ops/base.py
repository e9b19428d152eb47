"""The floor every operation stands on: script calls, reads, settling dependents.

An operation is a generator (:data:`~distsched.ops.protocol.Op`): it yields the requests it needs
(script calls, or plain commands sent together) and receives each reply through ``send``
(a refused script call arrives as a thrown error). The sync and asyncio shells only drive
it over their connections, so its logic is written once, whatever the I/O model.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as redis_exceptions

from distsched.errors import BusyError, InvalidArgument, ScriptError, Unavailable
from distsched.keys import Keys
from distsched.model import Admitted, Claim, TaskSpec, Wait
from distsched.ops import routing as route
from distsched.ops.protocol import (
    NOT_RUN_PAUSES_S,
    NOT_RUN_WAIT_S,
    READ_RETRY_PAUSES,
    Commands,
    Op,
    Sleep,
    not_run,
)
from distsched.validate import _is_int, task_spec
from distsched.wire.calls import PROPAGATE_BUDGET, Call, propagate_call
from distsched.wire.payload import _bytes
from distsched.wire.replies import split_reply


def once(call: Call) -> Op[tuple[int, list[Any]]]:
    """Send one script call as it is: (ids still propagating, its own values). The call
    names its stripe's keys, so this is the same on any stripe."""
    return split_reply(call.script, (yield call))


class Shortcuts:
    """Operations written once over ``claim`` and ``admit_many``, for one stripe as for
    every stripe of a namespace."""

    def claim(
        self, n: int, worker_id: str, listening: bool = False, request_id: str | None = None
    ) -> Op[tuple[list[Claim], Wait | None]]:
        raise NotImplementedError

    def admit_many(self, specs: Sequence[TaskSpec]) -> Op[list[Admitted]]:
        raise NotImplementedError

    def ready(self, n: int, worker_id: str) -> Op[list[Claim]]:
        return (yield from self.claim(n, worker_id))[0]

    def next(self, worker_id: str) -> Op[Claim | Wait]:
        claims, wait = yield from self.claim(1, worker_id)
        if claims:
            return claims[0]
        assert wait is not None
        return wait

    def schedule_many(self, specs: Sequence[TaskSpec]) -> Op[list[int]]:
        return [a.version for a in (yield from self.admit_many(specs))]

    def schedule(self, task_id: str, options: Mapping[str, Any]) -> Op[int]:
        return (yield from self.schedule_many([task_spec(task_id, options)]))[0]

    def admit(self, task_id: str, options: Mapping[str, Any]) -> Op[Admitted]:
        return (yield from self.admit_many([task_spec(task_id, options)]))[0]


class LeanPath:
    """Whether plain tasks go to enqueue.lua first: not for a while after the namespace
    said that its settings (fairness, the priority order) need schedule.lua."""

    CLOSED_S = 30.0

    def __init__(self) -> None:
        self._closed_until = 0.0

    def open(self) -> bool:
        return time.monotonic() >= self._closed_until

    def close(self) -> None:
        self._closed_until = time.monotonic() + self.CLOSED_S


@dataclass(frozen=True)
class Base(Shortcuts):
    """The operations of one namespace, with the scheduler's settings (pure, no I/O)."""

    keys: Keys
    lease_ms: int
    max_payload_bytes: int
    # The caller's current trace context (W3C headers), sent along with the tasks it
    # schedules; None: none active (distsched.otel.current_trace when tracing is on).
    trace_context: Callable[[], Mapping[str, str] | None] | None = None
    # The stripe count of the namespace this stripe belongs to (1: unstriped); what a
    # schedule's slot task ids look like depends on it (distsched.schedules.tags_slot_ids).
    stripes: int = 1
    # Shared by the copies of these operations (dataclasses.replace keeps it).
    lean: LeanPath = field(default_factory=LeanPath, compare=False, repr=False)

    # -------------------------------------------------------------- plumbing

    @route.first
    def run(self, call: Call) -> Op[list[Any]]:
        """Run one script; settle the dependents it left; return its own values.

        A task still settling its dependents cannot get a new version (``BUSY``):
        settle and send again, which always makes progress. A call refused before it
        ran while a cluster moves the namespace's slot or fails over (``TRYAGAIN``,
        ``CLUSTERDOWN``, ...) is sent again after a pause, for up to ``NOT_RUN_WAIT_S``
        in all, instead of failing at once.
        """
        waited, pause = 0.0, NOT_RUN_PAUSES_S[0]
        while True:
            try:
                reply = yield call
            except BusyError:
                yield from self.settle(PROPAGATE_BUDGET)
                continue
            except Unavailable as exc:
                if not not_run(exc) or waited >= NOT_RUN_WAIT_S:
                    raise
                yield Sleep(pause)
                waited += pause
                pause = min(pause * 2, NOT_RUN_PAUSES_S[1])
                continue
            left, values = split_reply(call.script, reply)
            if left > 0:
                yield from self.settle(PROPAGATE_BUDGET)
            return values

    @route.first
    def read(self, *commands: tuple[Any, ...], atomic: bool = True) -> Op[list[Any]]:
        """Send read-only commands together; again after a pause while Redis is
        briefly unavailable (a failover, a slot migration)."""
        request = Commands(commands, atomic)
        for pause in READ_RETRY_PAUSES:
            try:
                reply: list[Any] = yield request
                return reply
            except Unavailable:
                # While a cluster moves the slot, a transaction over keys split between
                # the old and the new node fails (ASK inside MULTI, TRYAGAIN) until the
                # move ends; sent apart, each command is redirected to where its key is.
                request = Commands(commands, atomic=False)
                yield Sleep(pause)
        reply = yield request
        return reply

    @route.every(merge=route.total)
    def settle(self, budget: int) -> Op[int]:
        if not _is_int(budget) or budget < 1:
            raise InvalidArgument("budget", "must be an int >= 1")
        total = 0
        call = propagate_call(self.keys, budget)
        while True:
            left, (used,) = split_reply("propagate", (yield call))
            total += int(used)
            if left == 0:
                return total

    @route.first
    def uses_sharded_pubsub(self) -> Op[bool]:
        """Whether wake-ups travel on sharded channels: the server has SPUBLISH (Redis 7)."""
        try:
            (info,) = yield from self.read(("INFO", "server"), atomic=False)
        except (redis_exceptions.RedisError, ScriptError):
            # Not allowed to ask (an ACL), or a server without INFO (fakeredis): distsched
            # needs Redis 7 anyway.
            return True
        if isinstance(info, (bytes, str)):
            found = re.search(rb"redis_version:(\d+)", _bytes(info))
            version = found.group(1).decode() if found else "7"
        else:
            version = str(info.get("redis_version", "7"))
        major = version.split(".", 1)[0]
        return not major.isdigit() or int(major) >= 7

    @route.first
    def noop(self) -> Op[None]:
        """An operation that sends nothing (lets a shell run its pending set-up)."""
        return
        yield  # a generator all the same
