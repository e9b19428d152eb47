"""The test mode: an in-process scheduler, a clock moved by the test, and a run of every
due task until idle (distsched.testing). The clock is the namespace's own."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest
import redis

from distsched import Scheduler, State, Worker
from distsched.errors import InvalidArgument
from distsched.model import Claim, Outcome, Wait
from distsched.tasks import Tasks
from distsched.testing import Harness, harness
from distsched.worker.link import WorkerLink
from tests.conftest import RedisServer, running
from tests.test_worker import wait_state


def make_tasks(log: list[str]) -> Tasks:
    tasks = Tasks()

    @tasks.task
    def note(text: str) -> str:
        log.append(text)
        return text.upper()

    @tasks.task(max_attempts=2, backoff=30)
    def flaky(text: str) -> str:
        log.append(text)
        if log.count(text) == 1:
            raise RuntimeError("first try fails")
        return text

    return tasks


@pytest.fixture
def log() -> list[str]:
    return []


@pytest.fixture
def h(log: list[str]) -> Iterator[Harness]:
    with harness(make_tasks(log)) as h:
        yield h


def test_a_delayed_task_runs_only_once_the_clock_reaches_it(h: Harness, log: list[str]) -> None:
    h.scheduler.schedule("later", fn="note", args=["later"], delay=3600)
    h.scheduler.schedule("now", fn="note", args=["now"])
    assert h.run_until_idle() == {"claimed": 1, "succeeded": 1}
    assert log == ["now"]
    h.advance(timedelta(minutes=59))
    assert h.run_until_idle() == {}
    h.advance(60)
    assert h.run_until_idle() == {"claimed": 1, "succeeded": 1}
    assert log == ["now", "later"]
    assert h.scheduler.result("later", timeout=1) == "LATER"


def test_a_retry_waits_its_backoff_on_the_moved_clock(h: Harness, log: list[str]) -> None:
    h.scheduler.schedule("f", fn="flaky", args=["x"], max_attempts=2, backoff=30)
    assert h.run_until_idle() == {"claimed": 1, "failed": 1}
    info = h.scheduler.status("f")
    assert (info.state, info.attempt) == (State.READY, 1)
    h.advance(29)
    assert h.run_until_idle() == {}
    h.advance(1)
    assert h.run_until_idle() == {"claimed": 1, "succeeded": 1}
    assert h.scheduler.status("f").state is State.SUCCEEDED


def test_dependents_run_in_the_same_run_until_idle(h: Harness, log: list[str]) -> None:
    h.scheduler.schedule("a", fn="note", args=["a"])
    h.scheduler.schedule("b", fn="note", args=["b"], deps=["a"])
    h.scheduler.schedule("c", fn="note", args=["c"], deps=["b"])
    assert h.run_until_idle()["succeeded"] == 3
    assert log == ["a", "b", "c"]


def test_a_deadline_passes_on_the_moved_clock(h: Harness, log: list[str]) -> None:
    h.scheduler.schedule("d", fn="note", args=["d"], delay=120, ttl=60)
    h.advance(121)
    h.run_until_idle()
    info = h.scheduler.status("d")
    assert info.state is State.CANCELLED and "deadline" in (info.error or "")
    assert log == []


def test_a_recurring_schedule_fires_its_slots_as_the_clock_moves(
    h: Harness, log: list[str]
) -> None:
    h.scheduler.add_schedule("hourly", "note", args=["tick"], interval=3600)
    assert h.run_until_idle() == {}
    h.advance(timedelta(hours=1))
    h.run_until_idle()
    assert log == ["tick"]
    h.advance(timedelta(hours=1))
    h.run_until_idle()
    assert log == ["tick", "tick"]
    assert h.scheduler.get_schedule("hourly").fired == 2


def test_the_clock_moves_only_forward_and_says_which_argument_is_wrong(h: Harness) -> None:
    before = h.now()
    for bad in (-1, math.nan, math.inf, True, "60"):
        with pytest.raises(InvalidArgument, match="by"):
            h.advance(bad)  # type: ignore[arg-type]
    h.advance(timedelta(days=2))
    assert timedelta(days=2) <= h.now() - before < timedelta(days=2, seconds=5)


def test_a_clock_is_one_namespace_s_own(redis_server: RedisServer) -> None:
    client = redis_server.client()
    try:
        with harness({"f": len}, client=client) as a, harness({"f": len}, client=client) as b:
            a.advance(timedelta(days=365))
            ahead = (a.now() - b.now()).total_seconds()
            assert abs(ahead - 365 * 86400) < 5
            assert abs(b.scheduler.server_time() - time.time()) < 5
        # The harness leaves a given client open.
        assert client.ping()
    finally:
        client.close()


def test_a_junk_clock_field_counts_as_no_offset(redis_server: RedisServer) -> None:
    client = redis_server.client()
    try:
        with harness({"f": len}, client=client) as h:
            client.hset(h.scheduler.keys.meta, "clock_ms", "junk")
            assert abs(h.scheduler.server_time() - time.time()) < 5
            h.scheduler.schedule("t", fn="f", args=["abc"])
            assert h.run_until_idle() == {"claimed": 1, "succeeded": 1}
    finally:
        client.close()


def test_leases_follow_the_moved_clock_while_a_worker_runs(
    redis_client: redis.Redis, namespace: str
) -> None:
    # Heartbeats extend leases on the namespace's clock: a run longer than the lease,
    # after the clock moved a day, keeps its lease and succeeds on its first attempt.
    s = Scheduler(redis_client, namespace=namespace, lease_s=0.6)
    try:
        h = Harness(s, {"slow": time.sleep})
        h.advance(timedelta(days=1))
        s.schedule("slow", fn="slow", args=[2.0])
        with running(Worker(s, {"slow": time.sleep})):
            wait_state(s, "slow", State.SUCCEEDED, timeout=20)
        assert s.status("slow").attempt == 1
    finally:
        s.close()


class SlowClaims(Scheduler):
    """Each claim's reply comes 0.3 s after the claim ran in Redis."""

    def claim(
        self, n: int, worker_id: str, *, listening: bool = False, request_id: str | None = None
    ) -> tuple[list[Claim], Wait | None]:
        got = super().claim(n, worker_id, listening=listening, request_id=request_id)
        time.sleep(0.3)
        return got


class LateReports(WorkerLink):
    """Each batch of completions goes out 0.1 s after the reporter has it."""

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        time.sleep(0.1)
        return super().complete_encoded(reports)


class LateReportsWorker(Worker):
    link_class = LateReports


def test_run_until_idle_runs_what_an_outcome_made_due_while_a_claim_was_on_its_way(
    redis_client: redis.Redis, namespace: str
) -> None:
    # The second claim runs in Redis before the parent's outcome lands, and its empty
    # reply comes back after that outcome made the child due.
    s = SlowClaims(redis_client, namespace=namespace, lease_s=5.0)
    try:
        s.schedule("parent", fn="note", args=["p"])
        s.schedule("child", fn="note", args=["c"], deps=["parent"])
        log: list[str] = []
        LateReportsWorker(s, {"note": log.append}, concurrency=1).run_until_idle()
        assert log == ["p", "c"]
        assert s.status("child").state is State.SUCCEEDED
    finally:
        s.close()
