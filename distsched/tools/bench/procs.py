"""Worker processes of the bench, and the check that each task ran exactly once."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from distsched.client import Scheduler
from distsched.errors import DistschedError
from distsched.text import clock_offset

NOOP = "noop"
# The same no-op as an ``async def`` function (the worker's event loop runs it).
ANOOP = "anoop"
# A no-op that also pushes its task id to the list named by its argument, so that the
# wake section learns of each end with one BLPOP instead of polling (whose cost would
# grow with the latency it measures).
SIGNAL = "signal"
WORKER_START_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 60.0


class BenchError(DistschedError):
    """A worker process of the bench did not start or stop as it should."""


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
        package_root = str(Path(__file__).resolve().parents[3])
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
