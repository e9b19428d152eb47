"""The short way for plain tasks (lua/enqueue.lua): the same tasks as schedule.lua writes,
for less work, and schedule.lua whenever a task or the namespace is not plain."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsched import Scheduler, State, TaskSpec, scripts
from distsched.errors import ScriptError
from distsched.keys import Keys
from distsched.ops import protocol
from distsched.ops.base import once
from distsched.wire.calls import Call, enqueue_call, fail_call, schedule_call
from tests.conftest import RedisServer, namespace_keys, script_calls

# An epoch-ms instant in the future: 'at' times make the two scripts' writes comparable.
LATER_MS = 4_000_000_000_000


class Recording(Scheduler):
    """A scheduler that keeps the name of every script it calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def _request(self, request: protocol.Request) -> Any:
        if isinstance(request, Call):
            self.calls.append(request.script)
        return super()._request(request)


@pytest.fixture
def rec(redis_client: redis.Redis, namespace: str) -> Iterator[Recording]:
    s = Recording(redis_client, namespace=namespace)
    yield s
    s.close()


def send(s: Scheduler, call: Call) -> list[Any]:
    """One script call as it is: its reply after the propagation count."""
    left, values = s._drive(once(call))
    assert left == 0
    return values


def comparable(dump: dict[bytes, object], namespace: str) -> dict[bytes, object]:
    """A namespace's keys with its name taken out of them and each record's time of its
    last change (the one value two calls cannot share) taken out of the records."""
    out: dict[bytes, object] = {}
    prefix = f"ds:{{{namespace}}}:".encode()
    for key, value in dump.items():
        name = key.removeprefix(prefix)
        if name == b"tasks":
            assert isinstance(value, dict)
            records = {}
            for task_id, raw in value.items():
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(raw)
                fields = [unpacker.unpack() for _ in range(12)]
                del fields[8]  # updated - run_at
                records[task_id] = (fields, raw[unpacker.tell() :])
            value = records
        out[name] = value
    return out


plain_specs = st.lists(
    st.builds(
        lambda i, priority, attempts, backoff, run_at, size: TaskSpec(
            f"id-{i}-é",
            "f",
            args=["x" * size],
            priority=priority,
            max_attempts=attempts,
            backoff=backoff,
            run_at=run_at,
        ),
        st.integers(0, 10**6),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(1, 10**6),
        st.integers(0, 3600),
        st.integers(0, 4_000_000_000).map(float),
        # Payloads on both sides of the size stored inline in the record (512 bytes).
        st.integers(0, 600),
    ),
    min_size=1,
    max_size=20,
    unique_by=lambda spec: spec.task_id,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=plain_specs)
def test_a_plain_batch_is_stored_exactly_as_the_schedule_script_stores_it(
    redis_server: RedisServer, specs: list[TaskSpec]
) -> None:
    client = redis_server.client()
    short, full = "e" + uuid.uuid4().hex[:10], "s" + uuid.uuid4().hex[:10]
    try:
        with Scheduler(client, namespace=short) as a, Scheduler(client, namespace=full) as b:
            versions = send(a, enqueue_call(a.keys, specs, 1 << 20))
            assert versions == list(range(1, len(specs) + 1))
            send(b, schedule_call(b.keys, specs, 1 << 20))
            assert comparable(namespace_keys(client, short), short) == comparable(
                namespace_keys(client, full), full
            )
    finally:
        for ns in (short, full):
            keys = list(client.scan_iter(match=f"ds:{{{ns}}}:*"))
            if keys:
                client.delete(*keys)
        client.close()


def test_a_plain_schedule_is_one_call_of_the_short_script(
    rec: Recording, redis_client: redis.Redis
) -> None:
    rec.schedule("warm", fn="f")
    rec.calls.clear()
    before = script_calls(redis_client)
    version = rec.schedule("a", fn="f", args=[1], delay=0)
    assert script_calls(redis_client) - before == 1
    assert rec.calls == ["enqueue"]
    status = rec.status("a")
    assert (status.state, status.version) == (State.READY, version)
    [claim] = [c for c in rec.ready(2, "w") if c.task_id == "a"]
    assert (claim.version, claim.args) == (version, (1,))


def test_a_plain_batch_is_one_call_with_versions_in_order(rec: Recording) -> None:
    versions = rec.schedule_many([TaskSpec(f"t{i}", "f", args=[i]) for i in range(50)])
    assert rec.calls == ["enqueue"]
    assert versions == list(range(1, 51))
    claims = rec.ready(50, "w")
    assert [c.task_id for c in claims] == [f"t{i}" for i in range(50)]
    assert rec.stats()["counts"]["running"] == 50


def test_a_task_with_an_option_or_a_dependency_goes_to_the_schedule_script(
    rec: Recording,
) -> None:
    rec.schedule("a", fn="f", dedupe=True)
    rec.schedule("b", fn="f", deps=["a"])
    rec.schedule_many([TaskSpec("c", "f"), TaskSpec("d", "f", ttl=60)])
    assert rec.calls == ["schedule", "schedule", "schedule"]


def test_scheduling_an_existing_id_replaces_it_through_the_schedule_script(
    rec: Recording,
) -> None:
    first = rec.schedule("a", fn="f", args=[1])
    second = rec.schedule("a", fn="f", args=[2])
    assert rec.calls == ["enqueue", "enqueue", "schedule"]
    assert second == first + 1
    assert rec.stats()["counts"]["ready"] == 1
    [claim] = rec.ready(5, "w")
    assert (claim.version, claim.args) == (second, (2,))


def test_a_fair_namespace_sends_plain_tasks_to_the_schedule_script_and_is_remembered(
    rec: Recording,
) -> None:
    rec.schedule("keyed", fn="f", key="tenant-a")  # the namespace turns fair
    rec.calls.clear()
    rec.schedule("a", fn="f")
    rec.schedule("b", fn="f")
    # The first plain task learns that the namespace needs schedule.lua; the next goes
    # there at once.
    assert rec.calls == ["enqueue", "schedule", "schedule"]
    claimed = {c.task_id for c in rec.ready(5, "w")}
    assert claimed == {"keyed", "a", "b"}


def test_the_priority_order_sends_plain_tasks_to_the_schedule_script(rec: Recording) -> None:
    rec.set_order("priority")
    rec.calls.clear()
    rec.schedule("low", fn="f", priority=1)
    rec.schedule("high", fn="f", priority=9)
    assert rec.calls[:2] == ["enqueue", "schedule"]
    assert [c.task_id for c in rec.ready(2, "w")] == ["high", "low"]


def test_a_waiting_propagation_job_sends_the_batch_to_the_schedule_script_which_settles_it(
    rec: Recording, redis_client: redis.Redis
) -> None:
    rec.schedule_many(
        [TaskSpec("root", "f")] + [TaskSpec(f"c{i}", "f", deps=["root"]) for i in range(3)]
    )
    [claim] = rec.ready(1, "w")
    call = fail_call(rec.keys, [(claim, "boom")])
    # A budget of one edge leaves a propagation job waiting, as a producer that stopped
    # part way would.
    left, _ = rec._drive(once(dataclasses.replace(call, args=[1, *call.args[1:]])))
    assert left == 1
    rec.calls.clear()
    rec.schedule("plain", fn="f")
    assert rec.calls == ["enqueue", "schedule"]
    assert redis_client.zcard(rec.keys.propagating) == 0
    assert rec.status("c2").state is State.BLOCKED


@pytest.mark.parametrize(
    ("counter", "junk"),
    [
        ("count:ready", "junk"),
        ("count:ready", "-5"),
        ("seq", "junk"),
        # An integer, but beyond what a version or a count may reach (19 digits).
        ("seq", "1234567890123456789"),
    ],
)
def test_a_counter_holding_junk_is_left_for_the_schedule_script_to_repair(
    rec: Recording, redis_client: redis.Redis, counter: str, junk: str
) -> None:
    rec.schedule("a", fn="f")
    redis_client.hset(rec.keys.meta, counter, junk)
    rec.calls.clear()
    version = rec.schedule("b", fn="f")
    assert rec.calls == ["enqueue", "schedule"]
    meta = redis_client.hgetall(rec.keys.meta)
    assert meta[f"corrupt:{counter}".encode()] == junk.encode()
    # The counter that held no junk was left as it was by the undone short call.
    if counter == "seq":
        assert meta[b"count:ready"] == b"2"
        assert 2 < version < 2**53
    else:
        assert meta[b"seq"] == b"2" and version == 2
        assert meta[b"count:ready"] == b"1"  # restarted at 0, then b
    assert rec.status("b").state is State.READY


def raw_enqueue(client: Any, s: Scheduler, args: list[Any]) -> Any:
    """enqueue.lua called as another language would: its keys and these arguments."""
    name = f"{scripts.library_name()}_enqueue"
    keys = s.keys.for_script("enqueue")
    return client.execute_command("FCALL", name, len(keys), *keys, *args)


GOOD = ["t", "in 0 0 1 1000", msgpack.packb({"fn": "f", "args": [1]})]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0"], "BADARG n must be in [1, 500]"),
        (["501", *GOOD], "BADARG n must be in [1, 500]"),
        (["x", *GOOD], "BADARG n must be an integer"),
        (["2", *GOOD], "BADARG ARGV length does not match the counts"),
        (["1", b"\xff", *GOOD[1:]], "BADARG task_id must be valid UTF-8"),
        (["1", "", *GOOD[1:]], "BADARG task_id"),
        (["1", "t", "in 0 0 1 1000 0 0 0", GOOD[2]], "BADARG spec of t must be"),
        (["1", "t", "soon 0 0 1 1000", GOOD[2]], "BADARG spec of t must be"),
        (["1", "t", "in 0 2147483648 1 1000", GOOD[2]], "BADARG priority out of range"),
        (["1", "t", "in 0 0 0 1000", GOOD[2]], "BADARG max_attempts out of range"),
        (["1", "t", "at 9007199254740992 0 1 1000", GOOD[2]], "BADARG run_at out of range"),
        (
            ["1", "t", "in 0 0 1 1000", msgpack.packb([1])],
            "BADARG payload of t must be a msgpack map",
        ),
        (
            ["1", "t", "in 0 0 1 1000", msgpack.packb({"fn": ""})],
            "BADARG payload of t field fn must be a non-empty string",
        ),
        (["1", *GOOD, "10"], "BADARG payload of t is 13 bytes, limit 10"),
        (["2", *GOOD, *GOOD], "BADARG task_id duplicated in batch: t"),
    ],
)
def test_the_short_script_refuses_bad_input_naming_the_field_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, args: list[Any], message: str
) -> None:
    if args[0] == "501":
        args = ["501"] + [v for i in range(501) for v in (f"t{i}", *GOOD[1:])]
        message = "BADARG n must be in [1, 500]"
    scheduler.schedule("loaded", fn="f")  # the library is loaded, the namespace not empty
    before = namespace_keys(redis_client, scheduler.keys.namespace)
    with pytest.raises(redis.ResponseError) as refused:
        raw_enqueue(redis_client, scheduler, args)
    assert str(refused.value).startswith(message)
    assert namespace_keys(redis_client, scheduler.keys.namespace) == before


def test_a_new_head_not_due_yet_wakes_one_idle_worker_and_so_does_a_task_due_now(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    channel = f"{scheduler.keys.prefix}w:idle-worker"
    untyped: Any = redis_client
    pubsub: Any = untyped.pubsub()
    try:
        pubsub.ssubscribe(channel)
        assert pubsub.get_sharded_message(timeout=1.0) is not None  # the subscription
        now_ms = int(redis_client.time()[0]) * 1000
        # First a task not due yet in an empty queue (the new head), then one due now.
        for task_id, delay in (("later", 3600), ("now", 0)):
            redis_client.zadd(scheduler.keys.idle, {channel: now_ms + 60_000})
            scheduler.schedule(task_id, fn="f", delay=delay)
            message = pubsub.get_sharded_message(timeout=2.0)
            assert message is not None and message["data"] == b"ready"
            assert redis_client.zcard(scheduler.keys.idle) == 0
        # A task due after the head wakes no one.
        redis_client.zadd(scheduler.keys.idle, {channel: now_ms + 60_000})
        scheduler.schedule("latest", fn="f", delay=7200)
        assert pubsub.get_sharded_message(timeout=0.5) is None
        assert redis_client.zcard(scheduler.keys.idle) == 1
    finally:
        pubsub.close()


def test_the_short_script_is_what_another_language_calls_with_the_documented_keys() -> None:
    call = enqueue_call(Keys("ns"), [TaskSpec("a", "f", delay=2, priority=3, max_attempts=4)], 1000)
    assert call.keys == [
        f"ds:{{ns}}:{name}"
        for name in ("tasks", "payloads", "queue", "meta", "idle", "propagating")
    ]
    assert call.args[:3] == [1, "a", "in 2000 3 4 1000"]
    assert call.args[-1] == 1000
    with pytest.raises(ScriptError):
        from distsched.wire.replies import decode_enqueue_reply

        decode_enqueue_reply([TaskSpec("a", "f")], ["other", "x"])
