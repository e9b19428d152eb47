"""(c) ``e2e``: queued no-op tasks drained end to end by real worker processes."""

from __future__ import annotations

from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import ANOOP, NOOP


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "e2e",
        f"end to end: {cfg.tasks:,} no-op tasks, worker processes of {cfg.concurrency} threads",
    )
    runs = []
    target = ">= 27,000/s and >= 3.5x seq EVALSHA"
    for fn, processes in ((NOOP, 1), (ANOOP, 1), (NOOP, cfg.processes)):
        kind = "async def" if fn == ANOOP else "def"
        label = f"{processes} worker process{'es' if processes > 1 else ''}, {kind}"
        namespace = bench.namespace(f"e2e{processes}{fn}")
        with bench.scheduler(namespace) as s:
            enqueue = cfg.tasks / bench.fill(s, "t", cfg.tasks, fn=fn)
            ids = [f"t{i}" for i in range(cfg.tasks)]
            result = bench.drain("e2e", namespace, s, ids, processes)
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
            met=None if ratio is None else (rate >= 27_000 and ratio >= 3.5),
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
