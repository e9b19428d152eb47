"""Schedules: recurring tasks fired by the workers, each slot exactly once."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from distsched import Claim, Overlap, Scheduler, State, TaskSpec, Worker, schedules
from distsched.errors import InvalidArgument, MissingExtraError, NotFoundError
from distsched.model import WaitReason
from distsched.schedules import Definition, plan_fire
from tests.conftest import RedisServer, namespace_keys, require_extra, running
from tests.fault_procs import rows, runs_key
from tests.test_faults import reaped, start_worker

require_extra("cronsim")

UTC = dt.timezone.utc


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def definition(**options: Any) -> Definition:
    return schedules.definition("s", "f", 0, options)


def local_slots(d: Definition, since: dt.datetime, n: int) -> list[str]:
    """The next ``n`` slots at or after ``since``, as local ISO times in the schedule's zone."""
    tz = ZoneInfo(d.tz)
    out: list[str] = []
    for slot in d.timetable().iterate(round(since.timestamp() * 1000)):
        if len(out) == n:
            break
        out.append(dt.datetime.fromtimestamp(slot / 1000, tz).isoformat())
    return out


def tasks_of(client: redis.Redis, s: Scheduler, name: str) -> list[str]:
    raw: Any = client.hkeys(s.keys.tasks)
    ids = [k.decode() for k in raw]
    return sorted(i for i in ids if i.startswith(f"{name}@"))


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


# --------------------------------------------------------------------------- daylight saving


def test_madrid_a_wall_time_in_the_spring_gap_fires_at_the_first_instant_after_it() -> None:
    d = definition(cron="30 2 * * *", tz="Europe/Madrid")
    since = dt.datetime(2026, 3, 28, 0, 0, tzinfo=UTC)
    assert local_slots(d, since, 3) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night
        "2026-03-30T02:30:00+02:00",
    ]


def test_madrid_a_repeated_wall_time_fires_once_at_its_first_occurrence() -> None:
    d = definition(cron="30 2 * * *", tz="Europe/Madrid")
    since = dt.datetime(2026, 10, 24, 0, 0, tzinfo=UTC)
    assert local_slots(d, since, 3) == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",  # not again at 02:30+01:00
        "2026-10-26T02:30:00+01:00",
    ]
    hourly = definition(cron="0 * * * *", tz="Europe/Madrid")
    start = dt.datetime(2026, 10, 24, 23, 30, tzinfo=UTC)  # 01:30+02:00 local
    assert local_slots(hourly, start, 3) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T03:00:00+01:00",  # the second 02:00 is the repeated one
        "2026-10-25T04:00:00+01:00",
    ]


def test_new_york_wall_times_in_the_gap_land_on_one_instant_and_fire_once() -> None:
    d = definition(cron="*/30 * * * *", tz="America/New_York")
    since = dt.datetime(2026, 3, 8, 6, 0, tzinfo=UTC)  # 01:00-05:00
    assert local_slots(d, since, 4) == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T01:30:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00 and 02:30 do not exist, 03:00 does: once
        "2026-03-08T03:30:00-04:00",
    ]


def test_new_york_the_repeated_hour_fires_only_in_its_first_occurrence() -> None:
    d = definition(cron="*/30 * * * *", tz="America/New_York")
    since = dt.datetime(2026, 11, 1, 5, 0, tzinfo=UTC)  # 01:00-04:00
    assert local_slots(d, since, 4) == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T02:30:00-05:00",
    ]
    # From inside the second occurrence, the next slot is the one after it.
    inside = dt.datetime(2026, 11, 1, 6, 10, tzinfo=UTC)  # 01:10-05:00
    assert local_slots(d, inside, 1) == ["2026-11-01T02:00:00-05:00"]


def test_cron_weekdays_at_nine_in_a_time_zone() -> None:
    d = definition(cron="0 9 * * MON-FRI", tz="Europe/Madrid")
    since = dt.datetime(2026, 3, 27, 12, 0, tzinfo=UTC)  # a Friday afternoon
    assert local_slots(d, since, 2) == ["2026-03-30T09:00:00+02:00", "2026-03-31T09:00:00+02:00"]


# --------------------------------------------------------------------------- catch-up plans


def test_a_catch_up_fires_the_slots_within_the_window_and_counts_the_older_as_missed() -> None:
    d = definition(interval=10, start=100.0, catchup="all", catchup_window=25)
    plan = plan_fire(d, 100_000, 200_000)
    assert [slot for slot, _ in plan.slots] == [180_000, 190_000, 200_000]
    assert (plan.missed, plan.next_ms) == (8, 210_000)


def test_a_catch_up_of_the_latest_only_fires_one_slot_and_counts_the_rest() -> None:
    d = definition(interval=10, start=100.0, catchup="latest", catchup_window=25)
    plan = plan_fire(d, 100_000, 200_000)
    assert [slot for slot, _ in plan.slots] == [200_000]
    assert (plan.missed, plan.next_ms) == (10, 210_000)


def test_a_catch_up_fires_at_most_a_bounded_number_of_slots_per_call() -> None:
    d = definition(interval=0.001, start=0.0, catchup="all", catchup_window=3600)
    plan = plan_fire(d, 0, 10_000, limit=100)
    assert len(plan.slots) == 100 and plan.next_ms == 100


def test_slots_past_the_end_are_not_fired_and_the_schedule_ends() -> None:
    d = definition(interval=10, start=100.0, end=150.0, catchup="all", catchup_window=25)
    plan = plan_fire(d, 100_000, 200_000)
    assert (plan.slots, plan.missed, plan.next_ms) == ([], 6, None)


def test_cron_slots_missed_beyond_the_window_are_counted() -> None:
    d = definition(cron="* * * * *", catchup="all", catchup_window=120)
    plan = plan_fire(d, 60_000, 3_600_000)
    assert [slot for slot, _ in plan.slots] == [3_480_000, 3_540_000, 3_600_000]
    assert plan.missed == 57


def test_jitter_delays_each_slot_by_a_fixed_amount_within_its_bound() -> None:
    d = definition(interval=1, start=0.0, jitter=0.5, catchup="all")
    offsets = [d.jitter_for(slot) for slot in range(0, 200_000, 1000)]
    assert all(0 <= o <= 500 for o in offsets)
    assert len(set(offsets)) > 50  # spread, not one value
    assert offsets == [d.jitter_for(slot) for slot in range(0, 200_000, 1000)]


# --------------------------------------------------------------------------- validation


BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("cron", {"cron": "61 * * * *"}),
    ("cron", {"cron": "0 0 30 2 *"}),  # never matches
    ("cron", {"cron": "0 9 * * *", "interval": 60}),
    ("cron", {}),
    ("tz", {"cron": "0 9 * * *", "tz": "Mars/Olympus"}),
    ("interval", {"interval": 0}),
    ("interval", {"interval": -5}),
    ("interval", {"interval": float("nan")}),
    ("overlap", {"interval": 60, "overlap": "sometimes"}),
    ("catchup", {"interval": 60, "catchup": "some"}),
    ("catchup_window", {"interval": 60, "catchup_window": -1}),
    ("priority", {"interval": 60, "priority": 2**31}),
    ("max_attempts", {"interval": 60, "max_attempts": 0}),
    ("jitter", {"interval": 60, "jitter": -1}),
    ("end", {"interval": 60, "start": 200.0, "end": 100.0}),
    ("start", {"interval": 60, "start": dt.datetime(2026, 1, 1)}),
    ("paused", {"interval": 60, "paused": "yes"}),
    ("args", {"interval": 60, "args": "abc"}),
    ("colour", {"interval": 60, "colour": "red"}),
    ("key", {"interval": 60, "key": ""}),
    ("key", {"interval": 60, "key": "k" * 257}),
    ("key", {"interval": 60, "key": 7}),
]


@pytest.mark.parametrize(("field", "options"), BAD_OPTIONS)
def test_a_bad_schedule_option_is_refused_naming_it_and_nothing_is_written(
    api: Scheduler, client: redis.Redis, field: str, options: dict[str, Any]
) -> None:
    api.add_schedule("kept", "f", interval=60)
    before = namespace_keys(client, api.namespace)
    with pytest.raises(InvalidArgument) as info:
        api.add_schedule("new", "f", **options)
    assert info.value.field == field
    assert namespace_keys(client, api.namespace) == before


@pytest.mark.parametrize("name", ["", "x" * 257, "bad\udc80"])
def test_a_bad_schedule_name_is_refused_and_nothing_is_written(
    api: Scheduler, client: redis.Redis, name: str
) -> None:
    before = namespace_keys(client, api.namespace)
    with pytest.raises(InvalidArgument) as info:
        api.add_schedule(name, "f", interval=60)
    assert info.value.field == "name"
    assert namespace_keys(client, api.namespace) == before


def test_a_bad_function_is_refused_naming_fn(api: Scheduler) -> None:
    with pytest.raises(InvalidArgument) as info:
        api.add_schedule("s", "", interval=60)
    assert info.value.field == "fn"


def test_a_cron_schedule_without_the_cron_extra_says_which_extra(
    api: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)
    with pytest.raises(MissingExtraError, match=r"distsched\[cron\]"):
        api.add_schedule("s", "f", cron="0 9 * * *")
    api.add_schedule("i", "f", interval=60)  # intervals need no extra


FIRE_ARGS: list[Any] = [
    1000, "s", "REV", "fire", 1, 2, 0, "skip", "0 1 1000", b"\x81\xa2fn\xa1f", 1024, 1, 1, 1,
]  # fmt: skip
BAD_FIRE_ARGS = [
    (1, "x" * 257, "name"),
    (3, "now", "mode"),
    (4, "1.5", "expected_ms"),
    (5, "x", "next_ms"),
    (6, "-1", "missed"),
    (7, "often", "policy"),
    (8, "0 0 1000", "max_attempts"),
    (8, "0 1", "spec"),
    (8, "0 1 1000 key=", "key"),
    (8, "0 1 1000 key=" + "6b" * 257, "key"),
    (8, "0 1 1000 key=ff", "key"),  # not UTF-8
    (8, "0 1 1000 tenant=6b", "spec"),
    (9, b"\x92\x01\x02", "payload"),
    (11, "1001", "m"),
    (12, "x", "slot"),
]


@pytest.mark.parametrize(("index", "value", "field"), BAD_FIRE_ARGS)
def test_fire_script_refuses_bad_arguments_naming_the_field_and_writes_nothing(
    sync_scheduler: Scheduler, client: redis.Redis, index: int, value: Any, field: str
) -> None:
    s = sync_scheduler
    s.add_schedule("s", "f", interval=60)
    state: Any = client.hget(s.keys.firing, "s")
    rev = state.split(b"|")[0]
    args = list(FIRE_ARGS)
    args[2] = rev
    args[index] = value
    before = namespace_keys(client, s.namespace)
    with pytest.raises(redis.ResponseError, match=rf"^BADARG {field} "):
        s._scripts["fire"](keys=s.keys.for_script("fire"), args=args)
    assert namespace_keys(client, s.namespace) == before


def test_recur_script_refuses_a_definition_that_is_not_a_msgpack_map(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    for args, field in (
        (["put", "s", "rev", b"\x92\x01\x02", ""], "definition"),
        (["put", "s", "a|b", b"\x80", ""], "rev"),
        (["put", "s", "rev", b"\x80", "soon"], "next_ms"),
        (["replace", "s"], "op"),
    ):
        with pytest.raises(redis.ResponseError, match=rf"^BADARG {field} "):
            s._scripts["recur"](keys=s.keys.for_script("recur"), args=args)
    assert namespace_keys(client, s.namespace) == {}


# --------------------------------------------------------------------------- the API


def test_a_schedule_is_listed_with_its_next_fire_and_removed(api: Scheduler) -> None:
    now = api.server_time()
    added = api.add_schedule("tick", "f", interval=60, args=[1], priority=5, max_attempts=3)
    assert added.next_fire is not None and now + 59 < added.next_fire < now + 61
    assert (added.args, added.priority, added.max_attempts) == ((1,), 5, 3)
    assert added.overlap is Overlap.SKIP and added.fired == 0
    assert [sc.name for sc in api.schedules()] == ["tick"]
    assert api.next_fires("tick", 3) == [added.next_fire + 60 * i for i in range(3)]
    assert api.remove_schedule("tick") is True
    assert api.remove_schedule("tick") is False
    assert api.schedules() == []
    with pytest.raises(NotFoundError):
        api.get_schedule("tick")


def test_pause_takes_a_schedule_out_of_the_fires_and_resume_puts_it_back(
    api: Scheduler, client: redis.Redis
) -> None:
    api.add_schedule("tick", "f", interval=60)
    paused = api.pause_schedule("tick")
    assert paused.paused and paused.next_fire is None
    assert client.zscore(api.keys.fires, "tick") is None
    assert len(api.next_fires("tick", 2)) == 2  # what it would have if resumed now
    resumed = api.resume_schedule("tick")
    assert not resumed.paused and resumed.next_fire is not None
    assert client.zscore(api.keys.fires, "tick") == resumed.next_fire * 1000


def test_a_schedule_added_paused_never_fires(api: Scheduler) -> None:
    added = api.add_schedule("tick", "f", interval=0.01, paused=True)
    assert added.next_fire is None
    time.sleep(0.05)
    assert api.fire_due() == 0


def test_start_sets_the_first_slot_and_end_stops_the_schedule(api: Scheduler) -> None:
    now = api.server_time()
    later = api.add_schedule("later", "f", interval=60, start=now + 3600)
    assert later.next_fire == pytest.approx(now + 3600, abs=0.001)
    ended = api.add_schedule("ended", "f", interval=60, start=now - 7200, end=now - 3600)
    assert ended.next_fire is None
    assert api.next_fires("ended", 3) == []
    bounded = api.add_schedule("bounded", "f", interval=0.05, start=now + 0.1, end=now + 0.25)
    assert bounded.next_fire is not None
    time.sleep(0.5)
    assert api.fire_due() == 1  # the latest slot of the five; then it has ended
    info = api.get_schedule("bounded")
    assert info.next_fire is None and info.fired + info.missed == 4


def test_backfill_creates_each_past_slot_once_within_its_limit(api: Scheduler) -> None:
    now = api.server_time()
    api.add_schedule("daily", "f", interval=86400, start=now - 10 * 86400)
    assert api.backfill("daily", now - 10 * 86400, now - 1, limit=4) == 4
    assert api.backfill("daily", now - 10 * 86400, now - 1) == 6  # the first four exist
    assert api.backfill("daily", now - 10 * 86400, now - 1) == 0
    first = round((now - 10 * 86400) * 1000)
    assert api.status(f"daily@{first}").state is State.READY
    with pytest.raises(InvalidArgument) as info:
        api.backfill("daily", now, now + 60)
    assert info.value.field == "end"


def test_backfilled_tasks_are_due_within_the_jitter_after_their_slot(api: Scheduler) -> None:
    now = api.server_time()
    api.add_schedule("j", "f", interval=1, start=now - 100, jitter=0.4)
    assert api.backfill("j", now - 100, now - 1) == 100
    offsets = []
    for i in range(100):
        slot = round((now - 100) * 1000) + 1000 * i
        offsets.append(api.status(f"j@{slot}").run_at * 1000 - slot)
    assert all(0 <= o <= 400 for o in offsets)
    assert max(offsets) - min(offsets) > 100


def test_a_slot_fires_exactly_once_however_often_fire_due_runs(api: Scheduler) -> None:
    now = api.server_time()
    api.add_schedule("s", "f", interval=0.02, overlap="allow", catchup="all", start=now)
    time.sleep(0.3)
    created = sum(api.fire_due() for _ in range(5))
    info = api.get_schedule("s")
    assert created == info.fired >= 10 and info.missed == 0
    assert info.next_fire is not None and info.next_fire > now + 0.29


def test_a_claim_says_when_a_slot_is_due(api: Scheduler) -> None:
    api.add_schedule("s", "f", interval=0.02, overlap="allow")
    time.sleep(0.05)
    claims, wait = api.claim(1, "w")
    assert claims == [] and wait is not None and wait.reason is WaitReason.FIRE
    assert api.fire_due() == 1
    claims, wait = api.claim(1, "w")
    assert [c.fn for c in claims] == ["f"] and claims[0].task_id.startswith("s@")


def test_a_next_fire_time_is_the_claim_delay_hint_of_an_idle_worker(api: Scheduler) -> None:
    now = api.server_time()
    api.add_schedule("s", "f", interval=60, start=now + 30)
    claims, wait = api.claim(1, "w", listening=True)
    assert claims == [] and wait is not None and wait.reason is WaitReason.EMPTY
    assert wait.delay is not None and 29 < wait.delay <= 30


# --------------------------------------------------------------------------- overlap


def run_one(api: Scheduler, task_id: str) -> Claim:
    [claim] = api.ready(1, "w")
    assert claim.task_id == task_id
    return claim


def test_skip_creates_nothing_while_the_last_run_is_queued_or_running(api: Scheduler) -> None:
    api.add_schedule("s", "f", interval=3600)
    first = api.trigger("s")
    assert first is not None
    assert api.trigger("s") is None  # queued
    claim = run_one(api, first)
    assert api.trigger("s") is None  # running
    api.complete(claim)
    second = api.trigger("s")
    assert second is not None and second != first
    assert api.get_schedule("s").skipped == 2


def test_buffer_one_keeps_at_most_one_run_waiting_for_the_running_one(api: Scheduler) -> None:
    api.add_schedule("s", "f", interval=3600, overlap="buffer_one")
    first = api.trigger("s")
    assert first is not None
    assert api.trigger("s") is None  # the queued run is the pending one
    claim = run_one(api, first)
    waiting = api.trigger("s")
    assert waiting is not None and api.status(waiting).state is State.PENDING
    assert api.trigger("s") is None  # one waits already
    api.complete(claim)
    assert api.status(waiting).state is State.READY
    assert api.get_schedule("s").skipped == 2


def test_buffer_all_queues_every_run_behind_the_one_before(api: Scheduler) -> None:
    api.add_schedule("s", "f", interval=3600, overlap="buffer_all")
    ids = [api.trigger("s") for _ in range(3)]
    assert None not in ids
    states = [api.status(i).state for i in ids if i]
    assert states == [State.READY, State.PENDING, State.PENDING]
    assert api.status(ids[2] or "").optional_deps == (ids[1],)
    api.complete(run_one(api, ids[0] or ""))
    assert api.status(ids[1] or "").state is State.READY
    assert api.status(ids[2] or "").state is State.PENDING


def test_cancel_previous_cancels_a_queued_run_and_asks_a_running_one_to_stop(
    api: Scheduler,
) -> None:
    api.add_schedule("s", "f", interval=3600, overlap="cancel_previous")
    first = api.trigger("s") or ""
    second = api.trigger("s") or ""
    assert api.status(first).state is State.CANCELLED
    run_one(api, second)
    third = api.trigger("s") or ""
    running = api.status(second)
    assert running.state is State.RUNNING and running.cancel_requested
    assert api.status(third).state is State.READY


def test_allow_creates_every_run(api: Scheduler) -> None:
    api.add_schedule("s", "f", interval=3600, overlap="allow")
    ids = [api.trigger("s") for _ in range(3)]
    assert len(set(ids)) == 3 and None not in ids
    assert all(api.status(i or "").state is State.READY for i in ids)
    assert api.get_schedule("s").fired == 3


def test_a_slot_during_a_running_run_is_skipped_by_the_fire_step_too(api: Scheduler) -> None:
    now = api.server_time()
    api.add_schedule("s", "f", interval=0.05, start=now, catchup="all")
    time.sleep(0.06)
    assert api.fire_due() >= 1
    claim = api.ready(1, "w")[0]
    time.sleep(0.11)
    assert api.fire_due() == 0
    assert api.get_schedule("s").skipped >= 2
    api.complete(claim)


# --------------------------------------------------------------------------- workers


def test_an_idle_worker_starts_a_slot_task_woken_by_its_fire_time(
    sync_scheduler: Scheduler,
) -> None:
    s = sync_scheduler
    started: dict[str, float] = {}

    def tick() -> None:
        from distsched import current_task

        started[current_task().task_id] = time.time()

    with running(Worker(s, {"tick": tick}, concurrency=1)):
        time.sleep(0.3)  # the worker is idle, waiting with its 2 s re-check
        now = s.server_time()
        s.add_schedule("s", "tick", interval=0.7, start=now + 0.9, overlap="allow", catchup="all")
        wait_until(lambda: len(started) >= 3, 10, "three slots")
    # Each task started within a small part of the 2 s re-check after its slot: the
    # worker was woken by the fire time, not by a periodic claim.
    for task_id, at in sorted(started.items())[:3]:
        slot = int(task_id.rsplit("@", 1)[1]) / 1000
        assert 0 <= at - slot < 0.5, (task_id, at - slot)


@pytest.mark.slow
def test_five_worker_processes_racing_over_two_hundred_slots_create_two_hundred_tasks(
    redis_server: RedisServer, client: redis.Redis, namespace: str
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    procs = [start_worker(redis_server.url, namespace, "--concurrency", "4") for _ in range(5)]
    done = threading.Event()

    def keep_them_busy() -> None:
        # Other work keeps every process claiming, so that each slot is seen due by
        # several of them at once: they race for it.
        i = 0
        while not done.is_set():
            s.schedule_many([TaskSpec(f"other-{i + j}", "record", args=[1]) for j in range(20)])
            i += 20
            time.sleep(0.01)

    busy = threading.Thread(target=keep_them_busy)
    with reaped(*procs):
        busy.start()
        try:
            now = s.server_time()
            start, step = now + 0.5, 0.025
            s.add_schedule(
                "race", "record", args=[0], interval=step, start=start, end=start + 199 * step,
                overlap="allow", catchup="all", catchup_window=600,
            )  # fmt: skip
            wait_until(lambda: s.get_schedule("race").next_fire is None, 60, "the last slot")
        finally:
            done.set()
            busy.join()
        wait_until(lambda: s.stats()["counts"]["ready"] == 0, 60, "the queue drained")
        time.sleep(0.3)
    runs = [r for r in rows(client, runs_key(namespace)) if r[0].startswith("race@")]
    ids = tasks_of(client, s, "race")
    first = round(start * 1000)
    assert ids == sorted(f"race@{first + 25 * i}" for i in range(200))
    assert sorted(r[0] for r in runs) == ids  # each ran once
    assert len({r[3] for r in runs}) > 1  # by several processes
    info = s.get_schedule("race")
    assert (info.fired, info.missed, info.skipped) == (200, 0, 0)
    s.close()


@pytest.mark.slow
def test_workers_killed_across_slots_lose_no_slot_within_the_catch_up_window(
    redis_server: RedisServer, client: redis.Redis, namespace: str
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    first_procs = [start_worker(redis_server.url, namespace) for _ in range(3)]
    with reaped(*first_procs):
        now = s.server_time()
        start, step = now + 0.3, 0.05
        s.add_schedule(
            "beat", "record", args=[0], interval=step, start=start, end=start + 59 * step,
            overlap="allow", catchup="all", catchup_window=600,
        )  # fmt: skip
        wait_until(lambda: s.get_schedule("beat").fired >= 10, 30, "ten slots")
        for proc in first_procs:
            proc.kill()  # SIGKILL: no goodbye, mid-slot
            proc.communicate()
        fired_at_kill = s.get_schedule("beat").fired
        time.sleep(1.0)  # slots go by with nobody to fire them
        assert s.get_schedule("beat").fired == fired_at_kill
    second_procs = [start_worker(redis_server.url, namespace) for _ in range(2)]
    with reaped(*second_procs):
        wait_until(lambda: s.get_schedule("beat").next_fire is None, 30, "the last slot")
    first = round(start * 1000)
    assert tasks_of(client, s, "beat") == sorted(f"beat@{first + 50 * i}" for i in range(60))
    info = s.get_schedule("beat")
    assert (info.fired, info.missed) == (60, 0)
    s.close()


# --------------------------------------------------------------------------- command line


def test_the_schedules_commands_add_list_trigger_pause_resume_backfill_next_and_remove(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import assert_one_line_error, invoke

    def ok(*args: str) -> str:
        result = invoke(redis_server, namespace, "schedules", *args)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    out = ok("add", "digest", "--fn", "send", "--cron", "0 9 * * MON-FRI", "--tz", "Europe/Madrid")
    assert "cron '0 9 * * MON-FRI' Europe/Madrid, active, next fire" in out
    ok("add", "tick", "--fn", "f", "--interval", "30s", "--overlap", "skip")
    listing = ok("list").splitlines()
    assert listing[0].split()[:4] == ["name", "fn", "when", "state"]
    assert [line.split()[0] for line in listing[1:]] == ["digest", "tick"]
    [first, second] = ok("next", "digest", "-n", "2").splitlines()
    assert first.endswith(" Europe/Madrid") and "T09:00:00+0" in first
    assert second > first
    task_id = ok("trigger", "tick").strip()
    assert task_id.startswith("tick@")
    assert ok("trigger", "tick").startswith("skipped: the previous run is still queued")
    assert ok("pause", "tick").strip() == "tick: paused"
    [tick] = [sc for sc in json.loads(ok("list", "--json")) if sc["name"] == "tick"]
    assert (tick["state"], tick["fired"], tick["skipped"], tick["last_task"]) == (
        "paused", 1, 1, task_id,
    )  # fmt: skip
    assert "active" in ok("resume", "tick")
    out = ok(
        "backfill", "digest", "--start", "2026-11-02T00:00:00Z", "--end", "2026-11-07T00:00:00Z"
    )
    assert out.strip() == "created 5 tasks"  # Monday to Friday
    assert ok("remove", "tick").strip() == "removed tick"
    result = invoke(redis_server, namespace, "schedules", "remove", "tick")
    assert_one_line_error(result, "no schedule 'tick'")
    result = invoke(
        redis_server, namespace, "schedules", "add", "x", "--fn", "f", "--cron", "99 * * * *"
    )
    assert_one_line_error(result, "--cron")
    result = invoke(
        redis_server, namespace, "schedules", "add", "x", "--fn", "f", "--interval", "1m",
        "--overlap", "sometimes",
    )  # fmt: skip
    assert result.exit_code == 2  # a usage error: click names the choices


def test_a_due_schedule_whose_definition_is_junk_leaves_the_fires_and_workers_go_on(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    s.add_schedule("broken", "f", interval=0.01)
    s.add_schedule("gone", "f", interval=0.01)
    client.hset(s.keys.schedules, "broken", b"\x81\xa1x\x01")  # a map, not a definition
    client.hdel(s.keys.firing, "gone")
    time.sleep(0.03)
    assert s.fire_due() == 0
    assert client.zrange(s.keys.fires, 0, -1) == []
    claims, wait = s.claim(1, "w")
    assert claims == [] and wait is not None and wait.reason is WaitReason.EMPTY


# ----------------------------------------------------------------- the DST rule, by brute force


def brute_force_slots(tz_name: str, every: int, start: dt.datetime, minutes: int) -> list[int]:
    """The slots (epoch ms) of ``*/every * * * *`` by the documented rule, minute by minute
    in UTC: a minute whose wall time matches and is its first occurrence; and the first
    minute after a gap when a wall time in the gap (or its own) matches."""
    tz = ZoneInfo(tz_name)
    out: list[int] = []
    for i in range(minutes):
        u = start + dt.timedelta(minutes=i)
        local = u.astimezone(tz)
        before = (u - dt.timedelta(minutes=1)).astimezone(tz)
        wall, wall_before = local.replace(tzinfo=None), before.replace(tzinfo=None)
        skipped = []  # wall minutes that never happened between the two
        w = wall_before + dt.timedelta(minutes=1)
        while w < wall:
            skipped.append(w)
            w += dt.timedelta(minutes=1)
        matches = wall.minute % every == 0 and local.fold == 0
        if matches or any(w.minute % every == 0 for w in skipped):
            out.append(round(u.timestamp() * 1000))
    return out


@pytest.mark.parametrize(
    ("tz_name", "day"),
    [
        ("Europe/Madrid", dt.datetime(2026, 3, 28, 22, tzinfo=UTC)),
        ("Europe/Madrid", dt.datetime(2026, 10, 24, 22, tzinfo=UTC)),
        ("America/New_York", dt.datetime(2026, 3, 8, 3, tzinfo=UTC)),
        ("America/New_York", dt.datetime(2026, 11, 1, 3, tzinfo=UTC)),
        ("Australia/Lord_Howe", dt.datetime(2026, 4, 4, 12, tzinfo=UTC)),  # 30-minute shift
        ("Australia/Lord_Howe", dt.datetime(2026, 10, 3, 12, tzinfo=UTC)),
    ],
)
@pytest.mark.parametrize("every", [1, 15, 30])
def test_cron_slots_around_a_clock_change_follow_the_rule_minute_by_minute(
    tz_name: str, day: dt.datetime, every: int
) -> None:
    d = definition(cron=f"*/{every} * * * *", tz=tz_name)
    minutes = 12 * 60
    tz = ZoneInfo(tz_name)
    later = day + dt.timedelta(minutes=minutes)
    assert day.astimezone(tz).utcoffset() != later.astimezone(tz).utcoffset()  # a change
    want = brute_force_slots(tz_name, every, day, minutes)
    got: list[int] = []
    end = round((day + dt.timedelta(minutes=minutes)).timestamp() * 1000)
    for slot in d.timetable().iterate(round(day.timestamp() * 1000)):
        if slot >= end:
            break
        got.append(slot)
    assert got == want


def test_a_catch_up_of_the_latest_of_millions_of_interval_slots_is_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = definition(interval=0.001, start=0.0, catchup="latest", catchup_window=7200)
    steps: list[int] = []
    after = schedules.Timetable.after

    def counted(self: schedules.Timetable, t_ms: int) -> int | None:
        steps.append(t_ms)
        return after(self, t_ms)

    monkeypatch.setattr(schedules.Timetable, "after", counted)
    plan = plan_fire(d, 0, 3_600_000)
    assert ([slot for slot, _ in plan.slots], plan.missed) == ([3_600_000], 3_600_000)
    assert plan.next_ms == 3_600_001
    assert len(steps) < 10  # computed, not walked slot by slot


# --------------------------------------------------------------------------- fairness keys


def test_a_schedule_with_a_key_fires_its_tasks_into_that_key(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    added = s.add_schedule("rep", "f", interval=3600, key="tenant:7", overlap="allow")
    assert added.key == "tenant:7" and s.get_schedule("rep").key == "tenant:7"
    s.set_key("tenant:7", cap=1)
    first, second = s.trigger("rep"), s.trigger("rep")
    assert first is not None and second is not None
    assert client.hget(s.keys.fairkeys, first) == b"tenant:7"
    info = s.key_info("tenant:7")
    assert info.queued == 2
    claims, _ = s.claim(5, "w")
    # The key's cap of one holds the second run back.
    assert [c.task_id for c in claims] == [first]
    assert s.explain(second).fair_key == "tenant:7"


def test_a_schedule_without_a_key_fires_into_the_default_key(
    sync_scheduler: Scheduler, client: redis.Redis
) -> None:
    s = sync_scheduler
    s.set_key("other")
    s.add_schedule("plain", "f", interval=3600)
    assert s.get_schedule("plain").key is None
    task = s.trigger("plain")
    assert task is not None
    assert client.hget(s.keys.fairkeys, task) is None
    assert s.explain(task).fair_key == ""


def test_the_cli_adds_a_schedule_with_a_key(redis_server: RedisServer, namespace: str) -> None:
    from tests.test_cli import invoke

    invoke(redis_server, namespace, "schedules", "add", "k", "--fn", "f", "--interval", "1h",
           "--key", "tenant:9")  # fmt: skip
    listed = json.loads(invoke(redis_server, namespace, "schedules", "list", "--json").stdout)
    assert [sc["key"] for sc in listed] == ["tenant:9"]
