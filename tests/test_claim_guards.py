"""Claims at their edges, on a real Redis: deadlines and turns in a fair namespace, junk
in the counters, and a failover's read-only reply."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis

from distsched import Claim, Scheduler, State, TaskSpec
from distsched.errors import ScriptError, Unavailable
from tests.conftest import RedisServer, free_port

EXPIRED = "expired: not started by its deadline"


# --------------------------------------------------------------------------- fair claims


@pytest.mark.parametrize("key", ["tenant", None], ids=["keyed", "default-key"])
def test_a_fair_namespace_expires_a_due_task_past_its_deadline_instead_of_starting_it(
    scheduler: Scheduler, key: str | None
) -> None:
    scheduler.set_key("other", weight=1)  # the namespace claims by turns from now on
    scheduler.schedule("late", fn="f", key=key, ttl=0.05)
    scheduler.schedule("next", fn="f", key=key, delay=0.06)
    time.sleep(0.1)
    claims, _ = scheduler.claim(2, "w")
    assert [c.task_id for c in claims] == ["next"]
    info = scheduler.status("late")
    assert info.state is State.CANCELLED and info.error == EXPIRED
    assert info.attempt == 0


def test_a_key_back_from_waiting_for_its_due_time_gets_its_turns_without_credit(
    scheduler: Scheduler,
) -> None:
    """Claims alternate between a busy key and one whose work came due later: the
    second gets no extra claims for the time it had nothing due."""
    s = scheduler
    s.schedule_many([TaskSpec(f"a{i}", "f", key="a") for i in range(30)])
    s.schedule_many([TaskSpec(f"b{i}", "f", key="b", delay=1.0) for i in range(30)])
    first = [str(claim_one(s).key) for _ in range(12)]
    assert first == ["a"] * 12  # b has nothing due: it waits
    time.sleep(1.1)
    keys = [str(claim_one(s).key) for _ in range(12)]
    assert sorted(keys) == ["a"] * 6 + ["b"] * 6, keys
    assert max(len(list(run)) for _, run in itertools.groupby(keys)) == 1, keys


def claim_one(s: Scheduler) -> Claim:
    claims, _ = s.claim(1, "w")
    assert len(claims) == 1
    return claims[0]


# --------------------------------------------------------------------------- junk counters


def test_a_counter_beyond_64_bits_is_repaired_before_a_claim_counts_on_it(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    s = scheduler
    s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(3)])
    junk = "9" * 19  # digits only, but past 2**63 - 1: HINCRBY refuses it
    redis_client.hset(s.keys.meta, "count:running", junk)
    claims, _ = s.claim(3, "w")
    assert sorted(c.task_id for c in claims) == ["t0", "t1", "t2"]
    meta: Any = redis_client.hmget(s.keys.meta, "count:running", "corrupt:count:running")
    assert meta == [b"3", junk.encode()]
    assert all(s.status(f"t{i}").state is State.RUNNING for i in range(3))


# --------------------------------------------------------------------------- failover


def test_a_read_only_reply_during_a_failover_is_a_retryable_error(own_redis: RedisServer) -> None:
    admin = own_redis.client()
    s = Scheduler(own_redis.client(), namespace="ns")
    try:
        s.schedule("before", fn="f")
        # The node became a replica (of a master not reachable yet): it refuses writes.
        admin.replicaof("127.0.0.1", free_port())
        for call in (lambda: s.schedule("during", fn="f"), lambda: s.claim(1, "w")):
            with pytest.raises(Unavailable) as info:
                call()
            assert not isinstance(info.value, ScriptError)
            assert isinstance(info.value, redis.ConnectionError)  # what callers retry on
        admin.replicaof("NO", "ONE")
        s.schedule("after", fn="f")
        claims, _ = s.claim(2, "w")
        assert sorted(c.task_id for c in claims) == ["after", "before"]
    finally:
        s.close()
        s.client.close()
        admin.close()
