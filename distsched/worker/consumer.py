"""The claim loop: claim as many due tasks as there are free slots, dispatch them, wait."""

from __future__ import annotations

import inspect
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from distsched.errors import ClosedError
from distsched.metrics import WorkerMetrics
from distsched.model import Claim, WaitReason
from distsched.wire.calls import IDLE_RECHECK_S
from distsched.worker.common import TRANSIENT, backoff, probe_backoff
from distsched.worker.execution import LoopPool, ThreadPool
from distsched.worker.jobs import Phase, Slots
from distsched.worker.link import WorkerLink
from distsched.worker.reports import Reporter, ReportKind
from distsched.worker.share import Member

log = logging.getLogger("distsched.worker")

# How often a worker running until idle looks again while its own tasks still run.
UNTIL_IDLE_POLL_S = 0.01

# How long a worker of a pool, listed idle, waits for its namespace's turn before it
# leaves the idle set (so that wake-ups go to workers that can claim).
PASS_WAKE_AFTER_S = 0.05

# How long claiming may wait on unsent outcomes (at the max_unsent bound) before that is
# logged: a busy worker reaches the bound for a round trip at a time, a stalled one stays.
UNSENT_STALL_S = 10.0


def idle_wait(delay: float | None) -> float:
    """How long an idle worker waits for a wake-up: until the next entry is due when it
    holds the timer (``delay``), and never longer than the re-check interval, after
    which it claims again in case a wake-up was lost."""
    if delay is None or not math.isfinite(delay):
        return IDLE_RECHECK_S
    return max(0.0, min(delay, IDLE_RECHECK_S))


class Consumer:
    """Claims tasks on the thread that calls :meth:`run` and hands each to its executor.

    It never claims more than the free slots; a finished task's outcome that is not
    sent yet takes a slot again past the worker's ``max_unsent`` bound (see
    :class:`~distsched.worker.jobs.Slots`), so a stalled reporter stops the claims
    (logged once it lasts ``UNSENT_STALL_S``) instead of letting them pile up. A claim
    that comes up short registers the worker as idle; it then waits on the wake-up
    event (set by the listener when a script sends it ``ready``), with the server's
    delay hint as timeout when it is the one idle worker waiting for the next entry,
    and at most ``IDLE_RECHECK_S``.
    """

    def __init__(
        self,
        link: WorkerLink,
        worker_id: str,
        functions: Mapping[str, Callable[..., Any]],
        slots: Slots,
        reporter: Reporter,
        threads: ThreadPool,
        loop: LoopPool | None,
        metrics: WorkerMetrics,
        stopping: threading.Event,
        wake: threading.Event,
        share: Member | None = None,
    ) -> None:
        self.link = link
        # A worker of a pool: its slots are drawn from those the namespaces share.
        self.share = share
        # Whether its last claim left it in the namespace's idle set (wake-ups come).
        self.idle_listed = False
        self.scheduler = link.scheduler
        self.worker_id = worker_id
        self.functions = functions
        self.slots = slots
        self.reporter = reporter
        self.threads = threads
        self.loop = loop
        self.metrics = metrics
        self.stopping = stopping
        self.wake = wake
        # The request id of the last claim call when its reply never came.
        self.lost: str | None = None
        self.fire_retry = backoff()
        self.fruitless = 0
        # Which functions are ``async def`` (asked once per name).
        self._async: dict[str, bool] = {}
        # Worker.run_until_idle: return once a claim finds nothing and nothing is held.
        self.until_idle = False

    def run(self) -> None:
        """Claim and dispatch until the worker stops; then leave the idle set."""
        try:
            self._claim_loop()
        finally:
            self.leave()

    def _claim_loop(self) -> None:
        retry = backoff()
        unreachable = probe_backoff()
        outage_since: float | None = None
        while not self.stopping.is_set():
            free = self.wait_free()
            if self.stopping.is_set():
                break
            # A wake-up from here on means the claim below may have missed something.
            self.wake.clear()
            # A call whose reply never came is sent again as it was: if it ran, the
            # script answers with the tasks it claimed then, instead of claiming more.
            request = self.lost or uuid.uuid4().hex
            # Until idle: a claim sent while an outcome was on its way may have run before
            # that outcome made more due, so only a claim sent with nothing held ends it.
            held_before = self.until_idle and bool(self.slots.held())
            try:
                started = time.monotonic()
                claims, wait = self.scheduler.claim(
                    free, self.worker_id, listening=True, request_id=request
                )
                self.metrics.on_claimed(len(claims), time.monotonic() - started)
                self.lost = None
                self.claimed(short=len(claims) < free)
            except ClosedError:
                break
            except TRANSIENT as exc:
                self.claimed(short=False)
                # The call may have run with only its reply lost.
                self.lost = request
                pause = next(unreachable)
                first = outage_since is None
                if outage_since is None:
                    outage_since = time.monotonic()
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "redis unavailable (%s); retrying in %.2fs",
                    exc,
                    pause,
                )
                self.stopping.wait(pause)
                continue
            except Exception:
                # Not a passing fault (an ACL refusal, a script error): the worker stays
                # up, and tries again after a pause, which grows while the error lasts.
                self.claimed(short=False)
                pause = next(retry)
                log.exception("claim failed; retrying in %.2fs", pause)
                self.stopping.wait(pause)
                continue
            retry = backoff()
            if outage_since is not None:
                log.info("redis reachable again after %.1f s", time.monotonic() - outage_since)
                outage_since = None
                unreachable = probe_backoff()
            if claims:
                self.dispatch_many(claims)
            if wait is not None and wait.reason is WaitReason.FIRE:
                # A schedule's slot is due: every worker that sees it may fire it (one
                # wins each slot), then claims again, the slot's task among the rest.
                self.fire()
                continue
            if self.fruitless:
                self.fruitless = 0
                self.fire_retry = backoff()
            if self.until_idle and not claims and (wait is None or wait.delay != 0):
                if not held_before and not self.slots.held():
                    return
                # Its own tasks still run: their ends may make more due.
                self.wake.wait(UNTIL_IDLE_POLL_S)
                continue
            if wait is None or wait.delay == 0:
                continue
            # The delay counts from when the script ran, which was after the call left:
            # waiting from the send, the next claim reaches Redis when the entry is due,
            # not a round trip later.
            self.wake.wait(max(0.0, started + idle_wait(wait.delay) - time.monotonic()))

    def claimed(self, short: bool) -> None:
        """A claim is answered (or failed): a short one lists this worker as idle, and
        in a pool tells the share it has no more work for now."""
        self.idle_listed = short
        if self.share is not None:
            self.share.claimed(short)

    def wait_free(self) -> int:
        """Wait for free slots (in a pool, for this namespace's turn at the shared ones)."""
        free = self.wait_own_free()
        if self.share is None or self.stopping.is_set():
            return free
        passed = False
        while not self.stopping.is_set():
            granted = self.share.wait_turn(self.stopping, PASS_WAKE_AFTER_S)
            if granted:
                return min(free, granted)
            if not passed and self.idle_listed:
                # Listed idle but the pool has no slot for this namespace: leave the idle
                # set, and pass on a wake-up that came meanwhile, to a worker with room.
                passed = True
                self.idle_listed = False
                self.pass_wake()
        return 0

    def pass_wake(self) -> None:
        try:
            self.link.pass_wake(self.worker_id, self.wake.is_set())
        except ClosedError:
            return
        except Exception as exc:
            # Its idle entry expires by itself; a wake-up sent to it meanwhile waits for
            # the others' re-check.
            log.debug("could not leave the idle set: %s", exc)

    def wait_own_free(self) -> int:
        """Wait for a free slot; say so when unsent outcomes hold the claims back long."""
        since = time.monotonic()
        warned = False
        while True:
            free = self.slots.wait_free(self.stopping, 1.0)
            if free or self.stopping.is_set():
                break
            waited = time.monotonic() - since
            if not warned and waited >= UNSENT_STALL_S and self.slots.held_by_unsent():
                warned = True
                log.warning(
                    "%d finished tasks wait for their outcome to be reported (max_unsent %s): "
                    "no new claims until reports go out; their leases are kept meanwhile",
                    self.slots.unsent,
                    self.slots.max_unsent,
                )
        if warned and not self.stopping.is_set():
            log.info(
                "reports went out again after %.1f s: claiming again", time.monotonic() - since
            )
        return free

    def fire(self) -> None:
        """Fire the due slots of the namespace's schedules (errors are logged: the next
        claim says again that a slot is due)."""
        try:
            created = self.scheduler.fire_due()
        except ClosedError:
            return
        except Exception as exc:
            pause = next(self.fire_retry)
            log.warning("could not fire the due schedules (%s); again in %.2fs", exc, pause)
            self.stopping.wait(pause)
            return
        if created:
            log.debug("fired %d scheduled task(s)", created)
            self.fruitless = 0
            self.fire_retry = backoff()
            return
        # Lost races, or a due slot that stays due: after a few in a row, pause (longer
        # while it lasts) rather than spin between claim and fire.
        self.fruitless += 1
        if self.fruitless >= 3:
            self.stopping.wait(next(self.fire_retry))

    def leave(self) -> None:
        """Take this worker out of the idle set, so that no wake-up is sent to it any more,
        and drop the tokens its last claim kept (handing them back if its reply was lost)."""
        try:
            if self.lost is not None:
                # Stopping before a lost claim reply was recovered: hand its tasks back.
                self.link.hand_back_lost_claim(self.worker_id, self.lost)
                self.lost = None
            # If it was the one idle worker waiting for the next entry, that passes on.
            self.scheduler.leave(self.worker_id)
        except Exception as exc:
            # Its entry expires by itself within wire.calls.IDLE_MS.
            log.warning("could not leave the idle set: %s", exc)

    def dispatch_many(self, claims: list[Claim]) -> None:
        """Start the claims of one reply: held under one lock, handed to each executor
        in one call (one wake-up of the event loop for all its ``async def`` runs)."""
        runnable: list[Claim] = []
        for claim in claims:
            if claim.payload_error is None and claim.fn in self.functions:
                runnable.append(claim)
            else:
                self.dispatch(claim)
        if not runnable:
            return
        jobs = self.slots.add_many(runnable)
        if self.loop is None:
            self.threads.submit_many(jobs)
            return
        on_loop = [j for j in jobs if self._is_async(j.claim.fn)]
        if on_loop:
            self.loop.submit_many(on_loop)
        if len(on_loop) < len(jobs):
            self.threads.submit_many([j for j in jobs if not self._is_async(j.claim.fn)])

    def _is_async(self, fn: str) -> bool:
        known = self._async.get(fn)
        if known is None:
            known = self._async[fn] = inspect.iscoroutinefunction(self.functions[fn])
        return known

    def dispatch(self, claim: Claim) -> None:
        """Start ``claim`` on its executor, or report at once a claim that cannot run here."""
        if claim.payload_error is not None:
            job = self.slots.add(claim, Phase.REPORTING)
            self.reporter.put(job, ReportKind.FAIL, f"payload decode error: {claim.payload_error}")
            return
        fn = self.functions.get(claim.fn)
        if fn is None:
            job = self.slots.add(claim, Phase.REPORTING)
            self.reporter.put(job, ReportKind.UNSERVED, None)
            return
        job = self.slots.add(claim)
        if self.loop is not None and inspect.iscoroutinefunction(fn):
            self.loop.submit(job)
        else:
            self.threads.submit(job)
