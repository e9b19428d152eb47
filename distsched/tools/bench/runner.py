"""One bench run: every section in turn, the report, and the ``distsched bench`` command."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from distsched import __version__
from distsched.text import finite_or_none, redact
from distsched.tools.bench import (
    ceiling,
    claim,
    dag,
    dashboard,
    e2e,
    enqueue,
    fairness,
    features,
    lateness,
    memory,
    profile,
    wake,
    worst,
)
from distsched.tools.bench.config import SECTIONS, BenchConfig
from distsched.tools.bench.harness import Bench, log
from distsched.tools.bench.report import environment, environment_lines, format_table

Echo = Callable[[str], None]


# Each section's run, by its name in SECTIONS.
RUNS: dict[str, Callable[[Bench], None]] = {
    "ceiling": ceiling.run,
    "enqueue": enqueue.run,
    "features": features.run,
    "e2e": e2e.run,
    "lateness": lateness.run,
    "claim": claim.run,
    "dag": dag.run,
    "memory": memory.run,
    "wake": wake.run,
    "dashboard": dashboard.run,
    "fairness": fairness.run,
    "profile": profile.run,
    "worst": worst.run,
}


def run(bench: Bench) -> dict[str, Any]:
    """Run the sections the config names, in the order of SECTIONS; the report."""
    started = time.time()
    t0 = time.perf_counter()
    info = bench.client.info("server")
    if bench.throwaway:
        bench.client.flushall()
    for name in SECTIONS:
        if not bench.config.only or name in bench.config.only:
            RUNS[name](bench)
    return {
        "distsched_version": __version__,
        "environment": environment(bench.client),
        "started_at": started,
        "duration_s": time.perf_counter() - t0,
        "redis": {
            "url": redact(bench.url),
            "backend": bench.backend,
            "version": info.get("redis_version"),
            "throwaway": bench.throwaway,
        },
        "namespace_prefix": bench.prefix,
        "config": asdict(bench.config),
        "sections": bench.sections,
        "rows": [asdict(row) for row in bench.rows],
        "problems": bench.problems,
    }


def run_bench(url: str | None, config: BenchConfig) -> dict[str, Any]:
    """Run every section on ``url``, or on an embedded throwaway Redis when None."""
    config.validate()
    if url is not None:
        return _run_closed(Bench(url, "external", throwaway=False, config=config))
    from distsched.tools.embedded import embedded_redis

    with embedded_redis() as server:
        log.info("running on %s", server.description)
        if server.kind != "redis-server":
            log.warning("fakeredis is far slower than Redis; these are not Redis figures")
        return _run_closed(Bench(server.url, server.kind, throwaway=True, config=config))


def _run_closed(bench: Bench) -> dict[str, Any]:
    try:
        return run(bench)
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
