"""Deadlines: a task not started by its deadline (or ttl) ends cancelled as expired."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any, cast

import pytest
import redis

from distsched import Claim, Scheduler, State, TaskSpec
from distsched.errors import InvalidArgument
from distsched.model import Reason
from tests.conftest import namespace_keys
from tests.test_cli import invoke as cli_invoke

EXPIRED = "expired: not started by its deadline"
W = "worker-1"


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every behaviour test here runs against both shells, the sync and the asyncio one."""
    return api


def test_housekeeping_expires_a_queued_task_past_its_deadline(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("late", fn="f", delay=60, ttl=0.05)
    scheduler.schedule("fine", fn="f", delay=60, ttl=60)
    assert scheduler.housekeeping()["expired"] == 0
    time.sleep(0.1)
    assert scheduler.housekeeping()["expired"] == 1
    info = scheduler.status("late")
    assert info.state is State.CANCELLED and info.error == EXPIRED
    assert scheduler.status("fine").state is State.READY
    assert redis_client.zcard(scheduler.keys.deadlines) == 1
    assert scheduler.stats()["counts"]["cancelled"] == 1


def test_a_claim_expires_a_due_task_past_its_deadline_instead_of_starting_it(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("late", fn="f", ttl=0.05)
    scheduler.schedule("next", fn="f", delay=0.06)
    time.sleep(0.1)
    got = scheduler.next(W)
    assert isinstance(got, Claim) and got.task_id == "next"
    info = scheduler.status("late")
    assert info.state is State.CANCELLED and info.error == EXPIRED
    assert info.attempt == 0


def test_a_task_started_before_its_deadline_runs_to_the_end_and_drops_its_entry(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f", deadline=time.time() + 0.2)
    claim = scheduler.next(W)
    assert isinstance(claim, Claim)
    assert redis_client.zcard(scheduler.keys.deadlines) == 0
    time.sleep(0.25)
    assert scheduler.housekeeping()["expired"] == 0
    scheduler.complete(claim, 1)
    assert scheduler.status("a").state is State.SUCCEEDED


def test_dependents_of_an_expired_task_are_blocked_with_it_as_the_cause(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many(
        [
            TaskSpec("root", "f", delay=60, deadline=dt.datetime.now(dt.UTC)),
            TaskSpec("child", "f", deps=["root"]),
            TaskSpec("grandchild", "f", deps=["child"]),
        ]
    )
    time.sleep(0.01)
    assert scheduler.housekeeping()["expired"] == 1
    for task_id in ("child", "grandchild"):
        info = scheduler.status(task_id)
        assert info.state is State.BLOCKED
        assert info.blocked_by is not None and info.blocked_by.root == "root"
    assert scheduler.status("root").error == EXPIRED
    assert scheduler.explain("grandchild").reasons == (Reason.BLOCKED, Reason.EXPIRED)
    root = scheduler.explain("root")
    assert root.reasons == (Reason.CANCELLED, Reason.EXPIRED) and root.error == EXPIRED
    scheduler.schedule("plain", fn="f")
    scheduler.cancel("plain")
    assert scheduler.explain("plain").reasons == (Reason.CANCELLED,)


def test_a_pending_task_expires_too(scheduler: Scheduler) -> None:
    scheduler.schedule("dep", fn="f", delay=60)
    scheduler.schedule("waiting", fn="f", deps=["dep"], ttl=0)
    time.sleep(0.01)
    assert scheduler.housekeeping()["expired"] == 1
    assert scheduler.status("waiting").state is State.CANCELLED


def test_a_retry_of_an_expired_task_has_no_deadline_unless_given(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f", ttl=0)
    time.sleep(0.01)
    scheduler.housekeeping()
    assert scheduler.status("a").state is State.CANCELLED
    version = scheduler.retry("a")
    assert redis_client.zcard(scheduler.keys.deadlines) == 0
    time.sleep(0.01)
    assert scheduler.housekeeping()["expired"] == 0
    claim = scheduler.next(W)
    assert isinstance(claim, Claim) and claim.version == version
    assert scheduler.status("a").error is None


def test_a_replaced_version_does_not_inherit_the_old_deadline(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f", delay=60, ttl=0.02)
    scheduler.schedule("a", fn="f")
    time.sleep(0.05)
    assert scheduler.housekeeping()["expired"] == 0
    assert isinstance(scheduler.next(W), Claim)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"ttl": -1}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"deadline": -5}, "deadline"),
        ({"deadline": dt.datetime(2030, 1, 1)}, "deadline"),
        ({"deadline": "soon"}, "deadline"),
        ({"deadline": 2e9, "ttl": 5}, "ttl"),
    ],
)
def test_bad_deadlines_are_refused_naming_the_field_and_write_nothing(
    sync_scheduler: Scheduler, redis_client: redis.Redis, options: dict[str, Any], field: str
) -> None:
    sync_scheduler.schedule("a", fn="f")
    before = namespace_keys(redis_client, sync_scheduler.keys.namespace)
    with pytest.raises(InvalidArgument) as err:
        sync_scheduler.schedule("a", fn="f", **options)
    assert err.value.field == field
    assert namespace_keys(redis_client, sync_scheduler.keys.namespace) == before


def test_racing_workers_never_start_a_task_after_its_deadline(
    redis_server: Any, namespace: str, redis_client: redis.Redis
) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        s.schedule_many([TaskSpec(f"t{i}", "f", ttl=0.002 * i) for i in range(200)])
        entries = cast(
            list[tuple[bytes, float]], redis_client.zrange(s.keys.deadlines, 0, -1, withscores=True)
        )
        deadlines = {member[14:].decode(): score for member, score in entries}
    assert len(deadlines) == 200
    go = threading.Barrier(4)

    def worker(n: int) -> None:
        with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
            go.wait()
            for _ in range(40):
                s.next(f"w{n}")
                time.sleep(0.005)
                if n == 0:
                    s.housekeeping()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.45)  # every deadline has passed: the rest expire now
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        s.housekeeping()
        counts = s.stats()["counts"]
        assert counts["running"] + counts["cancelled"] == 200
        assert counts["running"] > 0 and counts["cancelled"] > 0
        for i in range(200):
            info = s.status(f"t{i}")
            if info.state is State.RUNNING:
                # Claimed (its last transition) strictly before its deadline.
                assert info.updated_at * 1000 < deadlines[f"t{i}"]
                assert info.error is None
            else:
                assert info.state is State.CANCELLED
                assert info.error == EXPIRED and info.attempt == 0
        assert redis_client.zcard(s.keys.deadlines) == 0


def test_the_cli_schedules_with_a_ttl_or_a_deadline(
    redis_server: Any, namespace: str, redis_client: redis.Redis
) -> None:
    for args in (["--ttl", "30s"], ["--deadline", "2030-01-01T00:00:00+00:00"]):
        got = cli_invoke(redis_server, namespace, "schedule", "a", "--fn", "f", *args)
        assert got.exit_code == 0, got.stderr
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        entries = cast(
            list[tuple[bytes, float]], redis_client.zrange(s.keys.deadlines, 0, -1, withscores=True)
        )
        # The entry of version 1 (ttl) stays until its time; version 2 has the deadline.
        assert [(m[14:], m[:14]) for m, _ in entries][-1] == (b"a", b"%014x" % 2)
        assert entries[-1][1] == 1893456000000
    bad = cli_invoke(redis_server, namespace, "schedule", "b", "--fn", "f", "--deadline", "x")
    assert bad.exit_code != 0 and "deadline" in bad.stderr


def test_the_cli_status_and_why_say_a_task_expired(redis_server: Any, namespace: str) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        s.schedule("late", fn="f", delay=60, ttl=0)
        s.schedule("after", fn="f", deps=["late"])
        time.sleep(0.01)
        assert s.expire() == 1
    status = cli_invoke(redis_server, namespace, "status", "late")
    assert status.exit_code == 0 and f"error:            {EXPIRED}" in status.stdout
    explained = cli_invoke(redis_server, namespace, "why", "late")
    assert "it expired: it was not started by its deadline" in explained.stdout
    blocked = cli_invoke(redis_server, namespace, "why", "after")
    assert "its root cause expired" in blocked.stdout
