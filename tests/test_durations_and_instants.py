"""Durations as seconds or ``datetime.timedelta`` everywhere the API takes one; a
``run_at`` (or ``deadline``) that reads as milliseconds refused with the field named and
nothing written; every public error class importable from ``distsched``. Real Redis."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
import redis

import distsched
from distsched import InvalidArgument, Scheduler, State, Worker, errors
from distsched.aio import AsyncScheduler
from tests.conftest import RedisServer


def test_a_timedelta_delay_is_the_same_as_its_seconds(scheduler: Scheduler) -> None:
    scheduler.schedule("td", fn="f", delay=dt.timedelta(minutes=2))
    scheduler.schedule("s", fn="f", delay=120)
    td, s = scheduler.status("td"), scheduler.status("s")
    assert abs(td.run_at - s.run_at) < 5.0
    assert 110 < td.run_at - scheduler.server_time() <= 120


def test_task_options_take_timedeltas_for_every_duration(scheduler: Scheduler) -> None:
    scheduler.schedule(
        "job",
        fn="f",
        backoff=dt.timedelta(seconds=3),
        timeout=dt.timedelta(milliseconds=1500),
        ttl=dt.timedelta(hours=1),
        max_attempts=2,
    )
    info = scheduler.status("job")
    assert info.backoff == 3.0
    assert info.timeout == 1.5


def test_scheduler_settings_and_waits_take_timedeltas(
    redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=dt.timedelta(seconds=7))
    try:
        assert s.lease_s == 7.0
        s.set_retention(dt.timedelta(hours=2))
        assert s.stats()["retention_s"] == 7200.0
        assert s.set_order("priority", aging=dt.timedelta(minutes=1)).aging_s == 60.0
        s.schedule("w", fn="f")
        with pytest.raises(errors.Timeout):
            s.wait("w", timeout=dt.timedelta(milliseconds=50))
        claims, _ = s.claim(1, "w-1")
        assert s.release(claims, delay=dt.timedelta(seconds=30)) == 1
        assert s.overview(soon_s=dt.timedelta(seconds=10))["leases_soon_s"] == 10.0
    finally:
        s.close()


def test_schedules_and_workers_take_timedeltas(scheduler: Scheduler) -> None:
    sc = scheduler.add_schedule("every", "f", interval=dt.timedelta(minutes=5))
    assert sc.interval == 300.0
    worker = Worker(
        scheduler,
        {"f": lambda: None},
        heartbeat_s=dt.timedelta(seconds=1),
        grace=dt.timedelta(seconds=2),
        timeout=dt.timedelta(seconds=4),
        timeouts={"f": dt.timedelta(seconds=3)},
    )
    assert (worker.heartbeat_s, worker.grace, worker.timeout) == (1.0, 2.0, 4.0)
    assert worker.timeouts == {"f": 3.0}


def test_a_negative_timedelta_is_refused_where_seconds_below_zero_are(
    scheduler: Scheduler,
) -> None:
    with pytest.raises(InvalidArgument) as err:
        scheduler.schedule("neg", fn="f", timeout=dt.timedelta(seconds=-1))
    assert err.value.field == "timeout"
    with pytest.raises(InvalidArgument) as err:
        Worker(scheduler, {"f": lambda: None}, grace=dt.timedelta(seconds=-1))
    assert err.value.field == "grace"


def test_a_run_at_in_milliseconds_is_refused_naming_the_field_and_writes_nothing(
    scheduler: Scheduler,
) -> None:
    ms = time.time() * 1000
    with pytest.raises(InvalidArgument) as err:
        scheduler.schedule("ms", fn="f", run_at=ms)
    assert err.value.field == "run_at"
    assert "milliseconds" in str(err.value) and f"{ms / 1000:.3f}" in str(err.value)
    with pytest.raises(InvalidArgument) as err:
        scheduler.schedule("ms", fn="f", deadline=ms)
    assert err.value.field == "deadline"
    with pytest.raises(InvalidArgument) as err:
        scheduler.add_schedule("late", "f", interval=60, start=ms)
    assert err.value.field == "start"
    assert scheduler.stats()["counts"][State.READY.value] == 0
    assert scheduler.schedules() == []


def test_a_timedelta_given_as_run_at_is_refused_as_not_an_instant(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidArgument) as err:
        scheduler.schedule("td", fn="f", run_at=dt.timedelta(minutes=1))  # type: ignore[arg-type]
    assert err.value.field == "run_at" and "timedelta" in str(err.value)


def test_a_run_at_in_seconds_or_an_aware_datetime_is_taken(scheduler: Scheduler) -> None:
    now = scheduler.server_time()
    scheduler.schedule("s", fn="f", run_at=now + 60)
    scheduler.schedule("d", fn="f", run_at=dt.datetime.fromtimestamp(now + 60, dt.timezone.utc))
    assert abs(scheduler.status("s").run_at - scheduler.status("d").run_at) < 0.002


def test_the_async_shell_takes_timedeltas_and_refuses_milliseconds(
    redis_server: RedisServer, namespace: str
) -> None:
    async def story() -> None:
        s = AsyncScheduler.from_url(redis_server.url, namespace=namespace)
        try:
            await s.schedule("a", fn="f", delay=dt.timedelta(seconds=30))
            info = await s.status("a")
            assert 20 < info.run_at - await s.server_time() <= 30
            with pytest.raises(InvalidArgument) as err:
                await s.schedule("b", fn="f", run_at=time.time() * 1000)
            assert err.value.field == "run_at"
        finally:
            await s.close()

    asyncio.run(story())


def test_every_public_error_class_is_importable_from_the_package() -> None:
    public = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    }
    assert public
    assert public <= set(distsched.__all__)
    for name in public:
        assert getattr(distsched, name) is getattr(errors, name)
