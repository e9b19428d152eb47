"""(e) ``claim``: claim rate by queue size, in every namespace order."""

from __future__ import annotations

import math
import time
from typing import Any

from distsched.client import Scheduler
from distsched.model import TaskSpec
from distsched.tools.bench.harness import Bench, ServerTime
from distsched.tools.bench.procs import NOOP

# The claim section measures each namespace order (``Scheduler.set_order``), and a fair
# namespace (fairness keys, README "Tenants and fairness") with a key per 100 tasks queued,
# at most FAIR_KEYS_MAX keys (1,000,000 queued over 10,000 keys).
ORDERS = ("default", "priority", "fair", "fair_priority")
FAIR_TASKS_PER_KEY = 100
FAIR_KEYS_MAX = 10_000


def run(bench: Bench) -> None:
    cfg = bench.config
    sizes = sorted(set(cfg.claim_sizes))
    bench.phase("claim", f"claim rate with {', '.join(f'{n:,}' for n in sizes)} tasks queued")
    by_order: dict[str, list[dict[str, Any]]] = {}
    for order in ORDERS:
        for size in sizes:
            by_order.setdefault(order, []).append(_claim_size(bench, order, size))
    bench.sections["claim"] = {
        "claims": cfg.claims,
        "sizes": by_order["default"],
        "priority": by_order["priority"],
        "fair": by_order["fair"],
        "fair_priority": by_order["fair_priority"],
    }
    for order, results in by_order.items():
        smallest = results[0]
        for result in results:
            suffix = {
                "default": "",
                "priority": ", priority order",
                "fair": f", fair over {result.get('keys', 0):,} keys",
                "fair_priority": f", fair over {result.get('keys', 0):,} keys, priority order",
            }[order]
            for key, label in (("n1", "ready(1)"), ("n100", "ready(100)")):
                rate = result[key]["claims_per_s"]
                base = smallest[key]["claims_per_s"]
                row: dict[str, Any] = {}
                if result is not smallest:
                    ratio = rate / base
                    row = {"ratio": ratio, "ratio_to": f"at {smallest['queued']:,}"}
                    if result is results[-1]:
                        row.update(target=f">= 0.8x at {smallest['queued']:,}", met=ratio >= 0.8)
                bench.row(
                    "claim",
                    f"claim with {result['queued']:,} queued, {label}{suffix}",
                    rate,
                    "claims/s",
                    server_us=result[key]["server_us_per_call"],
                    **row,
                )


def _claim_size(bench: Bench, order: str, size: int) -> dict[str, Any]:
    """Claim rates with ``size`` tasks queued in namespace order ``order``; in the
    priority order the tasks have ten priorities, so ranks interleave (also inside
    each key for ``fair_priority``, the priority order with fairness keys)."""
    namespace = bench.namespace(f"claim{size}{order[0]}")
    with bench.scheduler(namespace, lease_s=3600.0) as s:
        if order in ("priority", "fair_priority"):
            s.set_order("priority", aging=1.0)
        before = bench.used_memory()
        keys = 0
        if order == "priority":
            fill = size / sum(
                bench.fill(s, f"c{p}-", size // 10 + (p < size % 10), priority=p) for p in range(10)
            )
        elif order in ("fair", "fair_priority"):
            keys = max(2, min(FAIR_KEYS_MAX, size // FAIR_TASKS_PER_KEY))
            fill = size / _fill_keyed(bench, s, size, keys, order == "fair_priority")
        else:
            fill = size / bench.fill(s, "c", size)
        after = bench.used_memory()
        s.release(s.ready(1, "bench-claimer"))  # the claim script is loaded
        one, per_one, one_server = _claim_rate(bench, s, 1, size)
        many, per_many, many_server = _claim_rate(bench, s, 100, size)
    bench.clean(namespace)
    how = f"{order} order"
    if keys:
        how = f"fair over {keys:,} keys" + (", priority order" if "priority" in order else "")
    bench.step(
        f"{size:,} queued, {how} (filled at {fill:,.0f} tasks/s): "
        f"{per_one:,.0f} claims/s one per call, {per_many:,.0f} with 100"
    )
    return {
        "queued": size,
        "order": order,
        "keys": keys,
        "fill_per_s": fill,
        "bytes_per_task": (after - before) / size,
        "n1": {
            "claims": one,
            "calls": one,
            "claims_per_s": per_one,
            "server_us_per_call": one_server.us_per_call,
        },
        "n100": {
            "claims": many,
            "calls": math.ceil(many / 100),
            "claims_per_s": per_many,
            "server_us_per_call": many_server.us_per_call,
        },
    }


def _claim_rate(bench: Bench, s: Scheduler, n: int, size: int) -> tuple[int, float, ServerTime]:
    """Time ``claims`` claims of up to ``n`` per call, the queue kept near ``size``.

    Claimed tasks go back to the queue (``release``, no attempt spent) every 100
    claims, outside the timed calls: so a small queue stays as full as a big one.
    """
    total = bench.config.claims
    claimed, spent, held = 0, 0.0, []
    with bench.server_time() as server:
        while claimed < total:
            t0 = time.perf_counter()
            got = s.ready(min(n, total - claimed), "bench-claimer")
            spent += time.perf_counter() - t0
            if not got:
                bench.problem("claim", [f"a queue of {size} ran dry"])
                break
            claimed += len(got)
            held += got
            if len(held) >= min(100, size // 2):
                with bench.exclude(server):
                    s.release(held)
                held = []
        if held:
            with bench.exclude(server):
                s.release(held)
    return claimed, claimed / spent if spent > 0 else 0.0, server


def _fill_keyed(
    bench: Bench, scheduler: Scheduler, count: int, keys: int, priorities: bool = False
) -> float:
    """Queue ``count`` no-op tasks spread round robin over ``keys`` fairness keys
    (with ``priorities``, of ten priorities in turn)."""
    batch = bench.config.batch
    spent = 0.0
    for start in range(0, count, batch):
        specs = [
            TaskSpec(
                f"c{i}", NOOP, key=f"tenant:{i % keys}", priority=(i // keys) % 10 * priorities
            )
            for i in range(start, min(count, start + batch))
        ]
        t0 = time.perf_counter()
        scheduler.schedule_many(specs)
        spent += time.perf_counter() - t0
    return spent
