"""(g) ``memory``: Redis memory per queued no-op task."""

from __future__ import annotations

from distsched.client import Scheduler
from distsched.model import TaskSpec
from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import NOOP


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase("memory", f"memory: {cfg.memory_tasks:,} queued no-op tasks")
    namespace = bench.namespace("memory")
    with bench.scheduler(namespace) as s:
        s.schedule("warm-up", fn=NOOP)  # the namespace's fixed keys are not per task
        before = bench.used_memory()
        _fill_with_argument(bench, s, "m", cfg.memory_tasks)
        after = bench.used_memory()
    bench.clean(namespace)
    per_task = (after - before) / cfg.memory_tasks
    bench.step(f"{per_task:.0f} bytes/task")
    bench.sections["memory"] = {
        "tasks": cfg.memory_tasks,
        "task_id_example": f"m{cfg.memory_tasks - 1}",
        "args_example": [cfg.memory_tasks - 1],
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_task": per_task,
    }
    bench.row_at_most(
        "memory", "Redis memory per queued task, one small argument", per_task, "bytes", 250
    )


def _fill_with_argument(bench: Bench, scheduler: Scheduler, prefix: str, count: int) -> None:
    """Queue ``count`` tasks of one small argument each (their number)."""
    batch = bench.config.batch
    for start in range(0, count, batch):
        scheduler.schedule_many(
            [
                TaskSpec(f"{prefix}{i}", NOOP, args=[i])
                for i in range(start, min(count, start + batch))
            ]
        )
