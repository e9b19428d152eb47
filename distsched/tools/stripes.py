"""What striping buys: one namespace's Redis CPU per task on each master of a local
three-master cluster with 1, 2 and 3 stripes, and the order inversion of claims across
stripes (``distsched bench-stripes``; README, "Scaling out").

For each producer regime (all enqueued first in batches, all first one ``schedule`` per
task, or one ``schedule`` per task while the workers drain) and each stripe count it
starts a namespace whose stripes are placed on that many different masters, queues
no-op tasks, drains them with worker processes (every task checked to run exactly
once), and reads ``used_cpu_sys + used_cpu_user`` of ``INFO cpu`` on every
master before and after: the difference over the tasks is the Redis CPU each master
spent per task (enqueue, claim, report and the workers' housekeeping). The busiest
master's figure bounds the namespace: ``1e6 / max µs per task`` is what its masters
could serve, Redis-bound, however many workers ran; the total over the masters, against
one stripe's in the same regime, is what striping costs in all.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from distsched.client import Scheduler, slot_owner
from distsched.errors import DistschedError, InvalidArgument
from distsched.keys import stripe_of
from distsched.model import State, TaskSpec
from distsched.placement import masters_spanned
from distsched.text import table
from distsched.tools.bench import NOOP, WorkerProcesses, check_exactly_once
from distsched.tools.fleet import FleetConfig, LocalFleet
from distsched.worker.link import WorkerLink

Echo = Callable[[str], None]

BATCH = 1000
# How producers enqueue: all first in batches of BATCH (then the workers drain), all
# first one schedule() per task, or one schedule() per task while the workers drain.
REGIMES = ("batch", "single", "live")
# The claim batch of the order measure, and its queue per stripe count.
ORDER_BATCH = 100
ORDER_TASKS = 3000


class StripesBenchError(DistschedError):
    """The striping measurement could not run as it should."""


@dataclass(frozen=True)
class StripesConfig:
    """The sizes of one run (the defaults take about a minute on two cores)."""

    tasks: int = 10_000
    stripes: tuple[int, ...] = (1, 2, 3)
    processes: int = 2
    concurrency: int = 16
    regimes: tuple[str, ...] = REGIMES

    def validate(self) -> None:
        for name in ("tasks", "processes", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(name, "must be an int >= 1")
        if not self.stripes or any(not 1 <= k <= 3 for k in self.stripes):
            raise InvalidArgument("stripes", "must be stripe counts in [1, 3] (three masters)")
        if not self.regimes or any(r not in REGIMES for r in self.regimes):
            raise InvalidArgument("regimes", f"must be some of {', '.join(REGIMES)}")


def _primaries(client: RedisCluster) -> list[ClusterNode]:
    primaries: list[ClusterNode] = client.get_primaries()  # type: ignore[no-untyped-call]
    return primaries


def cpu_seconds(client: RedisCluster) -> dict[str, float]:
    """``used_cpu_sys + used_cpu_user`` of every master, by ``host:port``."""
    out: dict[str, float] = {}
    for node in _primaries(client):
        info = client.info("cpu", target_nodes=node)
        out[node.name] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def spread_namespace(client: RedisCluster, namespace: str, stripes: int) -> str:
    """``namespace`` with ``stripes`` stripes placed on as many masters (the scheduler
    places them when it takes the count: :mod:`distsched.placement`); checked."""
    with Scheduler(client, namespace=namespace, stripes=stripes) as s:
        keys = WorkerLink(s).stripe_keys()
        owners = set(masters_spanned(keys, slot_owner(client.nodes_manager)))
    if len(owners) != stripes or None in owners:
        raise StripesBenchError(
            f"{namespace}: {stripes} stripes on masters {sorted(map(str, owners))}"
        )
    return namespace


def order_inversion(client: RedisCluster, prefix: str, stripes: int) -> dict[str, Any]:
    """Claim ``ORDER_TASKS`` due tasks of distinct due times, ``ORDER_BATCH`` at a time,
    with one scheduler; measure how far claims stray from the exact order."""
    namespace = spread_namespace(client, f"{prefix}-order{stripes}", stripes)
    with Scheduler(client, namespace=namespace, stripes=stripes) as s:
        try:
            now = s.server_time()
            ids = [f"o{i}" for i in range(ORDER_TASKS)]
            for start in range(0, len(ids), BATCH):
                s.schedule_many(
                    [
                        TaskSpec(t, NOOP, run_at=now - 100 + (start + i) / 1000)
                        for i, t in enumerate(ids[start : start + BATCH])
                    ]
                )
            claimed: list[str] = []
            while True:
                got = s.ready(ORDER_BATCH, "order-bench")
                if not got:
                    break
                claimed.extend(c.task_id for c in got)
                s.complete_many([(c, None) for c in got])
        finally:
            s.clear()
    rank = {t: i for i, t in enumerate(ids)}
    # Later tasks (in the exact order) claimed before each task: a Fenwick tree of ranks.
    tree = [0] * (len(ids) + 1)
    later_before: list[int] = []
    for seen, task_id in enumerate(claimed):
        r = rank[task_id] + 1
        at, not_later = r, 0
        while at > 0:
            not_later += tree[at]
            at -= at & -at
        later_before.append(seen - not_later)
        at = r
        while at <= len(ids):
            tree[at] += 1
            at += at & -at
    # From when a task heads its stripe, the claims of other stripes before it.
    position = {t: i for i, t in enumerate(claimed)}
    head_waits = [0]
    for stripe in range(stripes):
        mine = [t for t in claimed if stripe_of(t, stripes) == stripe]
        head_waits += [position[b] - position[a] - 1 for a, b in itertools.pairwise(mine)]
    in_order = all(
        [rank[t] for t in claimed if stripe_of(t, stripes) == stripe]
        == sorted(rank[t] for t in claimed if stripe_of(t, stripes) == stripe)
        for stripe in range(stripes)
    )
    return {
        "stripes": stripes,
        "tasks": len(ids),
        "batch": ORDER_BATCH,
        "claimed": len(claimed),
        "each_stripe_in_order": in_order,
        "max_later_claimed_before": max(later_before, default=0),
        "max_other_stripe_claims_after_head": max(head_waits),
        "bound_after_head": (stripes - 1) * ORDER_BATCH,
    }


def _enqueue(s: Scheduler, ids: list[str], regime: str) -> None:
    if regime == "batch":
        for start in range(0, len(ids), BATCH):
            s.schedule_many([TaskSpec(t, NOOP) for t in ids[start : start + BATCH]])
    else:
        for task_id in ids:
            s.schedule(task_id, fn=NOOP)


def measure(
    fleet: LocalFleet,
    client: RedisCluster,
    config: StripesConfig,
    stripes: int,
    regime: str,
    workdir: Path,
    prefix: str,
    progress: Echo,
) -> dict[str, Any]:
    """Enqueue (in ``regime``) and drain ``config.tasks`` no-op tasks on ``stripes``
    stripes placed on as many masters."""
    namespace = spread_namespace(client, f"{prefix}-{regime}-k{stripes}", stripes)
    ids = [f"t{i}" for i in range(config.tasks)]
    with Scheduler(client, namespace=namespace, stripes=stripes) as s:
        procs = WorkerProcesses(fleet.url, namespace, config.processes, config.concurrency, workdir)
        try:
            procs.start()
            before = cpu_seconds(client)
            t0 = time.perf_counter()
            if regime == "live":
                procs.go()
            _enqueue(s, ids, regime)
            enqueued = time.perf_counter()
            if regime != "live":
                procs.go()
            deadline = time.monotonic() + 120 + config.tasks / 200
            while s.stats()["counts"][State.SUCCEEDED.value] < len(ids):
                if time.monotonic() > deadline or not procs.alive():
                    raise StripesBenchError(f"{namespace}: the tasks did not all succeed in time")
                time.sleep(0.02)
            drained = time.perf_counter()
            after = cpu_seconds(client)
            reports = procs.stop()
        finally:
            procs.close()
        placement = sorted({key_slot(k.meta.encode()) for k in WorkerLink(s).stripe_keys()})
        s.clear()
    runs = [run for report in reports for run in report.runs]
    problems = check_exactly_once(ids, runs)
    per_master = {name: (after[name] - before[name]) * 1e6 / len(ids) for name in sorted(after)}
    busiest = max(per_master.values())
    result = {
        "regime": regime,
        "stripes": stripes,
        "namespace": namespace,
        "slots": placement,
        "tasks": len(ids),
        "enqueue_s": enqueued - t0,
        "drain_s": drained - enqueued,
        "tasks_per_s": len(ids) / (drained - t0),
        "redis_cpu_us_per_task": per_master,
        "total_us_per_task": sum(per_master.values()),
        "busiest_master_us_per_task": busiest,
        "redis_bound_tasks_per_s": 1e6 / busiest if busiest > 0 else None,
        "exactly_once_problems": problems,
    }
    cpu = ", ".join(f"{v:.1f}" for v in per_master.values())
    progress(
        f"  {regime}, {stripes} stripe(s): {result['tasks_per_s']:,.0f} tasks/s, Redis CPU "
        f"per task per master [{cpu}] us"
    )
    return result


def run_stripes_bench(config: StripesConfig, progress: Echo) -> dict[str, Any]:
    """Start a local three-master cluster, measure each stripe count, stop the cluster."""
    config.validate()
    workdir = Path(tempfile.mkdtemp(prefix="distsched-stripes-"))
    prefix = f"stripes-{uuid.uuid4().hex[:6]}"
    fleet = LocalFleet(
        FleetConfig(app="unused:APP", masters=3, workers=0, directory=workdir / "fleet")
    )
    progress("starting a local three-master Redis Cluster")
    started = time.perf_counter()
    try:
        fleet.start()
        client = RedisCluster(host="127.0.0.1", port=fleet.ports[0])
        try:
            runs = [
                measure(fleet, client, config, k, regime, workdir, prefix, progress)
                for regime in config.regimes
                for k in config.stripes
            ]
            progress("order inversion of claims across stripes")
            orders = [order_inversion(client, prefix, k) for k in config.stripes]
            first = _primaries(client)[0]
            version = str(client.info("server", target_nodes=first)["redis_version"])
        finally:
            client.close()
    finally:
        fleet.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "config": asdict(config),
        "redis_version": version,
        "duration_s": time.perf_counter() - started,
        "runs": runs,
        "order": orders,
        "problems": [
            *(
                f"{r['regime']}, {r['stripes']} stripe(s): {p}"
                for r in runs
                for p in r["exactly_once_problems"]
            ),
            *(
                f"{o['stripes']} stripe(s): a stripe out of order"
                for o in orders
                if not o["each_stripe_in_order"]
            ),
        ],
    }


def format_report(report: dict[str, Any]) -> list[str]:
    """The report as text tables."""
    masters = sorted({m for r in report["runs"] for m in r["redis_cpu_us_per_task"]})
    rows = [
        ["regime", "stripes", *[f"master {m}" for m in masters], "total", "vs 1 stripe",
         "busiest", "Redis-bound", "measured"],
        ["", "", *["us/task"] * len(masters), "us/task", "", "us/task", "tasks/s", "tasks/s"],
    ]  # fmt: skip
    one = {r["regime"]: r for r in report["runs"] if r["stripes"] == 1}
    for r in report["runs"]:
        cpu = r["redis_cpu_us_per_task"]
        bound = r["redis_bound_tasks_per_s"]
        base = one.get(r["regime"])
        ratio = (
            "-" if base is None else f"{r['total_us_per_task'] / base['total_us_per_task']:.2f}x"
        )
        capacity = ""
        if base is not None and bound is not None and base["redis_bound_tasks_per_s"]:
            capacity = f" ({bound / base['redis_bound_tasks_per_s']:.2f}x)"
        rows.append(
            [
                r["regime"],
                str(r["stripes"]),
                *[f"{cpu.get(m, 0.0):.1f}" for m in masters],
                f"{r['total_us_per_task']:.1f}",
                ratio,
                f"{r['busiest_master_us_per_task']:.1f}",
                "-" if bound is None else f"{bound:,.0f}{capacity}",
                f"{r['tasks_per_s']:,.0f}",
            ]
        )
    lines = table(rows, right=frozenset(range(1, len(masters) + 7)))
    lines.append("")
    order = [["stripes", "claim batch", "each stripe in order", "max later claimed before a task",
              "max other-stripe claims after it heads its stripe", "bound"]]  # fmt: skip
    for o in report["order"]:
        order.append(
            [
                str(o["stripes"]),
                str(o["batch"]),
                "yes" if o["each_stripe_in_order"] else "NO",
                f"{o['max_later_claimed_before']:,}",
                f"{o['max_other_stripe_claims_after_head']:,}",
                f"{o['bound_after_head']:,}",
            ]
        )
    return lines + table(order, right=frozenset({1, 3, 4, 5}))
