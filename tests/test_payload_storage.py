"""Where a task's payload is stored: in its record when small, else the payloads hash.

Whichever place holds it, the worker gets the payload of the version it claimed, status
shows it, a retry keeps it, a new version replaces it, and retention removes it.
"""

from __future__ import annotations

import redis

from distsched import Claim, Scheduler, State, TaskSpec
from distsched.wire import payload, records
from tests.conftest import INLINE_PAYLOAD_MAX, stored_payload

SMALL = ["s" * 10]
# A payload past the record's limit once encoded.
LARGE = ["x" * (INLINE_PAYLOAD_MAX + 1)]


def payload_hash_holds(client: redis.Redis, s: Scheduler, task_id: str) -> bool:
    return bool(client.hexists(s.keys.payloads, task_id))


def claim(s: Scheduler, task_id: str) -> Claim:
    got = s.ready(1, "w")
    assert [c.task_id for c in got] == [task_id]
    return got[0]


def test_a_small_payload_is_kept_in_the_record_and_a_large_one_in_the_payloads_hash(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    s = scheduler
    s.schedule_many([TaskSpec("small", "f", args=SMALL), TaskSpec("large", "f", args=LARGE)])
    small, large = (payload.encode_payload("f", args, {}) for args in (SMALL, LARGE))
    assert records.decode_record(redis_client.hget(s.keys.tasks, "small")).payload == small  # type: ignore[arg-type]
    assert records.decode_record(redis_client.hget(s.keys.tasks, "large")).payload is None  # type: ignore[arg-type]
    assert not payload_hash_holds(redis_client, s, "small")
    assert redis_client.hget(s.keys.payloads, "large") == large
    assert (s.status("small").args, s.status("large").args) == (tuple(SMALL), tuple(LARGE))
    assert s.explain("small").task_id == "small"
    claims = s.ready(2, "w")
    assert {c.task_id: c.args for c in claims} == {"small": tuple(SMALL), "large": tuple(LARGE)}
    # Every transition writes the record again: the payload stays with it.
    for c in claims:
        assert s.complete(c).value == "applied"
    assert stored_payload(redis_client, s.keys, "small") == small
    assert stored_payload(redis_client, s.keys, "large") == large
    assert s.status("small").state is State.SUCCEEDED and s.status("small").args == tuple(SMALL)


def test_a_new_version_replaces_the_payload_wherever_each_version_keeps_it(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    s = scheduler
    s.schedule("t", fn="f", args=LARGE)
    s.schedule("t", fn="g", args=SMALL)  # large -> small: the hash entry goes
    assert not payload_hash_holds(redis_client, s, "t")
    assert (s.status("t").fn, s.status("t").args) == ("g", tuple(SMALL))
    s.schedule("t", fn="h", args=LARGE)  # small -> large: the record holds none
    assert records.decode_record(redis_client.hget(s.keys.tasks, "t")).payload is None  # type: ignore[arg-type]
    c = claim(s, "t")
    assert (c.fn, c.args) == ("h", tuple(LARGE))


def test_a_retry_and_its_cascade_keep_each_tasks_payload(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    s = scheduler
    s.schedule("parent", fn="f", args=SMALL)
    s.submit("child", fn="g", args=LARGE, deps=["parent"])
    s.submit("grandchild", fn="h", args=SMALL, deps=["child"])
    assert s.fail(claim(s, "parent"), "boom").value == "applied"
    assert s.status("grandchild").state is State.BLOCKED
    s.retry("parent", cascade=True)
    assert s.complete(claim(s, "parent")).value == "applied"
    c = claim(s, "child")
    assert (c.fn, c.args) == ("g", tuple(LARGE))
    assert s.complete(c).value == "applied"
    c = claim(s, "grandchild")
    assert (c.fn, c.args) == ("h", tuple(SMALL))


def test_a_claim_sent_again_gets_the_same_payloads_from_either_place(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.schedule_many([TaskSpec("small", "f", args=SMALL), TaskSpec("large", "f", args=LARGE)])
    first, _ = s.claim(2, "w", request_id="r1")
    again, _ = s.claim(2, "w", request_id="r1")
    assert [(c.task_id, c.args) for c in again] == [(c.task_id, c.args) for c in first]
    assert {c.task_id: c.args for c in first} == {"small": tuple(SMALL), "large": tuple(LARGE)}
