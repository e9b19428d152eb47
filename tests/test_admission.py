"""Admission policies of ``schedule``: dedupe (with its window) and debounce."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest
import redis

from distsched import Admitted, Claim, Scheduler, State, TaskSpec, scripts
from distsched.errors import ConflictError, InvalidArgument
from tests.conftest import namespace_keys
from tests.test_cli import invoke as cli_invoke


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every behaviour test here runs against both shells, the sync and the asyncio one."""
    return api


W = "worker-1"


def server_ms(client: redis.Redis) -> int:
    secs, micros = client.time()
    return secs * 1000 + micros // 1000


def claim_one(s: Scheduler) -> Claim:
    got = s.next(W)
    assert isinstance(got, Claim), got
    return got


def test_dedupe_keeps_a_queued_version_and_returns_it(scheduler: Scheduler) -> None:
    first = scheduler.admit("a", fn="f", args=(1,), dedupe=True)
    again = scheduler.admit("a", fn="f", args=(2,), dedupe=True, priority=5)
    assert first == Admitted("a", first.version, True)
    assert again == Admitted("a", first.version, False)
    assert scheduler.schedule("a", fn="f", args=(3,), dedupe=True) == first.version
    info = scheduler.status("a")
    assert info.version == first.version
    assert info.args == (1,) and info.priority == 0


def test_dedupe_keeps_a_running_version_instead_of_a_conflict(scheduler: Scheduler) -> None:
    v = scheduler.schedule("a", fn="f")
    claim_one(scheduler)
    with pytest.raises(ConflictError):
        scheduler.schedule("a", fn="f")
    assert scheduler.admit("a", fn="f", dedupe=True) == Admitted("a", v, False)
    assert scheduler.status("a").state is State.RUNNING


def test_dedupe_without_a_window_makes_a_new_version_once_the_task_ended(
    scheduler: Scheduler,
) -> None:
    v = scheduler.schedule("a", fn="f")
    scheduler.complete(claim_one(scheduler), 1)
    got = scheduler.admit("a", fn="f", dedupe=True)
    assert got.created and got.version > v
    assert scheduler.status("a").state is State.READY


def test_dedupe_window_keeps_an_ended_version_until_the_window_passes(
    scheduler: Scheduler,
) -> None:
    v = scheduler.schedule("a", fn="f")
    scheduler.complete(claim_one(scheduler), "done")
    kept = scheduler.admit("a", fn="f", dedupe_window=60)
    assert kept == Admitted("a", v, False)
    assert scheduler.status("a").result == "done"
    scheduler.schedule("b", fn="f")
    assert scheduler.cancel("b") is State.CANCELLED
    assert scheduler.admit("b", fn="f", dedupe_window=60).created is False
    time.sleep(0.15)
    fresh = scheduler.admit("a", fn="f", dedupe=True, dedupe_window=0.05)
    assert fresh.created and fresh.version > v
    assert scheduler.status("a").state is State.READY


def test_a_batch_keeps_some_tasks_and_writes_the_others_with_dependencies_on_kept_ones(
    scheduler: Scheduler,
) -> None:
    va = scheduler.schedule("a", fn="f")
    got = scheduler.admit_many(
        [
            TaskSpec("a", "f", dedupe=True),
            TaskSpec("b", "f", deps=["a"], dedupe=True),
            TaskSpec("c", "f"),
        ]
    )
    assert [(g.task_id, g.created) for g in got] == [("a", False), ("b", True), ("c", True)]
    assert got[0].version == va and got[2].version == got[1].version + 1
    assert scheduler.status("b").state is State.PENDING
    assert scheduler.schedule_many([TaskSpec("b", "f", dedupe=True)]) == [got[1].version]
    scheduler.complete(claim_one(scheduler), None)
    assert scheduler.status("b").state is State.READY


def test_debounce_pushes_the_start_but_never_past_max_wait_after_the_first_submission(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    before = server_ms(redis_client)
    v1 = scheduler.schedule("d", fn="f", delay=5, debounce=8)
    first_run_at = round(scheduler.status("d").run_at * 1000)
    assert before + 5000 <= first_run_at <= server_ms(redis_client) + 5000
    v2 = scheduler.schedule("d", fn="f", delay=5, debounce=8, args=(2,))
    assert v2 > v1
    info = scheduler.status("d")
    assert info.version == v2 and info.args == (2,)
    assert round(info.run_at * 1000) >= first_run_at
    # A push beyond first + max_wait is cut to it.
    scheduler.schedule("d", fn="f", delay=60, debounce=8)
    capped = round(scheduler.status("d").run_at * 1000)
    assert before + 8000 <= capped == first_run_at + 3000
    entries = redis_client.hgetall(scheduler.keys.debounce)
    assert list(entries) == [b"d"]


def test_debounce_starts_a_new_burst_once_the_task_ran(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("d", fn="f", run_at=0, debounce=1)
    scheduler.complete(claim_one(scheduler), None)
    time.sleep(0.05)
    before = server_ms(redis_client)
    scheduler.schedule("d", fn="f", delay=60, debounce=10)
    assert round(scheduler.status("d").run_at * 1000) >= before + 10000


def test_debounce_of_a_running_task_is_a_conflict_as_without_it(scheduler: Scheduler) -> None:
    scheduler.schedule("d", fn="f", debounce=5)
    claim_one(scheduler)
    with pytest.raises(ConflictError):
        scheduler.schedule("d", fn="f", debounce=5)


def test_scheduling_without_debounce_drops_the_burst(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("d", fn="f", delay=5, debounce=8)
    scheduler.schedule("d", fn="f", delay=5, dedupe=False, debounce=None, priority=0)
    # The entry may stay (it is fenced by version), but a new burst starts at the next call.
    before = server_ms(redis_client)
    scheduler.schedule("d", fn="f", delay=60, debounce=8)
    assert round(scheduler.status("d").run_at * 1000) >= before + 8000


def test_forgetting_a_debounced_task_removes_its_burst(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("d", fn="f", debounce=8)
    assert scheduler.cancel("d") is State.CANCELLED
    assert redis_client.hexists(scheduler.keys.debounce, "d")
    assert scheduler.purge_tasks(["d"]) == 1
    assert not redis_client.exists(scheduler.keys.debounce)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"dedupe": 1}, "dedupe"),
        ({"dedupe_window": -1}, "dedupe_window"),
        ({"dedupe_window": float("nan")}, "dedupe_window"),
        ({"debounce": -0.5}, "debounce"),
        ({"debounce": "5"}, "debounce"),
        ({"debounce": 5, "dedupe": True}, "debounce"),
        ({"debounce": 5, "dedupe_window": 3}, "debounce"),
    ],
)
def test_bad_admission_options_are_refused_naming_the_field_and_write_nothing(
    sync_scheduler: Scheduler, redis_client: redis.Redis, options: dict[str, Any], field: str
) -> None:
    sync_scheduler.schedule("a", fn="f")
    before = namespace_keys(redis_client, sync_scheduler.keys.namespace)
    with pytest.raises(InvalidArgument) as err:
        sync_scheduler.schedule("a", fn="f", **options)
    assert err.value.field == field
    assert namespace_keys(redis_client, sync_scheduler.keys.namespace) == before


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (" dedupe=-1", "BADARG spec of a options must be"),
        (" due=5", "BADARG spec of a unknown option due"),
        (" ttl=5 deadline=9", "BADARG ttl of a cannot be combined with deadline"),
        (" deadline=-5", "BADARG spec of a options must be"),
        (" dedupe=1 dedupe=2", "BADARG dedupe of a given twice"),
        (" dedupe=99999999999999999", "BADARG dedupe_window of a out of range"),
        (" debounce=9007199254740992", "BADARG debounce of a out of range"),
        (" dedupe=0 debounce=5", "BADARG debounce of a cannot be combined with dedupe"),
        ("dedupe=0", "BADARG spec of a options must be"),
    ],
)
def test_the_script_refuses_bad_option_tokens_and_writes_nothing(
    sync_scheduler: Scheduler, redis_client: redis.Redis, suffix: str, message: str
) -> None:
    sync_scheduler.schedule("a", fn="f", delay=5)
    before = namespace_keys(redis_client, sync_scheduler.keys.namespace)
    payload = b"\x81\xa2fn\xa1f"
    keys = sync_scheduler.keys.for_script("schedule")
    with pytest.raises(redis.ResponseError) as err:
        redis_client.eval(
            scripts.source("schedule"),
            len(keys),
            *keys,
            1000,
            1,
            "a",
            "in 0 0 1 1000 0 0 0" + suffix,
            payload,
        )
    assert str(err.value).startswith(message)
    assert namespace_keys(redis_client, sync_scheduler.keys.namespace) == before


def test_racing_producers_with_dedupe_leave_exactly_one_version_per_id(
    redis_server: Any, namespace: str
) -> None:
    ids = [f"job-{i}" for i in range(20)]
    versions: dict[str, set[int]] = {i: set() for i in ids}
    created: dict[str, int] = dict.fromkeys(ids, 0)
    lock = threading.Lock()
    start = threading.Barrier(8)

    def producer() -> None:
        with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
            start.wait()
            for _ in range(3):
                got = s.admit_many([TaskSpec(i, "f", dedupe=True) for i in ids])
                with lock:
                    for a in got:
                        versions[a.task_id].add(a.version)
                        created[a.task_id] += a.created

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        for i in ids:
            assert len(versions[i]) == 1 and created[i] == 1
            assert s.status(i).version in versions[i]
        assert s.stats()["counts"]["ready"] == len(ids)


def test_racing_producers_with_debounce_start_one_run_within_max_wait(
    redis_server: Any, namespace: str, redis_client: redis.Redis
) -> None:
    start = threading.Barrier(6)
    before = server_ms(redis_client)

    def producer() -> None:
        with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
            start.wait()
            for _ in range(10):
                s.schedule("d", fn="f", delay=30, debounce=0.3)

    threads = [threading.Thread(target=producer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        info = s.status("d")
        first = int(cast(bytes, redis_client.hget(s.keys.debounce, "d")).split()[1])
        assert before <= first and round(info.run_at * 1000) == first + 300
        time.sleep(0.4)
        got = s.next(W)
        assert isinstance(got, Claim) and got.task_id == "d"
        assert not isinstance(s.next(W), Claim)
        assert s.stats()["counts"]["running"] == 1


def test_the_cli_schedule_dedupes_and_says_when_it_kept_a_version(
    redis_server: Any, namespace: str
) -> None:
    def run(*args: str) -> Any:
        return cli_invoke(redis_server, namespace, "schedule", "a", "--fn", "f", *args)

    first = run("--dedupe")
    assert first.exit_code == 0 and first.stdout.strip() == "1" and first.stderr == ""
    kept = run("--dedupe", "--args", "[2]")
    assert kept.exit_code == 0 and kept.stdout.strip() == "1"
    assert "kept the existing version 1" in kept.stderr
    assert run().stdout.strip() == "2"
    assert run("--dedupe-window", "1m").stdout.strip() == "2"


def test_the_cli_submit_debounces_within_max_wait(
    redis_server: Any, namespace: str, redis_client: redis.Redis
) -> None:
    before = server_ms(redis_client)
    for _ in range(2):
        got = cli_invoke(
            redis_server, namespace, "submit", "d", "--fn", "f", "--delay", "1h",
            "--debounce", "10s",
        )  # fmt: skip
        assert got.exit_code == 0, got.stderr
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        info = s.status("d")
        assert info.version == 2
        assert before + 10000 <= round(info.run_at * 1000) <= server_ms(redis_client) + 10000
    bad = cli_invoke(redis_server, namespace, "schedule", "x", "--fn", "f", "--debounce", "-1s")
    assert bad.exit_code != 0


def test_the_raw_reply_gets_flags_only_when_a_spec_has_an_option(
    sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    keys = sync_scheduler.keys.for_script("schedule")
    payload = b"\x81\xa2fn\xa1f"

    def call(*specs: tuple[str, str]) -> list[Any]:
        args: list[Any] = [1000, len(specs)]
        for task_id, spec in specs:
            args += [task_id, spec, payload]
        return cast(
            list[Any], redis_client.eval(scripts.source("schedule"), len(keys), *keys, *args)
        )

    assert call(("a", "in 0 0 1 1000 0 0 0")) == [0, 1]
    assert call(("a", "in 0 0 1 1000 0 0 0 dedupe=0"), ("b", "in 0 0 1 1000 0 0 0")) == [
        0,
        1,
        2,
        b"kn",
    ]
    assert call(("c", "in 0 0 1 1000 0 0 0 ttl=1000")) == [0, 3, b"n"]
