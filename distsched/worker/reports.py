"""Outcomes of runs, and the reporter thread that sends them to Redis in batches."""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distsched import core
from distsched.client import Scheduler
from distsched.context import TaskContext
from distsched.core import Outcome
from distsched.errors import Cancelled, ClosedError, ConflictError, InvalidArgument
from distsched.metrics import WorkerMetrics
from distsched.worker.common import TRANSIENT, backoff
from distsched.worker.jobs import Job, Slots
from distsched.worker.served import UNSERVED_RECHECK_S, GiveUp, HandBack, ServedFunctions

log = logging.getLogger("distsched.worker")

# The most outcomes sent in one report call.
REPORT_BATCH = 512


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


class Reporter:
    """One thread sending outcomes; those that pile up during a round trip go together
    in the next, so a batch grows with the load while an idle worker reports at once.

    It never drops an outcome it has not seen answered, short of a give-up deadline
    of at least a minute of Redis being unreachable.
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
        self._queue: queue.SimpleQueue[Report | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="distsched-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Send what is queued, then end the thread (waiting up to ``timeout``)."""
        self._queue.put(None)
        self._thread.join(timeout)

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

    # ------------------------------------------------------------------ thread

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < REPORT_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._send_batch(batch)
            if stop:
                return

    def _send_batch(self, batch: list[Report]) -> None:
        unserved = [r for r in batch if r.kind is ReportKind.UNSERVED]
        if unserved:
            batch = [r for r in batch if r.kind is not ReportKind.UNSERVED]
            batch.extend(self._resolve_unserved(unserved))
        groups: dict[tuple[ReportKind, object], list[Report]] = {}
        for report in batch:
            # Hand-backs go together only with the same delay; the rest by kind.
            value = report.value if report.kind is ReportKind.HAND_BACK else None
            groups.setdefault((report.kind, value), []).append(report)
        for (kind, _), reports in groups.items():
            if kind is ReportKind.CONFIRM_CANCEL:
                for report in reports:
                    self._send(kind, [report])
            else:
                self._send(kind, reports)

    def _resolve_unserved(self, reports: list[Report]) -> list[Report]:
        try:
            decisions = self._retrying(
                lambda: self.served.decide([r.job.claim for r in reports]), "unserved check"
            )
        except ClosedError:
            decisions = None
        except Exception:
            log.exception("checking which functions are served failed")
            decisions = None
        if decisions is None:
            decisions = [HandBack(UNSERVED_RECHECK_S)] * len(reports)
        resolved = []
        for report, decision in zip(reports, decisions, strict=True):
            if isinstance(decision, GiveUp):
                log.warning("task %r: %s", report.job.claim.task_id, decision.reason)
                resolved.append(Report(report.job, ReportKind.FAIL, decision.reason))
            else:
                resolved.append(Report(report.job, ReportKind.HAND_BACK, decision.delay))
        return resolved

    def _retrying(self, call: Callable[[], Any], what: str) -> Any:
        """``call()`` through transient faults; None when they outlast the deadline."""
        retry = backoff()
        deadline = time.monotonic() + max(60.0, 2 * self.scheduler.lease_s)
        while True:
            try:
                return call()
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    log.error("giving up on %s: %s", what, exc)
                    return None
                time.sleep(next(retry))

    def _send(self, kind: ReportKind, reports: list[Report]) -> None:
        """Send one kind of report and record the answers; the jobs are then done."""
        claims = [r.job.claim for r in reports]
        for report in reports:
            report.job.sent = True
        try:
            outcomes = self._retrying(lambda: self._call(kind, reports), f"{len(claims)} {kind}")
        except ClosedError:
            outcomes = None
        except ConflictError:
            # confirm_cancel refused: Redis holds no cancel request for this run.
            reason = "stopped on a cancel request that Redis does not hold"
            self._send(ReportKind.FAIL, [Report(reports[0].job, ReportKind.FAIL, reason)])
            return
        except Exception:
            log.exception("reporting %d %s outcomes failed", len(claims), kind)
            outcomes = None
        if outcomes is not None:
            for outcome in outcomes:
                self._count(kind, outcome)
        self.slots.done(r.job for r in reports)

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
