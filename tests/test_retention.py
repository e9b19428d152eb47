"""Retention and compaction (§4) against a real redis-server.

Terminal tasks are removed once the namespace's retention has passed, with every
byte they own (record, payload, result, applied tokens, dependency list, block
cause, edges); nothing else is ever purged. Stale queue entries are compacted in
bounded steps once they exceed the bound, and left to lazy deletion below it.
The soak runs 50,000 tasks through a real worker and checks that Redis memory
comes back to its baseline once the history has been purged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest
import redis

from distsched import Scheduler, State, TaskSpec, Worker
from distsched.model import Claim
from distsched.ops.base import once
from distsched.wire import calls, records
from tests.conftest import RedisServer, namespace_keys

# Hashes holding one field per task id.
PER_TASK_HASHES = ("tasks", "payloads", "results", "done", "deps", "blocked", "history")


def wait_until(predicate: object, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def split_prefixed(member: bytes) -> tuple[str, bytes]:
    """``hex3(len) id rest`` -> (id, rest), as edges and blockedby members are written."""
    size = int(member[:3], 16)
    return member[3 : 3 + size].decode("utf-8"), member[3 + size :]


def edges(s: Scheduler) -> set[tuple[str, str]]:
    """Every stored dependency edge as (parent, child)."""
    out = set()
    for member in cast(list[bytes], s.client.zrange(s.keys.edges, 0, -1)):
        parent, rest = split_prefixed(member)
        out.add((parent, rest[2:].decode("utf-8")))  # rest: flag, kind, child
    return out


def blockedby(s: Scheduler) -> set[tuple[str, str]]:
    out = set()
    for member in cast(list[bytes], s.client.zrange(s.keys.blockedby, 0, -1)):
        root, child = split_prefixed(member)
        out.add((root, child.decode("utf-8")))
    return out


def traces(s: Scheduler, task_id: str) -> set[str]:
    """Where ``task_id`` still has data: per-task hashes, finished, the per-state index,
    edges, blockedby."""
    found = {name for name in PER_TASK_HASHES if s.client.hexists(getattr(s.keys, name), task_id)}
    if s.client.zscore(s.keys.finished, task_id) is not None:
        found.add("finished")
    members = cast(list[bytes], s.client.zrange(s.keys.states, 0, -1))
    if any(m[15:] == task_id.encode() for m in members):
        found.add("states")
    if any(task_id in pair for pair in edges(s)):
        found.add("edges")
    if any(task_id in pair for pair in blockedby(s)):
        found.add("blockedby")
    return found


def wait_past_retention(s: Scheduler, retention_s: float) -> None:
    """Wait (server clock) until every finished task is older than ``retention_s``."""
    newest = s.client.zrange(s.keys.finished, -1, -1, withscores=True)
    assert newest, "nothing has finished"
    deadline_s = float(newest[0][1]) / 1000.0 + retention_s
    wait_until(lambda: s.server_time() > deadline_s + 0.002, what="the retention to pass")


def claim_one(s: Scheduler, task_id: str) -> Claim:
    claims = s.ready(1, "w")
    assert [c.task_id for c in claims] == [task_id]
    return claims[0]


def purge_all(s: Scheduler) -> int:
    total = 0
    while True:
        removed = s.purge()
        total += removed
        if removed == 0:
            return total


# --------------------------------------------------------------------------- purge


def build_history(s: Scheduler) -> None:
    """Terminal tasks of every kind, with results, errors, tokens, edges and a block cause.

    a succeeded (result) -> b succeeded; f failed -> c blocked (c also waits,
    optionally, on b); k cancelled while ready.
    """
    s.schedule("a", fn="f", args=(1, "x" * 100))
    s.schedule("f", fn="f", delay=0.05)
    s.schedule("k", fn="f", delay=3600)
    s.submit("b", fn="f", deps=["a"])
    s.submit("c", fn="f", deps=["f"], optional_deps=["b"])
    assert s.complete(claim_one(s, "a"), {"value": 1}).value == "applied"
    assert s.complete(claim_one(s, "b"), [1, 2, 3]).value == "applied"
    wait_until(lambda: s.server_time() >= s.status("f").run_at)
    assert s.fail(claim_one(s, "f"), RuntimeError("boom")).value == "applied"
    assert s.cancel("k") is State.CANCELLED
    states = {t: s.status(t).state for t in "abcfk"}
    assert states == {
        "a": State.SUCCEEDED, "b": State.SUCCEEDED, "c": State.BLOCKED,
        "f": State.FAILED, "k": State.CANCELLED,
    }  # fmt: skip


def test_terminal_tasks_are_purged_with_all_their_data_once_the_retention_has_passed(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    retention = 1.0
    scheduler.set_retention(retention)
    build_history(scheduler)
    # A payload too large for its record is kept in the payloads hash, and purged as well.
    scheduler.schedule("big", fn="f", args=["x" * 600])
    assert scheduler.complete(claim_one(scheduler, "big")).value == "applied"
    assert "payloads" in traces(scheduler, "big") and "payloads" not in traces(scheduler, "a")
    # Everything a terminal task owns is there before the purge.
    # (Small payloads are kept in the record; reports leave their trace in the history.)
    assert traces(scheduler, "a") == {
        "tasks", "results", "finished", "edges", "history", "states",
    }  # fmt: skip
    assert traces(scheduler, "c") >= {"tasks", "deps", "blocked", "finished",
                                      "edges", "blockedby", "states"}  # fmt: skip
    assert traces(scheduler, "f") >= {"results", "history", "edges", "blockedby"}

    # Not before the retention: nothing is removed.
    first = scheduler.client.zrange(scheduler.keys.finished, 0, 0, withscores=True)[0][1]
    before = namespace_keys(redis_client, namespace)
    assert purge_all(scheduler) == 0
    assert scheduler.server_time() < float(first) / 1000.0 + retention, "setup took too long"
    assert namespace_keys(redis_client, namespace) == before

    wait_past_retention(scheduler, retention)
    assert purge_all(scheduler) == 6
    for task_id in [*"abcfk", "big"]:
        assert traces(scheduler, task_id) == set(), task_id
    # k's queue entry is stale (it was cancelled while ready): the next claim drops it.
    claims, wait = scheduler.claim(1, "w")
    assert claims == [] and wait is not None and wait.reason == "empty"
    # Only the namespace's settings and counters remain; every count is back to zero.
    # (and the per-minute counters, trimmed by age, not by task)
    assert set(namespace_keys(redis_client, namespace)) == {
        scheduler.keys.meta.encode(),
        scheduler.keys.minutes.encode(),
    }
    stats = scheduler.stats()
    assert set(stats["counts"].values()) == {0}
    assert stats["retention_s"] == retention


def test_running_pending_and_ready_tasks_are_never_purged(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    scheduler.set_retention(0)
    short = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    scheduler.schedule("running", fn="f")
    claim_one(scheduler, "running")
    scheduler.schedule("lapsed", fn="f")  # its lease runs out but nobody reaps it
    lapsed = short.ready(1, "vanished")
    assert [c.task_id for c in lapsed] == ["lapsed"]
    scheduler.schedule("ready", fn="f", delay=3600)
    scheduler.submit("pending", fn="f", deps=["ready"])
    scheduler.submit("waiting", fn="f", deps=["later"], allow_unknown=True)
    scheduler.schedule("again", fn="f", delay=3600)
    scheduler.cancel("again")
    scheduler.schedule("again", fn="f", delay=3600)  # a new version of a terminal task
    deadline = dict(scheduler.leases())["lapsed"]
    wait_until(lambda: scheduler.server_time() > deadline + 0.01)

    before = namespace_keys(redis_client, namespace)
    assert purge_all(scheduler) == 0
    assert namespace_keys(redis_client, namespace) == before
    states = {t: scheduler.status(t).state for t in
              ("running", "lapsed", "ready", "pending", "waiting", "again")}  # fmt: skip
    assert states == {
        "running": State.RUNNING, "lapsed": State.RUNNING, "ready": State.READY,
        "pending": State.PENDING, "waiting": State.PENDING, "again": State.READY,
    }  # fmt: skip


def test_purging_a_finished_dependency_leaves_its_waiting_dependents_intact(
    scheduler: Scheduler,
) -> None:
    scheduler.set_retention(0)
    scheduler.schedule("done-dep", fn="f")
    scheduler.schedule("slow-dep", fn="f", delay=0.05)
    scheduler.submit("child", fn="f", deps=["done-dep", "slow-dep"])
    scheduler.complete(claim_one(scheduler, "done-dep"))
    wait_until(lambda: scheduler.server_time() > scheduler.status("done-dep").updated_at)
    assert purge_all(scheduler) == 1
    assert traces(scheduler, "done-dep") == set()
    child = scheduler.status("child")
    assert (child.state, child.remaining) == (State.PENDING, 1)

    wait_until(lambda: scheduler.server_time() >= scheduler.status("slow-dep").run_at)
    scheduler.complete(claim_one(scheduler, "slow-dep"))
    assert scheduler.status("child").state is State.READY


def test_a_task_still_settling_its_dependents_is_kept_until_they_are_settled(
    scheduler: Scheduler,
) -> None:
    fanout = calls.PROPAGATE_BUDGET + 300
    scheduler.submit_graph(
        [TaskSpec("root", "f")] + [TaskSpec(f"d{i}", "f", deps=["root"]) for i in range(fanout)]
    )
    claim = claim_one(scheduler, "root")
    # The raw transition, without the client's automatic settling: the completion
    # settles one budget of dependents and leaves the rest queued for propagation.
    left, _ = scheduler._drive(once(calls.complete_call(scheduler.keys, [(claim, None)])))
    assert int(left) > 0
    assert scheduler.client.zscore(scheduler.keys.propagating, "proot") is not None

    scheduler.set_retention(0)
    wait_until(lambda: scheduler.server_time() > scheduler.status("root").updated_at)
    assert purge_all(scheduler) == 0
    assert scheduler.status("root").state is State.SUCCEEDED
    assert scheduler.stats()["counts"]["pending"] == fanout - calls.PROPAGATE_BUDGET

    scheduler.settle()
    assert purge_all(scheduler) == 1
    assert traces(scheduler, "root") == set()
    counts = scheduler.stats()["counts"]
    assert (counts["ready"], counts["pending"]) == (fanout, 0)


def test_each_purge_call_removes_at_most_its_limit(scheduler: Scheduler) -> None:
    scheduler.set_retention(0)
    scheduler.schedule_many([TaskSpec(f"t{i}", "f", delay=3600) for i in range(25)])
    for i in range(25):
        scheduler.cancel(f"t{i}")
    wait_until(lambda: scheduler.server_time() > scheduler.status("t24").updated_at)
    assert [scheduler.purge(limit=10) for _ in range(4)] == [10, 10, 5, 0]
    assert scheduler.stats()["counts"]["cancelled"] == 0


def test_retention_belongs_to_the_namespace(
    redis_client: redis.Redis, scheduler: Scheduler, namespace: str
) -> None:
    other = Scheduler(redis_client, namespace=namespace + "-other")
    try:
        for s in (scheduler, other):
            s.schedule("x", fn="f", delay=3600)
            s.cancel("x")
        assert other.stats()["retention_s"] == calls.DEFAULT_RETENTION_S
        scheduler.set_retention(0)
        wait_until(lambda: scheduler.server_time() > other.status("x").updated_at)
        purge_all(scheduler)
        assert purge_all(other) == 0
        assert other.status("x").state is State.CANCELLED
        assert traces(scheduler, "x") == set()
        assert (scheduler.stats()["retention_s"], other.stats()["retention_s"]) == (
            0.0, calls.DEFAULT_RETENTION_S,
        )  # fmt: skip
    finally:
        for key in other.keys.all_keys():
            redis_client.delete(key)
        other.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", None])
def test_a_bad_retention_is_refused_and_changes_nothing(scheduler: Scheduler, bad: object) -> None:
    scheduler.set_retention(60)
    with pytest.raises(ValueError, match="retention"):
        scheduler.set_retention(bad)  # type: ignore[arg-type]
    assert scheduler.stats()["retention_s"] == 60.0


# --------------------------------------------------------------------------- compaction


def queue_with_stale_entries(s: Scheduler, tasks: int, cancelled: int, replaced: int) -> None:
    """``tasks`` not-yet-due tasks; ``cancelled`` of them cancelled, ``replaced`` of the
    rest scheduled again: each leaves one stale queue entry."""
    for start in range(0, tasks, 1000):
        s.schedule_many(
            [TaskSpec(f"t{i}", "f", delay=3600) for i in range(start, min(tasks, start + 1000))]
        )
    pipe_ids = [f"t{i}" for i in range(cancelled)]
    for task_id in pipe_ids:
        s.cancel(task_id)
    if replaced:
        s.schedule_many(
            [TaskSpec(f"t{i}", "f", delay=3600) for i in range(cancelled, cancelled + replaced)]
        )


def live_members(s: Scheduler) -> bool:
    """True when every queue entry is the current version of a ready task."""
    for member in cast(list[bytes], s.client.zrange(s.keys.queue, 0, -1)):
        version, task_id = records.parse_queue_member(member)
        info = s.status(task_id)
        if info.state is not State.READY or info.version != version:
            return False
    return True


def test_stale_queue_entries_are_compacted_in_bounded_steps_once_they_exceed_the_bound(
    scheduler: Scheduler,
) -> None:
    queue_with_stale_entries(scheduler, tasks=3000, cancelled=1500, replaced=600)
    stats = scheduler.stats()
    assert (stats["queue_entries"], stats["live_entries"], stats["stale_entries"]) == (
        3600, 1500, 2100,
    )  # fmt: skip
    budget = 300
    steps = []
    while True:
        removed = scheduler.compact(budget=budget)
        if removed == 0 and scheduler.client.hget(scheduler.keys.meta, "compact_cursor") is None:
            break
        steps.append(removed)
        assert len(steps) < 100, "compaction does not end"
    # Each step examines about `budget` entries (ZSCAN's COUNT is a hint, so a step may
    # see a few more), never the whole queue at once.
    assert len(steps) > 1
    assert max(steps) <= 2 * budget, steps
    assert sum(steps) == 2100
    stats = scheduler.stats()
    assert (stats["queue_entries"], stats["stale_entries"]) == (1500, 0)
    assert live_members(scheduler)
    # The live tasks are untouched and still come out in queue order.
    assert scheduler.status("t1500").state is State.READY


@pytest.mark.parametrize(
    ("tasks", "cancelled"),
    [(3000, 1400), (1500, 900)],
    ids=["stale-not-the-majority", "stale-below-the-minimum"],
)
def test_stale_entries_below_the_bound_are_left_to_lazy_deletion(
    scheduler: Scheduler, tasks: int, cancelled: int
) -> None:
    queue_with_stale_entries(scheduler, tasks=tasks, cancelled=cancelled, replaced=0)
    assert scheduler.compact() == 0
    assert scheduler.client.hget(scheduler.keys.meta, "compact_cursor") is None
    stats = scheduler.stats()
    assert (stats["queue_entries"], stats["stale_entries"]) == (tasks, cancelled)


# --------------------------------------------------------------------------- soak


@pytest.fixture
def soak_scheduler(own_redis: RedisServer) -> Iterator[Scheduler]:
    # A 1.5 s lease: heartbeats, and so housekeeping, every 0.5 s.
    s = Scheduler.from_url(own_redis.url, namespace="soak", lease_s=1.5)
    yield s
    s.close()


def used_memory(s: Scheduler) -> int:
    return int(s.client.info("memory")["used_memory"])


@pytest.mark.slow
def test_soak_memory_returns_to_its_baseline_once_history_is_purged(
    soak_scheduler: Scheduler,
) -> None:
    s = soak_scheduler
    tasks = 50_000
    s.set_retention(0.5)
    ran = [0]
    lock = threading.Lock()

    def noop() -> None:
        with lock:
            ran[0] += 1

    worker = Worker(s, {"noop": noop}, concurrency=32)
    thread = threading.Thread(target=worker.run, name="soak-worker")
    thread.start()
    try:
        # Warm up: scripts loaded, namespace settings written, pool threads started.
        s.schedule_many([TaskSpec(f"warm{i}", "noop") for i in range(10)])
        wait_until(
            lambda: worker.counts["succeeded"] == 10 and set(s.stats()["counts"].values()) == {0},
            what="the warm-up tasks to run and be purged",
        )
        baseline = used_memory(s)
        started = time.monotonic()
        for begin in range(0, tasks, 1000):
            s.schedule_many([TaskSpec(f"t{i}", "noop") for i in range(begin, begin + 1000)])
        enqueued = time.monotonic()
        peak = used_memory(s)

        def drained() -> bool:
            nonlocal peak
            peak = max(peak, used_memory(s))
            stats = s.stats()
            return ran[0] == tasks + 10 and set(stats["counts"].values()) == {0}

        # The worker's own housekeeping purges the history: the test purges nothing.
        wait_until(drained, timeout=50, what="every task to run and be purged")
        done = time.monotonic()
        after = used_memory(s)
    finally:
        worker.stop(grace=5)
        thread.join(30)
    assert not thread.is_alive()
    assert worker.counts["succeeded"] == tasks + 10
    assert worker.counts["stale"] == worker.counts["duplicate"] == 0
    peak = max(peak, int(s.client.info("memory")["used_memory_peak"]))
    growth = peak - baseline
    residual = after - baseline
    print(
        f"\nsoak: {tasks} tasks, enqueue {enqueued - started:.1f} s, run+purge "
        f"{done - enqueued:.1f} s; used_memory baseline {baseline}, peak {peak} "
        f"(+{growth}), after {after} ({residual:+d}); "
        f"keys left: {sorted(k.decode() for k in cast(list[bytes], s.client.keys('*')))}"
    )
    # Left: the settings and counters (per-minute ones too), and the record of the
    # functions workers serve.
    assert sorted(s.client.keys("*")) == sorted(
        [s.keys.meta.encode(), s.keys.minutes.encode(), s.keys.served.encode()]
    )
    assert residual < 0.1 * growth, (baseline, peak, after)
