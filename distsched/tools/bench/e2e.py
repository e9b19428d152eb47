"""(c) ``e2e``: queued no-op tasks drained end to end by real worker processes."""

from __future__ import annotations

from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import ANOOP, NOOP

TARGET = ">= 27,000/s and >= 3.5x seq EVALSHA"


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "e2e",
        f"end to end: {cfg.tasks:,} no-op tasks, worker processes of {cfg.concurrency} threads",
    )
    runs = []
    for fn, processes, threads in (
        (NOOP, 1, cfg.concurrency),
        (ANOOP, 1, cfg.concurrency),
        (NOOP, cfg.processes, cfg.concurrency),
        (NOOP, 1, 1),
    ):
        kind = "async def" if fn == ANOOP else "def"
        label = f"{processes} worker process{'es' if processes > 1 else ''}, {kind}"
        target = TARGET
        tasks = cfg.tasks
        if threads == 1:
            # One task at a time: what one task costs on its own, the claim, the run and
            # the report in turn (no target: the figure to compare the others with).
            label += ", 1 thread"
            target = ""
            tasks = max(1, cfg.tasks // 3)
        namespace = bench.namespace(f"e2e{processes}{fn}{threads}")
        with bench.scheduler(namespace) as s:
            enqueue = tasks / bench.fill(s, "t", tasks, fn=fn)
            ids = [f"t{i}" for i in range(tasks)]
            result = bench.drain("e2e", namespace, s, ids, processes, threads)
        result["enqueue_per_s"] = enqueue
        result["fn"] = kind
        rate, cpu = result["tasks_per_s"], result["redis_cpu_us_per_task"]
        bench.step(
            f"{label}: {rate or 0:,.0f} tasks/s in {result['drain_s']:.2f} s, "
            f"{cpu or 0:.1f} us Redis CPU/task"
        )
        bench.clean(namespace)
        runs.append(result)
        ratio = rate / bench.evalsha if rate else None
        bench.row(
            "e2e",
            f"end to end, {label}",
            rate,
            "tasks/s",
            ratio=ratio,
            ratio_to="seq EVALSHA",
            target=target,
            met=None if ratio is None or not target else rate >= 27_000 and ratio >= 3.5,
            cpu_us=cpu,
        )
        bench.row_at_most("e2e", f"  Redis CPU per drained task ({label})", cpu, "us", 12.0)
        bench.row(
            "e2e",
            f"  worker CPU per task ({label})",
            result["worker_cpu_us_per_task"],
            "us",
        )
        bench.row(
            "e2e",
            f"  not exactly once ({label})",
            len(result["exactly_once_problems"]),
            "tasks",
            target="0",
            met=not result["exactly_once_problems"],
        )
    bench.sections["e2e"] = {"tasks": cfg.tasks, "concurrency": cfg.concurrency, "runs": runs}
