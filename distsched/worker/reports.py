"""Outcomes of runs, and the reporter thread that sends them to Redis in batches."""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException

from distsched import core
from distsched.client import Scheduler
from distsched.context import TaskContext
from distsched.core import Outcome
from distsched.errors import Cancelled, ClosedError, ConflictError, InvalidArgument
from distsched.metrics import WorkerMetrics
from distsched.worker.common import RETRY_MAX_S, RETRY_MIN_S, TRANSIENT
from distsched.worker.jobs import Job, Slots
from distsched.worker.served import UNSERVED_RECHECK_S, GiveUp, HandBack, ServedFunctions

log = logging.getLogger("distsched.worker")

# The most outcomes sent in one report call.
REPORT_BATCH = 512
# Faults ridden out with short pauses: those of the worker, and redis-py's cluster
# client finding no node to ask (outside RedisError) while a cluster changes.
PASSING = (*TRANSIENT, RedisClusterException)
# The longest pause before sending again reports that Redis refused (not a transient
# fault: a corrupt record, an ACL, out of memory), so that the log is not flooded.
REFUSED_RETRY_MAX_S = 30.0
# How much longer than its send deadline a stop waits for the thread to end.
STOP_MARGIN_S = 1.0


class ReportKind(str, enum.Enum):
    """What the worker tells Redis about a claim it holds."""

    COMPLETE = "complete"  # the function returned: succeeded
    FAIL = "fail"  # the function raised (retried while attempts remain), or bad payload
    CONFIRM_CANCEL = "confirm_cancel"  # the function stopped on a cancel request: cancelled
    RELEASE = "release"  # stopped or never started on the shutdown: back to ready, no attempt
    UNSERVED = "unserved"  # not run: this worker does not serve the function (§8)
    HAND_BACK = "hand_back"  # an unserved claim given back, due again after a delay (value)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Returned:
    value: Any


@dataclass(frozen=True)
class Raised:
    error: BaseException


def outcome_of(ctx: TaskContext, result: Returned | Raised) -> tuple[ReportKind, object]:
    """The report for a run that ended with ``result``: the one rule for ``def`` and
    ``async def`` functions alike.

    - Returned: succeeded, even if the function was signalled meanwhile.
    - Raised after the lease was lost: failed (the report is stale anyway).
    - Raised ``Cancelled`` after a cancel request: cancelled.
    - Raised anything after the worker's shutdown signalled it: handed back to
      ready without spending an attempt (cancelled instead when a cancel was
      requested). The signal is the likeliest cause of whatever the function
      raised then, and a genuine failure shows again on the next run.
    - Anything else raised: failed.
    """
    if isinstance(result, Returned):
        return ReportKind.COMPLETE, result.value
    error = result.error
    if ctx.lease_lost:
        return ReportKind.FAIL, error
    if isinstance(error, Cancelled) and ctx._cancel_was_requested:
        return ReportKind.CONFIRM_CANCEL, None
    if ctx.worker_stopping:
        return ReportKind.RELEASE, None
    return ReportKind.FAIL, error


@dataclass(frozen=True)
class Report:
    job: Job
    kind: ReportKind
    value: object


@dataclass(eq=False)
class _Waiting:
    """A report whose last send failed, waiting to be sent again."""

    report: Report
    due: float  # time.monotonic() of the next try
    failures: int = 0
    # Sent on its own: a batch it was part of was refused, so that one bad report
    # cannot hold back the others.
    alone: bool = False


@dataclass(frozen=True)
class _Stop:
    deadline: float  # time.monotonic() after which what is still unsent is given up


class Reporter:
    """One thread sending outcomes; those that pile up during a round trip go together
    in the next, so a batch grows with the load while an idle worker reports at once.

    An outcome is kept until Redis answered it (applied, duplicate or stale). A send
    that fails is tried again with a capped backoff, however long Redis is away (a
    failover, a slot migration, a lost network), and so is one that Redis refuses
    (logged each time): a refused batch is split, so the other reports go through.
    Meanwhile the heartbeat keeps the leases. Only the worker's shutdown, once its
    time is up, or a closed scheduler ends that: the outcomes still unsent are then
    logged, and their tasks run again when their leases expire.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        slots: Slots,
        metrics: WorkerMetrics,
        served: ServedFunctions,
    ) -> None:
        self.scheduler = scheduler
        self.slots = slots
        self.metrics = metrics
        self.served = served
        self._queue: queue.SimpleQueue[Report | _Stop] = queue.SimpleQueue()
        self._waiting: list[_Waiting] = []
        self._thread = threading.Thread(target=self._loop, name="distsched-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Send what is queued (trying for up to ``timeout`` seconds), then end the thread."""
        self._queue.put(_Stop(time.monotonic() + timeout))
        self._thread.join(timeout + STOP_MARGIN_S)

    def put(self, job: Job, kind: ReportKind, value: object) -> None:
        """Queue an outcome; the value is encoded here, on the caller's thread."""
        if kind is ReportKind.COMPLETE:
            try:
                value = core.encode_result(value)
            except InvalidArgument as exc:
                kind, value = ReportKind.FAIL, f"result not storable: {exc}"
        elif kind is ReportKind.FAIL:
            value = core.error_text(value)
        self._queue.put(Report(job, kind, value))

    @property
    def unsent(self) -> int:
        """How many outcomes wait to be sent again after a failed send."""
        return len(self._waiting)

    # ------------------------------------------------------------------ thread

    def _loop(self) -> None:
        stop: _Stop | None = None
        while True:
            fresh, stop = self._collect(stop)
            now = time.monotonic()
            due = [w for w in self._waiting if w.due <= now]
            if due:
                self._waiting = [w for w in self._waiting if w.due > now]
            try:
                self._send_all(due, fresh)
            except Exception:
                # A bug of this loop must not end the thread: what was taken waits again.
                log.exception("sending reports failed")
                self._waiting.extend(due)
                self._waiting.extend(_Waiting(r, time.monotonic() + RETRY_MAX_S) for r in fresh)
            if stop is not None:
                if not self._waiting and self._queue.empty():
                    return
                if time.monotonic() >= stop.deadline:
                    self._give_up([w.report for w in self._waiting])
                    return

    def _collect(self, stop: _Stop | None) -> tuple[list[Report], _Stop | None]:
        """New reports (at most a batch), waiting until one comes, a waiting report is
        due again, or the shutdown's deadline."""
        wake = min((w.due for w in self._waiting), default=None)
        if stop is not None:
            wake = stop.deadline if wake is None else min(wake, stop.deadline)
        timeout = None if wake is None else max(0.0, wake - time.monotonic())
        fresh: list[Report] = []
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return fresh, stop
        while True:
            if isinstance(item, _Stop):
                stop = item
            else:
                fresh.append(item)
            if len(fresh) >= REPORT_BATCH:
                return fresh, stop
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return fresh, stop

    def _give_up(self, reports: list[Report]) -> None:
        for report in reports:
            claim = report.job.claim
            log.error(
                "the %s of task %r (version %d, attempt %d) was not reported before the "
                "shutdown ended: its lease will expire and it will run again",
                report.kind, claim.task_id, claim.version, claim.attempt,
            )  # fmt: skip
        self.slots.done(r.job for r in reports)

    def _send_all(self, waiting: list[_Waiting], fresh: list[Report]) -> None:
        """Send reports: those sent alone one by one, the rest in batches by kind."""
        together = [w.report for w in waiting if not w.alone] + fresh
        tries = {id(w.report): w for w in waiting}
        unserved = [r for r in together if r.kind is ReportKind.UNSERVED]
        if unserved:
            together = [r for r in together if r.kind is not ReportKind.UNSERVED]
            together.extend(self._resolve_unserved(unserved))
        groups: dict[tuple[ReportKind, object], list[Report]] = {}
        for report in together:
            # Hand-backs go together only with the same delay; the rest by kind.
            value = report.value if report.kind is ReportKind.HAND_BACK else None
            groups.setdefault((report.kind, value), []).append(report)
        batches = [[w.report] for w in waiting if w.alone]
        for (kind, _), reports in groups.items():
            if kind is ReportKind.CONFIRM_CANCEL:
                batches.extend([r] for r in reports)
            else:
                batches.extend(
                    reports[i : i + REPORT_BATCH] for i in range(0, len(reports), REPORT_BATCH)
                )
        for batch in batches:
            self._send(batch, [tries.get(id(r)) for r in batch])

    def _resolve_unserved(self, reports: list[Report]) -> list[Report]:
        try:
            decisions = self.served.decide([r.job.claim for r in reports])
        except Exception as exc:
            # Not worth a wait: handed back, they come round again to be checked anew.
            log.warning("checking which functions are served failed: %s", exc)
            decisions = [HandBack(UNSERVED_RECHECK_S)] * len(reports)
        resolved = []
        for report, decision in zip(reports, decisions, strict=True):
            if isinstance(decision, GiveUp):
                log.warning("task %r: %s", report.job.claim.task_id, decision.reason)
                resolved.append(Report(report.job, ReportKind.FAIL, decision.reason))
            else:
                resolved.append(Report(report.job, ReportKind.HAND_BACK, decision.delay))
        return resolved

    def _send(self, reports: list[Report], tries: list[_Waiting | None]) -> None:
        """Send one batch of one kind; record the answers, or keep it to try again."""
        kind = reports[0].kind
        for report in reports:
            report.job.sent = True
        try:
            outcomes = self._call(kind, reports)
        except ClosedError:
            log.error("the scheduler is closed: %d %s reports are dropped", len(reports), kind)
            self.slots.done(r.job for r in reports)
            return
        except ConflictError:
            # confirm_cancel refused: Redis holds no cancel request for this run.
            reason = "stopped on a cancel request that Redis does not hold"
            failed = Report(reports[0].job, ReportKind.FAIL, reason)
            self._waiting.append(_Waiting(failed, time.monotonic()))
            return
        except PASSING as exc:
            self._again(reports, tries, exc, transient=True)
            return
        except Exception as exc:
            self._again(reports, tries, exc, transient=False)
            return
        for outcome in outcomes:
            self._count(kind, outcome)
        self.slots.done(r.job for r in reports)

    def _again(
        self,
        reports: list[Report],
        tries: list[_Waiting | None],
        exc: Exception,
        transient: bool,
    ) -> None:
        """Keep a batch whose send failed, to send again after a pause."""
        now = time.monotonic()
        failures = 1 + max((t.failures for t in tries if t is not None), default=0)
        cap = RETRY_MAX_S if transient else REFUSED_RETRY_MAX_S
        pause = min(cap, RETRY_MIN_S * 2 ** min(failures - 1, 20))
        kind = reports[0].kind
        if transient:
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(level, "sending %d %s reports failed, trying again: %s", len(reports),
                    kind, exc)  # fmt: skip
        else:
            log.error(
                "Redis refused %d %s reports (trying again in %.1f s): %s",
                len(reports), kind, pause if len(reports) == 1 else RETRY_MIN_S, exc,
                exc_info=exc,
            )  # fmt: skip
        if not transient and len(reports) > 1:
            # Each on its own at once: the one that Redis refuses waits alone.
            self._waiting.extend(_Waiting(r, now, failures, alone=True) for r in reports)
            return
        alone = any(t is not None and t.alone for t in tries)
        self._waiting.extend(_Waiting(r, now + pause, failures, alone) for r in reports)

    def _call(self, kind: ReportKind, reports: list[Report]) -> list[Outcome]:
        s = self.scheduler
        if kind is ReportKind.COMPLETE:
            return s.complete_encoded([(r.job.claim, r.value) for r in reports])  # type: ignore[misc]
        if kind is ReportKind.FAIL:
            return s.fail_many([(r.job.claim, r.value) for r in reports])
        if kind is ReportKind.CONFIRM_CANCEL:
            return [s.confirm_cancel(reports[0].job.claim)]
        if kind is ReportKind.RELEASE or kind is ReportKind.HAND_BACK:
            delay = reports[0].value if kind is ReportKind.HAND_BACK else 0.0
            assert isinstance(delay, float)
            released = s.release([r.job.claim for r in reports], delay=delay)
            # The script answers how many were handed back; the rest were stale.
            return [Outcome.APPLIED] * released + [Outcome.STALE] * (len(reports) - released)
        raise AssertionError(f"no report call for {kind}")

    def _count(self, kind: ReportKind, outcome: Outcome) -> None:
        if kind is ReportKind.RELEASE or kind is ReportKind.HAND_BACK:
            if outcome is not Outcome.APPLIED:
                self.slots.count(outcome.value)
            elif kind is ReportKind.RELEASE:
                self.slots.count("released")
                self.metrics.on_released(1)
            else:
                self.slots.count("unserved")
            return
        if outcome is Outcome.APPLIED:
            key = {ReportKind.COMPLETE: "succeeded", ReportKind.CONFIRM_CANCEL: "cancelled"}.get(
                kind, "failed"
            )
        else:
            key = outcome.value
        self.slots.count(key)
        self.metrics.on_outcome(kind.value, outcome)
