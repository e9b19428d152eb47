"""What every section measures with: one run's namespaces, its table rows, fills and
drains, and Redis's own counters (script calls, CPU, memory)."""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from distsched import model, views
from distsched.client import Scheduler
from distsched.model import TaskSpec
from distsched.tools.bench.config import SECTIONS, BenchConfig
from distsched.tools.bench.procs import (
    NOOP,
    Run,
    WorkerProcesses,
    WorkerReport,
    check_exactly_once,
)

log = logging.getLogger("distsched.bench")
POLL_S = 0.01
# How often a long step (a fill, a drain) logs how far it got.
PROGRESS_S = 5.0


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(len(ordered), rank) - 1]


def percentiles(values: Sequence[float], *ps: float) -> tuple[float | None, ...]:
    """``percentile`` of ``values`` at each of ``ps`` (100: the largest); None for each
    when ``values`` is empty."""
    return tuple(percentile(values, p) if values else None for p in ps)


def start_lateness_ms(runs: Iterable[Run]) -> list[float]:
    """How long after its task's ``run_at`` each run started, in milliseconds."""
    return [(run.started - run.run_at) * 1000.0 for run in runs]


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


def us_text(server: ServerTime) -> str:
    return "? us" if server.us_per_call is None else f"{server.us_per_call:.1f} us"


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

    def close(self) -> None:
        try:
            for namespace in self.namespaces:
                with suppress(redis.RedisError):
                    self._drop(namespace)
        finally:
            self.client.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def namespace(self, name: str) -> str:
        namespace = f"{self.prefix}-{name}"
        self.namespaces.append(namespace)
        return namespace

    def _drop(self, namespace: str) -> None:
        """Remove a namespace's tasks and settings."""
        with self.scheduler(namespace) as scheduler:
            scheduler.clear()

    def clean(self, *namespaces: str) -> None:
        if self.throwaway:
            self.client.flushall()
        else:
            for namespace in namespaces:
                self._drop(namespace)

    @contextmanager
    def scheduler(self, namespace: str, lease_s: float = 30.0) -> Iterator[Scheduler]:
        scheduler = Scheduler(self.client, namespace=namespace, lease_s=lease_s)
        try:
            yield scheduler
        finally:
            scheduler.close()

    def phase(self, section: str, title: str) -> None:
        self._phase_started = time.perf_counter()
        log.info("[%d/%d] %s", SECTIONS.index(section) + 1, len(SECTIONS), title)

    def step(self, text: str) -> None:
        elapsed = time.perf_counter() - self._phase_started
        log.info("      %6.1f s  %s", elapsed, text)

    def row(self, section: str, name: str, value: float | None, unit: str, **extra: Any) -> Row:
        row = Row(section, name, value, unit, **extra)
        self.rows.append(row)
        return row

    def row_at_most(
        self, section: str, name: str, value: float | None, unit: str, limit: float, **extra: Any
    ) -> Row:
        """A row whose target is at most ``limit`` (in ``unit``); not judged without a value."""
        met = None if value is None else value <= limit
        target = f"<= {limit:g} {unit}"
        return self.row(section, name, value, unit, target=target, met=met, **extra)

    def skip(self, section: str, why: str) -> None:
        """Record ``section`` as skipped, and why, in the log, the report and the table."""
        self.step(f"skipped: {why}")
        self.sections[section] = {"skipped": why}
        self.row(section, f"skipped: {why}", None, "")

    def checked_runs(
        self,
        section: str,
        ids: Sequence[str],
        reports: Sequence[WorkerReport],
        finished: bool,
        noun: str = "tasks",
        more: Sequence[str] = (),
    ) -> tuple[list[Run], list[str]]:
        """Every run the workers reported, and the problems recorded for ``section``: the
        tasks ``ids`` not all finished in time, not run exactly once, and ``more``."""
        runs = [run for report in reports for run in report.runs]
        problems = [] if finished else [f"not all {len(ids)} {noun} succeeded in time"]
        problems += check_exactly_once(ids, runs) + list(more)
        self.problem(section, problems)
        return runs, problems

    def problem(self, section: str, problems: Sequence[str]) -> None:
        for problem in problems:
            self.problems.append(f"{section}: {problem}")
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            self.step(f"PROBLEM: {'; '.join(problems[:3])}{more}")

    def fill(self, scheduler: Scheduler, prefix: str, count: int, **spec: Any) -> float:
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
                self.step(f"queued {start + len(specs):,} of {count:,}")
        return spent

    def wait_for(
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
                self.step(f"{done:,} of {count:,} {state}")
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
            if row.state is not model.State.SUCCEEDED or row.attempt != 1:
                problems.append(
                    f"task {row.task_id!r} is {row.state.value} after attempt {row.attempt}"
                )
            last = max(last, row.updated_at)
        return last, problems

    def drain(
        self,
        section: str,
        namespace: str,
        scheduler: Scheduler,
        ids: Sequence[str],
        processes: int,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """Run queued tasks ``ids`` with worker processes (of ``concurrency`` threads, the
        configured number by default); time from first start to last end."""
        threads = self.config.concurrency if concurrency is None else concurrency
        procs = WorkerProcesses(self.url, namespace, processes, threads, self.workdir)
        try:
            procs.start()
            cpu_before = self.cpu_us()
            procs.go()
            finished = self.wait_for(
                scheduler, "succeeded", len(ids), procs, timeout=60.0 + len(ids) / 500.0
            )
            # Claims, reports, heartbeats and housekeeping of the whole drain, per task.
            cpu = self.cpu_delta(cpu_before, len(ids))
            end, record_problems = self._last_finished(scheduler)
            reports = procs.stop()
        finally:
            procs.close()
        runs, problems = self.checked_runs(section, ids, reports, finished, more=record_problems)
        start = min((run.started for run in runs), default=float("nan"))
        seconds = end - start
        return {
            "processes": processes,
            "concurrency": threads,
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

    def used_memory(self) -> int:
        # Memory still being freed from earlier phases would be counted as ours.
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            info = self.client.info("memory")
            if not int(info.get("lazyfree_pending_objects", 0)):
                break
            time.sleep(0.05)
        return int(info.get("used_memory", 0))

    @property
    def evalsha(self) -> float:
        return float(self.sections["ceiling"]["sequential_per_s"])

    @contextmanager
    def server_time(self) -> Iterator[ServerTime]:
        """Measure the script calls made inside the block, from Redis's side."""
        result = ServerTime()
        before = self.script_stats()
        yield result
        after = self.script_stats()
        if before is not None and after is not None:
            result.measured = True
            result.calls += after[0] - before[0]
            result.usec += after[1] - before[1]

    @contextmanager
    def exclude(self, server: ServerTime) -> Iterator[None]:
        """Leave the script calls made inside the block out of ``server``'s figure."""
        before = self.script_stats()
        yield
        after = self.script_stats()
        if before is not None and after is not None:
            server.calls -= after[0] - before[0]
            server.usec -= after[1] - before[1]

    def script_stats(self) -> tuple[int, int] | None:
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

    def cpu_delta(self, before: float | None, count: int) -> float | None:
        """Redis CPU since ``before`` (from ``_cpu_us``) per one of ``count``, microseconds."""
        after = self.cpu_us()
        if before is None or after is None or count <= 0:
            return None
        return (after - before) / count

    def cpu_us(self) -> float | None:
        """Redis's own CPU time so far (user + system), microseconds."""
        try:
            info = self.client.info("cpu")
        except redis.RedisError:
            return None
        return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6

    def profile_unavailable(self) -> str | None:
        """Why the profile section cannot run here, None when it can."""
        if not self.throwaway:
            return "it changes SLOWLOG settings: only on the bench's own server, not --redis"
        if self.backend != "redis-server":
            return f"{self.backend} does not log scripts' commands in SLOWLOG"
        return None
