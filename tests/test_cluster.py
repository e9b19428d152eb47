"""Redis Cluster: a namespace is one hash slot, so every script runs on one node (§9)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Worker, scripts, validate
from distsched.aio import AsyncScheduler
from distsched.errors import InvalidArgument
from distsched.keys import Keys
from distsched.ops.protocol import NOT_RUN_WAIT_S
from tests.cluster_fixtures import LocalCluster, close_cluster_client, namespace_in_slot
from tests.conftest import free_port


@pytest.fixture(scope="module")
def three_masters() -> Iterator[LocalCluster]:
    """Three real redis-server masters joined into a cluster on free ports."""
    local = LocalCluster(masters=3, replicas=0)
    yield local
    local.close()


@pytest.fixture
def cluster(three_masters: LocalCluster) -> Iterator[RedisCluster]:
    """A client of the module's cluster, for this test alone: its connections end with it."""
    client = RedisCluster(host="127.0.0.1", port=three_masters.seed.port)
    yield client
    close_cluster_client(client)


def test_every_key_of_a_namespace_hashes_to_one_cluster_slot(cluster: RedisCluster) -> None:
    s = Scheduler(cluster, namespace="slot-check")
    s.submit_graph([TaskSpec("a", "f"), TaskSpec("b", "f", deps=["a"])])
    slots = {cluster.keyslot(key) for key in s.keys.script_keys()}  # type: ignore[no-untyped-call]
    assert len(slots) == 1
    present = [key for key in s.keys.all_keys() if cluster.exists(key)]
    assert present and {cluster.keyslot(key) for key in present} == slots  # type: ignore[no-untyped-call]


def test_a_worker_on_a_cluster_runs_a_graph_in_order_and_wakes_for_new_tasks(
    cluster: RedisCluster,
) -> None:
    s = Scheduler(cluster, namespace="cluster-run", lease_s=2.0)
    ran: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> str:
        with lock:
            ran.append(name)
        return name

    s.submit_graph(
        [
            TaskSpec("extract", "record", args=("extract",)),
            TaskSpec("transform", "record", args=("transform",), deps=["extract"]),
            TaskSpec("load", "record", args=("load",), deps=["transform"]),
        ]
    )
    worker = Worker(s, {"record": record}, concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while s.status("load").state is not State.SUCCEEDED:
            assert time.monotonic() < deadline, "the graph did not finish on the cluster"
            time.sleep(0.02)
        # A task scheduled while the worker waits on an empty queue starts promptly.
        s.schedule("late", fn="record", args=("late",))
        while s.status("late").state is not State.SUCCEEDED:
            assert time.monotonic() < deadline + 10, "the late task did not run"
            time.sleep(0.02)
    finally:
        worker.stop(2)
        thread.join(20)
    assert not thread.is_alive()
    assert ran == ["extract", "transform", "load", "late"]
    assert s.stats()["counts"]["succeeded"] == 4


def test_fencing_and_cancellation_hold_on_a_cluster(cluster: RedisCluster) -> None:
    s = Scheduler(cluster, namespace="cluster-fence", lease_s=5.0)
    s.schedule("x", fn="f")
    s.schedule("queued", fn="f", delay=60)
    claim = s.next("w1")
    assert isinstance(claim, Claim) and claim.task_id == "x"
    assert s.cancel("queued") is State.CANCELLED
    assert s.complete(claim) is Outcome.APPLIED
    assert s.complete(claim) is Outcome.DUPLICATE
    s.schedule("y", fn="f")
    stale = s.next("w1")
    assert isinstance(stale, Claim)
    assert s.expire_lease("y") == 1  # lease lost: the task fails (max_attempts=1)
    assert s.complete(stale) is Outcome.STALE


def test_both_schedulers_reach_a_cluster_through_one_seed_node_url(
    cluster: RedisCluster,
) -> None:
    seed = cluster.get_nodes()[-1]  # type: ignore[no-untyped-call]
    url = f"redis+cluster://{seed.host}:{seed.port}"
    with Scheduler.from_url(url, namespace="cluster-url", max_running=5) as s:
        s.schedule("a", fn="f", args=(1,))
        s.schedule("b", fn="f", deps=["a"])
        assert s.status("b").state is State.PENDING
        assert s.stats()["max_running"] == 5
        claim = s.next("w")
        assert isinstance(claim, Claim) and claim.args == (1,)
        assert s.complete(claim) is Outcome.APPLIED
        assert s.status("b").state is State.READY
        assert s.overview()["counts"]["succeeded"] == 1
        assert abs(s.server_time() - time.time()) < 5

    async def story() -> None:
        async with AsyncScheduler.from_url(url, namespace="cluster-url") as a:
            assert (await a.status("b")).state is State.READY
            assert await a.cancel("b") is State.CANCELLED
            assert (await a.stats())["counts"]["cancelled"] == 1

    asyncio.run(story())


def test_both_schedulers_reach_a_cluster_through_any_live_seed_of_a_url_listing_several(
    cluster: RedisCluster,
) -> None:
    """Seeds go comma-separated where one host would; the first here answers nothing."""
    dead = free_port()
    seed = cluster.get_nodes()[0]  # type: ignore[no-untyped-call]
    url = f"redis+cluster://127.0.0.1:{dead},{seed.host}:{seed.port}/0"
    with Scheduler.from_url(url, namespace="seeds") as s:
        s.schedule("a", fn="f")
        assert s.status("a").state is State.READY

    async def story() -> None:
        async with AsyncScheduler.from_url(url, namespace="seeds") as a:
            assert await a.cancel("a") is State.CANCELLED

    asyncio.run(story())


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://h1:7000,,h2:7000", "got ''"),
        ("redis+cluster://h1:7000,h2:port", "got 'h2:port'"),
        ("redis+cluster://h1:7000,[::1:7000", "got '[::1:7000'"),
    ],
)
def test_a_cluster_url_with_a_malformed_seed_is_refused_naming_the_url(url: str, why: str) -> None:
    with pytest.raises(
        InvalidArgument, match=f"url: each seed of a cluster URL .*{re.escape(why)}"
    ):
        Scheduler.from_url(url)


def test_each_seed_of_a_cluster_url_keeps_its_user_path_and_query() -> None:
    url = "rediss+cluster://u:p%40w@h1:7000,[::1]:7001,h3/0?ssl_ca_certs=/ca.crt"
    assert validate.cluster_seeds(url) == [
        "rediss://u:p%40w@h1:7000/0?ssl_ca_certs=/ca.crt",
        "rediss://u:p%40w@[::1]:7001/0?ssl_ca_certs=/ca.crt",
        "rediss://u:p%40w@h3/0?ssl_ca_certs=/ca.crt",
    ]


def test_schedules_wait_for_a_slot_on_the_move_instead_of_failing_and_each_lands_once(
    three_masters: LocalCluster,
) -> None:
    """While the namespace's keys move one by one to another master, a script call meets
    TRYAGAIN (some of its keys are not on the old owner): it is sent again until the
    slot has moved, within NOT_RUN_WAIT_S, and runs once."""
    source = three_masters.masters()[0]
    target = three_masters.masters()[1]
    namespace = namespace_in_slot(three_masters.first_slot(source), "move")
    slot = three_masters.slot_of(namespace)
    with Scheduler.from_url(three_masters.url, namespace=namespace) as s:
        s.schedule_many([TaskSpec(f"before{i}", "f") for i in range(3)])
        s.schedule("dep", fn="f", deps=["before0"])  # the graph's keys move too
        moved: list[int] = []
        moving = threading.Thread(
            target=three_masters.migrate_slot_slowly,
            args=(slot, target, 0.3, moved.append),
            daemon=True,
        )
        moving.start()
        versions: list[int] = []
        slowest = 0.0
        while moving.is_alive():
            started = time.monotonic()
            versions.append(s.schedule(f"during{len(versions)}", fn="f"))
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        moving.join()
        assert three_masters.owner(slot) is target and len(moved) >= 5
        assert versions == sorted(versions)
        # A script names keys that do not exist yet, so the slot's old owner answers
        # TRYAGAIN for the whole window: a call sent then waited (longer than one key's
        # move) for the slot to land, and did not fail.
        assert slowest > 0.3
        assert slowest < NOT_RUN_WAIT_S
        for i in range(len(versions)):
            info = s.status(f"during{i}")
            assert (info.state, info.version) == (State.READY, versions[i])
        assert s.stats()["counts"]["ready"] == 3 + len(versions)


def test_a_worker_on_a_cluster_fires_a_schedule_each_slot_once(cluster: RedisCluster) -> None:
    s = Scheduler(cluster, namespace="cluster-recur", lease_s=2.0)
    ran: list[str] = []
    lock = threading.Lock()

    def tick() -> None:
        from distsched import current_task

        with lock:
            ran.append(current_task().task_id)

    start = s.server_time() + 0.2
    s.add_schedule(
        "tick", "tick", interval=0.05, start=start, end=start + 0.45, overlap="allow",
        catchup="all",
    )  # fmt: skip
    worker = Worker(s, {"tick": tick}, concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(ran) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(10)
    first = round(start * 1000)
    assert sorted(ran) == sorted(f"tick@{first + 50 * i}" for i in range(10))
    assert s.get_schedule("tick").next_fire is None
    s.clear()


def test_a_call_that_finds_the_script_library_missing_loads_it_on_every_master(
    cluster: RedisCluster,
) -> None:
    def has_library(node: Any) -> bool:
        listed = node.redis_connection.function_list()
        return any(scripts.library_name().encode() in entry for entry in listed)

    masters = cluster.get_primaries()  # type: ignore[no-untyped-call]
    namespaces: dict[str, str] = {}
    for i in range(10_000):
        owner = cluster.get_node_from_key(Keys(f"lib{i}").meta).name  # type: ignore[no-untyped-call]
        namespaces.setdefault(owner, f"lib{i}")
        if len(namespaces) == len(masters):
            break
    cluster.function_flush()  # every master, as after a restart without persistence
    assert not any(has_library(node) for node in masters)
    s = Scheduler(cluster, namespace=namespaces[masters[0].name])
    s.schedule("a", fn="f")
    assert all(has_library(node) for node in masters)
    # One master loses it (a node that never had it): the next call there loads it again.
    last = masters[-1]
    last.redis_connection.function_flush()
    other = Scheduler(cluster, namespace=namespaces[last.name])
    other.schedule("b", fn="f")
    assert other.status("b").state is State.READY
    assert all(has_library(node) for node in masters)


def test_an_asyncio_scheduler_loads_the_library_with_its_first_command(
    cluster: RedisCluster,
) -> None:
    seed = cluster.get_nodes()[-1]  # type: ignore[no-untyped-call]
    url = f"redis+cluster://{seed.host}:{seed.port}"
    cluster.function_flush()

    async def story() -> None:
        async with AsyncScheduler.from_url(url, namespace="aio-first") as a:
            version = await a.schedule("a", fn="f")  # the client's first command
            assert (await a.status("a")).version == version

    asyncio.run(story())
    listed = [node.redis_connection.function_list() for node in cluster.get_primaries()]  # type: ignore[no-untyped-call]
    assert all(any(scripts.library_name().encode() in e for e in lib) for lib in listed)
