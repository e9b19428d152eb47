"""The heartbeat thread: leases, cancel and lease-loss delivery, housekeeping, announcements,
and this worker's entry in the namespace's worker registry."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Collection
from importlib import metadata

from redis.exceptions import NoPermissionError

from distsched.client import Scheduler
from distsched.context import StopReason
from distsched.errors import ClosedError
from distsched.metrics import WorkerMetrics
from distsched.model import WorkerInfo
from distsched.worker.common import probe_backoff
from distsched.worker.jobs import Job, Slots
from distsched.worker.link import WorkerLink
from distsched.worker.logs import TaskOutcome, task_fields, tasks_log
from distsched.worker.reports import PASSING
from distsched.worker.served import ServedFunctions

log = logging.getLogger("distsched.worker")

# Due queue entries overview() reads per heartbeat round for the oldest due wait.
OVERVIEW_SCAN = 20
# How often a worker compares the retention plan with maxmemory.
RETENTION_CHECK_S = 600.0


def _version() -> str:
    try:
        return metadata.version("distsched")
    except metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


class Registration:
    """This worker's entry in the worker registry (``Scheduler.workers()``).

    Written at start and then on every heartbeat round (one HSET each), removed on a
    clean stop. Every ``lease_s`` the heartbeat also drops the entries of workers that
    stopped heartbeating without removing theirs (killed, cut off).
    """

    def __init__(
        self,
        link: WorkerLink,
        worker_id: str,
        functions: Collection[str],
        concurrency: int,
        heartbeat_s: float,
        slots: Slots,
        serves: tuple[str, ...] = (),
    ) -> None:
        self.link = link
        scheduler = link.scheduler
        self.slots = slots
        self.prune_every = scheduler.lease_s
        self._entry = WorkerInfo(
            worker_id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=_version(),
            concurrency=concurrency,
            functions=tuple(sorted(functions)),
            started=0.0,
            last_heartbeat=0.0,
            running=0,
            counts={},
            heartbeat_s=heartbeat_s,
            lease_s=scheduler.lease_s,
            serves=serves,
        )
        self._next_prune = 0.0
        self._closed = False
        self._lock = threading.Lock()

    def write(self) -> None:
        """Write the entry with the pool's figures now; raises what Redis raised."""
        with self.slots.cond:
            counts = dict(self.slots.counts)
        running = self.slots.running
        e = self._entry
        entry = dataclasses.replace(e, running=running, counts=counts)
        # Under the lock, so that a round still under way cannot write the entry back
        # after the stop removed it.
        with self._lock:
            if self._closed:
                return
            written = self.link.register_worker(entry)
        if not e.started:
            # The first write fixes the start time (server clock) for good.
            self._entry = written

    def prune_if_due(self) -> None:
        """Drop the entries of silent workers, at most once every ``prune_every`` s."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + self.prune_every
        dropped = self.link.prune_workers()
        if dropped:
            log.info("dropped %d silent worker(s) from the worker registry", dropped)

    def remove(self) -> None:
        """Remove the entry for good (a clean stop); later writes do nothing."""
        with self._lock:
            self._closed = True
            self.link.unregister_worker(self._entry.worker_id)


class RetentionWatch:
    """Every ``every`` seconds (the first time at the first round), a warning when the
    memory the namespace's ended tasks will take at today's rate and retention exceeds
    ``fraction`` of the server's ``maxmemory`` (docs: "Planning for retention").

    Off where the worker's user may not read ``INFO`` or ``HSTRLEN`` (said once at
    DEBUG), where no ``maxmemory`` is set, and with ``fraction`` None.
    """

    def __init__(self, scheduler: Scheduler, fraction: float | None, every: float) -> None:
        self.scheduler = scheduler
        self.fraction = fraction
        self.every = every
        self._next = time.monotonic()

    def check_if_due(self) -> None:
        if self.fraction is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every
        try:
            plan = self.scheduler.retention_plan()
        except NoPermissionError as exc:
            log.debug("retention plan not readable, not watched: %s", exc)
            self.fraction = None
            return
        if plan.over(self.fraction):
            log.warning(
                "namespace %r: ended tasks will take about %d bytes at the current rate "
                "(%.1f/s, %.0f bytes each) for the retention of %.0f s, %.0f%% of maxmemory "
                "(warning above %.0f%%); shorten the retention or raise maxmemory",
                self.scheduler.namespace,
                plan.projected_bytes,
                plan.ended_per_s,
                plan.bytes_per_ended_task or 0.0,
                plan.retention_s,
                100 * (plan.fraction_of_maxmemory or 0.0),
                100 * self.fraction,
            )


class Heartbeat:
    """Every ``interval`` seconds: extend the leases of every held claim, deliver cancel
    requests and lease losses to the running functions, run the fleet's chores
    (reap expired leases, compact, purge) and rewrite this worker's registry entry
    (dropping those of silent workers every lease). Between rounds, when due, it refreshes this
    worker's announcement of the functions it serves.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        slots: Slots,
        metrics: WorkerMetrics,
        served: ServedFunctions,
        interval: float,
        observed: bool,
        registration: Registration | None = None,
        retention: RetentionWatch | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.retention = retention
        self.slots = slots
        self.metrics = metrics
        self.served = served
        self.registration = registration
        self.interval = interval
        self.observed = observed
        # Set to run a round at once instead of at the next interval.
        self.now = threading.Event()
        # Server clock minus this machine's, measured each round when observed, so start
        # waits are measured against run_at on the clock that decided due-ness.
        self.clock_offset = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distsched-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self.now.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        next_beat = time.monotonic() + self.interval
        retry = probe_backoff()
        while not self._stop.is_set():
            try:
                wait = min(next_beat - time.monotonic(), self.served.refresh_due_in())
                self.now.wait(max(0.0, wait))
                if self._stop.is_set():
                    return
                if self.now.is_set() or time.monotonic() >= next_beat:
                    self.now.clear()
                    if self.beat():
                        retry = probe_backoff()
                        next_beat = time.monotonic() + self.interval
                    else:
                        # Redis is away (a failover takes seconds): try again soon, so
                        # that leases are extended as soon as it is back.
                        next_beat = time.monotonic() + min(self.interval, next(retry))
                if self.served.refresh_due_in() == 0:
                    self.announce()
            except Exception:
                # Without this thread every running task would lose its lease: whatever
                # goes wrong in a round, the next one comes.
                log.exception("heartbeat round failed")
                self._stop.wait(self.interval)

    def announce(self) -> None:
        try:
            self.served.announce()
        except (ClosedError, *PASSING) as exc:
            log.debug("announcing the served functions failed: %s", exc)
            self.served.postpone(self.interval)
        except Exception:
            log.exception("announcing the served functions failed")
            self.served.postpone(self.interval)

    def beat(self) -> bool:
        """One round; False when Redis was unavailable (the round is logged and tried
        again after a short pause)."""
        jobs = [j for j in self.slots.held() if not j.released]
        try:
            if jobs:
                self._extend(jobs)
            self._housekeep()
        except PASSING as exc:
            log.warning("heartbeat failed: %s", exc)
            return False
        except ClosedError:
            return True
        except Exception:
            # A refused call (corrupt record, OOM) must not end this thread: without
            # heartbeats every running task would lose its lease.
            log.exception("heartbeat round failed")
        return True

    def _extend(self, jobs: list[Job]) -> None:
        """Extend the leases of ``jobs``; signal those whose lease is lost or whose task
        has a cancel request."""
        statuses = self.scheduler.heartbeat_many([j.claim for j in jobs])
        for job, status in zip(jobs, statuses, strict=True):
            if status is None:
                self._lease_lost(job)
            elif status:
                job.ctx._signal_stop(StopReason.CANCEL)

    def _lease_lost(self, job: Job) -> None:
        if job.sent:
            return  # most likely raced with its own report, not a lost lease
        if not job.ctx.lease_lost:
            self.metrics.on_lease_lost(job.claim)
            claim = job.claim
            tasks_log.warning(
                "task %r (%s) version %d attempt %d: lease lost; the function "
                "is asked to stop and its outcome will not be recorded",
                claim.task_id,
                claim.fn,
                claim.version,
                claim.attempt,
                extra=task_fields(claim, TaskOutcome.LEASE_LOST),
            )
        job.ctx._signal_stop(StopReason.LEASE_LOST)

    def _housekeep(self) -> None:
        """The namespace's chores, this worker's registry entry, and what metrics observe."""
        chores = self.scheduler.housekeeping()
        self.metrics.on_housekeeping(chores["reaped"], chores["compacted"], chores["purged"])
        if self.registration is not None:
            self.registration.write()
            self.registration.prune_if_due()
        if self.observed:
            self._observe_namespace()
        if self.retention is not None:
            self.retention.check_if_due()

    def _observe_namespace(self) -> None:
        before = time.time()
        server = self.scheduler.server_time()
        self.clock_offset = server - (before + time.time()) / 2.0
        # overview() is stats() plus the oldest due wait and overdue leases, which is
        # what alerts watch; a short scan keeps the round cheap.
        self.metrics.on_stats(self.scheduler.overview(scan=OVERVIEW_SCAN))
        self.metrics.on_pool(self.slots.snapshot())
