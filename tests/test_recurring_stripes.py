"""Recurring schedules on a striped namespace: a schedule lives on the stripe of its name,
every task it fires goes to that stripe, and each slot fires exactly once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from distsched import Scheduler, State, TaskSpec
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.keys import stripe_of
from distsched.schedules import slot_task_id, tags_slot_ids
from distsched.testing import Harness
from tests.cluster_fixtures import LocalCluster, close_cluster_client
from tests.conftest import RedisServer
from tests.fault_procs import runs_key
from tests.test_faults import reaped, start_worker
from tests.test_stripes import ids_on

STRIPES = 3


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def names_on_every_stripe(per_stripe: int) -> list[str]:
    """Schedule names spread evenly over the stripes, and one with a {tag} of its own."""
    names = [n for s in range(STRIPES) for n in ids_on(s, STRIPES, per_stripe, "beat")]
    return [*names, "{reports}daily"]


def stored_ids(client: Any, s: Scheduler) -> dict[int, list[str]]:
    """The task ids each stripe's tasks hash holds."""
    out: dict[int, list[str]] = {}
    for stripe in range(STRIPES):
        raw: Any = client.hkeys(s.keys.of_stripe(stripe).tasks)
        out[stripe] = sorted(k.decode() for k in raw)
    return out


def race_over_slots(
    client: Any, url: str, s: Scheduler, namespace: str, names: list[str], slots: int, procs: int
) -> None:
    """``procs`` worker processes fire ``slots`` slots of every schedule of ``names``
    while other tasks keep them all claiming, so that several see each slot due."""
    s.stats()  # the stripe count is stored before the workers read it
    workers = [start_worker(url, namespace, "--concurrency", "3") for _ in range(procs)]
    done = threading.Event()

    def keep_them_busy() -> None:
        i = 0
        while not done.is_set():
            s.schedule_many([TaskSpec(f"other-{i + j}", "record", args=[1]) for j in range(12)])
            i += 12
            time.sleep(0.02)

    busy = threading.Thread(target=keep_them_busy)
    with reaped(*workers):
        busy.start()
        try:
            # The first slot a minute ahead, however long adding them takes on a busy
            # machine; then the namespace's clock moves to just before it, and the slots
            # come in real time.
            start, step = s.server_time() + 60, 0.05
            for name in names:
                s.add_schedule(
                    name, "record", args=[0], interval=step, start=start,
                    end=start + (slots - 1) * step, overlap="allow", catchup="all",
                    catchup_window=600,
                )  # fmt: skip
            Harness(s, {}).advance(start - s.server_time() - 0.3)
            wait_until(
                lambda: all(sc.next_fire is None for sc in s.schedules()), 60, "the last slots"
            )
        finally:
            done.set()
            busy.join()
        wait_until(lambda: s.stats()["counts"]["ready"] == 0, 60, "the queue drained")
        time.sleep(0.3)
    first = round(start * 1000)
    runs = [json.loads(r) for r in client.lrange(runs_key(namespace), 0, -1)]
    held = stored_ids(client, s)
    every = [i for ids in held.values() for i in ids]
    assert len(every) == len(set(every))  # no id on two stripes
    for name in names:
        home = stripe_of(name, STRIPES)
        want = sorted(slot_task_id(name, first + 50 * i, STRIPES) for i in range(slots))
        # Every task of the schedule on its stripe, each the stripe its id maps to.
        assert [i for i in held[home] if i.split("@")[0] == want[0].split("@")[0]] == want
        assert all(stripe_of(i, STRIPES) == home for i in want)
        ran = Counter(r[0] for r in runs if r[0] in want)
        assert sorted(ran) == want and set(ran.values()) == {1}, name  # each ran once
        info = s.get_schedule(name)
        assert (info.fired, info.missed, info.skipped) == (slots, 0, 0)
        assert s.status(want[-1]).state is State.SUCCEEDED  # routed by its id alone
    fired_runs = [r for r in runs if "@" in r[0]]
    assert len({r[3] for r in fired_runs}) > 1  # fired and run by several processes


# ------------------------------------------------------------------ slot ids and stripes


def test_every_slot_task_id_maps_to_the_stripe_of_its_schedules_name() -> None:
    names = [f"n{i}" for i in range(200)] + ["{t}x", "a{b", "x{y}z", "ü-ñ", "{order-7}sweep"]
    for stripes in (2, 3, 5, 16):
        for name in names:
            for slot in (0, 1_796_112_000_000, 1_796_112_000_001):
                task_id = slot_task_id(name, slot, stripes)
                assert stripe_of(task_id, stripes) == stripe_of(name, stripes), task_id
    # Unstriped, the ids are as they always were; a name with a tag keeps it.
    assert slot_task_id("report", 5) == "report@5"
    assert slot_task_id("report", 5, 3) == "{report}@5"
    assert slot_task_id("{t}x", 5, 3) == "{t}x@5"


def test_a_name_whose_brace_cannot_keep_its_slots_on_its_stripe_is_refused(
    redis_client: redis.Redis, namespace: str
) -> None:
    for name in ("a}b", "x{}y", "}"):
        with pytest.raises(InvalidArgument, match="name"):
            tags_slot_ids(name, STRIPES)
        assert tags_slot_ids(name, 1) is False  # unstriped: any name, as before
    with Scheduler(redis_client, namespace=namespace, stripes=STRIPES) as s:
        with pytest.raises(InvalidArgument, match="needs a \\{tag\\}"):
            s.add_schedule("a}b", "f", interval=60)
        assert s.schedules() == []


def test_the_fire_script_refuses_a_bad_slot_id_form_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    from tests.conftest import namespace_keys
    from tests.test_schedules import FIRE_ARGS

    s = scheduler
    for name, form in (("s", "braced"), ("s", ""), ("a}b", "tagged")):
        s.add_schedule(name, "f", interval=60)
        state: Any = redis_client.hget(s.keys.firing, name)
        args = [*FIRE_ARGS, form]
        args[1], args[2] = name, state.split(b"|")[0]
        before = namespace_keys(redis_client, s.namespace)
        with pytest.raises(redis.ResponseError, match=r"^BADARG ids "):
            s._scripts["fire"](keys=s.keys.for_script("fire"), args=args)
        assert namespace_keys(redis_client, s.namespace) == before
    # Tagged, a slot's task is {<name>}@<slot ms>; the form left out, <name>@<slot ms>.
    state = redis_client.hget(s.keys.firing, "s")
    for form in ("tagged", "plain"):
        args = [*FIRE_ARGS, form]
        args[2], args[3], args[4], args[5] = state.split(b"|")[0], "backfill", "", ""
        s._scripts["fire"](keys=s.keys.for_script("fire"), args=args)
    assert {t.task_id for t in s.tasks("ready").items} == {"{s}@1", "s@1"}


# ------------------------------------------------------------------ operations


def test_schedules_spread_over_the_stripes_are_listed_paused_resumed_triggered_and_removed(
    redis_client: redis.Redis, redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import invoke

    names = names_on_every_stripe(2)
    with Scheduler(redis_client, namespace=namespace, stripes=STRIPES) as s:
        for name in names:
            s.add_schedule(name, "f", interval=3600)
        # Each lives on the stripe of its name, and only there.
        for name in names:
            homes = [
                st
                for st in range(STRIPES)
                if redis_client.hexists(s.keys.of_stripe(st).schedules, name)
            ]
            assert homes == [stripe_of(name, STRIPES)]
        assert [sc.name for sc in s.schedules()] == sorted(names)
        assert {stripe_of(n, STRIPES) for n in names} == set(range(STRIPES))

        far = names[-2]  # a name of the last stripe
        assert s.pause_schedule(far).paused and s.get_schedule(far).next_fire is None
        assert len(s.next_fires(far, 2)) == 2
        assert not s.resume_schedule(far).paused and s.get_schedule(far).next_fire is not None

        task_id = s.trigger(far)
        assert task_id is not None and task_id.startswith("{" + far + "}@")
        assert stripe_of(task_id, STRIPES) == stripe_of(far, STRIPES)
        assert s.get_schedule(far).last_task == task_id
        assert s.status(task_id).state is State.READY
        assert s.explain(task_id).state is State.READY
        assert s.trigger(far) is None  # skip: its last run is still queued
        assert s.cancel(task_id) is State.CANCELLED
        now = s.server_time()
        s.add_schedule("{reports}daily", "f", interval=3600, start=now - 3 * 3600 - 1)
        assert s.backfill("{reports}daily", now - 3 * 3600, now, limit=2) == 2
        assert s.tasks("ready").items and all(
            stripe_of(t.task_id, STRIPES) == stripe_of("{reports}daily", STRIPES)
            for t in s.tasks("ready").items
        )

        listed = invoke(redis_server, namespace, "schedules", "list")
        assert listed.exit_code == 0, listed.stderr
        assert all(name in listed.stdout for name in names)

        assert s.remove_schedule(far) and not s.remove_schedule(far)
        with pytest.raises(NotFoundError):
            s.get_schedule(far)
        assert [sc.name for sc in s.schedules()] == sorted(n for n in names if n != far)
        s.clear()


def test_due_slots_of_every_stripe_fire_from_one_fire_due_of_the_asyncio_scheduler_too(
    redis_server: RedisServer, namespace: str
) -> None:
    from typing import cast

    from tests.conftest import BlockingAsync

    names = names_on_every_stripe(1)
    with Scheduler.from_url(redis_server.url, namespace=namespace, stripes=STRIPES) as sync:
        for name in names:
            sync.add_schedule(name, "f", interval=60)
        Harness(sync, {}).advance(61)  # one slot of each due, on its own stripe
        blocking = BlockingAsync(redis_server.url, namespace=namespace, lease_s=5.0)
        try:
            a = cast(Scheduler, blocking)
            assert [sc.name for sc in a.schedules()] == sorted(names)
            assert a.fire_due() == len(names)
            assert a.fire_due() == 0  # fired: each slot once
            for name in names:
                run = a.get_schedule(name).last_task
                assert run is not None and a.status(run).state is State.READY
                assert stripe_of(run, STRIPES) == stripe_of(name, STRIPES)
        finally:
            blocking.shutdown()
        sync.clear()


def test_the_dashboard_lists_the_schedules_of_every_stripe(
    redis_client: redis.Redis, namespace: str
) -> None:
    from tests.conftest import require_extra

    require_extra("starlette")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    names = names_on_every_stripe(1)
    with Scheduler(redis_client, namespace=namespace, stripes=STRIPES) as s:
        for name in names:
            s.add_schedule(name, "f", interval=3600)
        with TestClient(create_app(s)) as client:
            page = client.get("/schedules")
            assert page.status_code == 200
            assert all(name in page.text for name in names)
        s.clear()


def test_the_stripe_count_of_a_namespace_with_schedules_cannot_change(
    redis_client: redis.Redis, namespace: str
) -> None:
    # No task yet, only schedules: a new count would move names off their stripes, and a
    # schedule's next slot could then fire again beside its stripe's tasks.
    with Scheduler(redis_client, namespace=namespace) as s:
        s.add_schedule("beat", "f", interval=3600)
        assert s.stats()["counts"].get("ready", 0) == 0
    with pytest.raises(ConflictError, match="holds schedules"):
        Scheduler(redis_client, namespace=namespace, stripes=STRIPES).stats()
    with Scheduler(redis_client, namespace=namespace) as s:
        assert [sc.name for sc in s.schedules()] == ["beat"]
        s.clear()
    with Scheduler(redis_client, namespace=namespace, stripes=STRIPES) as s:
        s.add_schedule(ids_on(2, STRIPES, 1, "beat")[0], "f", interval=3600)
    with pytest.raises(ConflictError, match="holds schedules \\(stripe 2\\)"):
        Scheduler(redis_client, namespace=namespace, stripes=2).stats()
    with Scheduler(redis_client, namespace=namespace) as s:
        s.clear()


# ------------------------------------------------------------------ races


def test_worker_processes_racing_on_a_striped_namespace_fire_each_slot_of_each_schedule_once(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    names = names_on_every_stripe(3)
    with Scheduler(redis_client, namespace=namespace, stripes=STRIPES) as s:
        race_over_slots(redis_client, redis_server.url, s, namespace, names, slots=16, procs=3)
        s.clear()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(masters=3, replicas=0)
    try:
        yield local
    finally:
        local.close()


def test_worker_processes_on_a_cluster_fire_each_slot_once_on_the_stripe_of_its_schedule(
    local_cluster: LocalCluster,
) -> None:
    namespace = "striped-recur"
    cluster = RedisCluster(host="127.0.0.1", port=local_cluster.seed.port)
    try:
        s = Scheduler(cluster, namespace=namespace, stripes=STRIPES)
        try:
            # The stripes are three slots: a fire call on one stripe reaches only its own.
            slots = {key_slot(s.keys.of_stripe(st).tasks.encode()) for st in range(STRIPES)}
            assert len(slots) == STRIPES
            names = names_on_every_stripe(2)
            race_over_slots(cluster, local_cluster.url, s, namespace, names, slots=10, procs=2)
            s.clear()
        finally:
            s.close()
    finally:
        cluster.delete(runs_key(namespace))
        close_cluster_client(cluster)
