"""(j) ``fairness``: light keys' wait behind a heavy key's backlog, and claim shares
by weight."""

from __future__ import annotations

import time
from typing import Any

from distsched.model import TaskSpec
from distsched.text import clock_offset
from distsched.tools.bench.harness import POLL_S, Bench, percentiles
from distsched.tools.bench.procs import SIGNAL, WorkerProcesses, check_exactly_once

# The fairness section: ten light keys, each submitting one task every FAIR_LIGHT_EVERY_S,
# behind one heavy key's backlog, drained by one worker process of FAIR_CONCURRENCY threads;
# the run gives up on light tasks not started within FAIR_TIMEOUT_S. The shares use keys of
# FAIR_WEIGHTS, claimed FAIR_CLAIM_BATCH at a time.
FAIR_LIGHT_KEYS = 10
FAIR_LIGHT_EVERY_S = 0.1
FAIR_CONCURRENCY = 4
FAIR_TIMEOUT_S = 120.0
FAIR_WEIGHTS = (1, 1, 2, 4, 8)
FAIR_CLAIM_BATCH = 100


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "fairness",
        f"fairness: {FAIR_LIGHT_KEYS} light keys behind {cfg.fair_heavy:,} queued tasks "
        f"of one key, on and off; shares of {cfg.fair_claims:,} claims",
    )
    runs = [_starvation(bench, fair) for fair in (True, False)]
    on, off = runs
    for run in runs:
        mode = "fair" if run["fair"] else "no keys"
        for p in ("p50", "p99"):
            value, base = run[f"{p}_ms"], on[f"{p}_ms"]
            ratio = value / base if run is off and value is not None and base else None
            bench.row(
                "fairness",
                f"light-key wait {p}, {cfg.fair_heavy:,} heavy queued, {mode}",
                value,
                "ms",
                ratio=ratio,
                ratio_to="fair" if ratio is not None else "",
            )
    shares = _shares(bench)
    for share in shares["keys"]:
        ratio = share["share"] / share["weight_share"]
        bench.row(
            "fairness",
            f"claims of key {share['key']} (weight {share['weight']})",
            share["claims"],
            "claims",
            ratio=ratio,
            ratio_to="its weight's share",
            target="within 5% of its weight's share",
            met=abs(ratio - 1.0) <= 0.05,
        )
    bench.sections["fairness"] = {"starvation": runs, "shares": shares}


def _starvation(bench: Bench, fair: bool) -> dict[str, Any]:
    """Light tasks submitted every FAIR_LIGHT_EVERY_S per light key behind a heavy
    backlog, with keys (``fair``) or the same tasks without; their waits on the Redis
    clock (start - submission)."""
    cfg = bench.config
    namespace = bench.namespace("starve" + ("-fair" if fair else "-plain"))
    done_list = f"bench:{{{namespace}}}:done"
    light_ids: list[str] = []
    submitted: dict[str, float] = {}
    procs = WorkerProcesses(bench.url, namespace, 1, FAIR_CONCURRENCY, bench.workdir)
    with bench.scheduler(namespace) as s:
        try:
            procs.start()
            bench.fill(s, "h", cfg.fair_heavy, key="heavy" if fair else None)
            offset, _ = clock_offset(s)
            procs.go()
            started = time.monotonic()
            for r in range(cfg.fair_rounds):
                specs = [
                    TaskSpec(
                        f"l{k}-{r}",
                        SIGNAL,
                        args=[done_list],
                        key=f"light:{k}" if fair else None,
                    )
                    for k in range(FAIR_LIGHT_KEYS)
                ]
                now = time.time() + offset
                s.schedule_many(specs)
                for spec in specs:
                    submitted[spec.task_id] = now
                    light_ids.append(spec.task_id)
                pause = started + (r + 1) * FAIR_LIGHT_EVERY_S - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            deadline = time.monotonic() + FAIR_TIMEOUT_S
            while (
                int(bench.client.llen(done_list)) < len(light_ids)
                and time.monotonic() < deadline
                and procs.alive()
            ):
                time.sleep(POLL_S * 5)
            reports = procs.stop()
        finally:
            procs.close()
    bench.client.delete(done_list)
    bench.clean(namespace)
    wanted = set(light_ids)
    runs = [run for report in reports for run in report.runs if run.task_id in wanted]
    unstarted = len(wanted - {run.task_id for run in runs})
    problems = [p for p in check_exactly_once(light_ids, runs) if "never ran" not in p]
    bench.problem("fairness", problems)
    waits = [(run.started - submitted[run.task_id]) * 1000.0 for run in runs]
    p50, p99 = percentiles(waits, 50, 99)
    late = f", {unstarted} not started in {FAIR_TIMEOUT_S:g} s" if unstarted else ""
    bench.step(
        f"{'fair' if fair else 'no keys'}: light wait p50 {p50 or 0:,.1f} ms, "
        f"p99 {p99 or 0:,.1f} ms{late}"
    )
    return {
        "fair": fair,
        "heavy": cfg.fair_heavy,
        "light": len(light_ids),
        "light_keys": FAIR_LIGHT_KEYS,
        "concurrency": FAIR_CONCURRENCY,
        "unstarted": unstarted,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": max(waits) if waits else None,
        "exactly_once_problems": problems,
    }


def _shares(bench: Bench) -> dict[str, Any]:
    """Claims of backlogged keys of FAIR_WEIGHTS, FAIR_CLAIM_BATCH per call."""
    cfg = bench.config
    namespace = bench.namespace("shares")
    total = sum(FAIR_WEIGHTS)
    keys = [f"w{i}" for i in range(len(FAIR_WEIGHTS))]
    got: dict[str, int] = dict.fromkeys(keys, 0)
    claimed = 0
    with bench.scheduler(namespace) as s:
        for key, weight in zip(keys, FAIR_WEIGHTS, strict=True):
            s.set_key(key, weight=weight)
            # More than the key's share, so that every key stays backlogged.
            want = cfg.fair_claims * weight // total + FAIR_CLAIM_BATCH + 10
            bench.fill(s, f"{key}-", want, key=key)
        while claimed < cfg.fair_claims:
            claims, _ = s.claim(min(FAIR_CLAIM_BATCH, cfg.fair_claims - claimed), "bench")
            if not claims:
                break
            for c in claims:
                got[c.task_id.split("-")[0]] += 1
            claimed += len(claims)
    bench.clean(namespace)
    if claimed < cfg.fair_claims:
        bench.problem("fairness", [f"only {claimed} of {cfg.fair_claims} claims were made"])
    shares = [
        {
            "key": key,
            "weight": weight,
            "claims": got[key],
            "share": got[key] / claimed if claimed else 0.0,
            "weight_share": weight / total,
        }
        for key, weight in zip(keys, FAIR_WEIGHTS, strict=True)
    ]
    bench.step(
        "shares: "
        + ", ".join(f"{x['key']} {x['share']:.3f} (of {x['weight_share']:.3f})" for x in shares)
    )
    return {"claims": claimed, "batch": FAIR_CLAIM_BATCH, "keys": shares}
