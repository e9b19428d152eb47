"""One worker pool over several namespaces: shares by weight, strict order, wake-ups."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from distsched import InvalidArgument, Scheduler, TaskSpec, Worker, WorkerPool
from distsched.cli import cli
from distsched.worker import share
from tests.conftest import RedisServer, running

TASK_S = 0.02


class Ledger:
    """What ran where: per namespace, the tasks started, and how many run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: collections.Counter[str] = collections.Counter()
        self.now: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.first_start: dict[str, float] = {}

    def work(self, namespace: str, seconds: float = TASK_S) -> None:
        with self.lock:
            self.started[namespace] += 1
            self.now[namespace] += 1
            self.peak[namespace] = max(self.peak[namespace], self.now[namespace])
            self.first_start.setdefault(namespace, time.monotonic())
        time.sleep(seconds)
        with self.lock:
            self.now[namespace] -= 1

    def shares_over(self, seconds: float) -> dict[str, float]:
        """Each namespace's share of the tasks started during the next ``seconds``."""
        with self.lock:
            before = dict(self.started)
        time.sleep(seconds)
        with self.lock:
            gained = {k: v - before.get(k, 0) for k, v in self.started.items()}
        total = sum(gained.values())
        return {k: round(v / total, 3) for k, v in sorted(gained.items())}


@pytest.fixture
def schedulers(redis_client: redis.Redis, namespace: str) -> Iterator[list[Scheduler]]:
    made = [Scheduler(redis_client, namespace=f"{namespace}-{n}") for n in "abc"]
    yield made
    for s in made:
        s.close()


def backlog(s: Scheduler, count: int, seconds: float = TASK_S) -> None:
    s.schedule_many([TaskSpec(f"t{i}", "work", args=[s.namespace, seconds]) for i in range(count)])


def test_a_pool_over_three_namespaces_gives_each_its_weights_share_of_the_slots(
    schedulers: list[Scheduler],
) -> None:
    ledger = Ledger()
    for s in schedulers:
        backlog(s, 3000)
    weighted = [(schedulers[0], 1), (schedulers[1], 2), (schedulers[2], 5)]
    with running(WorkerPool(weighted, {"work": ledger.work}, concurrency=8)):
        time.sleep(1.0)  # past the start, every namespace with its backlog
        shares = ledger.shares_over(4.0)
    a, b, c = (s.namespace for s in schedulers)
    print("\nshares for weights 1:2:5:", shares)
    assert shares[a] == pytest.approx(1 / 8, abs=0.04)
    assert shares[b] == pytest.approx(2 / 8, abs=0.04)
    assert shares[c] == pytest.approx(5 / 8, abs=0.04)


def test_in_strict_order_a_namespace_gets_only_the_slots_those_before_it_leave(
    schedulers: list[Scheduler],
) -> None:
    ledger = Ledger()
    first, second, _ = schedulers
    backlog(first, 600)
    backlog(second, 3000)
    pool = WorkerPool([first, second], {"work": ledger.work}, concurrency=8, strict=True)
    with running(pool):
        time.sleep(0.5)
        while_first_has_work = ledger.shares_over(0.5)
        deadline = time.monotonic() + 30
        while first.stats()["counts"]["ready"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        after = ledger.shares_over(0.5)
    assert while_first_has_work.get(second.namespace, 0.0) <= 0.02, while_first_has_work
    assert after.get(second.namespace) == 1.0, after
    assert ledger.peak[second.namespace] == 8


def test_a_namespace_alone_with_work_gets_every_slot_and_max_running_still_holds(
    schedulers: list[Scheduler],
) -> None:
    ledger = Ledger()
    a, b, c = schedulers
    backlog(a, 3000)
    c.set_max_running(2)
    backlog(c, 3000)
    pool = WorkerPool([(a, 1), (b, 5), (c, 5)], {"work": ledger.work}, concurrency=8)
    with running(pool):
        time.sleep(0.5)
        shares = ledger.shares_over(1.5)
    # b has nothing, so its weight holds nothing back; c, held at its max_running, gets
    # at most 2 of the 8 slots (a little less: each end of its tasks wakes it to claim
    # again), a the rest.
    assert ledger.peak[c.namespace] == 2
    assert 0.12 <= shares[c.namespace] <= 2 / 8 + 0.03, shares
    assert shares[a.namespace] >= 6 / 8 - 0.03, shares


def test_a_wake_up_the_pool_cannot_use_is_passed_to_an_idle_worker_with_room(
    schedulers: list[Scheduler],
) -> None:
    ledger = Ledger()
    a, b, _ = schedulers
    pool = WorkerPool([a, b], {"work": ledger.work}, concurrency=2, worker_id="pool")
    helper = Worker(a, {"work": ledger.work}, concurrency=1, worker_id="helper")
    with running(pool), running(helper):
        time.sleep(0.5)  # both idle in a
        backlog(b, 2, seconds=3.0)  # the pool's slots: taken by b for 3 s
        deadline = time.monotonic() + 5
        while ledger.now[b.namespace] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        waits = []
        for i in range(4):
            scheduled = time.monotonic()
            a.schedule(f"late{i}", fn="work", args=[a.namespace, 0.0])
            assert a.wait(f"late{i}", timeout=5).state.value == "succeeded"
            waits.append(time.monotonic() - scheduled)
    # Without the hand-over a wake-up sent to the pool waits for the re-check (2 s).
    assert max(waits) < 1.0, waits


def test_each_registry_entry_of_a_pool_lists_what_the_pool_serves(
    schedulers: list[Scheduler],
) -> None:
    a, b, _ = schedulers
    pool = WorkerPool([(a, 3), (b, 1)], {"work": Ledger().work}, worker_id="pool-1")
    with running(pool):
        deadline = time.monotonic() + 5
        while not (a.workers() and b.workers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        entries = [s.workers() for s in (a, b)]
    for [entry] in entries:
        assert entry.worker_id == "pool-1"
        assert entry.serves == (f"{a.namespace}:3", f"{b.namespace}:1")
    strict = WorkerPool([a, b], {"work": Ledger().work}, strict=True, worker_id="pool-2")
    with running(strict):
        deadline = time.monotonic() + 5
        while not any(w.worker_id == "pool-2" for w in b.workers()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [entry] = [w for w in b.workers() if w.worker_id == "pool-2"]
    assert entry.serves == (a.namespace, b.namespace)


@pytest.mark.parametrize(
    ("namespaces", "why"),
    [
        ([], "non-empty"),
        ("abc", "non-empty"),
        (["not a scheduler"], "expected a Scheduler"),
        ([("S0", 0)], "must be > 0"),
        ([("S0", float("inf"))], "must be > 0"),
        ([("S0", "2")], "must be > 0"),
        (["S0", "S0"], "listed twice"),
    ],
)
def test_a_bad_namespace_list_is_refused_naming_namespaces(
    schedulers: list[Scheduler], namespaces: list[object], why: str
) -> None:
    def resolve(item: object) -> object:
        if item == "S0":
            return schedulers[0]
        if isinstance(item, tuple):
            return tuple(resolve(x) for x in item)
        return item

    given = [resolve(i) for i in namespaces] if isinstance(namespaces, list) else namespaces
    with pytest.raises(InvalidArgument, match=f"namespaces.*{why}"):
        WorkerPool(given, {"work": Ledger().work})  # type: ignore[arg-type]


def test_the_workers_command_and_the_dashboard_say_whom_a_pool_shares_its_slots_with(
    schedulers: list[Scheduler], redis_server: RedisServer
) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    a, b, _ = schedulers
    pool = WorkerPool([(a, 3), (b, 1)], {"work": Ledger().work}, worker_id="pool-3")
    with running(pool):
        deadline = time.monotonic() + 5
        while not a.workers():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        args = ["--redis", redis_server.url, "--namespace", a.namespace, "workers"]
        listed = CliRunner().invoke(cli, args, catch_exceptions=False).stdout
        with TestClient(create_app(a)) as client:
            page = client.get("/workers").text
    assert "slots shared with" in listed
    assert f"{a.namespace}:3, {b.namespace}:1" in listed
    assert f"shared with {a.namespace}:3, {b.namespace}:1" in page


def test_leaving_with_pass_wakes_another_idle_worker_and_anything_else_is_refused(
    redis_client: redis.Redis, namespace: str
) -> None:
    from distsched.keys import Keys
    from distsched.scripts import source
    from distsched.worker.link import WorkerLink

    with Scheduler(redis_client, namespace=namespace) as s:
        for worker in ("w1", "w2", "w3"):
            assert s.claim(1, worker, listening=True)[0] == []  # listed idle
        link = WorkerLink(s)
        assert link.pass_wake("w1", passing=False) is False
        assert redis_client.zcard(s.keys.idle) == 2
        assert link.pass_wake("w2", passing=True) is True  # w3 woken in its place
        assert redis_client.zcard(s.keys.idle) == 0
        keys = Keys(namespace).for_script("leave")
        channel = s.keys.worker_channel("w3")
        with pytest.raises(redis.ResponseError, match=r"^BADARG pass "):
            redis_client.eval(source("leave"), len(keys), *keys, channel, "w3", "bogus")


def test_a_namespace_away_with_work_holds_the_others_back_only_for_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The periodic re-read far off, so only the away limit can end the wait.
    monkeypatch.setattr(share, "RECHECK_S", 30.0)
    pool = share.PoolShare(concurrency=2, strict=True)
    first = pool.join("first", 1.0, lambda: 0)
    second = pool.join("second", 1.0, lambda: 0)
    stopping = threading.Event()
    assert first.wait_turn(stopping) == 2
    # Its claim is answered in full (it has more work) and its next claim call hangs:
    # it does not come back for its turn.
    first.claimed(short=False)
    started = time.monotonic()
    granted = second.wait_turn(stopping, limit=5.0)
    waited = time.monotonic() - started
    assert granted >= 1
    # Held back while the first could still be on its way back, not after.
    assert share.AWAY_S * 0.9 <= waited < 2.0, waited
