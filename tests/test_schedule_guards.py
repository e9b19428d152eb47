"""Schedules' guarantees at their edges: fencing of racing fire calls, the overlap
policy's cancel, catch-up counts and jitter, each on a real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from distsched import Scheduler, State, TaskInfo, Worker, current_task
from distsched.schedules import Definition, FiringState, plan_fire
from distsched.wire.calls import fire_call
from distsched.wire.replies import decode_fired
from tests.conftest import RedisServer, require_extra, running

require_extra("cronsim")


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


def stored(client: redis.Redis, s: Scheduler, name: str) -> tuple[Definition, FiringState, int]:
    """What a worker reads before it fires: the definition, firing state, next fire (ms)."""
    raw: Any = client.hget(s.keys.schedules, name)
    state: Any = client.hget(s.keys.firing, name)
    score: Any = client.zscore(s.keys.fires, name)
    return Definition.decode(name, raw), FiringState.decode(state), round(score)


def slot_tasks(client: redis.Redis, s: Scheduler, name: str) -> list[str]:
    ids: Any = client.hkeys(s.keys.tasks)
    return sorted(i.decode() for i in ids if i.decode().startswith(f"{name}@"))


def run_call(s: Scheduler, call: Any) -> Any:
    return decode_fired(s._scripts["fire"](keys=call.keys, args=call.args)[1:])


# --------------------------------------------------------------------------- fencing


def test_a_fire_call_from_a_next_fire_time_another_worker_moved_creates_and_moves_nothing(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    start = s.server_time() + 0.05
    s.add_schedule("s", "f", interval=0.05, start=start, overlap="allow", catchup="all")
    time.sleep(0.3)
    # A slow worker reads the schedule and plans its slots; another fires them first.
    d, state, due = stored(client, s, "s")
    plan = plan_fire(d, due, round(s.server_time() * 1000))
    assert len(plan.slots) >= 3
    time.sleep(0.1)
    assert s.fire_due() >= len(plan.slots)
    after = s.get_schedule("s").next_fire
    assert after is not None
    # The runs end and retention removes them: their task ids are free again.
    ids = slot_tasks(client, s, "s")
    for task_id in ids:
        s.cancel(task_id)
    assert s.purge_tasks(ids) == len(ids)
    late = fire_call(s.keys, d, state.rev, "fire", plan.slots, s.max_payload_bytes,
                     due, plan.next_ms, plan.missed)  # fmt: skip
    fired = run_call(s, late)
    assert fired.moved and fired.created == 0
    assert slot_tasks(client, s, "s") == []  # no slot ran twice
    assert s.get_schedule("s").next_fire == after  # and the next fire did not go back


def test_a_trigger_prepared_before_a_schedule_was_replaced_runs_nothing_of_the_old_one(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    s.add_schedule("s", "old", interval=3600, args=[1])
    d, state, _ = stored(client, s, "s")
    prepared = fire_call(s.keys, d, state.rev, "trigger", [("now", "now")], s.max_payload_bytes)
    s.add_schedule("s", "new", interval=3600, args=[2])
    fired = run_call(s, prepared)
    assert fired.moved and fired.created == 0
    assert slot_tasks(client, s, "s") == []
    task_id = s.trigger("s")
    assert task_id is not None
    [claim] = s.ready(1, "w")
    assert (claim.task_id, claim.fn, claim.args) == (task_id, "new", (2,))


# --------------------------------------------------------------------------- cancel_previous


def test_cancel_previous_signals_the_running_run_at_once_not_at_its_next_heartbeat(
    sync_scheduler: Scheduler,
) -> None:
    s = sync_scheduler
    heartbeat_s = 5.0
    started = threading.Event()
    seen: list[float] = []

    def watch() -> None:
        ctx = current_task()
        started.set()
        if ctx.wait_cancelled(3 * heartbeat_s):
            seen.append(time.monotonic())
        ctx.raise_if_cancelled()

    s.add_schedule("s", "watch", interval=3600, overlap="cancel_previous")
    worker = Worker(s, {"watch": watch}, concurrency=1, heartbeat_s=heartbeat_s)
    with running(worker):
        first = s.trigger("s")
        assert first is not None
        assert started.wait(10.0), "the first run never started"
        asked_at = time.monotonic()
        assert s.trigger("s") is not None
        wait_until(lambda: s.status(first).state.terminal, 3 * heartbeat_s, "the first run")
    assert seen, "the running run never saw the cancel request"
    assert seen[0] - asked_at < 1.0
    info = s.status(first)
    assert info.state is State.CANCELLED and info.cancel_requested


def test_cancel_previous_ends_a_queued_run_as_any_cancel_does(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    """Its waiters hear that it ended, and it is listed among the cancelled tasks."""
    s = sync_scheduler
    s.add_schedule("s", "f", interval=3600, overlap="cancel_previous")
    first = s.trigger("s")
    assert first is not None
    outcome: list[TaskInfo | Exception] = []

    def wait() -> None:
        try:
            outcome.append(s.wait(first, timeout=10))
        except Exception as exc:  # handed to the test
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: client.zscore(s.keys.waits, first) is not None, what="the waiter")
    time.sleep(0.2)  # from its registration to its listening
    second = s.trigger("s")
    assert second is not None and second != first
    waiter.join(5.0)
    assert not waiter.is_alive(), "the waiter was never told that the run ended"
    assert [getattr(i, "state", i) for i in outcome] == [State.CANCELLED]
    assert [i.task_id for i in s.tasks(State.CANCELLED).items] == [first]


# --------------------------------------------------------------------------- catch-up


def test_a_cron_catch_up_of_the_latest_counts_every_other_slot_of_an_outage_as_missed(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    """An hour without workers, a minutely cron, a ten-minute window: one run, 59 missed."""
    s = sync_scheduler
    s.add_schedule("s", "f", cron="* * * * *", catchup="latest", catchup_window=600)
    now = s.server_time()
    if now % 60 > 58:  # keep the hour's slots the same until fire_due reads the clock
        time.sleep(60 - now % 60 + 0.1)
        now = s.server_time()
    latest = int(now // 60) * 60_000
    # The workers were down for an hour: the stored next fire is an hour old.
    client.zadd(s.keys.fires, {"s": latest - 59 * 60_000}, xx=True)
    assert s.fire_due() == 1
    info = s.get_schedule("s")
    assert (info.fired, info.missed) == (1, 59)
    assert slot_tasks(client, s, "s") == [f"s@{latest}"]


# --------------------------------------------------------------------------- jitter


def test_slots_fired_by_the_workers_are_due_within_the_jitter_after_their_slot(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    start = s.server_time() + 0.05
    s.add_schedule("j", "f", interval=0.01, start=start, jitter=0.4, overlap="allow",
                   catchup="all")  # fmt: skip
    time.sleep(0.6)
    assert s.fire_due() >= 40
    offsets = []
    for task_id in slot_tasks(client, s, "j"):
        slot = int(task_id.rsplit("@", 1)[1])
        offsets.append(round(s.status(task_id).run_at * 1000) - slot)
    assert all(0 <= o <= 400 for o in offsets)
    assert max(offsets) - min(offsets) > 100  # spread over the bound, not one value
