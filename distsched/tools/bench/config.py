"""The sizes of one bench run, and its sections."""

from __future__ import annotations

import math
from dataclasses import dataclass

from distsched.errors import InvalidArgument
from distsched.validate import MAX_DEPS

SECTIONS = (
    "ceiling", "enqueue", "features", "e2e", "lateness", "claim", "dag", "memory", "wake",
    "dashboard", "fairness", "profile", "worst",
)  # fmt: skip


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
    fanout: int = MAX_DEPS
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
            evalsha_calls=1_000,
            pipeline=50,
            schedule_calls=300,
            enqueue_tasks=2_000,
            batch=500,
            tasks=1_000,
            concurrency=8,
            delayed=50,
            delay_min=0.1,
            delay_max=0.4,
            slots=5,
            claim_sizes=(100, 1_000),
            claims=50,
            chain=30,
            fanout=30,
            dependents=1_500,
            memory_tasks=1_000,
            wake_tasks=20,
            wake_processes=(1, 2),
            dashboard_tasks=300,
            dashboard_drain=200,
            fair_heavy=300,
            fair_rounds=2,
            fair_claims=320,
            profile_tasks=300,
            processes=2,
            worst_scale=0.01,
            worst_repeats=1,
        )

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
        if self.fanout > MAX_DEPS:
            # The fan-in task depends on every task of the fan-out.
            raise InvalidArgument("fanout", f"must be at most {MAX_DEPS}")
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
