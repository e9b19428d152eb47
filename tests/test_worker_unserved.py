"""Tasks whose function a worker does not serve (§8): handed back unstarted, with no
attempt spent and without spinning, and failed only after ``unserved_timeout`` in which
no live worker of the namespace served the function. Two real workers, real Redis."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator
from typing import cast

import pytest
import redis

from distsched import Claim, Scheduler, State, Wait, Worker, current_task
from distsched.errors import InvalidArgument
from tests.conftest import running
from tests.test_worker import wait_state, wait_until

LEASE_S = 0.6


@pytest.fixture
def fast(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    yield s
    s.close()


def test_a_worker_announces_the_functions_it_serves_before_it_claims(
    fast: Scheduler, redis_client: redis.Redis
) -> None:
    fast.schedule("one", fn="f")
    claimed_at: list[float] = []

    def f() -> None:
        claimed_at.append(fast.server_time())

    worker = Worker(fast, {"f": f, "g": f})
    with running(worker):
        wait_state(fast, "one", State.SUCCEEDED)
        served = {
            k.decode(): int(v) / 1000
            for k, v in cast(dict[bytes, bytes], redis_client.hgetall(fast.keys.served)).items()
        }
    assert set(served) == {"f", "g"}
    assert served["f"] <= claimed_at[0]
    assert fast.keys.served in fast.keys.all_keys()


def test_a_task_whose_function_only_a_busy_worker_serves_waits_for_it_and_spends_no_attempt(
    fast: Scheduler,
) -> None:
    release_blocker = threading.Event()
    ran_on: list[tuple[str, int]] = []

    def block() -> None:
        assert release_blocker.wait(20)

    def f() -> str:
        ran_on.append((threading.current_thread().name, current_task().attempt))
        return "served"

    serving = Worker(fast, {"f": f, "block": block}, concurrency=1, worker_id="serving")
    # unserved_timeout=0: it would fail the task at once if no live worker served f.
    other = Worker(fast, {"g": f}, concurrency=2, worker_id="other", unserved_timeout=0)
    fast.schedule("blocker", fn="block")
    with running(serving):
        wait_state(fast, "blocker", State.RUNNING)
        with running(other):
            version = fast.schedule("t", fn="f")
            run_at = fast.status("t").run_at
            # Only the other worker has a free slot: it claims t and hands it back.
            wait_until(lambda: other.counts["unserved"] >= 2, 10, "two hand-backs of t")
            held = fast.status("t")
            assert (held.state, held.version, held.attempt) in {
                (State.READY, version, 0),
                (State.RUNNING, version, 1),  # claimed again right now
            }
            assert held.run_at == run_at and held.error is None
            release_blocker.set()
            info = wait_state(fast, "t", State.SUCCEEDED, State.FAILED)
        claims_of_other = other.counts["claimed"]
    assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 1, "served")
    assert ran_on == [(ran_on[0][0], 1)]
    assert other.counts["failed"] == 0 and other.counts["succeeded"] == 0
    assert other.counts["unserved"] == claims_of_other
    # Each hand-back is due again only after a delay: a worker that cannot run the task
    # claims it a handful of times per second at most, not in a tight loop.
    assert claims_of_other < 20


def test_a_task_whose_function_no_live_worker_serves_fails_only_after_the_unserved_timeout(
    fast: Scheduler,
) -> None:
    timeout = 1.0
    worker = Worker(fast, {"g": lambda: None}, concurrency=2, unserved_timeout=timeout)
    with running(worker):
        fast.schedule("orphan", fn="nobody")
        info = wait_state(fast, "orphan", State.FAILED, State.SUCCEEDED, timeout=15)
    assert info.state is State.FAILED
    assert info.error is not None
    assert "nobody" in info.error and "no live worker" in info.error
    # Not before the timeout, on the server's clock.
    assert info.updated_at - info.run_at >= timeout
    assert worker.counts["failed"] == 1
    assert 1 <= worker.counts["unserved"] < 10


def test_a_function_last_announced_longer_ago_than_the_timeout_counts_as_unserved(
    fast: Scheduler, redis_client: redis.Redis
) -> None:
    long_ago = int((fast.server_time() - 600) * 1000)
    redis_client.hset(fast.keys.served, "retired", long_ago)
    fast.schedule("old", fn="retired")
    worker = Worker(fast, {"g": lambda: None}, unserved_timeout=0.5)
    with running(worker):
        info = wait_state(fast, "old", State.FAILED, State.SUCCEEDED)
    assert info.state is State.FAILED
    assert info.error is not None and "retired" in info.error
    assert re.search(r"last served: 60\ds ago", info.error)


def test_a_delayed_hand_back_keeps_run_at_and_the_attempt_and_is_due_only_after_the_delay(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("back", fn="f")
    run_at = scheduler.status("back").run_at
    claim = scheduler.next("w")
    assert isinstance(claim, Claim) and claim.attempt == 1
    released_at = scheduler.server_time()
    assert scheduler.release([claim], delay=0.5) == 1
    info = scheduler.status("back")
    assert (info.state, info.attempt, info.run_at, info.worker) == (State.READY, 0, run_at, None)
    wait = scheduler.next("w")
    assert isinstance(wait, Wait) and wait.reason == "not_due"
    assert wait.delay is not None and 0 < wait.delay <= 0.5
    wait_until(lambda: isinstance(scheduler.next("w"), Claim), 5, "the task to be due again")
    assert scheduler.server_time() >= released_at + 0.5 - 0.002
    again = scheduler.status("back")
    assert (again.state, again.attempt) == (State.RUNNING, 1)


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, "1", None, True])
def test_a_bad_hand_back_delay_is_refused_naming_it(scheduler: Scheduler, delay: object) -> None:
    scheduler.schedule("back", fn="f")
    claim = scheduler.next("w")
    assert isinstance(claim, Claim)
    with pytest.raises(InvalidArgument) as info:
        scheduler.release([claim], delay=delay)  # type: ignore[arg-type]
    assert info.value.field == "delay"
    assert scheduler.status("back").state is State.RUNNING
