"""Striped namespaces: one namespace spread over several hash slots (README, "Scaling out")."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from distsched import Outcome, Scheduler, State, TaskSpec, Worker
from distsched.errors import ConflictError, InvalidArgument
from distsched.keys import Keys, stripe_of
from distsched.worker.link import WorkerLink
from tests.cluster_fixtures import LocalCluster, close_cluster_client, wait_until
from tests.conftest import RedisServer, python_command, running, subprocess_env
from tests.worker_procs import live_key

PROCS = Path(__file__).with_name("worker_procs.py")


def ids_on(stripe: int, stripes: int, count: int, prefix: str = "t") -> list[str]:
    """``count`` ids that map to ``stripe`` of a namespace of ``stripes`` stripes."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        candidate = f"{prefix}{i}"
        if stripe_of(candidate, stripes) == stripe:
            found.append(candidate)
        i += 1
    return found


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        python_command(str(PROCS), *args),
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def reap(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    """Three real redis-server masters joined into a cluster on free ports."""
    local = LocalCluster(masters=3, replicas=0)
    try:
        yield local
    finally:
        local.close()


@pytest.fixture
def cluster(local_cluster: LocalCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=local_cluster.seed.port)
    yield client
    close_cluster_client(client)


# ------------------------------------------------------------------ ids and stripes


def test_an_id_maps_to_its_stripe_by_its_hash_tag_as_redis_cluster_hashes_keys() -> None:
    # Stripes are the CRC16 of the tag modulo the count: with 16384 stripes, the slot.
    for task_id in ["a", "order:7", "{user-1}mail", "x{}y", "{}", "{a}{b}", "é{ü}", "a{b"]:
        assert stripe_of(task_id, 16384) == key_slot(task_id.encode())
    assert (
        stripe_of("{order-7}charge", 3) == stripe_of("{order-7}ship", 3) == stripe_of("order-7", 3)
    )
    assert {stripe_of(f"t{i}", 3) for i in range(100)} == {0, 1, 2}
    assert all(stripe_of(f"t{i}", 1) == 0 for i in range(100))


def test_stripe_zero_is_the_namespace_itself_and_the_others_have_tags_no_namespace_has() -> None:
    assert Keys("mail").prefix == Keys("mail", 0).prefix == "ds:{mail}:"
    assert Keys("mail", 2).prefix == "ds:{mail{2}:"
    assert Keys("mail").of_stripe(1).tasks == "ds:{mail{1}:tasks"
    with pytest.raises(InvalidArgument, match="namespace"):
        Keys("mail{1")  # a namespace cannot be named like a stripe


def test_a_striped_namespace_puts_each_stripe_in_its_own_slot_and_each_task_on_its_stripe(
    cluster: RedisCluster,
) -> None:
    s = Scheduler(cluster, namespace="striped-slots", stripes=3)
    try:
        ids = [f"job:{i}" for i in range(60)]
        s.schedule_many([TaskSpec(i, "f") for i in ids])
        stripe_keys = WorkerLink(s).stripe_keys()
        assert [k.stripe for k in stripe_keys] == [0, 1, 2]
        slots = []
        for keys in stripe_keys:
            in_stripe = {cluster.keyslot(k) for k in keys.script_keys()}  # type: ignore[no-untyped-call]
            assert len(in_stripe) == 1
            slots.append(in_stripe.pop())
        assert len(set(slots)) == 3
        for task_id in ids:
            home = stripe_of(task_id, 3)
            for keys in stripe_keys:
                assert bool(cluster.hexists(keys.tasks, task_id)) == (keys.stripe == home)
        assert s.stats()["counts"]["ready"] == 60
        assert {s.status(i).state for i in ids} == {State.READY}
        assert s.cancel(ids[0]) is State.CANCELLED
        assert s.status(ids[0]).state is State.CANCELLED
    finally:
        s.clear()
        s.close()


# ------------------------------------------------------------------ the stripe count


def test_the_stripe_count_is_stored_and_a_different_count_is_refused_while_tasks_exist(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(10)])
    with pytest.raises(ConflictError, match=r"has 3 stripe\(s\).*stripes=2.*stripes=3"):
        Scheduler(redis_client, namespace=namespace, stripes=2)
    with pytest.raises(ConflictError, match="stripes=1"):
        Scheduler(redis_client, namespace=namespace, stripes=1)
    # Opened without a count, a scheduler (a worker's, the CLI's) reads the stored one.
    with Scheduler(redis_client, namespace=namespace) as again:
        assert len(WorkerLink(again).stripe_keys()) == 3
        assert again.status("t7").state is State.READY
        assert again.stats()["counts"]["ready"] == 10
        again.clear()
    # Empty, the namespace takes a new count.
    with Scheduler(redis_client, namespace=namespace, stripes=2) as fresh:
        assert len(WorkerLink(fresh).stripe_keys()) == 2
        fresh.clear()


def test_an_unstriped_namespace_is_a_one_stripe_namespace_and_stores_nothing(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace) as s:
        s.schedule("a", fn="f")
        assert WorkerLink(s).stripe_keys() == [Keys(namespace)]
        assert redis_client.hget(s.keys.meta, "stripes") is None
    # Tasks already there: going striped would move ids, so it is refused.
    with pytest.raises(ConflictError, match="has 1 stripe"):
        Scheduler(redis_client, namespace=namespace, stripes=2)


# ------------------------------------------------------------------ dependencies


def test_a_dependency_across_stripes_is_refused_naming_both_ids_and_writes_nothing(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        (a,) = ids_on(0, 3, 1, "a")
        (b,) = ids_on(1, 3, 1, "b")
        (c,) = ids_on(1, 3, 1, "c")
        s.schedule(a, fn="f")
        before = s.stats()["counts"]
        with pytest.raises(InvalidArgument, match=rf"{b!r} \(stripe 1\).*{a!r} \(stripe 0\).*tag"):
            s.schedule(b, fn="f", deps=[a])
        with pytest.raises(InvalidArgument, match="tag"):
            s.schedule_many([TaskSpec(c, "f"), TaskSpec(b, "f", optional_deps=[a])])
        with pytest.raises(InvalidArgument, match=rf"{b!r}.*stripe 1"):
            s.add_deps(b, [a])
        # A graph is atomic, so it lives on one stripe: ids of two stripes are refused.
        with pytest.raises(InvalidArgument, match=r"one stripe.*\{tag\}"):
            s.submit_graph([TaskSpec(a + "x", "f"), TaskSpec(c, "f"), TaskSpec(a, "f")])
        assert s.stats()["counts"] == before
        for task_id in (b, c, a + "x"):
            assert not redis_client.hexists(
                WorkerLink(s).stripe_keys()[stripe_of(task_id, 3)].tasks, task_id
            )


def test_a_graph_whose_ids_share_a_tag_runs_end_to_end_on_one_stripe(
    cluster: RedisCluster,
) -> None:
    s = Scheduler(cluster, namespace="striped-graph", stripes=3, lease_s=5.0)
    ran: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> str:
        with lock:
            ran.append(name)
        return name

    def boom() -> None:
        raise RuntimeError("boom")

    try:
        graph = ["{order-7}extract", "{order-7}transform", "{order-7}load"]
        s.submit_graph(
            [
                TaskSpec(graph[0], "record", args=("extract",)),
                TaskSpec(graph[1], "record", args=("transform",), deps=[graph[0]]),
                TaskSpec(graph[2], "record", args=("load",), deps=[graph[1]]),
                TaskSpec("{order-7}fails", "boom"),
                TaskSpec("{order-7}after", "record", args=("after",), deps=["{order-7}fails"]),
            ]
        )
        home = stripe_of("order-7", 3)
        # Tasks on the other stripes run alongside.
        others = [i for i in (f"solo{n}" for n in range(30)) if stripe_of(i, 3) != home][:5]
        s.schedule_many([TaskSpec(i, "record", args=(i,)) for i in others])
        with running(Worker(s, {"record": record, "boom": boom}, concurrency=3)):
            wait_until(
                lambda: (
                    all(s.status(t).state is State.SUCCEEDED for t in [*graph, *others])
                    and s.status("{order-7}after").state is State.BLOCKED
                ),
                30,
                "the graph and the other tasks to end",
            )
        assert [n for n in ran if n in ("extract", "transform", "load")] == [
            "extract",
            "transform",
            "load",
        ]
        assert "after" not in ran
        blocked = s.status("{order-7}after").blocked_by
        assert blocked is not None and blocked.root == "{order-7}fails"
        assert s.status(graph[2]).deps == (graph[1],)
        assert s.stats()["counts"]["succeeded"] == 3 + len(others)
    finally:
        s.clear()
        s.close()


# ------------------------------------------------------------------ workers


def test_several_worker_processes_drain_a_striped_namespace_running_each_task_exactly_once(
    cluster: RedisCluster, local_cluster: LocalCluster
) -> None:
    namespace = "striped-drain"
    ids = [f"t{i:05d}" for i in range(3000)]
    s = Scheduler(cluster, namespace=namespace, stripes=3)
    try:
        for start in range(0, len(ids), 500):
            s.schedule_many([TaskSpec(i, "f") for i in ids[start : start + 500]])
        procs = [spawn("claim", local_cluster.url, namespace) for _ in range(3)]
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = []
            for proc in procs:
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            reap(procs)
        claimed = Counter(t[0] for r in results for t in r["tokens"])
        assert sorted(claimed) == ids
        assert set(claimed.values()) == {1}
        assert all(t[2] == 1 for r in results for t in r["tokens"])
        assert {o for r in results for o in r["outcomes"]} == {Outcome.APPLIED.value}
        assert all(r["tokens"] for r in results), "one process did all the work"
        counts = s.stats()["counts"]
        assert counts["succeeded"] == len(ids) and counts["ready"] == counts["running"] == 0
    finally:
        s.clear()
        s.close()


def test_max_running_holds_across_stripes_under_racing_worker_processes(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    limit, total = 5, 60
    s = Scheduler(redis_client, namespace=namespace, lease_s=5.0, stripes=3, max_running=limit)
    try:
        shares = [
            int(redis_client.hget(k.meta, "max_running") or 0) for k in WorkerLink(s).stripe_keys()
        ]
        assert sum(shares) == limit and s.stats()["max_running"] == limit
        # Uneven on purpose: most work on stripe 2, so shares must move there.
        ids = ids_on(2, 3, 40) + ids_on(0, 3, 10) + ids_on(1, 3, 10)
        s.schedule_many([TaskSpec(i, "sleep", args=(0.05,)) for i in ids[:total]])
        procs = [
            spawn("worker", redis_server.url, namespace, "--concurrency", "4") for _ in range(3)
        ]
        metas = [k.meta for k in WorkerLink(s).stripe_keys()]
        try:
            samples: list[int] = []

            def all_succeeded() -> bool:
                # One transaction: an exact snapshot of every stripe's running count.
                pipe = redis_client.pipeline(transaction=True)
                for meta in metas:
                    pipe.hget(meta, "count:running")
                samples.append(sum(int(v or 0) for v in pipe.execute()))
                return bool(s.stats()["counts"]["succeeded"] == total)

            wait_until(all_succeeded, 60, "every task to succeed")
            summaries = []
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                out, err = proc.communicate(timeout=30)
                assert proc.returncode == 0, err
                summaries.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            reap(procs)
        assert max(samples) <= limit
        # Counted inside the functions, across the processes: reached, never passed.
        assert max(sm["peak_live"] for sm in summaries) == limit
        assert sum(sm["succeeded"] for sm in summaries) == total
        assert int(redis_client.get(live_key(namespace)) or 0) == 0
        shares = [int(redis_client.hget(meta, "max_running") or 0) for meta in metas]
        assert sum(shares) <= limit
    finally:
        s.close()


def test_claims_across_stripes_keep_each_stripe_in_order_and_the_inversion_bound(
    redis_client: redis.Redis, namespace: str
) -> None:
    stripes, batch, total = 3, 5, 300
    with Scheduler(redis_client, namespace=namespace, stripes=stripes) as s:
        now = s.server_time()
        ids = [f"task-{i}" for i in range(total)]
        # Every task due, in a global order by run_at.
        s.schedule_many([TaskSpec(t, "f", run_at=now - 100 + i / 1000) for i, t in enumerate(ids)])
        rank = {t: i for i, t in enumerate(ids)}
        claimed: list[str] = []
        while True:
            got = s.ready(batch, "w1")
            if not got:
                break
            assert len({stripe_of(c.task_id, stripes) for c in got}) <= 2
            claimed.extend(c.task_id for c in got)
        assert sorted(claimed) == sorted(ids)
        # Each stripe exact in its own order.
        for stripe in range(stripes):
            mine = [t for t in claimed if stripe_of(t, stripes) == stripe]
            assert mine == sorted(mine, key=rank.__getitem__)
        # From when a task heads its stripe (every earlier task of it claimed), at most
        # (stripes - 1) * batch tasks of the other stripes are claimed before it.
        position = {t: i for i, t in enumerate(claimed)}
        for stripe in range(stripes):
            mine = [t for t in claimed if stripe_of(t, stripes) == stripe]
            for before, task in itertools.pairwise(mine):
                between = position[task] - position[before] - 1
                assert between <= (stripes - 1) * batch


def test_a_striped_namespace_reports_stats_lists_tasks_and_waits_across_stripes(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3, lease_s=5.0) as s:
        ids = [f"t{i}" for i in range(12)]
        s.schedule_many([TaskSpec(i, "f") for i in ids])
        listed: list[str] = []
        cursor: str | None = None
        while True:
            page = s.tasks("ready", limit=5, cursor=cursor)
            listed.extend(item.task_id for item in page.items)
            cursor = page.cursor
            if cursor is None:
                break
        assert sorted(listed) == sorted(ids)
        rows = []
        scan = 0
        while True:
            scan, part = s.scan_tasks(scan, 100)
            rows.extend(part)
            if scan == 0:
                break
        assert sorted(r.task_id for r in rows) == sorted(ids)
        assert s.cancel(ids[0]) is State.CANCELLED
        claims = s.ready(12, "w")
        assert len(claims) == 11 and len(s.leases()) == 11
        assert s.stats()["running"] == 11
        done: list[object] = []
        waiter = threading.Thread(target=lambda: done.append(s.wait(ids[5], timeout=20)))
        waiter.start()
        time.sleep(0.2)
        assert s.complete_many([(c, None) for c in claims]) == [Outcome.APPLIED] * 11
        waiter.join(20)
        assert done and getattr(done[0], "state", None) is State.SUCCEEDED
        assert s.retry(ids[0]) > 0 and s.status(ids[0]).state is State.READY
        assert s.stats()["counts"]["succeeded"] == 11
        assert sum(m.succeeded for m in s.throughput(2)) == 11


# ------------------------------------------------------------------ command line and tools


def test_the_command_line_works_on_a_striped_namespace_without_being_told_the_count(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import invoke

    setup = invoke(redis_server, namespace, "stripes", "3")
    assert setup.exit_code == 0, setup.stderr
    assert f"namespace {namespace!r}: 3 stripe(s)" in setup.stdout
    assert f"ds:{{{namespace}{{2}}:*" in setup.stdout
    a, b = ids_on(1, 3, 1, "a")[0], ids_on(2, 3, 1, "b")[0]
    for task_id in (a, b):
        assert invoke(redis_server, namespace, "schedule", task_id, "--fn", "f").exit_code == 0
    stats = invoke(redis_server, namespace, "stats", "--json")
    assert stats.exit_code == 0 and json.loads(stats.stdout)["counts"]["ready"] == 2
    status = invoke(redis_server, namespace, "status", b)
    assert status.exit_code == 0 and "ready" in status.stdout
    listed = invoke(redis_server, namespace, "tasks", "--state", "ready", "--json")
    assert listed.exit_code == 0 and a in listed.stdout and b in listed.stdout
    assert invoke(redis_server, namespace, "cancel", a).exit_code == 0
    assert invoke(redis_server, namespace, "retry", a).exit_code == 0
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        assert s.status(a).state is State.READY and s.status(a).version > 1
    # Tasks there: a new count is refused, naming the stored one.
    refused = invoke(redis_server, namespace, "stripes", "2")
    assert refused.exit_code == 1 and "has 3 stripe(s)" in refused.stderr


def test_the_stripes_bench_measures_every_master_and_checks_each_task_ran_once() -> None:
    from distsched.tools.stripes import StripesConfig, format_report, run_stripes_bench

    lines: list[str] = []
    config = StripesConfig(tasks=300, processes=1, concurrency=4, regimes=("batch", "live"))
    report = run_stripes_bench(config, lines.append)
    assert report["problems"] == []
    assert [(r["regime"], r["stripes"]) for r in report["runs"]] == [
        (regime, k) for regime in ("batch", "live") for k in (1, 2, 3)
    ]
    for run in report["runs"]:
        assert len(run["redis_cpu_us_per_task"]) == 3
        assert len(run["slots"]) == run["stripes"] and run["exactly_once_problems"] == []
        assert run["total_us_per_task"] == sum(run["redis_cpu_us_per_task"].values())
    for order in report["order"]:
        assert order["each_stripe_in_order"] and order["claimed"] == order["tasks"]
        assert order["max_other_stripe_claims_after_head"] <= order["bound_after_head"]
    assert any("master" in line for line in format_report(report))


def test_the_asyncio_scheduler_routes_and_claims_across_stripes_as_the_sync_one_does(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.conftest import BlockingAsync

    with Scheduler.from_url(redis_server.url, namespace=namespace, stripes=3) as sync:
        sync.schedule_many([TaskSpec(f"t{i}", "f") for i in range(9)])
    blocking = BlockingAsync(redis_server.url, namespace=namespace, lease_s=5.0)
    s = cast(Scheduler, blocking)
    try:
        assert s.status("t4").state is State.READY
        claims = s.ready(9, "w")
        assert sorted(c.task_id for c in claims) == [f"t{i}" for i in range(9)]
        assert s.complete_many([(c, None) for c in claims]) == [Outcome.APPLIED] * 9
        assert s.wait("t8", 5).state is State.SUCCEEDED
        assert s.stats()["counts"]["succeeded"] == 9
    finally:
        blocking.shutdown()
    refused = BlockingAsync(redis_server.url, namespace=namespace, stripes=2)
    try:
        with pytest.raises(ConflictError, match="has 3 stripe"):
            cast(Scheduler, refused).stats()
    finally:
        refused.shutdown()


def test_a_user_limited_to_the_namespace_and_its_stripes_can_run_everything(
    own_redis: RedisServer,
) -> None:
    admin = own_redis.client()
    ns = "acl-striped"
    patterns = [f"ds:{{{ns}}}:*", f"ds:{{{ns}{{*}}:*"]
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "app", "reset", "on", ">secret",
        *(f"~{p}" for p in patterns), *(f"&{p}" for p in patterns), "+@all",
    )  # fmt: skip
    app = own_redis.client(username="app", password="secret")
    s = Scheduler(app, namespace=ns, stripes=3, max_running=4)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            Scheduler(app, namespace=ns + "x").schedule("x", fn="f")
        ran: list[int] = []
        s.schedule_many([TaskSpec(f"w{i}", "f", args=(i,)) for i in range(12)])
        with running(Worker(s, {"f": ran.append}, concurrency=2)):
            assert s.wait("w11", timeout=20).state is State.SUCCEEDED
            wait_until(lambda: s.stats()["counts"]["succeeded"] == 12, 20, "every task to succeed")
        assert sorted(ran) == list(range(12))
    finally:
        s.close()
        app.close()
    stripes_seen = {key.split(b":")[1] for key in cast(list[bytes], admin.keys("*"))}
    assert stripes_seen == {f"{{{ns}}}".encode(), f"{{{ns}{{1}}".encode(), f"{{{ns}{{2}}".encode()}
    admin.close()


def test_the_dashboard_shows_a_striped_namespace(redis_client: redis.Redis, namespace: str) -> None:
    from tests.conftest import require_extra

    require_extra("starlette")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        ids = [f"t{i}" for i in range(9)]
        s.schedule_many([TaskSpec(i, "f") for i in ids])
        s.cancel(ids[4])
        with TestClient(create_app(s)) as client:
            counts = client.get("/api/overview").json()["data"]["counts"]
            assert counts["ready"] == 8 and counts["cancelled"] == 1
            page = client.get("/tasks?state=ready")
            assert page.status_code == 200
            assert all(i in page.text for i in ids if i != ids[4])
            task = client.get(f"/task?id={ids[7]}")
            assert task.status_code == 200 and "ready" in task.text


def test_shares_of_max_running_move_to_the_stripes_with_due_work_and_never_sum_above_it(
    redis_client: redis.Redis, namespace: str
) -> None:
    from distsched.ops.shares import REBALANCE_EVERY_S

    with Scheduler(redis_client, namespace=namespace, stripes=3, max_running=6) as s:
        metas = [k.meta for k in WorkerLink(s).stripe_keys()]

        def shares() -> list[int]:
            return [int(redis_client.hget(m, "max_running") or 0) for m in metas]

        assert shares() == [2, 2, 2]
        s.schedule_many([TaskSpec(t, "f") for t in ids_on(0, 3, 12)])
        first = s.ready(12, "w")
        # Stripe 0 was at its share: the others had no due work, so it took theirs.
        assert len(first) == 2 and shares() == [6, 0, 0]
        more = s.ready(12, "w")
        assert len(more) == 4 and s.stats()["running"] == 6
        # Work arrives on stripe 1: its share comes back only as stripe 0's running ends.
        (late,) = ids_on(1, 3, 1, "late")
        s.schedule(late, fn="f")
        time.sleep(REBALANCE_EVERY_S * 1.5)
        assert s.ready(1, "w") == []
        assert shares() == [3, 0, 0]  # lowered first; no room to raise stripe 1 yet
        s.complete_many([(c, None) for c in first + more[:1]])
        time.sleep(REBALANCE_EVERY_S * 1.5)
        # This claim finds every stripe with work full and moves room to stripe 1 ...
        assert s.ready(1, "w") == []
        # ... which the next claim uses.
        assert [c.task_id for c in s.ready(1, "w")] == [late]
        assert shares() == [3, 3, 0] and sum(shares()) <= 6
