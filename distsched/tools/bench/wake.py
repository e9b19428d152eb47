"""(h) ``wake``: a trickle of tasks with idle worker processes: cost per task and
wake-up latency."""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Any

import redis

from distsched.client import Scheduler
from distsched.tools.bench.harness import POLL_S, Bench, percentiles, start_lateness_ms
from distsched.tools.bench.procs import (
    SIGNAL,
    WORKER_START_TIMEOUT_S,
    BenchError,
    WorkerProcesses,
    check_exactly_once,
)

# Threads per worker process in the wake section: more than one, so that a worker
# holding a task still has a free slot (and stays idle, waiting for the next).
WAKE_CONCURRENCY = 2


def run(bench: Bench) -> None:
    cfg = bench.config
    sizes = ", ".join(str(n) for n in cfg.wake_processes)
    bench.phase("wake", f"wake: {cfg.wake_tasks:,} tasks one at a time, {sizes} idle processes")
    results = [_wake_run(bench, n) for n in cfg.wake_processes]
    bench.sections["wake"] = {"tasks": cfg.wake_tasks, "runs": results}
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
            bench.row(
                "wake",
                f"{name}, {n} idle processes",
                value,
                unit,
                ratio=ratio,
                ratio_to=f"{base['processes']} process(es)" if ratio is not None else "",
                target="<= 1.2x" if last else "",
                met=(ratio <= 1.2) if last and ratio is not None else None,
            )
        bench.row("wake", f"wake-up latency p50, {n} idle processes", run["p50_ms"], "ms")
        bench.row_at_most(
            "wake", f"wake-up latency p99, {n} idle processes", run["p99_ms"], "ms", 2.0
        )


def _wake_run(bench: Bench, processes: int) -> dict[str, Any]:
    cfg = bench.config
    namespace = bench.namespace(f"wake{processes}")
    ids = [f"w{i}" for i in range(cfg.wake_tasks)]
    warm = [f"warm{i}" for i in range(3)]
    procs = WorkerProcesses(
        bench.url, namespace, processes, WAKE_CONCURRENCY, bench.workdir, lease_s=300.0
    )
    with bench.scheduler(namespace, lease_s=300.0) as s:
        try:
            procs.start()
            procs.go()
            _wait_subscribed(bench, s, processes, procs)
            for task_id in warm:
                _one_task(bench, s, task_id, procs)
            time.sleep(0.2)  # every worker back to waiting
            calls_before, cpu_before = bench.script_stats(), bench.cpu_us()
            started = time.perf_counter()
            for task_id in ids:
                _one_task(bench, s, task_id, procs)
            seconds = time.perf_counter() - started
            calls_after, cpu_after = bench.script_stats(), bench.cpu_us()
            reports = procs.stop()
        finally:
            procs.close()
    bench.clean(namespace)
    runs = [run for report in reports for run in report.runs if run.task_id in set(ids)]
    problems = check_exactly_once(ids, runs)
    bench.problem("wake", problems)
    calls = script_us = None
    if calls_before is not None and calls_after is not None:
        calls = (calls_after[0] - calls_before[0]) / len(ids)
        script_us = (calls_after[1] - calls_before[1]) / len(ids)
    cpu = None
    if cpu_before is not None and cpu_after is not None:
        cpu = (cpu_after - cpu_before) / len(ids)
    p50, p99, worst = percentiles(start_lateness_ms(runs), 50, 99, 100)
    bench.step(
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
        "max_ms": worst,
        "exactly_once_problems": problems,
    }


def _wait_subscribed(bench: Bench, s: Scheduler, processes: int, procs: WorkerProcesses) -> None:
    """Until every worker process listens for wake-ups (sharded or not)."""
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while time.monotonic() < deadline and procs.alive():
        listening = 0
        for count in (bench.client.pubsub_numsub, bench.client.pubsub_shardnumsub):
            with suppress(redis.RedisError):
                listening += int(count(s.keys.wake)[0][1])
        if listening >= processes:
            time.sleep(0.3)  # their first claims are done
            return
        time.sleep(POLL_S)
    raise BenchError("the wake section's worker processes did not subscribe in time")


def _one_task(bench: Bench, s: Scheduler, task_id: str, procs: WorkerProcesses) -> None:
    done_list = f"bench:{{{s.namespace}}}:done"
    s.schedule(task_id, fn=SIGNAL, args=[done_list])
    deadline = time.monotonic() + 30.0
    while bench.client.blpop([done_list], timeout=0.5) is None:
        if time.monotonic() > deadline or not procs.alive():
            raise BenchError(f"task {task_id!r} of the wake section did not run")
