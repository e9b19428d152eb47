"""(d) ``lateness``: how late delayed tasks, and a schedule's slots, start."""

from __future__ import annotations

import random
import time
from typing import Any

from distsched.model import TaskSpec
from distsched.tools.bench.harness import Bench, percentiles, start_lateness_ms
from distsched.tools.bench.procs import NOOP, WorkerProcesses

# The interval of the schedule whose slots the lateness section fires.
SLOT_INTERVAL_S = 0.1


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "lateness",
        f"lateness: {cfg.delayed:,} tasks due over "
        f"[{cfg.delay_min:g}, {cfg.delay_max:g}] s, one worker process",
    )
    namespace = bench.namespace("late")
    rng = random.Random(7)
    ids = [f"d{i}" for i in range(cfg.delayed)]
    procs = WorkerProcesses(bench.url, namespace, 1, cfg.concurrency, bench.workdir)
    with bench.scheduler(namespace) as s:
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
            finished = bench.wait_for(
                s, "succeeded", cfg.delayed, procs, timeout=cfg.delay_max + 60.0
            )
            reports = procs.stop()
        finally:
            procs.close()
    bench.clean(namespace)
    runs, problems = bench.checked_runs("lateness", ids, reports, finished)
    late = start_lateness_ms(runs)
    p50, p99, worst = percentiles(late, 50, 99, 100)
    bench.sections["lateness"] = {
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
    bench.step(f"p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms, max {worst or 0:.2f} ms")
    bench.row("lateness", "delayed task start - run_at, p50", p50, "ms")
    bench.row_at_most("lateness", "delayed task start - run_at, p99", p99, "ms", 1.0)
    bench.row("lateness", "delayed task start - run_at, max", worst, "ms")
    bench.sections["lateness"]["slots"] = _slot_lateness(bench)


def _slot_lateness(bench: Bench) -> dict[str, Any]:
    """A schedule's slots fired by one idle worker process: task start - slot."""
    cfg = bench.config
    bench.step(f"slots: {cfg.slots} slots {SLOT_INTERVAL_S * 1000:g} ms apart, one idle worker")
    namespace = bench.namespace("slots")
    step_ms = round(SLOT_INTERVAL_S * 1000)
    procs = WorkerProcesses(bench.url, namespace, 1, cfg.concurrency, bench.workdir)
    with bench.scheduler(namespace) as s:
        try:
            procs.start()
            procs.go()
            time.sleep(0.2)  # the worker has found nothing to do: it is idle
            start = s.server_time() + 0.5
            s.add_schedule(
                "tick",
                NOOP,
                interval=SLOT_INTERVAL_S,
                start=start,
                end=start + (cfg.slots - 1) * SLOT_INTERVAL_S,
                overlap="allow",
                catchup="all",
            )
            finished = bench.wait_for(
                s,
                "succeeded",
                cfg.slots,
                procs,
                timeout=cfg.slots * SLOT_INTERVAL_S + 60.0,
            )
            reports = procs.stop()
        finally:
            procs.close()
    bench.clean(namespace)
    first = round(start * 1000)
    ids = [f"tick@{first + i * step_ms}" for i in range(cfg.slots)]
    runs, problems = bench.checked_runs("lateness", ids, reports, finished, "slot tasks")
    p50, p99, worst = percentiles(start_lateness_ms(runs), 50, 99, 100)
    bench.step(f"slots: p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms, max {worst or 0:.2f} ms")
    bench.row("lateness", "slot task start - slot time, p50", p50, "ms")
    bench.row("lateness", "slot task start - slot time, p99", p99, "ms")
    return {
        "slots": cfg.slots,
        "interval_s": SLOT_INTERVAL_S,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": worst,
        "exactly_once_problems": problems,
    }
