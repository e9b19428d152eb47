"""§3: claims follow ``(run_at, -priority, sequence)`` exactly, on the server's clock."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsched import Claim, Scheduler, State, TaskSpec, Wait
from distsched.model import WaitReason
from tests.conftest import RedisServer, require_extra


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every test here runs against both shells, the sync and the asyncio one."""
    return api


PMIN, PMAX = -(2**31), 2**31 - 1
# An absolute time well in the past (November 2023), in ms.
BASE_MS = 1_700_000_000_000
W = "w"

priorities = st.one_of(
    st.sampled_from([PMIN, PMIN + 1, -1, 0, 1, PMAX - 1, PMAX]),
    st.integers(PMIN, PMAX),
)
# Few distinct run_at values, so that many tasks tie on run_at (and on priority).
task_keys = st.tuples(
    st.integers(0, 4),  # run_at offset in ms
    st.floats(-0.4, 0.4),  # sub-ms noise that rounding to the nearest ms removes
    priorities,
)


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """One connection pool for the module; every example works in a fresh namespace."""
    c = redis_server.client()
    c.ping()  # its connection opens here, the module's, not in whichever test comes first
    yield c
    c.close()


def fresh(client: redis.Redis, **kwargs: object) -> Scheduler:
    return Scheduler(client, namespace="o" + uuid.uuid4().hex[:12], **kwargs)  # type: ignore[arg-type]


def submit_all(
    s: Scheduler, keys: list[tuple[int, float, int]], data: st.DataObject
) -> list[tuple[str, int, int]]:
    """Schedule the tasks in order with a mix of ``schedule`` and ``schedule_many``.

    Returns ``(task_id, run_at_ms, priority)`` in submission order.
    """
    submitted: list[tuple[str, int, int]] = []
    versions: list[int] = []
    i = 0
    while i < len(keys):
        size = data.draw(st.integers(1, 6), label="batch size")
        chunk = keys[i : i + size]
        specs = [
            TaskSpec(
                f"t{i + j}",
                "f",
                run_at=(BASE_MS + off + noise) / 1000.0,
                priority=prio,
                args=(i + j,),
            )
            for j, (off, noise, prio) in enumerate(chunk)
        ]
        if len(specs) == 1 and data.draw(st.booleans(), label="single schedule"):
            spec = specs[0]
            versions.append(
                s.schedule(
                    spec.task_id, fn="f", run_at=spec.run_at, priority=spec.priority, args=spec.args
                )
            )
        else:
            versions.extend(s.schedule_many(specs))
        submitted.extend(
            (f"t{i + j}", BASE_MS + off, prio) for j, (off, _, prio) in enumerate(chunk)
        )
        i += size
    # The sequence is assigned by Redis in submission order.
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    return submitted


def reference_order(submitted: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The contract's order: run_at, then highest priority, then submission order."""
    indexed = list(enumerate(submitted))
    indexed.sort(key=lambda item: (item[1][1], -item[1][2], item[0]))
    return [task for _, task in indexed]


def claim_all(s: Scheduler, total: int, data: st.DataObject) -> list[Claim]:
    claims: list[Claim] = []
    while len(claims) < total:
        if data.draw(st.booleans(), label="use next"):
            got = s.next(W)
            assert isinstance(got, Claim), got
            claims.append(got)
        else:
            n = data.draw(st.integers(1, 8), label="ready n")
            batch = s.ready(n, W)
            assert len(batch) == min(n, total - len(claims))
            claims.extend(batch)
    assert s.next(W) == Wait(WaitReason.EMPTY, None)
    return claims


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(task_keys, min_size=1, max_size=40), data=st.data())
def test_claims_follow_run_at_then_priority_then_submission_order(
    client: redis.Redis, keys: list[tuple[int, float, int]], data: st.DataObject
) -> None:
    s = fresh(client)
    try:
        submitted = submit_all(s, keys, data)
        claims = claim_all(s, len(keys), data)
        expected = reference_order(submitted)
        assert [c.task_id for c in claims] == [task_id for task_id, _, _ in expected]
        for claim, (_, run_at_ms, prio) in zip(claims, expected, strict=True):
            assert claim.priority == prio
            assert round(claim.run_at * 1000) == run_at_ms
    finally:
        s.close()


def test_priority_extremes_order_tasks_due_at_the_same_time(client: redis.Redis) -> None:
    s = fresh(client)
    try:
        at = BASE_MS / 1000
        for task_id, prio in (("low", PMIN), ("zero", 0), ("high", PMAX), ("low2", PMIN)):
            s.schedule(task_id, fn="f", run_at=at, priority=prio)
        assert [c.task_id for c in s.ready(10, W)] == ["high", "zero", "low", "low2"]
    finally:
        s.close()


def test_an_earlier_run_at_leads_whatever_the_priority(client: redis.Redis) -> None:
    s = fresh(client)
    try:
        s.schedule("urgent-later", fn="f", run_at=(BASE_MS + 1) / 1000, priority=PMAX)
        s.schedule("lazy-first", fn="f", run_at=BASE_MS / 1000, priority=PMIN)
        assert [c.task_id for c in s.ready(2, W)] == ["lazy-first", "urgent-later"]
    finally:
        s.close()


# --------------------------------------------------------------------------- due-ness


def test_a_delayed_task_is_not_claimable_before_it_is_due(scheduler: Scheduler) -> None:
    scheduler.schedule("later", fn="f", delay=30)
    got = scheduler.next(W)
    assert isinstance(got, Wait) and got.reason == "not_due"
    assert got.delay is not None and 29.0 < got.delay <= 30.0
    assert scheduler.ready(5, W) == []
    assert scheduler.status("later").state is State.READY


def test_a_task_at_an_absolute_future_time_waits_for_the_remaining_time(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("later", fn="f", run_at=scheduler.server_time() + 20)
    got = scheduler.next(W)
    assert isinstance(got, Wait) and got.reason == "not_due"
    assert got.delay is not None and 19.0 < got.delay <= 20.001  # run_at is rounded to the ms


def test_a_due_task_is_claimed_before_a_not_yet_due_task_of_higher_priority(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("vip", fn="f", delay=60, priority=PMAX)
    scheduler.schedule("plain", fn="f", priority=0)
    got = scheduler.next(W)
    assert isinstance(got, Claim) and got.task_id == "plain"
    wait = scheduler.next(W)
    assert isinstance(wait, Wait) and wait.reason == "not_due"


def test_an_empty_queue_answers_empty_with_no_delay(scheduler: Scheduler) -> None:
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)
    assert scheduler.claim(3, W) == ([], Wait(WaitReason.EMPTY, None))


def test_a_negative_delay_is_due_at_once(scheduler: Scheduler) -> None:
    t0 = scheduler.server_time()
    scheduler.schedule("past", fn="f", delay=-5)
    t1 = scheduler.server_time()
    info = scheduler.status("past")
    assert t0 - 5 - 0.001 <= info.run_at <= t1 - 5 + 0.001
    got = scheduler.next(W)
    assert isinstance(got, Claim) and got.task_id == "past"


def test_delay_is_counted_from_the_server_clock(scheduler: Scheduler) -> None:
    t0 = scheduler.server_time()
    scheduler.schedule("d", fn="f", delay=12.5)
    t1 = scheduler.server_time()
    assert t0 + 12.5 - 0.001 <= scheduler.status("d").run_at <= t1 + 12.5 + 0.001


def test_timezone_aware_datetimes_are_accepted_as_absolute_times(scheduler: Scheduler) -> None:
    plus5 = dt.timezone(dt.timedelta(hours=5))
    minus3 = dt.timezone(dt.timedelta(hours=-3, minutes=-30))
    scheduler.schedule("a", fn="f", run_at=dt.datetime(2020, 1, 1, 5, 0, 0, 1500, tzinfo=plus5))
    scheduler.schedule("b", fn="f", run_at=dt.datetime(2019, 12, 31, 20, 30, tzinfo=minus3))
    scheduler.schedule("c", fn="f", run_at=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    assert scheduler.status("a").run_at == 1577836800.002  # 1.5 ms rounds half up to 2 ms
    assert scheduler.status("b").run_at == 1577836800.0
    # b and c are the same instant (tie, both priority 0): submission order decides.
    assert [c.task_id for c in scheduler.ready(3, W)] == ["b", "c", "a"]


@pytest.mark.parametrize(
    ("given_s", "stored_ms"),
    [
        (1_600_000_000.0004, 1_600_000_000_000),
        (1_600_000_000.0006, 1_600_000_000_001),
        (1_600_000_000.9996, 1_600_000_001_000),
        (12.0004, 12_000),
        (12.0006, 12_001),
    ],
)
def test_run_at_is_rounded_to_the_nearest_millisecond(
    scheduler: Scheduler, given_s: float, stored_ms: int
) -> None:
    scheduler.schedule("r", fn="f", run_at=given_s)
    assert round(scheduler.status("r").run_at * 1000) == stored_ms
    got = scheduler.next(W)
    assert isinstance(got, Claim) and round(got.run_at * 1000) == stored_ms


def test_tasks_rounded_to_the_same_millisecond_tie_and_keep_submission_order(
    scheduler: Scheduler,
) -> None:
    base = BASE_MS / 1000
    scheduler.schedule("first", fn="f", run_at=base + 0.0003)
    scheduler.schedule("second", fn="f", run_at=base - 0.0003)
    assert [c.task_id for c in scheduler.ready(2, W)] == ["first", "second"]


# --------------------------------------------------------------------------- sequence width


@pytest.mark.parametrize("start", [2**31 - 4, 2**32 - 4, 2**52 - 4, 2**53 - 10])
def test_order_holds_for_sequences_up_to_2_to_the_53(
    redis_client: redis.Redis, namespace: str, start: int
) -> None:
    s = Scheduler(redis_client, namespace=namespace)
    try:
        redis_client.hset(s.keys.meta, "seq", start)
        at = BASE_MS / 1000
        versions = [s.schedule("s0", fn="f", run_at=at)]
        versions += s.schedule_many([TaskSpec(f"s{i}", "f", run_at=at) for i in range(1, 6)])
        versions += [s.schedule("s6", fn="f", run_at=at, priority=-1)]
        versions += [s.schedule("s7", fn="f", run_at=at)]
        versions += s.schedule_many([TaskSpec("s8", "f", run_at=at, priority=1)])
        assert versions == list(range(start + 1, start + 10))
        assert s.status("s8").version == start + 9
        claimed = [c.task_id for c in s.ready(20, W)]
        assert claimed == ["s8", "s0", "s1", "s2", "s3", "s4", "s5", "s7", "s6"]
        assert [c.version for c in s.ready(1, W)] == []
    finally:
        s.close()


# --------------------------------------------------------------------------- parity


def test_fakeredis_claims_in_the_same_order_as_redis(redis_client: redis.Redis) -> None:
    """A quick cross-check of the scripts on fakeredis's Lua (the real server is the proof)."""
    rng = random.Random(7)
    specs = [
        TaskSpec(
            f"p{i}",
            "f",
            run_at=(BASE_MS + rng.randrange(3)) / 1000,
            priority=rng.choice([PMIN, -1, 0, 0, 1, PMAX]),
        )
        for i in range(40)
    ]
    fakeredis = require_extra("fakeredis")
    fake = fakeredis.FakeRedis()
    orders = []
    for client in (redis_client, fake):
        s = Scheduler(client, namespace="parity" + uuid.uuid4().hex[:8])
        try:
            s.schedule_many(specs[:25])
            for spec in specs[25:]:
                s.schedule(spec.task_id, fn="f", run_at=spec.run_at, priority=spec.priority)
            s.schedule("p3", fn="f", run_at=BASE_MS / 1000 + 5)  # a replacement
            orders.append([c.task_id for c in s.ready(100, W)])
        finally:
            s.close()
    fake.close()
    assert orders[0] == orders[1]
    assert len(orders[0]) == 40 and orders[0][-1] == "p3"
