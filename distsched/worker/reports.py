"""Outcomes of runs, and the reporter thread that sends them to Redis in batches."""

from __future__ import annotations

import difflib
import enum
import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from redis.exceptions import RedisClusterException

from distsched.context import TaskContext
from distsched.errors import Cancelled, ClosedError, ConflictError, InvalidArgument, LeaseLost
from distsched.metrics import WorkerMetrics
from distsched.model import Claim, Outcome, Spawn, State
from distsched.wire import payload
from distsched.worker.common import RESUME_PROBE_S, RETRY_MAX_S, RETRY_MIN_S, TRANSIENT
from distsched.worker.jobs import Job, Slots
from distsched.worker.link import WorkerLink
from distsched.worker.logs import TaskOutcome, error_line, task_fields, tasks_log
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
# The most task records read after one batch of failures, to log each as retried or
# failed; the failures past it (a mass failure) are logged as failed.
STATUS_READS_MAX = 64

# How many handed-back task versions are remembered, so each is logged once.
HANDED_BACK_KEEP = 10_000


class ReportKind(str, enum.Enum):
    """What the worker tells Redis about a claim it holds."""

    COMPLETE = "complete"  # the function returned: succeeded
    SPAWN = "spawn"  # the function returned a Spawn: succeeded, its tasks added (value)
    FAIL = "fail"  # the function raised (retried while attempts remain), or bad payload
    CONFIRM_CANCEL = "confirm_cancel"  # the function stopped on a cancel request: cancelled
    RELEASE = "release"  # stopped or never started on the shutdown: back to ready, no attempt
    UNSERVED = "unserved"  # not run: this worker does not serve the function (§8)
    HAND_BACK = "hand_back"  # an unserved claim given back, due again after a delay (value)

    def __str__(self) -> str:
        return self.value


# Slotted and not frozen: one of them is made per run, and a frozen dataclass's
# __init__ goes through object.__setattr__ field by field.
@dataclass(slots=True)
class Returned:
    value: Any


@dataclass(slots=True)
class Raised:
    error: BaseException


def outcome_of(ctx: TaskContext, result: Returned | Raised) -> tuple[ReportKind, object]:
    """The report for a run that ended with ``result``: the one rule for ``def`` and
    ``async def`` functions alike.

    - Reached its time limit (and not stopped on a cancel request): failed with
      ``timed out after N s``, whether it then returned or raised.
    - Returned: succeeded, even if the function was signalled meanwhile; a returned
      :class:`~distsched.model.Spawn` adds its tasks in the same report.
    - Raised after the lease was lost: failed (the report is stale anyway).
    - Raised ``Cancelled`` after a cancel request: cancelled.
    - Raised anything after the worker's shutdown signalled it: handed back to
      ready without spending an attempt (cancelled instead when a cancel was
      requested). The signal is the likeliest cause of whatever the function
      raised then, and a genuine failure shows again on the next run.
    - Anything else raised: failed.
    """
    error = result.error if isinstance(result, Raised) else None
    if ctx.timed_out and not (isinstance(error, Cancelled) and ctx._cancel_was_requested):
        return ReportKind.FAIL, ctx.timeout_error
    if isinstance(result, Returned):
        if isinstance(result.value, Spawn):
            return ReportKind.SPAWN, result.value
        return ReportKind.COMPLETE, result.value
    error = result.error
    if ctx.lease_lost:
        return ReportKind.FAIL, error
    if isinstance(error, Cancelled) and ctx._cancel_was_requested:
        return ReportKind.CONFIRM_CANCEL, None
    if ctx.worker_stopping:
        return ReportKind.RELEASE, None
    return ReportKind.FAIL, error


class Report(NamedTuple):
    """One outcome on its way to Redis (a tuple: one is made per run)."""

    job: Job
    kind: ReportKind
    value: object
    # For the log: how long the function ran, and what it raised (with its traceback).
    duration: float | None = None
    error: BaseException | None = None


def _log_unrecorded(kind: ReportKind, report: Report, outcome: Outcome) -> None:
    """The line of a report Redis did not record: stale (lease lost) or a duplicate."""
    claim = report.job.claim
    error = _error_of(report)
    if outcome is Outcome.DUPLICATE:
        tasks_log.debug(
            "task %r (%s) attempt %d: %s already reported",
            claim.task_id,
            claim.fn,
            claim.attempt,
            kind,
            extra=task_fields(claim, TaskOutcome.DUPLICATE, report.duration, error),
        )
        return
    # The function only obeyed the signal when it raised LeaseLost: no news in it.
    exc_info = None if isinstance(report.error, LeaseLost) else report.error
    what = "result" if kind is ReportKind.COMPLETE or kind is ReportKind.SPAWN else "outcome"
    tasks_log.warning(
        "task %r (%s) version %d attempt %d: the lease was lost before its %s "
        "(%s) was reported; another run owns the task, this one is not recorded",
        claim.task_id,
        claim.fn,
        claim.version,
        claim.attempt,
        what,
        kind,
        exc_info=exc_info,
        extra=task_fields(claim, TaskOutcome.LEASE_LOST, report.duration, error),
    )


def _log_failure(report: Report, runs_again: bool) -> None:
    claim = report.job.claim
    error = _error_of(report)
    if runs_again:
        tasks_log.warning(
            "task %r (%s) attempt %d failed and will run again: %s",
            claim.task_id,
            claim.fn,
            claim.attempt,
            error,
            exc_info=report.error,
            extra=task_fields(claim, TaskOutcome.RETRIED, report.duration, error),
        )
    else:
        tasks_log.error(
            "task %r (%s) attempt %d failed: %s",
            claim.task_id,
            claim.fn,
            claim.attempt,
            error,
            exc_info=report.error,
            extra=task_fields(claim, TaskOutcome.FAILED, report.duration, error),
        )


def _log_recorded(kind: ReportKind, report: Report, runs_again: bool) -> None:
    """The line of a report Redis applied; ``runs_again`` for a failure whose retry is due."""
    claim = report.job.claim
    if kind is ReportKind.FAIL:
        _log_failure(report, runs_again)
    elif kind is ReportKind.COMPLETE or kind is ReportKind.SPAWN:
        tasks_log.debug(
            "task %r (%s) attempt %d succeeded in %.3fs",
            claim.task_id,
            claim.fn,
            claim.attempt,
            report.duration or 0.0,
            extra=task_fields(claim, TaskOutcome.SUCCEEDED, report.duration),
        )
    elif kind is ReportKind.CONFIRM_CANCEL:
        tasks_log.info(
            "task %r (%s) attempt %d cancelled",
            claim.task_id,
            claim.fn,
            claim.attempt,
            extra=task_fields(claim, TaskOutcome.CANCELLED, report.duration),
        )
    elif kind is ReportKind.RELEASE:
        tasks_log.info(
            "task %r (%s) handed back by the shutdown; no attempt spent",
            claim.task_id,
            claim.fn,
            extra=task_fields(claim, TaskOutcome.RELEASED, report.duration),
        )
    # A hand-back (function not served here) is logged when it is decided, once per
    # task version: Reporter._log_hand_back.


def _encoded_results(reports: list[Report]) -> list[tuple[Claim, bytes]]:
    # A COMPLETE report's value is bytes: ``Reporter.report`` encodes it with
    # ``wire.payload.encode_result`` (or turns the report into a FAIL) unless the caller
    # encoded it already. The cast states that; Report.value is typed for every kind.
    return [(r.job.claim, cast(bytes, r.value)) for r in reports]


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
        link: WorkerLink,
        slots: Slots,
        metrics: WorkerMetrics,
        served: ServedFunctions,
    ) -> None:
        self.link = link
        self.scheduler = link.scheduler
        self.slots = slots
        self.metrics = metrics
        self.served = served
        self._queue: queue.SimpleQueue[Report | _Stop] = queue.SimpleQueue()
        self._waiting: list[_Waiting] = []
        # The task versions handed back once already (their later hand-backs log nothing).
        self._handed_back: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._thread = threading.Thread(target=self._loop, name="distsched-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Send what is queued (trying for up to ``timeout`` seconds), then end the thread."""
        self._queue.put(_Stop(time.monotonic() + timeout))
        self._thread.join(timeout + STOP_MARGIN_S)

    def put(
        self,
        job: Job,
        kind: ReportKind,
        value: object,
        duration: float | None = None,
        encoded: bool = False,
    ) -> None:
        """Queue an outcome; the value is encoded here, on the caller's thread, unless
        ``encoded`` (a result already encoded by ``wire.payload.encode_result``).
        ``duration`` is how long the function ran (for the log)."""
        error = value if isinstance(value, BaseException) else None
        if kind is ReportKind.COMPLETE and not encoded:
            try:
                value = payload.encode_result(value)
            except InvalidArgument as exc:
                kind, value = ReportKind.FAIL, f"result not storable: {exc}"
        elif kind is ReportKind.FAIL:
            value = payload.error_text(value)
        self._queue.put(Report(job, kind, value, duration, error))

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
        self.slots.done(r.job for r in reports)
        for report in reports:
            claim = report.job.claim
            tasks_log.error(
                "the %s of task %r (version %d, attempt %d) was not reported before the "
                "shutdown ended: its lease will expire and it will run again",
                report.kind,
                claim.task_id,
                claim.version,
                claim.attempt,
                extra=task_fields(
                    claim, TaskOutcome.UNREPORTED, report.duration, _error_of(report)
                ),
            )

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
            if kind is ReportKind.CONFIRM_CANCEL or kind is ReportKind.SPAWN:
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
                claim = report.job.claim
                tasks_log.warning(
                    "task %r (%s): %s",
                    claim.task_id,
                    claim.fn,
                    decision.reason,
                    extra=task_fields(
                        claim, TaskOutcome.UNSERVED, None, error_line(decision.reason)
                    ),
                )
                self.metrics.on_unserved(claim)
                resolved.append(Report(report.job, ReportKind.FAIL, decision.reason))
            else:
                self._log_hand_back(report.job.claim, decision)
                resolved.append(Report(report.job, ReportKind.HAND_BACK, decision.delay))
        return resolved

    def _log_hand_back(self, claim: Claim, decision: HandBack) -> None:
        """One line at the first hand-back of a task version, none at the ones after:
        the task comes round every few seconds until a worker serves it."""
        seen = (claim.task_id, claim.version)
        if seen in self._handed_back:
            return
        self._handed_back[seen] = None
        if len(self._handed_back) > HANDED_BACK_KEEP:
            self._handed_back.popitem(last=False)
        extra = task_fields(claim, TaskOutcome.HANDED_BACK)
        if decision.served_elsewhere:
            tasks_log.debug(
                "task %r (%s) handed back unstarted: another live worker serves it",
                claim.task_id,
                claim.fn,
                extra=extra,
            )
            return
        close = difflib.get_close_matches(claim.fn, self.served.functions, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
        tasks_log.warning(
            "task %r (%s) handed back unstarted: no live worker of the namespace serves "
            "function %r%s; it fails if none does within unserved_timeout (%gs)",
            claim.task_id,
            claim.fn,
            claim.fn,
            hint,
            self.served.timeout,
            extra=extra,
        )

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
        except (ConflictError, InvalidArgument) as exc:
            if kind is ReportKind.SPAWN:
                # A spawn refused whole (an id that exists, a bad task): nothing was
                # written, and the run fails saying why.
                reason = f"spawn refused: {exc}"
            elif isinstance(exc, InvalidArgument):
                self._again(reports, tries, exc, transient=False)
                return
            else:
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
        self._count_all(kind, outcomes)
        # Let go first: the slots and leases are free whatever the log lines below cost.
        self.slots.done(r.job for r in reports)
        try:
            self._log_outcomes(kind, reports, outcomes)
        except Exception:
            # The outcomes are recorded: a failure to describe them must not send them again.
            log.exception("logging %d %s outcomes failed", len(reports), kind)

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
        cap = RESUME_PROBE_S if transient else REFUSED_RETRY_MAX_S
        pause = min(cap, RETRY_MIN_S * 2 ** min(failures - 1, 20))
        kind = reports[0].kind
        if transient:
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(
                level, "sending %d %s reports failed, trying again: %s", len(reports), kind, exc
            )
        else:
            log.error(
                "Redis refused %d %s reports (trying again in %.1f s): %s",
                len(reports),
                kind,
                pause if len(reports) == 1 else RETRY_MIN_S,
                exc,
                exc_info=exc,
            )
        if not transient and len(reports) > 1:
            # Each on its own at once: the one that Redis refuses waits alone.
            self._waiting.extend(_Waiting(r, now, failures, alone=True) for r in reports)
            return
        alone = any(t is not None and t.alone for t in tries)
        self._waiting.extend(_Waiting(r, now + pause, failures, alone) for r in reports)

    def _call(self, kind: ReportKind, reports: list[Report]) -> list[Outcome]:
        s = self.scheduler
        if kind is ReportKind.COMPLETE:
            return self.link.complete_encoded(_encoded_results(reports))
        if kind is ReportKind.SPAWN:
            return [s.spawn(reports[0].job.claim, cast(Spawn, reports[0].value))]
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

    def _log_outcomes(
        self, kind: ReportKind, reports: list[Report], outcomes: list[Outcome]
    ) -> None:
        """One line per report that Redis answered."""
        handed_back = kind is ReportKind.RELEASE or kind is ReportKind.HAND_BACK
        if handed_back and Outcome.STALE in outcomes:
            # The release reply counts the stale ones without naming them: one line.
            stale = outcomes.count(Outcome.STALE)
            tasks_log.warning(
                "%d of %d %s reports were stale: their leases were lost before",
                stale,
                len(reports),
                kind,
            )
            return
        if (
            (kind is ReportKind.COMPLETE or kind is ReportKind.SPAWN)
            and not tasks_log.isEnabledFor(logging.DEBUG)
            and all(o is Outcome.APPLIED for o in outcomes)
        ):
            return  # successes are logged at DEBUG only: nothing to build
        failed = [
            r
            for r, o in zip(reports, outcomes, strict=False)
            if kind is ReportKind.FAIL and o is Outcome.APPLIED
        ]
        again = self._will_run_again(failed)
        for report, outcome in zip(reports, outcomes, strict=False):
            if outcome is Outcome.STALE or outcome is Outcome.DUPLICATE:
                _log_unrecorded(kind, report, outcome)
            else:
                _log_recorded(kind, report, again.get(id(report), False))

    def _will_run_again(self, failed: list[Report]) -> dict[int, bool]:
        """For applied failures: whether the task is due to run again (by ``id`` of the
        report). The fail reply does not say; the records do, read after it."""
        again: dict[int, bool] = {}
        if not failed or not tasks_log.isEnabledFor(logging.WARNING):
            return again
        for report in failed[:STATUS_READS_MAX]:
            claim = report.job.claim
            try:
                info = self.scheduler.status(claim.task_id)
            except Exception as exc:
                # Not known: logged as failed, the safer reading for whoever watches.
                log.debug("reading task %r after its failure failed: %s", claim.task_id, exc)
                continue
            # Same version and not ended: the retry is queued (or already running).
            again[id(report)] = info.version == claim.version and info.state in (
                State.READY,
                State.RUNNING,
                State.PENDING,
            )
        return again

    def _count_all(self, kind: ReportKind, outcomes: list[Outcome]) -> None:
        if kind is ReportKind.COMPLETE and all(o is Outcome.APPLIED for o in outcomes):
            # The common case, counted under one lock for the whole batch.
            self.slots.count("succeeded", len(outcomes))
            for outcome in outcomes:
                self.metrics.on_outcome(kind.value, outcome)
            return
        for outcome in outcomes:
            self._count(kind, outcome)

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
            key = {
                ReportKind.COMPLETE: "succeeded",
                ReportKind.SPAWN: "succeeded",
                ReportKind.CONFIRM_CANCEL: "cancelled",
            }.get(kind, "failed")
        else:
            key = outcome.value
        self.slots.count(key)
        self.metrics.on_outcome(kind.value, outcome)


def _error_of(report: Report) -> str | None:
    """The ``error`` field of a report's log line."""
    if report.error is not None:
        return error_line(report.error)
    if report.kind is ReportKind.FAIL and isinstance(report.value, str):
        return error_line(report.value)
    return None
