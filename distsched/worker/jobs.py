"""The claims a worker holds, and the pool slots they take.

A claim takes a slot from the claim until its function returns. A finished claim
whose outcome is not answered yet (``REPORTING``) holds its lease, and takes a slot
again once more than ``max_unsent`` of them wait: the consumer then stops claiming
until reports go out, so a worker never holds more than ``concurrency +
max_unsent`` leases, however long its reporter is stalled.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from distsched.context import StopReason, TaskContext
from distsched.model import Claim


class Phase(enum.Enum):
    """Where a claim held by the worker is: ``CLAIMED`` and ``RUNNING`` take a slot, the
    others (unsent outcomes) only past the ``max_unsent`` bound."""

    CLAIMED = "claimed"  # waiting for a pool thread or the event loop
    RUNNING = "running"  # its function is executing
    REPORTING = "reporting"  # its outcome is on its way to Redis (the lease is still held)
    RELEASED = "released"  # handed back by the shutdown before it started


@dataclass(eq=False, slots=True)
class Job:
    """One claim held by the worker, from the claim until its report was answered."""

    claim: Claim
    ctx: TaskContext = field(init=False)
    phase: Phase = Phase.CLAIMED
    # Set when its report is on the wire: a heartbeat that then finds the token gone
    # most likely raced with that very report, not with a lost lease.
    sent: bool = False

    def __post_init__(self) -> None:
        self.ctx = TaskContext(self.claim)

    @property
    def released(self) -> bool:
        return self.phase is Phase.RELEASED


class Slots:
    """The pool's bookkeeping under one lock: held jobs, free slots, running, counts.

    Every thread of the worker goes through it, so that a snapshot is always
    consistent: claimed plus running never exceeds the pool size, and held claims
    never exceed the pool size plus ``max_unsent``.
    """

    def __init__(
        self,
        concurrency: int,
        max_unsent: int | None = None,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        self.concurrency = concurrency
        # Told (under this lock) whenever a slot may have come free: the pool's share,
        # when the worker draws its slots from one shared with other namespaces.
        self.on_free = on_free
        # None: no bound (an outcome on its way never holds back a claim).
        self.max_unsent = max_unsent
        self.cond = threading.Condition()
        self._jobs: dict[tuple[str, int, int], Job] = {}
        self._in_phase = dict.fromkeys(Phase, 0)
        self.peak_running = 0
        # Functions still running after their attempt was reported timed out: each
        # keeps its slot until it returns (a thread cannot be killed).
        self.overrunning = 0
        self.counts: dict[str, int] = {
            "claimed": 0,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "released": 0,
            "unserved": 0,
            "stale": 0,
            "duplicate": 0,
            "overran": 0,
        }

    # -- transitions

    def _move(self, job: Job, phase: Phase) -> None:
        self._in_phase[job.phase] -= 1
        job.phase = phase
        self._in_phase[phase] += 1
        if phase is not Phase.CLAIMED and phase is not Phase.RUNNING:
            self._notify()

    def _notify(self) -> None:
        self.cond.notify_all()
        if self.on_free is not None:
            self.on_free()

    def add(self, claim: Claim, phase: Phase = Phase.CLAIMED) -> Job:
        """Hold a new claim (``REPORTING`` for one that will not run)."""
        job = Job(claim, phase=phase)
        with self.cond:
            self._jobs[claim.token] = job
            self._in_phase[phase] += 1
            self.counts["claimed"] += 1
            if phase is Phase.REPORTING:
                self._notify()
        return job

    def add_many(self, claims: Iterable[Claim]) -> list[Job]:
        """Hold new claims that will run, under one lock for the whole claim reply."""
        jobs = [Job(claim) for claim in claims]
        with self.cond:
            for job in jobs:
                self._jobs[job.claim.token] = job
            self._in_phase[Phase.CLAIMED] += len(jobs)
            self.counts["claimed"] += len(jobs)
        return jobs

    def begin(self, job: Job) -> bool:
        """A pool thread picks ``job`` up; False if the shutdown released it first."""
        with self.cond:
            if job.phase is not Phase.CLAIMED:
                return False
            self._move(job, Phase.RUNNING)
            self.peak_running = max(self.peak_running, self._in_phase[Phase.RUNNING])
            return True

    def end(self, job: Job) -> None:
        """The function returned: its slot is free; the job stays until its report lands."""
        with self.cond:
            if job.phase is Phase.RUNNING and job.claim.token in self._jobs:
                self._move(job, Phase.REPORTING)

    def overran(self, job: Job) -> None:
        """``job``'s function outlived its time limit: its attempt is being reported, and
        its slot stays taken until :meth:`overrun_ended`."""
        with self.cond:
            self.overrunning += 1
            self.counts["overran"] += 1
            if job.phase is Phase.RUNNING and job.claim.token in self._jobs:
                self._move(job, Phase.REPORTING)

    def overrun_ended(self) -> None:
        """A function that outlived its time limit returned at last: its slot is free."""
        with self.cond:
            self.overrunning -= 1
            self._notify()

    def done(self, jobs: Iterable[Job]) -> None:
        """Reports of ``jobs`` were answered (or given up): they hold nothing any more."""
        with self.cond:
            for job in jobs:
                if self._jobs.pop(job.claim.token, None) is not None:
                    self._in_phase[job.phase] -= 1
            self._notify()

    def release_unstarted(self) -> list[Job]:
        """Mark every claim no pool thread picked up yet as released (shutdown): none
        will start it, and it is held until its hand-back is answered."""
        with self.cond:
            jobs = [j for j in self._jobs.values() if j.phase is Phase.CLAIMED]
            for job in jobs:
                self._move(job, Phase.RELEASED)
            return jobs

    # -- reading

    @property
    def free(self) -> int:
        with self.cond:
            return self._free()

    def _free(self) -> int:
        return self.concurrency - self._busy()

    def _busy(self) -> int:
        busy = self._in_phase[Phase.CLAIMED] + self._in_phase[Phase.RUNNING] + self.overrunning
        return busy + self._over_bound()

    def busy(self) -> int:
        """The slots taken: claimed, running, overrunning, and unsent past the bound."""
        with self.cond:
            return self._busy()

    def _unsent(self) -> int:
        return self._in_phase[Phase.REPORTING] + self._in_phase[Phase.RELEASED]

    def _over_bound(self) -> int:
        """Unsent outcomes past ``max_unsent``: each of them takes a slot."""
        if self.max_unsent is None:
            return 0
        return max(0, self._unsent() - self.max_unsent)

    @property
    def unsent(self) -> int:
        """Finished claims whose outcome Redis has not answered yet."""
        with self.cond:
            return self._unsent()

    def held_by_unsent(self) -> bool:
        """Whether the unsent outcomes alone leave no slot free (claiming waits on them)."""
        with self.cond:
            return self._free() <= 0 and self._over_bound() > 0

    @property
    def running(self) -> int:
        with self.cond:
            return self._in_phase[Phase.RUNNING]

    def held(self) -> list[Job]:
        """The jobs whose lease this worker holds (everything not yet answered)."""
        with self.cond:
            return list(self._jobs.values())

    def matching(self, task_id: str, version: int) -> list[Job]:
        with self.cond:
            return [
                j
                for j in self._jobs.values()
                if j.claim.task_id == task_id and j.claim.version == version
            ]

    def signal_all(self, reason: StopReason) -> None:
        for job in self.held():
            job.ctx._signal_stop(reason)

    def snapshot(self) -> dict[str, int]:
        with self.cond:
            return {
                "executing": self._in_phase[Phase.RUNNING],
                "unstarted": self._in_phase[Phase.CLAIMED],
                "reporting": self._in_phase[Phase.REPORTING],
                "overrunning": self.overrunning,
                "free": self._free(),
            }

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.counts[key] += n

    # -- waiting

    def wait_free(self, stopping: threading.Event, limit: float | None = None) -> int:
        """Block until a slot is free, ``stopping`` is set or ``limit`` seconds passed;
        return the free slots (0 when none came in time)."""
        deadline = None if limit is None else time.monotonic() + limit
        with self.cond:
            while self._free() <= 0 and not stopping.is_set():
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left <= 0:
                    break
                self.cond.wait(left)
            return max(0, self._free())

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is held any more; False when ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True
