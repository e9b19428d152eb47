"""The worker's one way to claim: the consumer's claims and the reporter's
report-and-claim calls, one at a time."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from distsched.metrics import WorkerMetrics
from distsched.model import Claim, Outcome, Wait
from distsched.worker.common import TRANSIENT
from distsched.worker.jobs import Job, Slots
from distsched.worker.link import WorkerLink

log = logging.getLogger("distsched.worker")


@dataclass(frozen=True)
class ShortClaim:
    """Why a report-and-claim call claimed fewer tasks than it asked for, and when it
    was sent: the consumer waits on it as on the answer to a claim of its own."""

    wait: Wait
    sent: float  # time.monotonic() when the call left


class Claimer:
    """Claims for one worker, from the consumer or from the reporter, one call at a time.

    A worker's succeeded tasks are reported by the call that claims its next ones
    (lua/finish.lua): one round trip per task at any concurrency. Two claim calls of one
    worker must not overlap: the tasks a call claimed are kept under the worker's id for
    a call whose reply was lost, and the next call is sent with the lost call's request
    id (it then answers with those tasks instead of claiming more). Every call goes
    through here, holding the lock, and what it claims is dispatched before the lock is
    let go, so that the next call counts the slots those tasks took.
    """

    def __init__(
        self,
        link: WorkerLink,
        worker_id: str,
        slots: Slots,
        metrics: WorkerMetrics,
        stopping: threading.Event,
        wake: threading.Event,
    ) -> None:
        self.link = link
        self.scheduler = link.scheduler
        self.worker_id = worker_id
        self.slots = slots
        self.metrics = metrics
        self.stopping = stopping
        self.wake = wake
        # Hands claimed tasks to the executors (the consumer's dispatch).
        self.dispatch: Callable[[list[Claim]], None] = _undispatched
        self._lock = threading.Lock()
        # The request id of the last claim call when its reply never came.
        self.lost: str | None = None
        # The last report-and-claim call that came up short, for the consumer.
        self._short: ShortClaim | None = None
        self._left = False

    def claim(self) -> tuple[list[Claim], Wait | None, float] | None:
        """The consumer's claim of the free slots, dispatched; with why fewer came and
        when the call was sent. None when no slot is free any more (a report claimed
        them meanwhile). A transient fault leaves the request id to send again."""
        with self._lock:
            n = self.slots.free
            if n <= 0:
                return None
            self._short = None
            with self._request() as request:
                started = time.monotonic()
                claims, wait = self.scheduler.claim(
                    n, self.worker_id, listening=True, request_id=request
                )
            self._took(claims, started)
            return claims, wait, started

    @contextmanager
    def _request(self) -> Iterator[str]:
        """The request id of a claim call: the last one's when its reply was lost."""
        request = self.lost or uuid.uuid4().hex
        try:
            yield request
        except TRANSIENT:
            # The call may have run with only its reply lost: the next is sent with its id.
            self.lost = request
            raise
        self.lost = None

    def _took(self, claims: list[Claim], started: float) -> None:
        self.metrics.on_claimed(len(claims), time.monotonic() - started)
        if claims:
            self.dispatch(claims)

    def take_short(self) -> ShortClaim | None:
        """The answer of a report-and-claim call that came up short since the consumer's
        last claim, once: the consumer waits on it instead of claiming again at once."""
        with self._lock:
            short, self._short = self._short, None
            return short

    def report_and_claim(
        self, reports: Sequence[tuple[Claim, bytes]], jobs: Sequence[Job]
    ) -> list[Outcome] | None:
        """Report ``reports`` (succeeded, results encoded) and claim the slots their jobs
        free, in one call; None, with nothing sent, when this is no time to claim (another
        claim is on its way, no slot would be free, the worker stops): the caller then
        reports them alone."""
        if self.stopping.is_set() or not self._lock.acquire(blocking=False):
            return None
        try:
            n = self.slots.free_after(jobs)
            if self._left or n <= 0:
                return None
            # A wake-up from here on may be for something this claim misses.
            self.wake.clear()
            with self._request() as request:
                started = time.monotonic()
                outcomes, claims, wait = self.link.complete_and_claim(
                    reports, n, self.worker_id, request
                )
            self._took(claims, started)
            self._short = None if wait is None else ShortClaim(wait, started)
            return outcomes
        finally:
            self._lock.release()

    def leave(self) -> None:
        """No claim from here on: hand back what a claim whose reply was lost took, and
        leave the idle set, so that no wake-up is sent to this worker any more."""
        with self._lock:
            self._left = True
            if self.lost is not None:
                self.link.hand_back_lost_claim(self.worker_id, self.lost)
                self.lost = None
            # If it was the one idle worker waiting for the next entry, that passes on.
            self.scheduler.leave(self.worker_id)


def _undispatched(claims: list[Claim]) -> None:
    raise AssertionError("Claimer.dispatch was not set")
