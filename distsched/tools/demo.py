"""``distsched demo``: a short, checked story of what the scheduler promises.

A real :class:`~distsched.worker.Worker` runs in a background thread of this
process against a fresh namespace, while the story schedules, replaces,
cancels and claims tasks the way producers and other workers would. Every
expected outcome is verified; :func:`run_demo` returns False (and prints a
``FAILED`` line) when anything did not happen as told.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from distsched.client import Scheduler
from distsched.context import current_task
from distsched.model import BlockedBy, Claim, Outcome, State, TaskSpec
from distsched.text import table
from distsched.views import describe, lookup_many, render_text, walk
from distsched.worker import Worker

Echo = Callable[[str], Any]

LEASE_S = 1.0
# No step of the story should take this long; waiting longer means it went wrong.
STEP_TIMEOUT_S = 10.0
POLL_S = 0.01
WORKER_ID = "demo-worker"
VANISHED_ID = "vanished-worker"

# The pipeline chapter: (task id, function, required dependencies).
PIPELINE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("extract", "record", ()),
    ("transform-a", "record", ("extract",)),
    ("transform-b", "flaky", ("extract",)),
    ("transform-c", "record", ("extract",)),
    ("load", "record", ("transform-a", "transform-b", "transform-c")),
    ("publish", "record", ("load",)),
)
FLAKY_ERROR = "source unavailable (first call only)"


class _StoryFailed(Exception):
    """A step never reached its expected state; the story cannot go on."""


@dataclass(frozen=True)
class _Run:
    """One invocation of a task function, as the function itself saw it."""

    task_id: str
    version: int
    attempt: int
    args: tuple[Any, ...]
    server_time: float  # Redis clock when the function started
    run_at: float  # when the claimed version was due (Redis clock)


class _Story:
    def __init__(self, scheduler: Scheduler, echo: Echo) -> None:
        self.s = scheduler
        self.echo = echo
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.runs: list[_Run] = []
        self.submitted: list[str] = []
        self.checks = 0
        self.failures: list[str] = []
        self.release_hold = threading.Event()
        self.release_busy = threading.Event()
        self.stop_functions = threading.Event()
        self.raised: set[str] = set()  # ids whose flaky function already raised
        # Relates the server clock to this process's monotonic clock, for display only:
        # due-ness is always decided, and checked, with the server clock.
        before = time.monotonic()
        self.server0 = scheduler.server_time()
        self.mono0 = (before + time.monotonic()) / 2

    # ---------------------------------------------------------------- output

    def now_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1000.0

    def server_ms(self, server_ts: float) -> float:
        """A server timestamp on the timeline (ms since the demo started)."""
        return (server_ts - self.server0 + self.mono0 - self.t0) * 1000.0

    def say(self, who: str, text: str) -> None:
        with self.lock:
            self._line(who, text)

    def _line(self, who: str, text: str) -> None:
        self.echo(f"[+{self.now_ms():5.0f} ms] {who:<9} {text}")

    def heading(self, text: str) -> None:
        with self.lock:
            self.echo("")
            self.echo(text)

    def check(self, ok: bool, what: str) -> bool:
        self.checks += 1
        if ok:
            self.say("check", f"ok: {what}")
        else:
            self.failures.append(what)
            self.say("check", f"FAILED: {what}")
        return ok

    # ---------------------------------------------------------------- task functions

    def _started(self, label: str) -> _Run:
        ctx = current_task()
        run = _Run(
            task_id=ctx.task_id,
            version=ctx.version,
            attempt=ctx.attempt,
            args=ctx.claim.args,
            server_time=self.s.server_time(),
            run_at=ctx.claim.run_at,
        )
        with self.lock:
            self.runs.append(run)
        self.say(
            "worker",
            f"runs '{run.task_id}' (version {run.version}, attempt {run.attempt}): {label}",
        )
        return run

    def record(self, label: str) -> str:
        """The ordinary task: note that it ran."""
        self._started(label)
        return f"done: {label}"

    def hold(self, label: str) -> str:
        """Keep the worker's only slot busy until the story lets go."""
        self._started(label)
        self.release_hold.wait(STEP_TIMEOUT_S)
        return f"done: {label}"

    def busy(self, label: str) -> str:
        """Keep the worker's only slot busy until the schedule chapter lets go."""
        self._started(label)
        self.release_busy.wait(STEP_TIMEOUT_S)
        return f"done: {label}"

    def watch(self, label: str) -> str:
        """A long job that checks for cancellation between small steps of work."""
        ctx = current_task()
        self._started(label)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline and not self.stop_functions.is_set():
            if ctx.wait_cancelled(0.05):
                self.say("worker", f"'{ctx.task_id}' sees the cancellation request and stops")
                ctx.raise_if_cancelled()
        return "finished without being cancelled"

    def flaky(self, label: str) -> str:
        """Raises the first time it runs for a task id, succeeds after that."""
        run = self._started(label)
        with self.lock:
            first = run.task_id not in self.raised
            self.raised.add(run.task_id)
        if first:
            self.say("worker", f"'{run.task_id}' raises: {FLAKY_ERROR}")
            raise RuntimeError(FLAKY_ERROR)
        return f"done: {label}"

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {
            "record": self.record,
            "hold": self.hold,
            "watch": self.watch,
            "flaky": self.flaky,
            "busy": self.busy,
        }

    # ---------------------------------------------------------------- helpers

    def runs_of(self, task_id: str) -> list[_Run]:
        with self.lock:
            return [r for r in self.runs if r.task_id == task_id]

    def started_order(self, prefix: str) -> list[str]:
        with self.lock:
            return [r.task_id for r in self.runs if r.task_id.startswith(prefix)]

    def started_among(self, ids: list[str]) -> list[str]:
        with self.lock:
            return [r.task_id for r in self.runs if r.task_id in ids]

    def schedule(self, task_id: str, note: str = "", **kwargs: Any) -> int:
        # Holding the output lock: the worker may start the task at once, and its
        # lines must come after the one that scheduled it.
        with self.lock:
            version = self.s.schedule(task_id, **kwargs)
            if task_id not in self.submitted:
                self.submitted.append(task_id)
            due = self.server_ms(self.s.status(task_id).run_at)
            extra = f", {note}" if note else ""
            self._line(
                "producer",
                f"schedule '{task_id}' -> version {version}, due at +{due:.0f} ms{extra}",
            )
        return version

    def wait_for(self, what: str, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not predicate():
            if time.monotonic() > deadline:
                raise _StoryFailed(f"{what} did not happen within {STEP_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)

    def wait_state(self, task_id: str, *states: State) -> None:
        names = " or ".join(s.value for s in states)
        self.wait_for(
            f"'{task_id}' becoming {names}", lambda: self.s.status(task_id).state in states
        )

    def sleep_until_server(self, server_ts: float) -> None:
        while self.s.server_time() < server_ts:
            time.sleep(POLL_S)

    # ---------------------------------------------------------------- the story

    def part_delays(self) -> None:
        self.heading("1. Delayed tasks start when they are due by the Redis clock, never before")
        # Submitted latest-first: the queue orders by due time, not by submission.
        self.schedule("remind-600ms", fn="record", args=["a reminder"], delay=0.6)
        self.schedule("remind-300ms", fn="record", args=["another reminder"], delay=0.3)
        for task_id in ("remind-300ms", "remind-600ms"):
            self.wait_state(task_id, State.SUCCEEDED)
        order = self.started_order("remind-")
        self.check(order == ["remind-300ms", "remind-600ms"], "the +300 ms task ran first")
        for task_id in ("remind-300ms", "remind-600ms"):
            runs = self.runs_of(task_id)
            if not self.check(len(runs) == 1, f"'{task_id}' ran exactly once"):
                continue
            late_ms = (runs[0].server_time - runs[0].run_at) * 1000.0
            # run_at is whole ms and the claim script compares whole ms of the same clock.
            self.check(
                late_ms >= -0.5,
                f"'{task_id}' started {late_ms:.1f} ms after it was due (server clock), not before",
            )

    def part_priorities(self) -> None:
        self.heading(
            "2. Order is (run_at, -priority, submission order): "
            "six tasks, five of them due at the same instant"
        )
        at = self.s.server_time() + 0.3
        batch = [
            ("batch-low", 0, at),
            ("batch-tie-a", 5, at),
            ("batch-high", 10, at),
            ("batch-tie-b", 5, at),
            ("batch-urgent-but-later", 100, at + 0.05),
            ("batch-tie-c", 5, at),
        ]
        expected = [
            "batch-high",
            "batch-tie-a",
            "batch-tie-b",
            "batch-tie-c",
            "batch-low",
            "batch-urgent-but-later",
        ]
        # One atomic batch, so none of them can start before all are queued.
        specs = [
            TaskSpec(task_id, fn="record", args=[f"priority {prio}"], priority=prio, run_at=when)
            for task_id, prio, when in batch
        ]
        with self.lock:
            versions = self.s.schedule_many(specs)
            for (task_id, prio, when), version in zip(batch, versions, strict=True):
                self.submitted.append(task_id)
                self._line(
                    "producer",
                    f"schedule '{task_id}' -> version {version}, priority {prio:>3}, "
                    f"due at +{self.server_ms(when):.0f} ms",
                )
        for task_id in expected:
            self.wait_state(task_id, State.SUCCEEDED)
        order = self.started_order("batch-")
        self.check(
            order == expected,
            "they ran highest priority first, equal priorities in submission order, "
            "and the later one last despite its priority 100",
        )

    def part_replacement(self) -> None:
        self.heading("3. Scheduling an id again replaces the queued version")
        # Far enough apart that the old version cannot become due before it is replaced.
        first = self.schedule("report", fn="record", args=["report draft v1"], delay=0.5)
        old_due = self.s.status("report").run_at
        version = self.schedule(
            "report",
            note=f"replaces version {first} (versions come from one counter per namespace)",
            fn="record",
            args=["report final v2"],
            delay=0.2,
        )
        stats = self.s.stats()
        self.say(
            "demo",
            f"the queue holds {stats['queue_entries']} entries for {stats['live_entries']} "
            "live task: the old entry is dropped when it reaches the head",
        )
        self.wait_state("report", State.SUCCEEDED)
        # Let the old version's due time pass: it must still never run.
        self.sleep_until_server(old_due + 0.1)
        stats = self.s.stats()
        self.say("demo", f"the queue now holds {stats['queue_entries']} entries")
        runs = self.runs_of("report")
        self.check(
            len(runs) == 1 and runs[0].version == version and runs[0].args == ("report final v2",),
            f"only version {version} ran, with its new arguments",
        )

    def part_cancel(self) -> None:
        self.heading("4. Cancellation: hard for queued tasks, cooperative for running ones")
        self.schedule("never-runs", fn="record", args=["should never run"], delay=0.5)
        state = self.s.cancel("never-runs")
        self.say("producer", f"cancel 'never-runs' -> {state}")
        self.check(state is State.CANCELLED, "a queued task is cancelled at once")
        self.sleep_until_server(self.s.status("never-runs").run_at + 0.1)
        self.check(not self.runs_of("never-runs"), "'never-runs' did not run once its time came")

        self.schedule("long-job", fn="watch", args=["works in small steps until cancelled"])
        self.wait_for("'long-job' starting", lambda: bool(self.runs_of("long-job")))
        state = self.s.cancel("long-job")
        self.say("producer", f"cancel 'long-job' -> {state} (cancellation requested)")
        self.check(state is State.RUNNING, "cancel() of a running task reports it still running")
        self.wait_state("long-job", State.CANCELLED, State.SUCCEEDED, State.FAILED)
        info = self.s.status("long-job")
        self.say("demo", f"'long-job' is now {info.state}")
        self.check(
            info.state is State.CANCELLED and info.cancel_requested,
            "the function stopped on the signal and the task ended cancelled",
        )

    def part_vanished(self) -> None:
        self.heading("5. A worker claims a task and vanishes: its lease expires, it is retried")
        self.schedule("hold-the-slot", fn="hold", args=["keeps the demo worker's only slot busy"])
        self.wait_for("'hold-the-slot' starting", lambda: bool(self.runs_of("hold-the-slot")))
        self.schedule(
            "vanishing",
            note="max_attempts=2, backoff=0",
            fn="record",
            args=["picked up again after the lease expired"],
            max_attempts=2,
            backoff=0.0,
        )
        claim = self.s.next(VANISHED_ID)
        if not isinstance(claim, Claim):
            raise _StoryFailed(f"{VANISHED_ID} could not claim 'vanishing': {claim}")
        info = self.s.status("vanishing")
        expiry = self.server_ms(info.lease_deadline or 0.0)
        self.say(
            "other",
            f"{VANISHED_ID} claims '{claim.task_id}' (attempt {claim.attempt}, lease until "
            f"+{expiry:.0f} ms) and crashes: no heartbeat, no report",
        )
        self.check(
            claim.task_id == "vanishing" and claim.attempt == 1, "the first attempt was claimed"
        )
        self.release_hold.set()

        seen: tuple[State, int, str | None] | None = None
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            info = self.s.status("vanishing")
            now = (info.state, info.attempt, info.worker)
            if now != seen:
                seen = now
                holder = f", held by {info.worker}" if info.worker else ""
                note = f" ({info.error})" if info.error and info.state is State.READY else ""
                self.say(
                    "status",
                    f"'vanishing': {info.state}, attempt {info.attempt} of "
                    f"{info.max_attempts}{holder}{note}",
                )
            if info.state.terminal:
                break
            if time.monotonic() > deadline:
                raise _StoryFailed("'vanishing' did not finish")
            time.sleep(POLL_S)
        runs = self.runs_of("vanishing")
        self.check(
            info.state is State.SUCCEEDED and [r.attempt for r in runs] == [2],
            "the worker pool reaped the expired lease and attempt 2 succeeded",
        )
        outcome = self.s.complete(claim, "late result")
        self.say("other", f"{VANISHED_ID} comes back and reports attempt 1 done -> {outcome}")
        self.check(
            outcome is Outcome.STALE and self.s.status("vanishing").result != "late result",
            "the late report of the lost attempt changed nothing",
        )

    def part_pipeline(self) -> None:
        self.heading(
            "6. A pipeline: 'extract' fans out to three transforms that fan in to 'load', "
            "then 'publish';\n   'transform-b' fails (max_attempts=1) and blocks what needs it "
            "until it is retried"
        )
        ids = [task_id for task_id, _, _ in PIPELINE]
        specs = [
            TaskSpec(task_id, fn=fn, args=[f"{task_id} step"], deps=deps, max_attempts=1)
            for task_id, fn, deps in PIPELINE
        ]
        # One atomic graph: no task can start before all of it is registered.
        with self.lock:
            versions = self.s.submit_graph(specs)
            for (task_id, _, deps), version in zip(PIPELINE, versions, strict=True):
                self.submitted.append(task_id)
                after = f"after {', '.join(deps)}" if deps else "no dependencies"
                self._line("producer", f"submit '{task_id}' -> version {version}, {after}")
        for task_id, state in (
            ("transform-a", State.SUCCEEDED),
            ("transform-c", State.SUCCEEDED),
            ("transform-b", State.FAILED),
            ("publish", State.BLOCKED),
        ):
            self.wait_state(task_id, state)
        for task_id in ("transform-b", "load", "publish"):
            self.say("status", f"'{task_id}': {describe(self.s.status(task_id))}")
        self.say("demo", "what `distsched graph load` prints now:")
        with self.lock:
            for line in render_text(walk(self.s, "load"), self.s.namespace):
                self.echo(f"{'':21}{line}")
        load, publish = self.s.status("load"), self.s.status("publish")
        order = self.started_among(ids)
        self.check(
            load.blocked_by == BlockedBy("transform-b", ("transform-b", "load"))
            and publish.blocked_by == BlockedBy("transform-b", ("transform-b", "load", "publish")),
            "'load' and 'publish' are blocked, naming 'transform-b' as the cause with the path",
        )
        self.check(
            order[:1] == ["extract"]
            and sorted(order[1:]) == ["transform-a", "transform-b", "transform-c"]
            and not self.runs_of("load")
            and not self.runs_of("publish"),
            "'extract' ran before the transforms, and nothing that needs 'transform-b' ran",
        )

        with self.lock:
            version = self.s.retry("transform-b")
            self._line("producer", f"retry 'transform-b' (cascade) -> version {version}")
            # The worker cannot finish 'transform-b' while this lock is held, so the
            # states read here are the ones the retry left.
            states = {t: self.s.status(t) for t in ("load", "publish")}
            for task_id, info in states.items():
                self._line("status", f"'{task_id}': version {info.version}, {describe(info)}")
        self.check(
            all(info.state is State.PENDING for info in states.values()),
            "the retry cascaded: 'load' and 'publish' got new versions and wait again",
        )
        self.wait_state("publish", State.SUCCEEDED, State.FAILED, State.BLOCKED)
        runs = {task_id: self.runs_of(task_id) for task_id in ids}
        self.check(
            self.s.status("publish").state is State.SUCCEEDED
            and [r.version for r in runs["transform-b"]][1:] == [version]
            and self.started_among(ids)[-3:] == ["transform-b", "load", "publish"],
            "the new 'transform-b' succeeded, then 'load' and 'publish' ran: the pipeline "
            "completed",
        )
        self.check(
            all(len(runs[t]) == 1 for t in ids if t != "transform-b")
            and len(runs["transform-b"]) == 2,
            "every other step ran exactly once: the retry redid only what had not succeeded",
        )

    def part_schedule(self) -> None:
        self.heading(
            "7. A recurring task: the worker fires each slot once, and overlaps are skipped"
        )
        start = self.s.server_time() + 0.3
        with self.lock:
            sc = self.s.add_schedule(
                "ticker", "record", args=["a slot of the schedule"], interval=0.25, start=start
            )
            first = self.server_ms(sc.next_fire or start)
            self._line(
                "producer",
                f"add_schedule 'ticker' every 250 ms (overlap {sc.overlap}) -> first slot at "
                f"+{first:.0f} ms; its tasks are named ticker@<slot ms>",
            )
        self.wait_for("three slots of 'ticker'", lambda: len(self.started_order("ticker@")) >= 3)
        sc = self.s.pause_schedule("ticker")
        self.say("producer", f"pause 'ticker' after {sc.fired} slots")
        fired = sc.fired
        self.wait_for("every slot's task", lambda: len(self.started_order("ticker@")) >= fired)
        slots = self.started_order("ticker@")
        self.wait_state(slots[-1], State.SUCCEEDED)
        with self.lock:
            late = [
                r.server_time - int(r.task_id.rsplit("@", 1)[1]) / 1000
                for r in self.runs
                if r.task_id.startswith("ticker@")
            ]
        self.say(
            "demo", f"each slot's task started {max(late) * 1000:.0f} ms after its slot at most"
        )
        self.check(
            len(slots) == len(set(slots)) == sc.fired, "each slot's task was created and ran once"
        )
        self.schedule("keep-busy", fn="busy", args=["keeps the worker's only slot busy"])
        self.wait_for("'keep-busy' starting", lambda: bool(self.runs_of("keep-busy")))
        queued = self.s.trigger("ticker")
        self.say("producer", f"trigger 'ticker' -> {queued} (queued behind 'keep-busy')")
        again = self.s.trigger("ticker")
        self.say("producer", f"trigger 'ticker' again -> {again}: the last run is still queued")
        self.check(
            queued is not None and again is None,
            "overlap skip: no second run while the previous one is queued or running",
        )
        self.release_busy.set()
        self.wait_for("the triggered run", lambda: bool(self.runs_of(queued or "")))
        sc = self.s.get_schedule("ticker")
        self.say("demo", f"'ticker': fired {sc.fired}, skipped {sc.skipped}, missed {sc.missed}")
        self.s.remove_schedule("ticker")

    def final_table(self) -> None:
        self.heading("Every task, as Redis has it now:")
        rows = [("task", "state", "version", "attempt", "priority", "outcome")]
        for info in lookup_many(self.s, self.submitted):
            outcome = info.error or (str(info.result) if info.result is not None else "")
            rows.append(
                (
                    info.task_id,
                    info.state.value,
                    str(info.version),
                    str(info.attempt),
                    str(info.priority),
                    outcome,
                )
            )
        for line in table(rows):
            self.echo("  " + line)
        cancelled = ("never-runs", "long-job")
        expected = {
            task_id: State.CANCELLED if task_id in cancelled else State.SUCCEEDED
            for task_id in self.submitted
        }
        wrong = [
            task_id
            for task_id, state in expected.items()
            if self.s.status(task_id).state is not state
        ]
        self.echo("")
        self.check(
            not wrong,
            "every task ended in the expected state"
            + (f" (not: {', '.join(wrong)})" if wrong else ""),
        )


# The scene ``demo --dashboard`` leaves for the dashboard: (task id, function, error) of
# the tasks that fail, in three groups (one large), each error as a worker stores it.
GATEWAY = "ConnectionError: payment gateway timed out after {s}s (order {n})"
RECEIPT = "KeyError: 'customer-{n}'"
IMAGE = "ValueError: image {n}x{s} is larger than 4096 px"
_TRACE = 'Traceback (most recent call last):\n  File "{fn}.py", line {line}, in {fn}\n'
# A branch that cannot go on: its root fails (in the large group) and blocks the rest.
BRANCH: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sync-orders", ()),
    ("build-invoices", ("sync-orders",)),
    ("email-invoices", ("build-invoices",)),
    ("ledger-update", ("sync-orders",)),
    ("month-close", ("email-invoices", "ledger-update")),
)


def _scene_failures() -> dict[str, tuple[str, str]]:
    """Task id -> (function, error text) of the scene's failed tasks."""
    out: dict[str, tuple[str, str]] = {}
    for i in range(36):
        error = GATEWAY.format(s=30 if i % 3 else 60, n=41_000 + i * 7)
        out[f"charge:{41_000 + i * 7}"] = (
            "charge_card",
            _TRACE.format(fn="charge_card", line=42) + error,
        )
    for i in range(5):
        error = RECEIPT.format(n=900 + i * 13)
        out[f"receipt:{900 + i * 13}"] = (
            "send_receipt",
            _TRACE.format(fn="send_receipt", line=17) + error,
        )
    for i in range(2):
        error = IMAGE.format(n=5000 + i * 800, s=3000 + i)
        out[f"thumbnail:{i}"] = ("resize_image", _TRACE.format(fn="resize_image", line=8) + error)
    out["sync-orders"] = (
        "sync_orders",
        _TRACE.format(fn="sync_orders", line=30) + GATEWAY.format(s=30, n=0),
    )
    return out


def stage_failures(scheduler: Scheduler, echo: Echo) -> None:
    """Leave the failure-and-blocked story in the namespace for the dashboard: three
    groups of failed tasks (one large), a branch blocked behind a failed root, a
    recurring schedule and a task due tomorrow. No worker runs: the failures are
    reported as a worker would report them."""
    failing = _scene_failures()
    specs = [TaskSpec(t, fn=fn) for t, (fn, _) in failing.items() if t != "sync-orders"]
    scheduler.schedule_many(specs)
    scheduler.submit_graph([TaskSpec(t, fn=t.replace("-", "_"), deps=deps) for t, deps in BRANCH])
    claims = scheduler.ready(len(failing), WORKER_ID)
    scheduler.fail_many([(c, failing[c.task_id][1]) for c in claims])
    scheduler.schedule("weekly-digest", fn="send_digest", delay=86_400.0)
    scheduler.add_schedule("hourly-report", "build_report", interval=3600.0)
    echo("")
    echo(
        f"For the dashboard: {len(claims)} tasks failed with three kinds of error (see "
        "Failures), 'sync-orders' failed and blocks its branch (see its graph), "
        "'hourly-report' recurs and 'weekly-digest' is due tomorrow."
    )


@contextmanager
def _redis_url(url: str | None) -> Iterator[tuple[str, str | None]]:
    """The URL to use, and what was started for it (None when the user gave one)."""
    if url is not None:
        yield url, None
        return
    from distsched.tools.embedded import embedded_redis

    with embedded_redis() as server:
        yield server.url, server.description


def _cleanup(scheduler: Scheduler) -> None:
    """Remove the demo's namespace: the demo should leave nothing behind in a given Redis."""
    scheduler.clear()


@dataclass(frozen=True)
class DashboardOptions:
    """``distsched demo --dashboard``: serve the dashboard on what the demo ran, on
    ``bind``:``port``, until ``until(url)`` returns (by default: until Ctrl-C)."""

    bind: str = "127.0.0.1"
    port: int = 8080
    until: Callable[[str], None] | None = None


def _until_interrupted(url: str) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()


def _serve_dashboard(scheduler: Scheduler, options: DashboardOptions, echo: Echo) -> None:
    from distsched.dashboard import create_app
    from distsched.dashboard.serve import Served, exposed_warning

    # Actions (retry a group of failures) only where no other machine can reach them.
    token = secrets.token_urlsafe(32) if not exposed_warning(options.bind, True) else None
    stage_failures(scheduler, echo)
    try:
        app = create_app(scheduler, allow_actions=token is not None, token=token)
        served = Served(app, options.bind, options.port)
    except RuntimeError as exc:  # the port is taken, the address cannot be bound
        echo(f"The dashboard could not start: {exc} (pick another with --port).")
        return
    with served:
        echo("")
        echo(f"Dashboard of what the demo ran: {served.url}/")
        echo("Press Ctrl-C to stop it; the demo's namespace is deleted then.")
        if token is not None:
            echo(f"To retry a group of failures (Failures page), log in with the token {token}")
        (options.until or _until_interrupted)(served.url)


def run_demo(url: str | None, echo: Echo, dashboard: DashboardOptions | None = None) -> bool:
    """Run the story on ``url`` (None: an embedded Redis); True when it went as told.

    With ``dashboard`` the dashboard of the demo's namespace is served at the end,
    until ``dashboard.until`` returns; the namespace is deleted after that."""
    with _redis_url(url) as (redis_url, started):
        namespace = f"demo-{uuid.uuid4().hex[:8]}"
        echo(
            "distsched demo: delays, priorities, replacement, cancellation, a vanished worker, "
            "a pipeline and a recurring task"
        )
        if started is not None:
            echo(f"Redis: started {started}")
        else:
            echo(
                f"Redis: {redis_url} (the demo writes only to namespace '{namespace}' "
                "and deletes it at the end)"
            )
        scheduler = Scheduler.from_url(redis_url, namespace=namespace, lease_s=LEASE_S)
        try:
            ok = _run_story(scheduler, echo, namespace)
            if dashboard is not None:
                _serve_dashboard(scheduler, dashboard, echo)
            else:
                echo(
                    "To look around what the demo ran in the web dashboard, run "
                    "`distsched demo --dashboard` (pip install 'distsched[dashboard]'): it "
                    "serves http://127.0.0.1:8080/ until Ctrl-C."
                )
            return ok
        finally:
            # When Redis itself is the problem, the error that stopped the story is the
            # one to report, not a second one from the cleanup.
            with contextlib.suppress(redis.RedisError):
                _cleanup(scheduler)
            scheduler.close()


def _run_story(scheduler: Scheduler, echo: Echo, namespace: str) -> bool:
    story = _Story(scheduler, echo)
    echo(
        f"Namespace '{namespace}', lease {LEASE_S:g} s. One worker with a single slot runs in "
        "a background thread,\nso tasks start one at a time in queue order. Times are ms since "
        "the start; due times follow the Redis clock."
    )
    worker = Worker(scheduler, story.functions(), concurrency=1, worker_id=WORKER_ID, grace=1.0)
    # The story tells every outcome itself: the worker's task lines (the flaky step's
    # traceback among them) would only repeat it on stderr.
    task_lines = logging.getLogger("distsched.worker.tasks")
    task_level = task_lines.level
    task_lines.setLevel(logging.CRITICAL)
    thread = threading.Thread(target=worker.run, name="distsched-demo-worker", daemon=True)
    thread.start()
    story.say("demo", f"worker '{WORKER_ID}' started (concurrency 1)")
    aborted: str | None = None
    try:
        for part in (
            story.part_delays,
            story.part_priorities,
            story.part_replacement,
            story.part_cancel,
            story.part_vanished,
            story.part_pipeline,
            story.part_schedule,
        ):
            part()
    except _StoryFailed as exc:
        aborted = str(exc)
        story.failures.append(aborted)
        story.say("check", f"FAILED: {aborted}")
    finally:
        story.release_hold.set()
        story.release_busy.set()
        story.stop_functions.set()
        worker.stop(grace=1.0)
        thread.join(STEP_TIMEOUT_S)
        task_lines.setLevel(task_level)
    story.final_table()
    elapsed = time.monotonic() - story.t0
    if thread.is_alive():
        story.failures.append("the worker did not stop")
    if story.failures:
        echo(f"FAILED: {len(story.failures)} of {story.checks} checks failed:")
        for failure in story.failures:
            echo(f"  - {failure}")
        return False
    echo(f"demo OK: all {story.checks} checks passed in {elapsed:.1f} s; worker stopped.")
    return True
