"""``distsched bench``: the scheduler measured against raw Redis, in one run.

Sections (each on fresh namespaces):

- ``ceiling``: sequential and pipelined EVALSHA of ``return 1`` from one client,
  the most script calls one client can get from this Redis;
- ``enqueue``: one ``schedule`` call per task, and batched ``schedule_many``;
- ``e2e``: queued no-op tasks drained by one real worker process (``def``, then
  ``async def`` no-ops), then by ``--processes`` of them, with every task checked to
  have run exactly once and Redis's CPU per drained task (``INFO cpu``);
- ``lateness``: how late delayed tasks start against the Redis clock, and how late the
  tasks of a schedule's slots start with an idle worker (woken by the fire time);
- ``claim``: claim rate with small and very large queues, one and 100 per call, in the
  default order and in the priority order (ten priorities, so ranks interleave);
- ``dag``: a long chain, a wide fan-out/fan-in, and the longest single script
  call while 100,000 dependents are released or blocked;
- ``memory``: Redis memory per queued no-op task;
- ``wake``: a trickle of tasks (each scheduled once the one before has finished)
  with 1, 8 (and 32, ``--wake-processes``) idle worker processes: script calls and
  Redis CPU per task, which must not grow with the number of idle workers, and the
  wake-up latency (task start - run_at on the Redis clock);
- ``dashboard``: Redis commands each dashboard page sends with a few tasks and with
  many (they must be equal), and the drain rate of a worker process with and without
  a dashboard client polling the overview every second (needs the dashboard extra);
- ``fairness``: starvation (light keys' tasks trickling in behind one heavy key's backlog,
  drained by one worker process, with fairness keys and without: the light tasks' wait)
  and shares (backlogged keys of weights 1, 1, 2, 4, 8: each key's share of the claims
  against its weight's share);
- ``profile``: on the bench's own server only (it changes SLOWLOG settings, restored
  after), every command logged while ``schedule`` is called once per task, then while
  one worker process drains those tasks: Redis time per script (INFO commandstats
  counts every FCALL as one command), split into the commands the scripts run and
  their own Lua;
- ``worst``: on the bench's own server only (SLOWLOG settings restored after), the
  worst input the caps of ``distsched.limits`` accept for every script, each run a few
  times: the longest single call per script, the input that made it, and whether it
  stayed under 50 ms (``distsched.tools.worst``).

Worker processes run ``python -m distsched.tools.bench worker URL NAMESPACE``: a
``Worker`` whose no-op records each run (task id, version, attempt, start time,
``run_at``) and writes them to a file when SIGTERM stops it.

Figures are printed next to the project's targets, as information, with the machine,
the Redis version and the client libraries they were measured with. Progress is logged
on ``distsched.bench`` (the CLI writes it to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import IO, Any, NamedTuple

import redis

from distsched import __version__, core, scripts, views
from distsched.client import Scheduler
from distsched.core import TaskSpec
from distsched.errors import DistschedError, InvalidArgument
from distsched.text import clock_offset, finite_or_none, redact, table

Echo = Callable[[str], None]
log = logging.getLogger("distsched.bench")

# The claim section measures each namespace order (``Scheduler.set_order``), and a fair
# namespace (fairness keys, README "Tenants and fairness") with a key per 100 tasks queued,
# at most FAIR_KEYS_MAX keys (1,000,000 queued over 10,000 keys).
ORDERS = ("default", "priority", "fair", "fair_priority")
FAIR_TASKS_PER_KEY = 100
FAIR_KEYS_MAX = 10_000
SECTIONS = (
    "ceiling", "enqueue", "e2e", "lateness", "claim", "dag", "memory", "wake", "dashboard",
    "fairness", "profile", "worst",
)  # fmt: skip
# The dashboard pages the bench counts Redis commands for.
DASHBOARD_PAGES = (
    "/", "/api/overview", "/tasks?state=ready", "/tasks?state=failed", "/task?id=extract",
    "/leases", "/workers",
)  # fmt: skip
# Tasks of the small namespace the dashboard's costs are compared with.
DASHBOARD_FEW = 100
DASHBOARD_POLL_S = 1.0
NOOP = "noop"
# The same no-op as an ``async def`` function (the worker's event loop runs it).
ANOOP = "anoop"
# A no-op that also pushes its task id to the list named by its argument, so that the
# wake section learns of each end with one BLPOP instead of polling (whose cost would
# grow with the latency it measures).
SIGNAL = "signal"
# Batches for graph submissions and the dependents' fill: big enough to be fast,
# small enough that no single submission is a long script call.
GRAPH_BATCH = 5_000
# Parts a large graph is submitted in when no call may hold Redis long.
GRAPH_PART = 1_000
WORKER_START_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 60.0
# Threads per worker process in the wake section: more than one, so that a worker
# holding a task still has a free slot (and stays idle, waiting for the next).
WAKE_CONCURRENCY = 2
POLL_S = 0.01
# How often a long step (a fill, a drain) logs how far it got.
PROGRESS_S = 5.0
# The fairness section: ten light keys, each submitting one task every FAIR_LIGHT_EVERY_S,
# behind one heavy key's backlog, drained by one worker process of FAIR_CONCURRENCY threads;
# the run gives up on light tasks not started within FAIR_TIMEOUT_S. The shares use keys of
# FAIR_WEIGHTS, claimed FAIR_CLAIM_BATCH at a time.
FAIR_LIGHT_KEYS = 10
FAIR_LIGHT_EVERY_S = 0.1
FAIR_CONCURRENCY = 4
FAIR_TIMEOUT_S = 120.0
FAIR_WEIGHTS = (1, 1, 2, 4, 8)
FAIR_CLAIM_BATCH = 100
# The interval of the schedule whose slots the lateness section fires.
SLOT_INTERVAL_S = 0.1
# The profile section logs every command: SLOWLOG must hold the whole of a phase, about
# this many entries per task (script calls and their inner commands) and a margin.
PROFILE_ENTRIES_PER_TASK = 20
PROFILE_ENTRIES_MARGIN = 10_000
# The name of the profile section's own client, whose polling SLOWLOG entries leave out.
PROFILE_CLIENT = "distsched-bench-profile"
# Inner commands shown one per row, the costliest first.
PROFILE_TOP_COMMANDS = 5
# The longest input description (and refusal) a row of the worst section shows.
WORST_SHOWN = 110


class BenchError(DistschedError):
    """A worker process of the bench did not start or stop as it should."""


@dataclass(frozen=True)
class BenchConfig:
    """The sizes of one run; the defaults take about four minutes on two cores."""

    evalsha_calls: int = 20_000
    pipeline: int = 100
    schedule_calls: int = 5_000
    enqueue_tasks: int = 50_000
    batch: int = 1_000
    tasks: int = 30_000
    concurrency: int = 32
    delayed: int = 2_000
    delay_min: float = 0.5
    delay_max: float = 3.5
    slots: int = 40
    claim_sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    claims: int = 5_000
    chain: int = 10_000
    fanout: int = core.MAX_DEPS
    dependents: int = 100_000
    memory_tasks: int = 100_000
    wake_tasks: int = 200
    wake_processes: tuple[int, ...] = (1, 8)
    dashboard_tasks: int = 100_000
    dashboard_drain: int = 20_000
    fair_heavy: int = 20_000
    fair_rounds: int = 20
    fair_claims: int = 20_000
    profile_tasks: int = 3_000
    # Worker processes of the e2e section's last run (its first runs use one).
    processes: int = 2
    # The worst section: the share of each cap its inputs use (1.0: the caps themselves),
    # and how many times each input runs.
    worst_scale: float = 1.0
    worst_repeats: int = 3
    # The sections to run (empty: every one).
    only: tuple[str, ...] = ()

    @classmethod
    def quick(cls) -> BenchConfig:
        """Small sizes for a smoke run of every section, in well under 20 seconds."""
        return cls(
            evalsha_calls=1_000, pipeline=50, schedule_calls=300, enqueue_tasks=2_000,
            batch=500, tasks=1_000, concurrency=8, delayed=50, delay_min=0.1, delay_max=0.4,
            slots=5, claim_sizes=(100, 1_000), claims=50, chain=30, fanout=30,
            dependents=1_500, memory_tasks=1_000, wake_tasks=20, wake_processes=(1, 2),
            dashboard_tasks=300, dashboard_drain=200, fair_heavy=300, fair_rounds=2,
            fair_claims=320, profile_tasks=300, processes=2, worst_scale=0.01, worst_repeats=1,
        )  # fmt: skip

    def validate(self) -> None:
        for name in (
            "evalsha_calls",
            "pipeline",
            "schedule_calls",
            "enqueue_tasks",
            "batch",
            "tasks",
            "concurrency",
            "delayed",
            "slots",
            "claims",
            "chain",
            "fanout",
            "dependents",
            "memory_tasks",
            "wake_tasks",
            "dashboard_tasks",
            "dashboard_drain",
            "fair_heavy",
            "fair_rounds",
            "fair_claims",
            "profile_tasks",
            "processes",
            "worst_repeats",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(name, "must be an int >= 1")
        if self.fanout > core.MAX_DEPS:
            # The fan-in task depends on every task of the fan-out.
            raise InvalidArgument("fanout", f"must be at most {core.MAX_DEPS}")
        if not (isinstance(self.worst_scale, (int, float)) and 0 < self.worst_scale <= 1):
            raise InvalidArgument("worst_scale", "must be a number in (0, 1]")
        unknown = [name for name in self.only if name not in SECTIONS]
        if unknown:
            raise InvalidArgument(
                "only", f"no section {unknown[0]!r} (sections: {', '.join(SECTIONS)})"
            )
        if not self.claim_sizes or any(n < 2 for n in self.claim_sizes):
            raise InvalidArgument("claim_sizes", "must be queue sizes >= 2")
        if not self.wake_processes or any(n < 1 for n in self.wake_processes):
            raise InvalidArgument("wake_processes", "must be process counts >= 1")
        if not (
            math.isfinite(self.delay_min)
            and math.isfinite(self.delay_max)
            and 0 <= self.delay_min <= self.delay_max
        ):
            raise InvalidArgument("delay_max", "need 0 <= delay_min <= delay_max")


# --------------------------------------------------------------------------- exactly once


class Run(NamedTuple):
    """One execution of the no-op, as its worker process recorded it."""

    task_id: str
    version: int
    attempt: int
    started: float = 0.0  # epoch seconds, Redis server clock
    run_at: float = 0.0


def check_exactly_once(expected_ids: Iterable[str], runs: Iterable[Run]) -> list[str]:
    """Every problem with "each expected task ran exactly once, on its first attempt"."""
    expected = set(expected_ids)
    by_id: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_id[run.task_id].append(run)
    problems: list[str] = []
    for task_id in sorted(expected - by_id.keys()):
        problems.append(f"task {task_id!r} never ran")
    for task_id in sorted(by_id):
        got = by_id[task_id]
        if task_id not in expected:
            problems.append(f"task {task_id!r} ran but was not part of the run")
        elif len(got) > 1:
            tokens = ", ".join(f"v{r.version}/a{r.attempt}" for r in got)
            problems.append(f"task {task_id!r} ran {len(got)} times ({tokens})")
        elif got[0].attempt != 1:
            # An earlier attempt was claimed and lost: either it ran unrecorded or its
            # lease expired, and both break "exactly once" for this run.
            problems.append(f"task {task_id!r} ran as attempt {got[0].attempt}, not 1")
    return problems


# --------------------------------------------------------------------------- small helpers


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class Row:
    """One line of the table."""

    section: str
    name: str
    value: float | None
    unit: str
    ratio: float | None = None
    ratio_to: str = ""
    target: str = ""
    met: bool | None = None
    # Mean time Redis spent per script call (INFO commandstats), microseconds.
    server_us: float | None = None
    # Redis's own CPU (INFO cpu, user + system) per call or per task, microseconds.
    cpu_us: float | None = None


@dataclass
class ServerTime:
    """Script calls seen by Redis during a measurement (other clients' calls included),
    less the calls measured apart with ``exclude``."""

    measured: bool = False
    calls: int = 0
    usec: int = 0

    @property
    def us_per_call(self) -> float | None:
        return self.usec / self.calls if self.measured and self.calls > 0 else None


def _us(server: ServerTime) -> str:
    return "? us" if server.us_per_call is None else f"{server.us_per_call:.1f} us"


# --------------------------------------------------------------------------- worker processes


@dataclass
class WorkerReport:
    worker_id: str
    offset: float
    runs: list[Run]
    counts: dict[str, int]
    peak_running: int
    # CPU seconds of the worker process (all its threads) from "go" to its stop.
    cpu_s: float = 0.0


class WorkerProcesses:
    """Worker processes on one namespace, started together on a go line, stopped by SIGTERM."""

    def __init__(
        self,
        url: str,
        namespace: str,
        count: int,
        concurrency: int,
        workdir: Path,
        lease_s: float = 30.0,
    ):
        self.lease_s = lease_s
        self.url = url
        self.namespace = namespace
        self.count = count
        self.concurrency = concurrency
        self.workdir = workdir
        self.procs: list[subprocess.Popen[str]] = []
        self.outs: list[Path] = []
        self.errs: list[IO[str]] = []

    def start(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        for i in range(self.count):
            tag = f"{self.namespace}-{i}"
            out = self.workdir / f"{tag}.json"
            err = open(self.workdir / f"{tag}.err", "w+")  # noqa: SIM115 - closed by close()
            self.outs.append(out)
            self.errs.append(err)
            command = [
                sys.executable,
                "-m",
                "distsched.tools.bench",
                "worker",
                self.url,
                self.namespace,
                "--concurrency",
                str(self.concurrency),
                "--out",
                str(out),
                "--lease",
                str(self.lease_s),
            ]
            self.procs.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    env=env,
                    cwd=self.workdir,
                )
            )
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            # Nothing is buffered before the first line, so the pipe itself says when it comes.
            readable, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            line = proc.stdout.readline().strip() if readable else ""
            if line != "ready":
                raise BenchError(f"worker process did not start: {self._stderr(i)}")

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def stop(self) -> list[WorkerReport]:
        """SIGTERM each process (a graceful shutdown) and read what its no-op recorded."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        reports: list[WorkerReport] = []
        failures: list[str] = []
        for i, proc in enumerate(self.procs):
            try:
                code = proc.wait(WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            if code != 0 or not self.outs[i].exists():
                failures.append(f"worker process exited with {code}: {self._stderr(i)}")
                continue
            data = json.loads(self.outs[i].read_text("utf-8"))
            reports.append(
                WorkerReport(
                    worker_id=data["worker_id"],
                    offset=float(data["offset"]),
                    runs=[Run(*r) for r in data["runs"]],
                    counts=data["counts"],
                    peak_running=int(data["peak_running"]),
                    cpu_s=float(data.get("cpu_s", 0.0)),
                )
            )
        self.close()
        if failures:
            raise BenchError("; ".join(failures))
        return reports

    def close(self) -> None:
        """Kill what is still running and release pipes and files (idempotent)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None and not pipe.closed:
                    # A broken pipe to a process already gone is no news.
                    with suppress(OSError):
                        pipe.close()
        for err in self.errs:
            if not err.closed:
                err.close()

    def _stderr(self, i: int) -> str:
        err = self.errs[i]
        err.flush()
        text = (self.workdir / f"{self.namespace}-{i}.err").read_text("utf-8", "replace")
        lines = text.strip().splitlines()
        return " | ".join(lines[-5:]) if lines else "(no output)"


def worker_main(argv: Sequence[str]) -> int:
    """``python -m distsched.tools.bench worker URL NAMESPACE --concurrency N --out FILE``."""
    from distsched.context import current_task
    from distsched.worker import Worker

    parser = argparse.ArgumentParser(prog="python -m distsched.tools.bench worker")
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lease", type=float, default=30.0)
    options = parser.parse_args(argv)

    runs: list[tuple[str, int, int, float, float]] = []

    def noop() -> None:
        started = time.time()
        ctx = current_task()
        # list.append is atomic: the pool threads need no lock for it.
        runs.append((ctx.task_id, ctx.version, ctx.attempt, started, ctx.claim.run_at))

    scheduler = Scheduler.from_url(options.url, namespace=options.namespace, lease_s=options.lease)

    def signal(done_list: str) -> None:
        noop()
        scheduler.client.rpush(done_list, current_task().task_id)

    async def anoop() -> None:
        noop()

    try:
        functions: dict[str, Callable[..., Any]] = {NOOP: noop, ANOOP: anoop, SIGNAL: signal}
        worker = Worker(scheduler, functions, concurrency=options.concurrency)
        before, _ = clock_offset(scheduler)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 1
        cpu = time.process_time()
        worker.run()  # on the main thread: SIGTERM shuts it down gracefully
        cpu = time.process_time() - cpu
        after, _ = clock_offset(scheduler)
        offset = (before + after) / 2.0
        data = {
            "worker_id": worker.worker_id,
            "offset": offset,
            "runs": [[t, v, a, started + offset, run_at] for t, v, a, started, run_at in runs],
            "counts": worker.counts,
            "peak_running": worker.peak_running,
            "cpu_s": cpu,
        }
        partial = Path(options.out + ".partial")
        partial.write_text(json.dumps(data), "utf-8")
        partial.replace(options.out)
    finally:
        scheduler.close()
    return 0


# --------------------------------------------------------------------------- the run


class Bench:
    """One run against one Redis; ``throwaway`` when this run started that server."""

    def __init__(self, url: str, backend: str, throwaway: bool, config: BenchConfig) -> None:
        self.url = url
        self.backend = backend
        self.throwaway = throwaway
        self.config = config
        self.client = redis.Redis.from_url(url)
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.namespaces: list[str] = []
        self.sections: dict[str, dict[str, Any]] = {}
        self.rows: list[Row] = []
        self.problems: list[str] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="distsched-bench-"))
        self._phase_started = 0.0

    # -- plumbing

    def close(self) -> None:
        try:
            for namespace in self.namespaces:
                with suppress(redis.RedisError):
                    self._drop(namespace)
        finally:
            self.client.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _namespace(self, name: str) -> str:
        namespace = f"{self.prefix}-{name}"
        self.namespaces.append(namespace)
        return namespace

    def _drop(self, namespace: str) -> None:
        """Remove a namespace's tasks and settings."""
        with self._scheduler(namespace) as scheduler:
            scheduler.clear()

    def _clean(self, *namespaces: str) -> None:
        if self.throwaway:
            self.client.flushall()
        else:
            for namespace in namespaces:
                self._drop(namespace)

    @contextmanager
    def _scheduler(self, namespace: str, lease_s: float = 30.0) -> Iterator[Scheduler]:
        scheduler = Scheduler(self.client, namespace=namespace, lease_s=lease_s)
        try:
            yield scheduler
        finally:
            scheduler.close()

    def _phase(self, index: int, title: str) -> None:
        self._phase_started = time.perf_counter()
        log.info("[%d/%d] %s", index, len(SECTIONS), title)

    def _step(self, text: str) -> None:
        elapsed = time.perf_counter() - self._phase_started
        log.info("      %6.1f s  %s", elapsed, text)

    def _row(self, section: str, name: str, value: float | None, unit: str, **extra: Any) -> Row:
        row = Row(section, name, value, unit, **extra)
        self.rows.append(row)
        return row

    def _problem(self, section: str, problems: Sequence[str]) -> None:
        for problem in problems:
            self.problems.append(f"{section}: {problem}")
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            self._step(f"PROBLEM: {'; '.join(problems[:3])}{more}")

    def _fill(self, scheduler: Scheduler, prefix: str, count: int, **spec: Any) -> float:
        """Queue ``count`` no-op tasks in batches; return the seconds spent in the calls."""
        batch = self.config.batch
        fn = spec.pop("fn", NOOP)
        spent = 0.0
        shown = time.monotonic()
        for start in range(0, count, batch):
            specs = [
                TaskSpec(f"{prefix}{i}", fn, **spec)
                for i in range(start, min(count, start + batch))
            ]
            t0 = time.perf_counter()
            scheduler.schedule_many(specs)
            spent += time.perf_counter() - t0
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                self._step(f"queued {start + len(specs):,} of {count:,}")
        return spent

    def _fill_with_argument(self, scheduler: Scheduler, prefix: str, count: int) -> None:
        """Queue ``count`` tasks of one small argument each (their number)."""
        batch = self.config.batch
        for start in range(0, count, batch):
            scheduler.schedule_many(
                [
                    TaskSpec(f"{prefix}{i}", NOOP, args=[i])
                    for i in range(start, min(count, start + batch))
                ]
            )

    def _fill_keyed(
        self, scheduler: Scheduler, count: int, keys: int, priorities: bool = False
    ) -> float:
        """Queue ``count`` no-op tasks spread round robin over ``keys`` fairness keys
        (with ``priorities``, of ten priorities in turn)."""
        batch = self.config.batch
        spent = 0.0
        for start in range(0, count, batch):
            specs = [
                TaskSpec(
                    f"c{i}", NOOP, key=f"tenant:{i % keys}", priority=(i // keys) % 10 * priorities
                )
                for i in range(start, min(count, start + batch))
            ]
            t0 = time.perf_counter()
            scheduler.schedule_many(specs)
            spent += time.perf_counter() - t0
        return spent

    def _wait_for(
        self,
        scheduler: Scheduler,
        state: str,
        count: int,
        procs: WorkerProcesses | None,
        timeout: float,
    ) -> bool:
        deadline = time.monotonic() + timeout
        shown = time.monotonic()
        while time.monotonic() < deadline:
            done = scheduler.stats()["counts"][state]
            if done >= count:
                return True
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                self._step(f"{done:,} of {count:,} {state}")
            if procs is not None and not procs.alive():
                return False
            time.sleep(POLL_S)
        return False

    def _last_finished(self, scheduler: Scheduler) -> tuple[float, list[str]]:
        """Server time (seconds) of the namespace's latest completion, from the task
        records (stamped by the scripts with the Redis clock); and the tasks that did
        not end succeeded on their first attempt."""
        last, problems = 0.0, []
        for row in views.tasks(scheduler):
            if row.state is not core.State.SUCCEEDED or row.attempt != 1:
                problems.append(
                    f"task {row.task_id!r} is {row.state.value} after attempt {row.attempt}"
                )
            last = max(last, row.updated_at)
        return last, problems

    def _drain(
        self, section: str, namespace: str, scheduler: Scheduler, ids: Sequence[str], processes: int
    ) -> dict[str, Any]:
        """Run queued tasks ``ids`` with worker processes; time from first start to last end."""
        procs = WorkerProcesses(
            self.url, namespace, processes, self.config.concurrency, self.workdir
        )
        try:
            procs.start()
            cpu_before = self._cpu_us()
            procs.go()
            finished = self._wait_for(
                scheduler, "succeeded", len(ids), procs, timeout=60.0 + len(ids) / 500.0
            )
            # Claims, reports, heartbeats and housekeeping of the whole drain, per task.
            cpu = self._cpu_delta(cpu_before, len(ids))
            end, record_problems = self._last_finished(scheduler)
            reports = procs.stop()
        finally:
            procs.close()
        runs = [run for report in reports for run in report.runs]
        problems = [] if finished else [f"not all {len(ids)} tasks succeeded in time"]
        problems += check_exactly_once(ids, runs) + record_problems
        self._problem(section, problems)
        start = min((run.started for run in runs), default=float("nan"))
        seconds = end - start
        return {
            "processes": processes,
            "concurrency": self.config.concurrency,
            "tasks": len(ids),
            "drain_s": seconds,
            "tasks_per_s": len(ids) / seconds if seconds > 0 else None,
            "redis_cpu_us_per_task": cpu,
            "worker_cpu_us_per_task": sum(r.cpu_s for r in reports) / len(ids) * 1e6,
            "exactly_once_problems": problems,
            "worker_counts": [r.counts for r in reports],
            "peak_running": [r.peak_running for r in reports],
            "clock_offset_ms": [r.offset * 1000.0 for r in reports],
        }

    def _used_memory(self) -> int:
        # Memory still being freed from earlier phases would be counted as ours.
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            info = self.client.info("memory")
            if not int(info.get("lazyfree_pending_objects", 0)):
                break
            time.sleep(0.05)
        return int(info.get("used_memory", 0))

    # -- (a) the ceiling

    def ceiling(self) -> None:
        cfg = self.config
        self._phase(1, "ceiling: EVALSHA of 'return 1' from one client")
        sha = self.client.script_load("return 1")
        for _ in range(100):
            self.client.evalsha(sha, 0)
        with self._server_time() as seq_server:
            t0 = time.perf_counter()
            for _ in range(cfg.evalsha_calls):
                self.client.evalsha(sha, 0)
            sequential = cfg.evalsha_calls / (time.perf_counter() - t0)
        self._step(f"sequential: {sequential:,.0f} calls/s")
        pipe = self.client.pipeline(transaction=False)
        rounds = max(1, cfg.evalsha_calls // cfg.pipeline)
        with self._server_time() as pipe_server:
            t0 = time.perf_counter()
            for _ in range(rounds):
                for _ in range(cfg.pipeline):
                    pipe.evalsha(sha, 0)
                pipe.execute()
            pipelined = rounds * cfg.pipeline / (time.perf_counter() - t0)
        self._step(f"pipelined: {pipelined:,.0f} calls/s")
        self.sections["ceiling"] = {
            "sequential_calls": cfg.evalsha_calls,
            "sequential_per_s": sequential,
            "sequential_server_us_per_call": seq_server.us_per_call,
            "pipeline": cfg.pipeline,
            "pipelined_calls": rounds * cfg.pipeline,
            "pipelined_per_s": pipelined,
            "pipelined_server_us_per_call": pipe_server.us_per_call,
        }
        self._row(
            "ceiling",
            "EVALSHA 'return 1', sequential",
            sequential,
            "calls/s",
            server_us=seq_server.us_per_call,
        )
        self._row(
            "ceiling",
            f"EVALSHA 'return 1', pipelines of {cfg.pipeline}",
            pipelined,
            "calls/s",
            ratio=pipelined / sequential,
            ratio_to="sequential",
            server_us=pipe_server.us_per_call,
        )

    @property
    def _evalsha(self) -> float:
        return float(self.sections["ceiling"]["sequential_per_s"])

    # -- (b) enqueue

    def enqueue(self) -> None:
        cfg = self.config
        self._phase(2, "enqueue: schedule one task per call, then schedule_many")
        single_ns, batch_ns = self._namespace("single"), self._namespace("batched")
        with self._scheduler(single_ns) as s:
            s.schedule("warm-up", fn=NOOP)
            # The floor of one call at a time: a raw LPUSH of the same msgpack payload,
            # from the same client, just before the schedule calls.
            payload = core.encode_payload(NOOP, [], {})
            raw_key = f"bench:{{{single_ns}}}:raw"
            t0 = time.perf_counter()
            for _ in range(cfg.schedule_calls):
                self.client.lpush(raw_key, payload)
            lpush = cfg.schedule_calls / (time.perf_counter() - t0)
            self.client.delete(raw_key)
            cpu_before = self._cpu_us()
            with self._server_time() as single_server:
                t0 = time.perf_counter()
                for i in range(cfg.schedule_calls):
                    s.schedule(f"s{i}", fn=NOOP)
                single = cfg.schedule_calls / (time.perf_counter() - t0)
            single_cpu = self._cpu_delta(cpu_before, cfg.schedule_calls)
            # Redis time of the smallest transition: one claim's lease extended per call.
            claim = s.next("bench")
            assert isinstance(claim, core.Claim)
            with self._server_time() as heartbeat_server:
                t0 = time.perf_counter()
                for _ in range(cfg.schedule_calls):
                    s.heartbeat(claim)
                heartbeats = cfg.schedule_calls / (time.perf_counter() - t0)
            # The reports that end an attempt, one per call: half the tasks succeed, half
            # fail (their only attempt: terminal, with the error stored).
            claims: list[core.Claim] = []
            while len(claims) < cfg.schedule_calls:
                got = s.ready(min(100, cfg.schedule_calls - len(claims)), "bench")
                if not got:
                    break
                claims += got
            half = len(claims) // 2
            with self._server_time() as complete_server:
                t0 = time.perf_counter()
                for c in claims[:half]:
                    s.complete(c)
                completes = half / max(time.perf_counter() - t0, 1e-9)
            with self._server_time() as fail_server:
                t0 = time.perf_counter()
                for c in claims[half:]:
                    s.fail(c, "RuntimeError: bench failure")
                fails = (len(claims) - half) / max(time.perf_counter() - t0, 1e-9)
        self._step(f"LPUSH: {lpush:,.0f} calls/s")
        self._step(
            f"schedule: {single:,.0f} calls/s, {_us(single_server)} in Redis/call, "
            f"{single_cpu or 0:.1f} us Redis CPU/call"
        )
        self._step(f"heartbeat: {heartbeats:,.0f} calls/s, {_us(heartbeat_server)} in Redis/call")
        self._step(f"complete: {completes:,.0f} calls/s, {_us(complete_server)} in Redis/call")
        self._step(f"fail: {fails:,.0f} calls/s, {_us(fail_server)} in Redis/call")
        with self._scheduler(batch_ns) as s, self._server_time() as batch_server:
            batched = cfg.enqueue_tasks / self._fill(s, "b", cfg.enqueue_tasks)
        self._step(f"schedule_many: {batched:,.0f} tasks/s")
        self._clean(single_ns, batch_ns)
        ratio = single / self._evalsha
        self.sections["enqueue"] = {
            "single_calls": cfg.schedule_calls,
            "single_per_s": single,
            "single_vs_evalsha": ratio,
            "single_server_us_per_call": single_server.us_per_call,
            "single_redis_cpu_us_per_call": single_cpu,
            "lpush_per_s": lpush,
            "single_vs_lpush": single / lpush,
            "heartbeat_per_s": heartbeats,
            "heartbeat_server_us_per_call": heartbeat_server.us_per_call,
            "complete_per_s": completes,
            "complete_server_us_per_call": complete_server.us_per_call,
            "fail_per_s": fails,
            "fail_server_us_per_call": fail_server.us_per_call,
            "batched_tasks": cfg.enqueue_tasks,
            "batch": cfg.batch,
            "batched_per_s": batched,
            "batched_server_us_per_call": batch_server.us_per_call,
        }
        self._row(
            "enqueue",
            "schedule, one call per task",
            single,
            "calls/s",
            ratio=ratio,
            ratio_to="seq EVALSHA",
            target=">= 0.9x seq EVALSHA",
            met=ratio >= 0.9,
            server_us=single_server.us_per_call,
            cpu_us=single_cpu,
        )
        self._row(
            "enqueue",
            "  Redis CPU per schedule call",
            single_cpu,
            "us",
            target="<= 15 us",
            met=None if single_cpu is None else single_cpu <= 15.0,
        )
        self._row(
            "enqueue",
            "  raw LPUSH of the same payload, one call at a time",
            lpush,
            "calls/s",
        )
        self._row(
            "enqueue",
            "  schedule against the raw LPUSH",
            single,
            "calls/s",
            ratio=single / lpush,
            ratio_to="LPUSH",
            target=">= 0.9x LPUSH",
            met=single / lpush >= 0.9,
        )
        self._row(
            "enqueue",
            "heartbeat, one claim per call",
            heartbeats,
            "calls/s",
            server_us=heartbeat_server.us_per_call,
        )
        self._row(
            "enqueue",
            "complete, one claim per call",
            completes,
            "calls/s",
            server_us=complete_server.us_per_call,
        )
        self._row(
            "enqueue",
            "fail, one claim per call (last attempt)",
            fails,
            "calls/s",
            server_us=fail_server.us_per_call,
        )
        self._row(
            "enqueue",
            f"schedule_many, batches of {cfg.batch}",
            batched,
            "tasks/s",
            ratio=batched / self._evalsha,
            ratio_to="seq EVALSHA",
            target=">= 150,000/s",
            met=batched >= 150_000,
            server_us=batch_server.us_per_call,
        )

    # -- (c) end to end

    def e2e(self) -> None:
        cfg = self.config
        self._phase(
            3,
            f"end to end: {cfg.tasks:,} no-op tasks, worker processes of {cfg.concurrency} threads",
        )
        runs = []
        target = ">= 27,000/s and >= 3.5x seq EVALSHA"
        for fn, processes in ((NOOP, 1), (ANOOP, 1), (NOOP, cfg.processes)):
            kind = "async def" if fn == ANOOP else "def"
            label = f"{processes} worker process{'es' if processes > 1 else ''}, {kind}"
            namespace = self._namespace(f"e2e{processes}{fn}")
            with self._scheduler(namespace) as s:
                enqueue = cfg.tasks / self._fill(s, "t", cfg.tasks, fn=fn)
                ids = [f"t{i}" for i in range(cfg.tasks)]
                result = self._drain("e2e", namespace, s, ids, processes)
            result["enqueue_per_s"] = enqueue
            result["fn"] = kind
            rate, cpu = result["tasks_per_s"], result["redis_cpu_us_per_task"]
            self._step(
                f"{label}: {rate or 0:,.0f} tasks/s in {result['drain_s']:.2f} s, "
                f"{cpu or 0:.1f} us Redis CPU/task"
            )
            self._clean(namespace)
            runs.append(result)
            ratio = rate / self._evalsha if rate else None
            self._row(
                "e2e",
                f"end to end, {label}",
                rate,
                "tasks/s",
                ratio=ratio,
                ratio_to="seq EVALSHA",
                target=target,
                met=None if ratio is None else (rate >= 27_000 and ratio >= 3.5),
                cpu_us=cpu,
            )
            self._row(
                "e2e",
                f"  Redis CPU per drained task ({label})",
                cpu,
                "us",
                target="<= 12 us",
                met=None if cpu is None else cpu <= 12.0,
            )
            self._row(
                "e2e",
                f"  worker CPU per task ({label})",
                result["worker_cpu_us_per_task"],
                "us",
            )
            self._row(
                "e2e",
                f"  not exactly once ({label})",
                len(result["exactly_once_problems"]),
                "tasks",
                target="0",
                met=not result["exactly_once_problems"],
            )
        self.sections["e2e"] = {"tasks": cfg.tasks, "concurrency": cfg.concurrency, "runs": runs}

    # -- (d) lateness

    def lateness(self) -> None:
        cfg = self.config
        self._phase(
            4,
            f"lateness: {cfg.delayed:,} tasks due over "
            f"[{cfg.delay_min:g}, {cfg.delay_max:g}] s, one worker process",
        )
        namespace = self._namespace("late")
        rng = random.Random(7)
        ids = [f"d{i}" for i in range(cfg.delayed)]
        procs = WorkerProcesses(self.url, namespace, 1, cfg.concurrency, self.workdir)
        with self._scheduler(namespace) as s:
            try:
                procs.start()
                procs.go()
                for start in range(0, cfg.delayed, cfg.batch):
                    s.schedule_many(
                        [
                            TaskSpec(task_id, NOOP, delay=rng.uniform(cfg.delay_min, cfg.delay_max))
                            for task_id in ids[start : start + cfg.batch]
                        ]
                    )
                finished = self._wait_for(
                    s, "succeeded", cfg.delayed, procs, timeout=cfg.delay_max + 60.0
                )
                reports = procs.stop()
            finally:
                procs.close()
        self._clean(namespace)
        runs = [run for report in reports for run in report.runs]
        problems = [] if finished else [f"not all {cfg.delayed} tasks succeeded in time"]
        problems += check_exactly_once(ids, runs)
        self._problem("lateness", problems)
        late = [(run.started - run.run_at) * 1000.0 for run in runs]
        p50, p99, worst = (
            (percentile(late, 50), percentile(late, 99), max(late)) if late else (None,) * 3
        )
        self.sections["lateness"] = {
            "tasks": cfg.delayed,
            "delay_min_s": cfg.delay_min,
            "delay_max_s": cfg.delay_max,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": worst,
            "min_ms": min(late) if late else None,
            "clock_offset_ms": [r.offset * 1000.0 for r in reports],
            "exactly_once_problems": problems,
        }
        self._step(f"p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms, max {worst or 0:.2f} ms")
        self._row("lateness", "delayed task start - run_at, p50", p50, "ms")
        self._row(
            "lateness",
            "delayed task start - run_at, p99",
            p99,
            "ms",
            target="<= 1 ms",
            met=None if p99 is None else p99 <= 1.0,
        )
        self._row("lateness", "delayed task start - run_at, max", worst, "ms")
        self.sections["lateness"]["slots"] = self._slot_lateness()

    def _slot_lateness(self) -> dict[str, Any]:
        """A schedule's slots fired by one idle worker process: task start - slot."""
        cfg = self.config
        self._step(f"slots: {cfg.slots} slots {SLOT_INTERVAL_S * 1000:g} ms apart, one idle worker")
        namespace = self._namespace("slots")
        step_ms = round(SLOT_INTERVAL_S * 1000)
        procs = WorkerProcesses(self.url, namespace, 1, cfg.concurrency, self.workdir)
        with self._scheduler(namespace) as s:
            try:
                procs.start()
                procs.go()
                time.sleep(0.2)  # the worker has found nothing to do: it is idle
                start = s.server_time() + 0.5
                s.add_schedule(
                    "tick", NOOP, interval=SLOT_INTERVAL_S, start=start,
                    end=start + (cfg.slots - 1) * SLOT_INTERVAL_S, overlap="allow",
                    catchup="all",
                )  # fmt: skip
                finished = self._wait_for(
                    s, "succeeded", cfg.slots, procs,
                    timeout=cfg.slots * SLOT_INTERVAL_S + 60.0,
                )  # fmt: skip
                reports = procs.stop()
            finally:
                procs.close()
        self._clean(namespace)
        first = round(start * 1000)
        ids = [f"tick@{first + i * step_ms}" for i in range(cfg.slots)]
        runs = [run for report in reports for run in report.runs]
        problems = [] if finished else [f"not all {cfg.slots} slot tasks succeeded in time"]
        problems += check_exactly_once(ids, runs)
        self._problem("lateness", problems)
        late = [(run.started - run.run_at) * 1000.0 for run in runs]
        p50, p99, worst = (
            (percentile(late, 50), percentile(late, 99), max(late)) if late else (None,) * 3
        )
        self._step(f"slots: p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms, max {worst or 0:.2f} ms")
        self._row("lateness", "slot task start - slot time, p50", p50, "ms")
        self._row("lateness", "slot task start - slot time, p99", p99, "ms")
        return {
            "slots": cfg.slots, "interval_s": SLOT_INTERVAL_S, "p50_ms": p50, "p99_ms": p99,
            "max_ms": worst, "exactly_once_problems": problems,
        }  # fmt: skip

    # -- (e) claim rate

    def claim(self) -> None:
        cfg = self.config
        sizes = sorted(set(cfg.claim_sizes))
        self._phase(5, f"claim rate with {', '.join(f'{n:,}' for n in sizes)} tasks queued")
        by_order: dict[str, list[dict[str, Any]]] = {}
        for order in ORDERS:
            for size in sizes:
                by_order.setdefault(order, []).append(self._claim_size(order, size))
        self.sections["claim"] = {
            "claims": cfg.claims,
            "sizes": by_order["default"],
            "priority": by_order["priority"],
            "fair": by_order["fair"],
            "fair_priority": by_order["fair_priority"],
        }
        for order, results in by_order.items():
            smallest = results[0]
            for result in results:
                suffix = {
                    "default": "",
                    "priority": ", priority order",
                    "fair": f", fair over {result.get('keys', 0):,} keys",
                    "fair_priority": f", fair over {result.get('keys', 0):,} keys, priority order",
                }[order]
                for key, label in (("n1", "ready(1)"), ("n100", "ready(100)")):
                    rate = result[key]["claims_per_s"]
                    base = smallest[key]["claims_per_s"]
                    row: dict[str, Any] = {}
                    if result is not smallest:
                        ratio = rate / base
                        row = {"ratio": ratio, "ratio_to": f"at {smallest['queued']:,}"}
                        if result is results[-1]:
                            row.update(
                                target=f">= 0.8x at {smallest['queued']:,}", met=ratio >= 0.8
                            )
                    self._row(
                        "claim",
                        f"claim with {result['queued']:,} queued, {label}{suffix}",
                        rate,
                        "claims/s",
                        server_us=result[key]["server_us_per_call"],
                        **row,
                    )

    def _claim_size(self, order: str, size: int) -> dict[str, Any]:
        """Claim rates with ``size`` tasks queued in namespace order ``order``; in the
        priority order the tasks have ten priorities, so ranks interleave (also inside
        each key for ``fair_priority``, the priority order with fairness keys)."""
        namespace = self._namespace(f"claim{size}{order[0]}")
        with self._scheduler(namespace, lease_s=3600.0) as s:
            if order in ("priority", "fair_priority"):
                s.set_order("priority", aging=1.0)
            before = self._used_memory()
            keys = 0
            if order == "priority":
                fill = size / sum(
                    self._fill(s, f"c{p}-", size // 10 + (p < size % 10), priority=p)
                    for p in range(10)
                )
            elif order in ("fair", "fair_priority"):
                keys = max(2, min(FAIR_KEYS_MAX, size // FAIR_TASKS_PER_KEY))
                fill = size / self._fill_keyed(s, size, keys, order == "fair_priority")
            else:
                fill = size / self._fill(s, "c", size)
            after = self._used_memory()
            s.release(s.ready(1, "bench-claimer"))  # the claim script is loaded
            one, per_one, one_server = self._claim_rate(s, 1, size)
            many, per_many, many_server = self._claim_rate(s, 100, size)
        self._clean(namespace)
        how = f"{order} order"
        if keys:
            how = f"fair over {keys:,} keys" + (", priority order" if "priority" in order else "")
        self._step(
            f"{size:,} queued, {how} (filled at {fill:,.0f} tasks/s): "
            f"{per_one:,.0f} claims/s one per call, {per_many:,.0f} with 100"
        )
        return {
            "queued": size,
            "order": order,
            "keys": keys,
            "fill_per_s": fill,
            "bytes_per_task": (after - before) / size,
            "n1": {
                "claims": one,
                "calls": one,
                "claims_per_s": per_one,
                "server_us_per_call": one_server.us_per_call,
            },
            "n100": {
                "claims": many,
                "calls": math.ceil(many / 100),
                "claims_per_s": per_many,
                "server_us_per_call": many_server.us_per_call,
            },
        }

    def _claim_rate(self, s: Scheduler, n: int, size: int) -> tuple[int, float, ServerTime]:
        """Time ``claims`` claims of up to ``n`` per call, the queue kept near ``size``.

        Claimed tasks go back to the queue (``release``, no attempt spent) every 100
        claims, outside the timed calls: so a small queue stays as full as a big one.
        """
        total = self.config.claims
        claimed, spent, held = 0, 0.0, []
        with self._server_time() as server:
            while claimed < total:
                t0 = time.perf_counter()
                got = s.ready(min(n, total - claimed), "bench-claimer")
                spent += time.perf_counter() - t0
                if not got:
                    self._problem("claim", [f"a queue of {size} ran dry"])
                    break
                claimed += len(got)
                held += got
                if len(held) >= min(100, size // 2):
                    with self._exclude(server):
                        s.release(held)
                    held = []
            if held:
                with self._exclude(server):
                    s.release(held)
        return claimed, claimed / spent if spent > 0 else 0.0, server

    # -- (f) dependencies

    def dag(self) -> None:
        cfg = self.config
        self._phase(
            6,
            f"dependencies: a {cfg.chain:,}-task chain, a {cfg.fanout:,}-wide "
            f"fan-out/fan-in, {cfg.dependents:,} dependents released and blocked",
        )
        section: dict[str, Any] = {}
        # A chain: each task depends on the one before.
        namespace = self._namespace("chain")
        ids = [f"c{i}" for i in range(cfg.chain)]
        specs = [TaskSpec(ids[0], NOOP)] + [
            TaskSpec(ids[i], NOOP, deps=[ids[i - 1]]) for i in range(1, cfg.chain)
        ]
        chain = self._submit_whole(specs)
        with self._scheduler(namespace) as s:
            chain.update(self._submit_parts(s, specs))
            chain.update(self._drain("dag", namespace, s, ids, 1))
        self._clean(namespace)
        section["chain"] = chain
        self._step(f"chain: {chain['tasks_per_s'] or 0:,.0f} tasks/s")
        # Fan-out/fan-in: root -> fanout tasks -> sink.
        namespace = self._namespace("fan")
        mids = [f"m{i}" for i in range(cfg.fanout)]
        specs = [TaskSpec("root", NOOP)]
        specs += [TaskSpec(m, NOOP, deps=["root"]) for m in mids]
        specs.append(TaskSpec("sink", NOOP, deps=mids))
        fan = self._submit_whole(specs)
        with self._scheduler(namespace) as s:
            fan.update(self._submit_parts(s, specs))
            fan.update(self._drain("dag", namespace, s, ["root", *mids, "sink"], 1))
        self._clean(namespace)
        section["fan"] = fan
        self._step(f"fan-out/fan-in: {fan['tasks_per_s'] or 0:,.0f} tasks/s")
        # The longest script call: one task's end settles many dependents.
        for mode in ("complete", "fail"):
            section[mode] = self._settle_many(mode)
            self._step(
                f"{cfg.dependents:,} dependents, {mode}: longest script call "
                f"{section[mode]['max_ms']:.1f} ms over {section[mode]['calls']} calls"
            )
        self.sections["dag"] = section
        for key, label in (
            ("chain", f"{cfg.chain:,}-task chain, 1 worker process"),
            ("fan", f"fan-out/fan-in 1 -> {cfg.fanout:,} -> 1, 1 worker process"),
        ):
            data = section[key]
            self._row("dag", label, data["tasks_per_s"], "tasks/s")
            self._row(
                "dag",
                f"  submit in parts of {GRAPH_PART:,}: longest script call",
                data["part_max_ms"],
                "ms",
                target="<= 50 ms",
                met=data["part_max_ms"] <= 50.0,
            )
            self._row(
                "dag",
                f"  submit_graph of all {data['tasks']:,} tasks at once (atomic)",
                data["submit_ms"],
                "ms",
                server_us=data["submit_server_us"],
            )
        for mode, verb in (("complete", "releasing"), ("fail", "blocking")):
            data = section[mode]
            self._row(
                "dag",
                f"longest script call {verb} {cfg.dependents:,} dependents",
                data["max_ms"],
                "ms",
                target="<= 50 ms",
                met=data["max_ms"] <= 50.0,
                server_us=data["server_us_per_call"],
            )
            if data["slowlog_max_ms"] is not None:
                self._row(
                    "dag",
                    "  same, server side (SLOWLOG)",
                    data["slowlog_max_ms"],
                    "ms",
                    target="<= 50 ms",
                    met=data["slowlog_max_ms"] <= 50.0,
                )

    def _submit_whole(self, specs: Sequence[TaskSpec]) -> dict[str, Any]:
        """submit_graph of a whole graph in one atomic script call (in a namespace of its
        own, removed afterwards): what holding Redis for the whole graph costs."""
        namespace = self._namespace("whole")
        with self._scheduler(namespace) as s, self._server_time() as server:
            t0 = time.perf_counter()
            s.submit_graph(specs)
            elapsed = time.perf_counter() - t0
        self._clean(namespace)
        return {
            "tasks": len(specs),
            "submit_ms": elapsed * 1000.0,
            "submit_server_us": server.us_per_call,
        }

    def _submit_parts(self, s: Scheduler, specs: Sequence[TaskSpec]) -> dict[str, Any]:
        """submit_graph in parts, dependencies first, as a large graph should be submitted
        when Redis must not be held long: the longest script call in ms. A task with more
        dependencies than one part is itself placed in parts: each call is timed alone."""
        times = []
        for start in range(0, len(specs), GRAPH_PART):
            op = s._ops.submit_graph(specs[start : start + GRAPH_PART])
            step = core.advance(op, None)
            while not isinstance(step, core.Done):
                t0 = time.perf_counter()
                reply = s._send(step)
                if isinstance(step, core.Call):
                    times.append((time.perf_counter() - t0) * 1000.0)
                step = core.advance(op, reply)
        return {"part_max_ms": max(times), "parts": len(times)}

    def _submit_graph(self, s: Scheduler, specs: Sequence[TaskSpec]) -> list[float]:
        """submit_graph in batches (each batch only names tasks already known); ms per call."""
        times = []
        for start in range(0, len(specs), GRAPH_BATCH):
            t0 = time.perf_counter()
            s.submit_graph(specs[start : start + GRAPH_BATCH])
            times.append((time.perf_counter() - t0) * 1000.0)
        return times

    def _settle_many(self, mode: str) -> dict[str, Any]:
        cfg = self.config
        namespace = self._namespace(f"settle-{mode}")
        with self._scheduler(namespace) as s:
            s.submit("root", fn=NOOP)
            ids = [f"d{i}" for i in range(cfg.dependents)]
            submit = self._submit_graph(s, [TaskSpec(i, NOOP, deps=["root"]) for i in ids])
            claim = s.next("bench")
            assert isinstance(claim, core.Claim)
            mark = self._slowlog_mark()
            call = (
                core.complete_call(s.keys, [(claim, None)])
                if mode == "complete"
                else core.fail_call(s.keys, [(claim, "bench")])
            )
            # Each script call timed alone, as the client sees it: the task's own
            # transition, then the bounded propagation calls until nothing is left.
            times = []
            with self._server_time() as server:
                t0 = time.perf_counter()
                s._drive(s._ops.once(call))
                times.append(time.perf_counter() - t0)
                left = 1
                while left:
                    t0 = time.perf_counter()
                    left, _ = s._drive(s._ops.once(core.propagate_call(s.keys)))
                    times.append(time.perf_counter() - t0)
            slowlog_max = self._slowlog_max_ms(mark)
            counts = s.stats()["counts"]
        self._clean(namespace)
        expected = "ready" if mode == "complete" else "blocked"
        if counts[expected] != cfg.dependents:
            self._problem(
                "dag",
                [f"after {mode}: {counts[expected]} of {cfg.dependents} dependents {expected}"],
            )
        return {
            "dependents": cfg.dependents,
            "calls": len(times),
            "max_ms": max(times) * 1000.0,
            "mean_ms": sum(times) / len(times) * 1000.0,
            "total_s": sum(times),
            "server_us_per_call": server.us_per_call,
            "slowlog_max_ms": slowlog_max,
            "slowlog_threshold_ms": self._slowlog_threshold_ms(),
            "submit_max_ms": max(submit),
        }

    @contextmanager
    def _server_time(self) -> Iterator[ServerTime]:
        """Measure the script calls made inside the block, from Redis's side."""
        result = ServerTime()
        before = self._script_stats()
        yield result
        after = self._script_stats()
        if before is not None and after is not None:
            result.measured = True
            result.calls += after[0] - before[0]
            result.usec += after[1] - before[1]

    @contextmanager
    def _exclude(self, server: ServerTime) -> Iterator[None]:
        """Leave the script calls made inside the block out of ``server``'s figure."""
        before = self._script_stats()
        yield
        after = self._script_stats()
        if before is not None and after is not None:
            server.calls -= after[0] - before[0]
            server.usec -= after[1] - before[1]

    def _script_stats(self) -> tuple[int, int] | None:
        """(calls, microseconds) of FCALL and EVALSHA from INFO commandstats; scripts'
        inner commands are counted apart, so this is the whole script calls' time."""
        try:
            stats = self.client.info("commandstats")
        except redis.RedisError:
            return None
        entries: list[dict[str, Any]] = [
            entry
            for entry in (stats.get("cmdstat_fcall"), stats.get("cmdstat_evalsha"))
            if isinstance(entry, dict)
        ]
        if not entries:
            return None
        calls = sum(int(entry.get("calls", 0)) for entry in entries)
        return calls, sum(int(entry.get("usec", 0)) for entry in entries)

    def _slowlog_threshold_ms(self) -> float | None:
        try:
            value = self.client.config_get("slowlog-log-slower-than").get("slowlog-log-slower-than")
        except redis.RedisError:
            return None
        return None if value is None else int(value) / 1000.0

    def _slowlog_mark(self) -> int | None:
        """The newest SLOWLOG entry id now (-1: empty; None: no SLOWLOG here)."""
        try:
            if self.throwaway:
                # Our own server: log every script call slower than 1 ms, and keep them all.
                # Top-level commands only: a script's inner commands are never logged.
                self.client.config_set("slowlog-log-slower-than", 1000)
                self.client.config_set("slowlog-max-len", 10_000)
            entries = self.client.slowlog_get(1)
        except redis.RedisError:
            return None
        return int(entries[0]["id"]) if entries else -1

    def _slowlog_max_ms(self, mark: int | None) -> float | None:
        if mark is None:
            return None
        try:
            entries = self.client.slowlog_get(10_000)
        except redis.RedisError:
            return None
        durations = [
            int(e["duration"])
            for e in entries
            if int(e["id"]) > mark and _command_name(e.get("command")) in (b"EVALSHA", b"EVAL")
        ]
        return max(durations) / 1000.0 if durations else None

    # -- (g) memory

    def memory(self) -> None:
        cfg = self.config
        self._phase(7, f"memory: {cfg.memory_tasks:,} queued no-op tasks")
        namespace = self._namespace("memory")
        with self._scheduler(namespace) as s:
            s.schedule("warm-up", fn=NOOP)  # the namespace's fixed keys are not per task
            before = self._used_memory()
            self._fill_with_argument(s, "m", cfg.memory_tasks)
            after = self._used_memory()
        self._clean(namespace)
        per_task = (after - before) / cfg.memory_tasks
        self._step(f"{per_task:.0f} bytes/task")
        self.sections["memory"] = {
            "tasks": cfg.memory_tasks,
            "task_id_example": f"m{cfg.memory_tasks - 1}",
            "args_example": [cfg.memory_tasks - 1],
            "used_memory_before": before,
            "used_memory_after": after,
            "bytes_per_task": per_task,
        }
        self._row(
            "memory",
            "Redis memory per queued task, one small argument",
            per_task,
            "bytes",
            target="<= 250 bytes",
            met=per_task <= 250,
        )

    # -- (h) wake-ups

    def wake(self) -> None:
        cfg = self.config
        sizes = ", ".join(str(n) for n in cfg.wake_processes)
        self._phase(8, f"wake: {cfg.wake_tasks:,} tasks one at a time, {sizes} idle processes")
        results = [self._wake_run(n) for n in cfg.wake_processes]
        self.sections["wake"] = {"tasks": cfg.wake_tasks, "runs": results}
        base = results[0]
        for run in results:
            n = run["processes"]
            for key, name, unit in (
                ("script_calls_per_task", "script calls per task", "calls"),
                ("script_us_per_task", "Redis time in scripts per task", "us"),
                ("redis_cpu_us_per_task", "Redis CPU per task", "us"),
            ):
                value, first = run[key], base[key]
                ratio = value / first if value is not None and first else None
                last = n == results[-1]["processes"] and n > base["processes"]
                self._row(
                    "wake",
                    f"{name}, {n} idle processes",
                    value,
                    unit,
                    ratio=ratio,
                    ratio_to=f"{base['processes']} process(es)" if ratio is not None else "",
                    target="<= 1.2x" if last else "",
                    met=(ratio <= 1.2) if last and ratio is not None else None,
                )
            self._row("wake", f"wake-up latency p50, {n} idle processes", run["p50_ms"], "ms")
            self._row(
                "wake",
                f"wake-up latency p99, {n} idle processes",
                run["p99_ms"],
                "ms",
                target="<= 2 ms",
                met=None if run["p99_ms"] is None else run["p99_ms"] <= 2.0,
            )

    def _wake_run(self, processes: int) -> dict[str, Any]:
        cfg = self.config
        namespace = self._namespace(f"wake{processes}")
        ids = [f"w{i}" for i in range(cfg.wake_tasks)]
        warm = [f"warm{i}" for i in range(3)]
        procs = WorkerProcesses(
            self.url, namespace, processes, WAKE_CONCURRENCY, self.workdir, lease_s=300.0
        )
        with self._scheduler(namespace, lease_s=300.0) as s:
            try:
                procs.start()
                procs.go()
                self._wait_subscribed(s, processes, procs)
                for task_id in warm:
                    self._one_task(s, task_id, procs)
                time.sleep(0.2)  # every worker back to waiting
                calls_before, cpu_before = self._script_stats(), self._cpu_us()
                started = time.perf_counter()
                for task_id in ids:
                    self._one_task(s, task_id, procs)
                seconds = time.perf_counter() - started
                calls_after, cpu_after = self._script_stats(), self._cpu_us()
                reports = procs.stop()
            finally:
                procs.close()
        self._clean(namespace)
        runs = [run for report in reports for run in report.runs if run.task_id in set(ids)]
        problems = check_exactly_once(ids, runs)
        self._problem("wake", problems)
        calls = script_us = None
        if calls_before is not None and calls_after is not None:
            calls = (calls_after[0] - calls_before[0]) / len(ids)
            script_us = (calls_after[1] - calls_before[1]) / len(ids)
        cpu = None
        if cpu_before is not None and cpu_after is not None:
            cpu = (cpu_after - cpu_before) / len(ids)
        late = [(run.started - run.run_at) * 1000.0 for run in runs]
        p50, p99 = (percentile(late, 50), percentile(late, 99)) if late else (None, None)
        self._step(
            f"{processes} processes: {calls or 0:.2f} script calls/task "
            f"({script_us or 0:.0f} us), {cpu or 0:.0f} us Redis CPU/task, "
            f"latency p50 {p50 or 0:.2f} ms, "
            f"p99 {p99 or 0:.2f} ms"
        )
        return {
            "processes": processes,
            "concurrency": WAKE_CONCURRENCY,
            "tasks": len(ids),
            "seconds": seconds,
            "script_calls_per_task": calls,
            "redis_cpu_us_per_task": cpu,
            "script_us_per_task": script_us,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max(late) if late else None,
            "exactly_once_problems": problems,
        }

    def _wait_subscribed(self, s: Scheduler, processes: int, procs: WorkerProcesses) -> None:
        """Until every worker process listens for wake-ups (sharded or not)."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while time.monotonic() < deadline and procs.alive():
            listening = 0
            for count in (self.client.pubsub_numsub, self.client.pubsub_shardnumsub):
                with suppress(redis.RedisError):
                    listening += int(count(s.keys.wake)[0][1])
            if listening >= processes:
                time.sleep(0.3)  # their first claims are done
                return
            time.sleep(POLL_S)
        raise BenchError("the wake section's worker processes did not subscribe in time")

    def _one_task(self, s: Scheduler, task_id: str, procs: WorkerProcesses) -> None:
        done_list = f"bench:{{{s.namespace}}}:done"
        s.schedule(task_id, fn=SIGNAL, args=[done_list])
        deadline = time.monotonic() + 30.0
        while self.client.blpop([done_list], timeout=0.5) is None:
            if time.monotonic() > deadline or not procs.alive():
                raise BenchError(f"task {task_id!r} of the wake section did not run")

    def _cpu_delta(self, before: float | None, count: int) -> float | None:
        """Redis CPU since ``before`` (from ``_cpu_us``) per one of ``count``, microseconds."""
        after = self._cpu_us()
        if before is None or after is None or count <= 0:
            return None
        return (after - before) / count

    def _cpu_us(self) -> float | None:
        """Redis's own CPU time so far (user + system), microseconds."""
        try:
            info = self.client.info("cpu")
        except redis.RedisError:
            return None
        return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6

    # -- everything

    # -- (i) dashboard

    def dashboard(self) -> None:
        cfg = self.config
        self._phase(
            9,
            f"dashboard: Redis commands per page with {DASHBOARD_FEW:,} and "
            f"{cfg.dashboard_tasks:,} tasks; {cfg.dashboard_drain:,} tasks drained while polled",
        )
        try:
            from distsched.dashboard import create_app
            from distsched.dashboard.serve import Served
        except ImportError as exc:
            self._step(f"skipped: pip install 'distsched[dashboard]' ({exc})")
            self.sections["dashboard"] = {"skipped": str(exc)}
            self._row("dashboard", "skipped: the dashboard extra is not installed", None, "")
            return
        costs: dict[int, dict[str, int | None]] = {}
        for size in (DASHBOARD_FEW, cfg.dashboard_tasks):
            namespace = self._namespace(f"dash{size}")
            with self._scheduler(namespace) as s, Served(create_app(s)) as served:
                self._dashboard_story(s, size)
                costs[size] = {page: self._page_cost(served.url + page) for page in DASHBOARD_PAGES}
            self._clean(namespace)
            self._step(f"{size:,} tasks: {costs[size]}")
        few, many = costs[DASHBOARD_FEW], costs[cfg.dashboard_tasks]
        for page in DASHBOARD_PAGES:
            value, base = many[page], few[page]
            self._row(
                "dashboard",
                f"Redis commands for {page} with {cfg.dashboard_tasks:,} tasks",
                value,
                "commands",
                ratio=None if value is None or not base else value / base,
                ratio_to=f"at {DASHBOARD_FEW:,}",
                target=f"= at {DASHBOARD_FEW:,} tasks",
                met=None if value is None else value == base,
            )
        runs = []
        for polled in (False, True):
            namespace = self._namespace("dashdrain" + ("-polled" if polled else ""))
            with self._scheduler(namespace) as s:
                self._fill(s, "t", cfg.dashboard_drain)
                ids = [f"t{i}" for i in range(cfg.dashboard_drain)]
                if polled:
                    with Served(create_app(s)) as served, _Poller(served.url) as poller:
                        result = self._drain("dashboard", namespace, s, ids, 1)
                    result["polls"] = poller.polls
                    result["poll_errors"] = poller.errors
                else:
                    result = self._drain("dashboard", namespace, s, ids, 1)
            result["polled"] = polled
            self._clean(namespace)
            runs.append(result)
            self._step(
                f"{'polled' if polled else 'alone'}: {result['tasks_per_s'] or 0:,.0f} tasks/s"
            )
        alone, polled_rate = runs[0]["tasks_per_s"], runs[1]["tasks_per_s"]
        ratio = polled_rate / alone if alone and polled_rate else None
        self._row("dashboard", "drain, 1 worker process, no dashboard", alone, "tasks/s")
        self._row(
            "dashboard",
            f"drain, 1 worker process, overview polled every {DASHBOARD_POLL_S:g} s",
            polled_rate,
            "tasks/s",
            ratio=ratio,
            ratio_to="no dashboard",
            target=">= 0.9x no dashboard",
            met=None if ratio is None else ratio >= 0.9,
        )
        self.sections["dashboard"] = {
            "tasks": cfg.dashboard_tasks,
            "few": DASHBOARD_FEW,
            "commands": {str(size): pages for size, pages in costs.items()},
            "drain": runs,
        }

    def _dashboard_story(self, s: Scheduler, size: int) -> None:
        """``size`` tasks queued for later, a failed task with a dependent, three leases."""
        self._fill(s, "t", size, delay=3600)
        s.submit_graph([TaskSpec("extract", NOOP), TaskSpec("load", NOOP, deps=["extract"])])
        claim = s.next("bench-dashboard")
        if not isinstance(claim, core.Claim) or claim.task_id != "extract":
            raise BenchError(f"the dashboard's failed task was not claimed first: {claim}")
        s.fail(claim, "RuntimeError: the bench's failed task")
        for i in range(3):
            s.schedule(f"running{i}", fn=NOOP)
        s.ready(3, "bench-dashboard")

    def _commands_sent(self) -> int | None:
        try:
            stats = self.client.info("commandstats")
        except redis.ResponseError:
            return None
        if not stats:
            return None
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    def _page_cost(self, url: str) -> int | None:
        """Redis commands one GET of ``url`` sends (after a first GET that warms up)."""
        _get(url)
        before = self._commands_sent()
        _get(url)
        after = self._commands_sent()
        return None if before is None or after is None else after - before

    # -- (j) fairness

    def fairness(self) -> None:
        cfg = self.config
        self._phase(
            10,
            f"fairness: {FAIR_LIGHT_KEYS} light keys behind {cfg.fair_heavy:,} queued tasks "
            f"of one key, on and off; shares of {cfg.fair_claims:,} claims",
        )
        runs = [self._starvation(fair) for fair in (True, False)]
        on, off = runs
        for run in runs:
            mode = "fair" if run["fair"] else "no keys"
            for p in ("p50", "p99"):
                value, base = run[f"{p}_ms"], on[f"{p}_ms"]
                ratio = value / base if run is off and value is not None and base else None
                self._row(
                    "fairness",
                    f"light-key wait {p}, {cfg.fair_heavy:,} heavy queued, {mode}",
                    value,
                    "ms",
                    ratio=ratio,
                    ratio_to="fair" if ratio is not None else "",
                )
        shares = self._shares()
        for share in shares["keys"]:
            ratio = share["share"] / share["weight_share"]
            self._row(
                "fairness",
                f"claims of key {share['key']} (weight {share['weight']})",
                share["claims"],
                "claims",
                ratio=ratio,
                ratio_to="its weight's share",
                target="within 5% of its weight's share",
                met=abs(ratio - 1.0) <= 0.05,
            )
        self.sections["fairness"] = {"starvation": runs, "shares": shares}

    def _starvation(self, fair: bool) -> dict[str, Any]:
        """Light tasks submitted every FAIR_LIGHT_EVERY_S per light key behind a heavy
        backlog, with keys (``fair``) or the same tasks without; their waits on the Redis
        clock (start - submission)."""
        cfg = self.config
        namespace = self._namespace("starve" + ("-fair" if fair else "-plain"))
        done_list = f"bench:{{{namespace}}}:done"
        light_ids: list[str] = []
        submitted: dict[str, float] = {}
        procs = WorkerProcesses(self.url, namespace, 1, FAIR_CONCURRENCY, self.workdir)
        with self._scheduler(namespace) as s:
            try:
                procs.start()
                self._fill(s, "h", cfg.fair_heavy, key="heavy" if fair else None)
                offset, _ = clock_offset(s)
                procs.go()
                started = time.monotonic()
                for r in range(cfg.fair_rounds):
                    specs = [
                        TaskSpec(
                            f"l{k}-{r}",
                            SIGNAL,
                            args=[done_list],
                            key=f"light:{k}" if fair else None,
                        )
                        for k in range(FAIR_LIGHT_KEYS)
                    ]
                    now = time.time() + offset
                    s.schedule_many(specs)
                    for spec in specs:
                        submitted[spec.task_id] = now
                        light_ids.append(spec.task_id)
                    pause = started + (r + 1) * FAIR_LIGHT_EVERY_S - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                deadline = time.monotonic() + FAIR_TIMEOUT_S
                while (
                    int(self.client.llen(done_list)) < len(light_ids)
                    and time.monotonic() < deadline
                    and procs.alive()
                ):
                    time.sleep(POLL_S * 5)
                reports = procs.stop()
            finally:
                procs.close()
        self.client.delete(done_list)
        self._clean(namespace)
        wanted = set(light_ids)
        runs = [run for report in reports for run in report.runs if run.task_id in wanted]
        unstarted = len(wanted - {run.task_id for run in runs})
        problems = [p for p in check_exactly_once(light_ids, runs) if "never ran" not in p]
        self._problem("fairness", problems)
        waits = [(run.started - submitted[run.task_id]) * 1000.0 for run in runs]
        p50, p99 = (percentile(waits, 50), percentile(waits, 99)) if waits else (None, None)
        late = f", {unstarted} not started in {FAIR_TIMEOUT_S:g} s" if unstarted else ""
        self._step(
            f"{'fair' if fair else 'no keys'}: light wait p50 {p50 or 0:,.1f} ms, "
            f"p99 {p99 or 0:,.1f} ms{late}"
        )
        return {
            "fair": fair,
            "heavy": cfg.fair_heavy,
            "light": len(light_ids),
            "light_keys": FAIR_LIGHT_KEYS,
            "concurrency": FAIR_CONCURRENCY,
            "unstarted": unstarted,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max(waits) if waits else None,
            "exactly_once_problems": problems,
        }

    def _shares(self) -> dict[str, Any]:
        """Claims of backlogged keys of FAIR_WEIGHTS, FAIR_CLAIM_BATCH per call."""
        cfg = self.config
        namespace = self._namespace("shares")
        total = sum(FAIR_WEIGHTS)
        keys = [f"w{i}" for i in range(len(FAIR_WEIGHTS))]
        got: dict[str, int] = dict.fromkeys(keys, 0)
        claimed = 0
        with self._scheduler(namespace) as s:
            for key, weight in zip(keys, FAIR_WEIGHTS, strict=True):
                s.set_key(key, weight=weight)
                # More than the key's share, so that every key stays backlogged.
                want = cfg.fair_claims * weight // total + FAIR_CLAIM_BATCH + 10
                self._fill(s, f"{key}-", want, key=key)
            while claimed < cfg.fair_claims:
                claims, _ = s.claim(min(FAIR_CLAIM_BATCH, cfg.fair_claims - claimed), "bench")
                if not claims:
                    break
                for c in claims:
                    got[c.task_id.split("-")[0]] += 1
                claimed += len(claims)
        self._clean(namespace)
        if claimed < cfg.fair_claims:
            self._problem("fairness", [f"only {claimed} of {cfg.fair_claims} claims were made"])
        shares = [
            {
                "key": key,
                "weight": weight,
                "claims": got[key],
                "share": got[key] / claimed if claimed else 0.0,
                "weight_share": weight / total,
            }
            for key, weight in zip(keys, FAIR_WEIGHTS, strict=True)
        ]
        self._step(
            "shares: "
            + ", ".join(f"{x['key']} {x['share']:.3f} (of {x['weight_share']:.3f})" for x in shares)
        )
        return {"claims": claimed, "batch": FAIR_CLAIM_BATCH, "keys": shares}

    # -- (k) profile

    def profile(self) -> None:
        cfg = self.config
        n = cfg.profile_tasks
        self._phase(
            11,
            f"profile: Redis time per script (SLOWLOG), {n:,} schedule calls, "
            "then those tasks drained by one worker process",
        )
        why = self._profile_unavailable()
        if why is not None:
            self._step(f"skipped: {why}")
            self.sections["profile"] = {"skipped": why}
            self._row("profile", f"skipped: {why}", None, "")
            return
        namespace = self._namespace("profile")
        max_len = n * PROFILE_ENTRIES_PER_TASK + PROFILE_ENTRIES_MARGIN
        shas = {script.sha: name for name, script in scripts.Registry(self.client).scripts.items()}
        ids = [f"p{i}" for i in range(n)]
        saved = self._slowlog_settings()
        # The bench's own polling during the drain goes through a client of its own name,
        # so that its commands are not counted as the drain's.
        own = redis.Redis.from_url(self.url, client_name=PROFILE_CLIENT)
        try:
            self.client.config_set("slowlog-max-len", max_len)
            self.client.config_set("slowlog-log-slower-than", 0)
            with Scheduler(own, namespace=namespace) as s:
                self.client.slowlog_reset()
                for task_id in ids:
                    s.schedule(task_id, fn=NOOP)
                enqueue = self._slowlog_read(max_len)
                self._step(f"schedule: {len(enqueue):,} SLOWLOG entries")
                self.client.slowlog_reset()
                drain = self._drain("profile", namespace, s, ids, 1)
                drained = self._slowlog_read(max_len)
                self._step(f"drain: {len(drained):,} SLOWLOG entries")
        finally:
            for name, value in saved.items():
                self.client.config_set(name, value)
            self.client.slowlog_reset()  # its entries' memory back
            own.close()
        self._clean(namespace)
        cut = [
            phase
            for phase, got in (("schedule", enqueue), ("drain", drained))
            if len(got) >= max_len
        ]
        if cut:
            # Figures too low, not a wrong run: said, and kept in the JSON.
            self._step(f"WARNING: SLOWLOG of {max_len:,} entries was full ({', '.join(cut)})")
        sched = profile_slowlog(enqueue, shas)
        dr = profile_slowlog(drained, shas, skip_clients=[PROFILE_CLIENT])
        self._profile_rows(n, sched, dr)
        self.sections["profile"] = {
            "tasks": n,
            "slowlog_max_len": max_len,
            "slowlog_full": cut,
            "settings_restored": saved,
            "schedule": self._per(sched, n),
            "drain": {
                **self._per(dr, n),
                "tasks_per_s": drain["tasks_per_s"],
                "exactly_once_problems": drain["exactly_once_problems"],
            },
        }

    # -- (l) worst

    def worst(self) -> None:
        cfg = self.config
        self._phase(
            12,
            f"worst: the longest call of each script at the caps (scale {cfg.worst_scale:g}, "
            f"{cfg.worst_repeats} runs each)",
        )
        why = self._profile_unavailable()
        if why is not None:
            self._step(f"skipped: {why}")
            self.sections["worst"] = {"skipped": why}
            self._row("worst", f"skipped: {why}", None, "")
            return
        from distsched.tools import worst

        report = worst.run_worst(
            self.url, self.prefix, cfg.worst_scale, cfg.worst_repeats, self._step
        )
        self.sections["worst"] = report
        target = f"< {worst.TARGET_MS:g} ms"
        for row in report["scripts"]:
            shown = row["input"] if row["outcome"] == "ok" else f"{row['input']}: {row['outcome']}"
            shown = shown if len(shown) <= WORST_SHOWN else shown[: WORST_SHOWN - 3] + "..."
            self._row("worst", f"{row['script']}: {shown}", row["ms"], "ms", target=target,
                      met=row["met"])  # fmt: skip
        for problem in report["problems"]:
            self._step(problem)

    def _profile_unavailable(self) -> str | None:
        """Why the profile section cannot run here, None when it can."""
        if not self.throwaway:
            return "it changes SLOWLOG settings: only on the bench's own server, not --redis"
        if self.backend != "redis-server":
            return f"{self.backend} does not log scripts' commands in SLOWLOG"
        return None

    def _slowlog_settings(self) -> dict[str, str]:
        got = self.client.config_get("slowlog-*")
        return {
            name: str(_text_of(got[name]))
            for name in ("slowlog-log-slower-than", "slowlog-max-len")
            if name in got
        }

    def _slowlog_read(self, count: int) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.client.slowlog_get(count)
        return entries

    @staticmethod
    def _per(profile: dict[str, Any], n: int) -> dict[str, Any]:
        """A ``profile_slowlog`` result with its figures per task too."""

        def each(items: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
            return {
                key: {**value, "calls_per_task": value["calls"] / n, "us_per_task": value["us"] / n}
                for key, value in sorted(items.items(), key=lambda kv: -kv[1]["us"])
            }

        return {
            "entries": profile["entries"],
            "scripts": each(profile["scripts"]),
            "inner": each(profile["inner"]),
            "other": each(profile["other"]),
            "script_us": profile["script_us"],
            "inner_us": profile["inner_us"],
            "lua_us": profile["script_us"] - profile["inner_us"],
            "script_calls": profile["script_calls"],
            "script_us_per_task": profile["script_us"] / n,
            "inner_us_per_task": profile["inner_us"] / n,
            "lua_us_per_task": (profile["script_us"] - profile["inner_us"]) / n,
        }

    def _profile_rows(self, n: int, sched: dict[str, Any], dr: dict[str, Any]) -> None:
        calls = max(1, int(sched["scripts"].get("schedule", {}).get("calls", 0)))
        schedule_us = sched["scripts"].get("schedule", {}).get("us", 0)
        # The schedule phase runs the schedule script only: its inner commands are its own.
        self._row("profile", "schedule: Redis time per call", schedule_us / calls, "us/call")
        self._row(
            "profile", "  of which commands run by the script", sched["inner_us"] / calls, "us/call"
        )
        self._row(
            "profile",
            "  of which the script's own Lua",
            (schedule_us - sched["inner_us"]) / calls,
            "us/call",
        )
        self._step(
            f"schedule: {schedule_us / calls:.1f} us/call, "
            f"{sched['inner_us'] / calls:.1f} us of it in its commands"
        )
        for name, value in sorted(dr["scripts"].items(), key=lambda kv: -kv[1]["us"]):
            self._row(
                "profile",
                f"drain: {name} ({value['calls'] / n:.2f} calls/task), Redis time per drained task",
                value["us"] / n,
                "us/task",
            )
        self._row(
            "profile", "  commands run by scripts, per drained task", dr["inner_us"] / n, "us/task"
        )
        top = sorted(dr["inner"].items(), key=lambda kv: -kv[1]["us"])[:PROFILE_TOP_COMMANDS]
        for name, value in top:
            self._row(
                "profile",
                f"  {name} per drained task ({value['calls'] / n:.2f} calls/task)",
                value["us"] / n,
                "us/task",
            )
        self._row(
            "profile",
            "  Lua of the scripts, per drained task",
            (dr["script_us"] - dr["inner_us"]) / n,
            "us/task",
        )
        self._step(
            f"drain: {dr['script_us'] / n:.1f} us/task in scripts, "
            f"{dr['inner_us'] / n:.1f} us of it in their commands"
        )

    def run(self) -> dict[str, Any]:
        started = time.time()
        t0 = time.perf_counter()
        info = self.client.info("server")
        if self.throwaway:
            self.client.flushall()
        for name in SECTIONS:
            if not self.config.only or name in self.config.only:
                getattr(self, name)()
        return {
            "distsched_version": __version__,
            "environment": environment(self.client),
            "started_at": started,
            "duration_s": time.perf_counter() - t0,
            "redis": {
                "url": redact(self.url),
                "backend": self.backend,
                "version": info.get("redis_version"),
                "throwaway": self.throwaway,
            },
            "namespace_prefix": self.prefix,
            "config": asdict(self.config),
            "sections": self.sections,
            "rows": [asdict(row) for row in self.rows],
            "problems": self.problems,
        }


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:
        body: bytes = reply.read()
        return body


class _Poller:
    """A dashboard left open: the overview and its JSON fetched every second."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-dashboard-poller")

    def _run(self) -> None:
        while not self._stop.is_set():
            for page in ("/", "/api/overview"):
                try:
                    _get(self.base + page)
                    self.polls += 1
                except OSError:
                    self.errors += 1
            self._stop.wait(DASHBOARD_POLL_S)

    def __enter__(self) -> _Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# --------------------------------------------------------------------------- SLOWLOG profile

# Script calls as SLOWLOG names them (argv[0], upper case).
_FUNCTION_CALLS = (b"FCALL", b"FCALL_RO")
_EVALSHA_CALLS = (b"EVALSHA", b"EVALSHA_RO")
_EVAL_CALLS = (b"EVAL", b"EVAL_RO")


def _argv_head(command: Any) -> tuple[bytes, bytes]:
    """argv[0] (upper case) and argv[1] of a SLOWLOG entry's command: a list of
    arguments, or the one string redis-py joins them into (neither a command name, a
    function name nor a SHA1 holds a space, so the first two words are exact)."""
    words: list[bytes] = []
    items = command if isinstance(command, (list, tuple)) else [command]
    for item in items:
        if isinstance(item, str):
            item = item.encode()
        if not isinstance(item, bytes):
            break
        words.extend(item.split(b" ", 2 - len(words))[: 2 - len(words)])
        if len(words) >= 2:
            break
    words += [b""] * (2 - len(words))
    return words[0].upper(), words[1]


def _text_of(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def script_of(command: Any, shas: dict[str, str]) -> str | None:
    """The distsched script a SLOWLOG entry called, None when it is no script call.

    An FCALL names the function ``distsched_<hash>_<script>`` (scripts.function_name; the
    hash is ignored, so an older library's calls count too: script names may hold
    ``_``, hence the split after the hash rather than at the last ``_``); an EVALSHA
    names the SHA1 of the script's text (``shas``: SHA1 to script name). Any other
    script call is named ``other ...`` with its function or the start of its SHA1."""
    name, first = _argv_head(command)
    if name in _FUNCTION_CALLS:
        parts = first.decode("utf-8", "replace").split("_", 2)
        if len(parts) == 3 and parts[0] == "distsched" and parts[2] in scripts.SCRIPT_NAMES:
            return parts[2]
        return f"other function {'_'.join(parts)}"
    if name in _EVALSHA_CALLS:
        sha = first.decode("ascii", "replace").lower()
        return shas.get(sha, f"other script {sha[:12]}")
    if name in _EVAL_CALLS:
        # The one script distsched sends as text: the server clock (core.SERVER_TIME_LUA).
        text = command if isinstance(command, bytes) else b" ".join(_words(command))
        return "server clock (EVAL)" if _SERVER_TIME in text else "other script (EVAL)"
    return None


_SERVER_TIME = core.SERVER_TIME_LUA.encode()


def _words(command: Any) -> list[bytes]:
    items = command if isinstance(command, (list, tuple)) else [command]
    return [
        item.encode() if isinstance(item, str) else item
        for item in items
        if isinstance(item, (str, bytes))
    ]


def _is_script_client(address: Any) -> bool:
    """Whether a SLOWLOG entry's client is a script's own (its commands are a script's
    inner commands): Redis names that client's address ``?:0``."""
    return _text_of(address).startswith("?")


def profile_slowlog(
    entries: Iterable[dict[str, Any]],
    shas: dict[str, str],
    skip_clients: Iterable[str] = (),
) -> dict[str, Any]:
    """Where Redis time went, from SLOWLOG entries logged with ``slowlog-log-slower-than 0``.

    Each script call is counted under its script (calls, microseconds: its inner commands
    included); the commands a script runs are logged too, just before the script call
    itself (Redis logs a command when it ends), and are summed by command name under
    ``inner``. Calls from ``skip_clients`` (client names: the bench's own polling) are
    left out with their inner commands; other top-level commands go under ``other``."""
    skip = set(skip_clients)
    by_script: dict[str, dict[str, int]] = {}
    inner: dict[str, dict[str, int]] = {}
    other: dict[str, dict[str, int]] = {}
    pending: list[tuple[str, int]] = []
    count = 0

    def add(table_: dict[str, dict[str, int]], key: str, usec: int) -> None:
        slot = table_.setdefault(key, {"calls": 0, "us": 0})
        slot["calls"] += 1
        slot["us"] += usec

    # SLOWLOG GET lists the newest first; the inner commands must come before their call.
    for entry in sorted(entries, key=lambda e: int(e["id"])):
        count += 1
        usec = int(entry["duration"])
        command = entry.get("command")
        if _is_script_client(entry.get("client_address")):
            pending.append((_argv_head(command)[0].decode("utf-8", "replace"), usec))
            continue
        skipped = _text_of(entry.get("client_name")) in skip
        script = script_of(command, shas)
        if not skipped:
            if script is not None:
                add(by_script, script, usec)
            else:
                add(other, _argv_head(command)[0].decode("utf-8", "replace"), usec)
        if script is not None:
            if not skipped:
                for name, inner_us in pending:
                    add(inner, name, inner_us)
            pending = []
    # Inner commands with no script call after them (none, unless the log was cut).
    for name, inner_us in pending:
        add(inner, name, inner_us)
    return {
        "entries": count,
        "scripts": by_script,
        "script_us": sum(s["us"] for s in by_script.values()),
        "script_calls": sum(s["calls"] for s in by_script.values()),
        "inner": inner,
        "inner_us": sum(s["us"] for s in inner.values()),
        "other": other,
    }


def _command_name(command: Any) -> bytes:
    if isinstance(command, (list, tuple)):
        command = command[0] if command else b""
    if isinstance(command, str):
        command = command.encode()
    if not isinstance(command, bytes):
        return b""
    return command.split(b" ", 1)[0].upper()


# --------------------------------------------------------------------------- output


def _value_text(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ms":
        return f"{value:,.2f}"
    if unit.startswith("us/"):
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def format_table(report: dict[str, Any]) -> list[str]:
    """The report's rows as an aligned text table."""
    header = (
        "section", "measure", "value", "unit", "ratio", "server us/call", "Redis CPU us",
        "target", "met",
    )  # fmt: skip
    lines: list[tuple[str, ...]] = [header]
    for row in report["rows"]:
        ratio = f"{row['ratio']:.2f}x {row['ratio_to']}" if row["ratio"] is not None else ""
        server = "" if row["server_us"] is None else f"{row['server_us']:,.1f}"
        cpu = "" if row.get("cpu_us") is None else f"{row['cpu_us']:,.1f}"
        met = "" if row["met"] is None else ("yes" if row["met"] else "no")
        value = _value_text(row["value"], row["unit"])
        lines.append(
            (row["section"], row["name"], value, row["unit"], ratio, server, cpu,
             row["target"], met)
        )  # fmt: skip
    return table(lines, right=frozenset({2, 5, 6}))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _library_version(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def environment(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured with: the machine, Python, the client libraries,
    and the Redis server."""
    try:
        server = client.info("server")
    except redis.RedisError:
        server = {}
    from redis.utils import HIREDIS_AVAILABLE

    return {
        "machine": {
            "cores": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "system": f"{platform.system()} {platform.release()}",
        },
        "python": platform.python_version(),
        "libraries": {
            "distsched": __version__,
            "redis": _library_version("redis"),
            "hiredis": _library_version("hiredis"),
            "msgpack": _library_version("msgpack"),
        },
        "hiredis_parser": bool(HIREDIS_AVAILABLE),
        "server": {
            "version": server.get("redis_version"),
            "valkey_version": server.get("valkey_version"),
            "mode": server.get("redis_mode"),
        },
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    """The environment of a report as lines of text."""
    machine, libs = env["machine"], env["libraries"]
    parser = "hiredis parser" if env["hiredis_parser"] else "pure-Python parser"
    server = env["server"]
    name = (
        f"Valkey {server['valkey_version']}"
        if server.get("valkey_version")
        else (f"Redis {server['version']}")
    )
    return [
        f"machine: {machine['cores']} cores, {machine['cpu_model']}, {machine['system']}",
        f"server: {name}; client: Python {env['python']}, redis-py {libs['redis']} "
        f"({parser}{', hiredis ' + libs['hiredis'] if libs['hiredis'] else ''}), "
        f"msgpack {libs['msgpack']}",
    ]


@contextmanager
def progress_lines(stream: IO[str]) -> Iterator[None]:
    """Write the bench's progress (its INFO log) to ``stream`` as plain lines meanwhile."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def run_bench(url: str | None, config: BenchConfig) -> dict[str, Any]:
    """Run every section on ``url``, or on an embedded throwaway Redis when None."""
    config.validate()
    if url is not None:
        bench = Bench(url, "external", throwaway=False, config=config)
        try:
            return bench.run()
        finally:
            bench.close()
    from distsched.tools.embedded import embedded_redis

    with embedded_redis() as server:
        log.info("running on %s", server.description)
        if server.kind != "redis-server":
            log.warning("fakeredis is far slower than Redis; these are not Redis figures")
        bench = Bench(server.url, server.kind, throwaway=True, config=config)
        try:
            return bench.run()
        finally:
            bench.close()


def bench_command(url: str | None, config: BenchConfig, json_path: str | None, echo: Echo) -> bool:
    """What ``distsched bench`` does: run, print the table, write JSON; False on problems.

    Progress is logged on ``distsched.bench`` (INFO)."""
    report = run_bench(url, config)
    redis_info = report["redis"]
    echo(
        f"distsched {report['distsched_version']} on {redis_info['backend']} Redis "
        f"{redis_info['version']} at {redis_info['url']}, {report['duration_s']:.0f} s"
    )
    for line in environment_lines(report["environment"]):
        echo(line)
    echo("")
    for line in format_table(report):
        echo(line)
    echo("")
    echo("Targets are information, not pass/fail; figures are noisy on a busy machine.")
    if json_path is not None:
        text = json.dumps(finite_or_none(report), indent=2, allow_nan=False)
        Path(json_path).write_text(text + "\n", "utf-8")
        echo(f"wrote {json_path}")
    if report["problems"]:
        echo(f"{len(report['problems'])} correctness problem(s):")
        for problem in report["problems"][:20]:
            echo(f"  {problem}")
        return False
    return True


def _main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    print("usage: python -m distsched.tools.bench worker URL NAMESPACE --out FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
