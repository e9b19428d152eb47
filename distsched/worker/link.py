"""What the bundled worker asks of a namespace beyond the public scheduler API.

Pre-encoded completions, lost claim replies, the worker registry, where wake-ups
travel, and the progress and checkpoints of the functions it runs: a worker needs
them, an application does not, so they live here rather than on
:class:`~distsched.client.Scheduler`. The link drives the same operations as the
scheduler, over the scheduler's connection and stripes.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from distsched.client import Scheduler
from distsched.keys import Keys
from distsched.model import Claim, DependencyResult, Outcome, Wait, WorkerInfo
from distsched.ops.namespace import Ops
from distsched.subscription import message_within
from distsched.wire.calls import IDLE_RECHECK_S


class WorkerLink:
    """The worker's side of one scheduler: the operations only a worker calls."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        """``complete_many`` with results already msgpack-encoded (b"" for none)."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.complete_many, reports, encoded=True))

    def complete_and_claim(
        self,
        reports: Sequence[tuple[Claim, bytes]],
        n: int,
        worker_id: str,
        request_id: str | None = None,
    ) -> tuple[list[Outcome], list[Claim], Wait | None]:
        """``complete_encoded`` of ``reports``, then a claim of up to ``n`` tasks for this
        listening worker, in one call where the namespace has one stripe."""
        s = self.scheduler
        return s._drive(
            s._ops.finish(
                reports, n, worker_id, listening=True, request_id=request_id, encoded=True
            )
        )

    def place_stripes(self) -> tuple[int, ...]:
        """Place the stripes of an empty namespace on distinct cluster masters again
        (``distsched stripes --place``); the salts stored."""
        s = self.scheduler
        return s._drive(s._ops.place())

    def pass_wake(self, worker_id: str, passing: bool) -> bool:
        """Leave the idle set; with ``passing``, wake another idle worker in this one's
        place (a wake-up it got and cannot use). True when one was woken."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.leave, worker_id, passing))

    def report_progress(self, claim: Claim, fraction: float, note: str) -> Outcome:
        """A running function's progress report (``current_task().report_progress``)."""
        return self.scheduler.report_progress(claim, fraction, note)

    def save_checkpoint(self, claim: Claim, value: object) -> Outcome:
        """A running function's checkpoint (``current_task().save_checkpoint``)."""
        return self.scheduler.save_checkpoint(claim, value)

    def checkpoint(self, claim: Claim) -> Any:
        """The checkpoint of ``claim``'s version (``current_task().checkpoint``)."""
        return self.scheduler.checkpoint(claim)

    def dependency_results(
        self, task_id: str, version: int, ids: Sequence[str] | None = None
    ) -> dict[str, DependencyResult]:
        """What the dependencies of ``task_id`` hold now (all, or ``ids``), for its
        running attempt of ``version``: ``ConflictError`` once the task has another
        version (this attempt's dependencies are no longer the task's)."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.dependency_results, task_id, ids, version))

    def hand_back_lost_claim(self, worker_id: str, request_id: str) -> int:
        """Hand back, without spending an attempt, what the claim call ``request_id`` of
        ``worker_id`` claimed when its reply never arrived; returns how many."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.hand_back_lost_claim, worker_id, request_id))

    def register_worker(self, info: WorkerInfo) -> WorkerInfo:
        """Write a worker's registry entry, stamped with the server's time (at start and
        on every heartbeat); returns the entry written."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.register_worker, info))

    def unregister_worker(self, worker_id: str) -> bool:
        """Remove a worker's registry entry (a clean stop); True if it was there."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.unregister_worker, worker_id))

    def prune_workers(self) -> int:
        """Drop the registry entries of workers silent past their drop time."""
        s = self.scheduler
        return s._drive(s._ops.prune_workers())

    def wake_channels(self, worker_id: str | None = None) -> list[str]:
        """The channels that wake a worker: every stripe's wake channel, and with
        ``worker_id`` that worker's own channel on every stripe."""
        s = self.scheduler
        return s._drive(s._ops.wake_channels(worker_id))

    def stripe_keys(self) -> list[Keys]:
        """The keys of each stripe of the namespace, stripe 0 (the namespace's own) first."""
        s = self.scheduler
        return s._drive(s._ops.stripe_keys())

    def uses_sharded_pubsub(self) -> bool:
        """Whether wake-ups travel on sharded channels (``SSUBSCRIBE``; Redis >= 7)."""
        s = self.scheduler
        return s._drive(s._ops.call(Ops.uses_sharded_pubsub))

    def wait_for_wake(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for a wake-up message.

        The caller counts as an idle worker for the call (on a channel of its own), so a
        task that becomes due, or capacity that frees, wakes it. Subscribes only for the
        call, so a message published before it is not seen: use it after a claim that
        returned ``Wait``, with ``Wait.delay`` as timeout.
        """
        s = self.scheduler
        s._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = "wait:" + uuid.uuid4().hex
        channels = self.wake_channels(waiter)
        sharded = self.uses_sharded_pubsub()
        pubsub: Any = s.client.pubsub(ignore_subscribe_messages=True)
        try:
            (pubsub.ssubscribe if sharded else pubsub.subscribe)(*channels)
            get = pubsub.get_message
            if sharded and isinstance(s.client, RedisCluster):
                get = pubsub.get_sharded_message
            while True:
                left = IDLE_RECHECK_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return False
                # Registered (again) for no longer than the entry lives.
                s._drive(s._ops.call(Ops.idle, waiter))
                if message_within(pubsub, get, min(left, IDLE_RECHECK_S)) is not None:
                    return True
        finally:
            with contextlib.suppress(RedisError):
                s.leave(waiter)
            pubsub.close()
