"""``features``: what turning a feature on costs Redis, per scheduled and per drained
task: the same no-op tasks scheduled one per call, then claimed 32 at a time and
completed in batches, plain and with each feature in a namespace of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distsched import Scheduler
from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import NOOP

CLAIM = 32


@dataclass(frozen=True)
class Feature:
    """One column of the table: how its namespace is set up and what each task carries."""

    name: str
    options: Callable[[int], dict[str, Any]]
    setup: Callable[[Scheduler], object] = lambda s: None


def _plain(i: int) -> dict[str, Any]:
    return {}


def _root(s: Scheduler) -> None:
    s.schedule("root", fn=NOOP)
    [claim] = s.ready(1, "bench")
    s.complete(claim)


FEATURES = (
    Feature("plain", _plain),
    Feature("priority order", _plain, lambda s: s.set_order("priority")),
    Feature("fairness keys (10 keys)", lambda i: {"key": f"k{i % 10}"}),
    Feature("fleet-wide running limit", _plain, lambda s: s.set_max_running(10_000)),
    Feature("dedupe", lambda i: {"dedupe": True}),
    Feature("deadline (ttl)", lambda i: {"ttl": 3600}),
    Feature("one dependency (succeeded)", lambda i: {"deps": ["root"]}, _root),
)


def _measure(bench: Bench, feature: Feature, tasks: int) -> tuple[float | None, float | None]:
    """(server us per schedule call, server us per drained task) of one feature."""
    namespace = bench.namespace("feature-" + feature.name.split(" ")[0])
    with bench.scheduler(namespace) as s:
        feature.setup(s)
        with bench.server_time() as scheduled:
            for i in range(tasks):
                s.schedule(f"t{i}", fn=NOOP, **feature.options(i))
        with bench.server_time() as drained:
            while claims := s.ready(CLAIM, "bench"):
                s.complete_many([(claim, None) for claim in claims])
    bench.clean(namespace)
    per_task = drained.usec / tasks if drained.measured and drained.calls else None
    return scheduled.us_per_call, per_task


def _us(value: float | None) -> str:
    return "? us" if value is None else f"{value:.1f} us"


def run(bench: Bench) -> None:
    tasks = bench.config.schedule_calls
    bench.phase("features", f"features: {tasks:,} tasks scheduled and drained per feature")
    figures: dict[str, dict[str, float | None]] = {}
    # A first script call, so that Redis counts script calls from the first measurement.
    warm = bench.namespace("feature-warm")
    with bench.scheduler(warm) as s:
        s.schedule("warm", fn=NOOP)
    bench.clean(warm)
    for feature in FEATURES:
        schedule_us, drain_us = _measure(bench, feature, tasks)
        figures[feature.name] = {"schedule_us": schedule_us, "drain_us_per_task": drain_us}
        bench.step(f"{feature.name}: schedule {_us(schedule_us)}/call, drain {_us(drain_us)}/task")
    bench.sections["features"] = {"tasks": tasks, "claim": CLAIM, "features": figures}
    plain = figures["plain"]
    for name, got in figures.items():
        for key, label in (("schedule_us", "schedule"), ("drain_us_per_task", "drain")):
            value, base = got[key], plain[key]
            ratio = value / base if value is not None and base else None
            unit = "us/call" if key == "schedule_us" else "us/task"
            bench.row(
                "features",
                f"{label}, {name}" if label == "schedule" else f"  {label}, {name}",
                value,
                unit,
                ratio=ratio,
                ratio_to="plain",
            )
