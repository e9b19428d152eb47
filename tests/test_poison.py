"""No poison pills: one bad record never stops the fleet (§9, §12).

A producer in any language cannot write what a worker cannot read (the scripts check
what the Python client checks), and junk written into a namespace by hand fails or
shows only its own task: claims go on past it, workers stay up, good tasks run once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import msgpack
import pytest
import redis

from distsched import Claim, Scheduler, State, TaskSpec, Worker, limits, model
from distsched.errors import ScriptError
from distsched.metrics import WorkerMetrics
from distsched.wire import records
from distsched.wire.payload import decode_payload
from tests.conftest import RedisServer, namespace_keys, put_payload, running
from tests.fault_procs import rows, runs_key
from tests.test_faults import reaped, start_worker, stop_worker, wait_until
from tests.test_wire_protocol import BUDGET, Producer


def spec(
    mode: str = "in",
    time_ms: int = 0,
    priority: int = 0,
    max_attempts: int = 1,
    backoff: int = 0,
    required: int = 0,
    optional: int = 0,
) -> str:
    return f"{mode} {time_ms} {priority} {max_attempts} {backoff} 0 {required} {optional}"


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


GOOD = pack({"fn": "f"})


@pytest.fixture
def producer(redis_client: redis.Redis, namespace: str) -> Producer:
    return Producer(redis_client, namespace)


@pytest.fixture
def s(redis_server: RedisServer, namespace: str) -> Iterator[Scheduler]:
    sched = Scheduler.from_url(redis_server.url, namespace=namespace, lease_s=5.0)
    yield sched
    sched.close()


# --------------------------------------------------------------------------- the scripts check


SCHEDULE_REFUSALS: list[tuple[str, list[Any], str]] = [
    ("non-UTF-8 id", [b"\xff\xfe", spec(), GOOD], "task_id"),
    ("surrogate in id", [b"a\xed\xa0\x80", spec(), GOOD], "task_id"),
    ("overlong UTF-8 id", [b"\xc0\xaf", spec(), GOOD], "task_id"),
    ("empty id", ["", spec(), GOOD], "task_id"),
    ("id over 512 bytes", ["x" * 513, spec(), GOOD], "task_id"),
    ("priority 2^31", ["t", spec(priority=2**31), GOOD], "priority"),
    ("max_attempts 0", ["t", spec(max_attempts=0), GOOD], "max_attempts"),
    ("max_attempts 10^6 + 1", ["t", spec(max_attempts=1_000_001), GOOD], "max_attempts"),
    ("max_attempts 2^63", ["t", spec(max_attempts=2**63), GOOD], "max_attempts"),
    ("backoff 2^63", ["t", spec(backoff=2**63), GOOD], "backoff"),
    ("run_at 2^53", ["t", spec(mode="at", time_ms=2**53), GOOD], "run_at"),
    ("delay 2^52 + 1", ["t", spec(time_ms=2**52 + 1), GOOD], "delay"),
    ("10001 deps", ["t", spec(required=10_001), GOOD], "deps"),
    (
        "optional deps over MAX_DEPS_PER_TASK",
        ["t", spec(optional=limits.MAX_DEPS_PER_TASK + 1), GOOD],
        "optional_deps",
    ),
    ("non-UTF-8 dep", ["t", spec(required=1), GOOD, b"\xff"], "deps"),
    ("empty dep", ["t", spec(optional=1), GOOD, ""], "optional_deps"),
    ("self dep", ["t", spec(required=1), GOOD, "t"], "deps"),
    ("dep twice", ["t", spec(required=1, optional=1), GOOD, "a", "a"], "optional_deps"),
    ("payload not msgpack", ["t", spec(), b"\xc1"], "payload"),
    ("payload truncated", ["t", spec(), GOOD[:-1]], "payload"),
    ("payload with trailing bytes", ["t", spec(), GOOD + b"\x00"], "payload"),
    ("payload an array", ["t", spec(), pack(["f"])], "payload"),
    ("payload a string", ["t", spec(), pack("f")], "payload"),
    ("payload without fn", ["t", spec(), pack({"args": []})], "payload"),
    ("fn empty", ["t", spec(), pack({"fn": ""})], "payload"),
    ("fn a number", ["t", spec(), pack({"fn": 5})], "payload"),
    ("fn bytes", ["t", spec(), pack({"fn": b"f"})], "payload"),
    ("fn not UTF-8", ["t", spec(), b"\x81\xa2fn\xa2\xff\xfe"], "payload"),
    ("args a map", ["t", spec(), pack({"fn": "f", "args": {"a": 1}})], "payload"),
    ("kwargs a list", ["t", spec(), pack({"fn": "f", "kwargs": [1]})], "payload"),
    ("kwargs int keys", ["t", spec(), pack({"fn": "f", "kwargs": {1: 2}})], "payload"),
    ("string in args not UTF-8", ["t", spec(), b"\x82\xa2fn\xa1f\xa4args\x91\xa1\xff"], "payload"),
    ("payload over the limit", ["t", spec(), pack({"fn": "f", "args": ["x" * 64]}), 32], "payload"),
    ("limit 0", ["t", spec(), GOOD, 0], "max_payload_bytes"),
]


@pytest.mark.parametrize(
    "args,field",
    [(a, f) for _, a, f in SCHEDULE_REFUSALS],
    ids=[c for c, _, _ in SCHEDULE_REFUSALS],
)
def test_schedule_refuses_what_the_python_client_refuses_naming_the_field_and_writes_nothing(
    producer: Producer,
    redis_client: redis.Redis,
    namespace: str,
    args: list[Any],
    field: str,
) -> None:
    producer.call("schedule", BUDGET, 1, "before", spec(), GOOD)
    before = namespace_keys(redis_client, namespace)
    with pytest.raises(redis.ResponseError) as info:
        producer.raw("schedule", BUDGET, 1, *args)
    assert str(info.value).startswith(f"BADARG {field} "), str(info.value)
    assert namespace_keys(redis_client, namespace) == before


def test_schedule_accepts_the_edges_of_every_range(producer: Producer, s: Scheduler) -> None:
    longest = "é" * 256  # 512 bytes
    deps = [f"d{i}" for i in range(limits.MAX_EDGES_PER_CALL)]
    producer.call(
        "schedule", BUDGET, 1, "first", spec(priority=-(2**31), max_attempts=1_000_000), GOOD
    )
    producer.call("schedule", BUDGET, 1, "top", spec(priority=2**31 - 1), GOOD)
    producer.call("schedule", BUDGET, 1, longest, spec(mode="at", time_ms=2**53 - 1), GOOD)
    # allow_unknown set: as many dependencies as one call takes, none existing yet, wait.
    wide = f"in 0 0 1 0 1 {len(deps)} 0"
    producer.call("schedule", BUDGET, 1, "many", wide, GOOD, *deps)
    payload = pack({"fn": "f", "args": ["x" * 100]})
    producer.call("schedule", BUDGET, 1, "exact", spec(), payload, len(payload))
    # Each stored as given, none clamped or rounded.
    first = s.status("first")
    assert (first.state, first.priority, first.max_attempts) == (State.READY, -(2**31), 1_000_000)
    assert s.status("top").priority == 2**31 - 1
    far = s.status(longest)
    assert (far.task_id, far.state, far.run_at) == (longest, State.READY, (2**53 - 1) / 1000)
    many = s.status("many")
    assert (many.state, many.remaining, many.deps) == (State.PENDING, len(deps), tuple(deps))
    exact = s.status("exact")
    assert (exact.state, exact.fn, exact.args) == (State.READY, "f", ("x" * 100,))
    # The due ones are claimed as they were stored; the far one is never due.
    claims, _ = s.claim(10, "w")
    got = {c.task_id: (c.priority, c.args) for c in claims}
    assert got == {"first": (-(2**31), ()), "top": (2**31 - 1, ()), "exact": (0, ("x" * 100,))}


def test_nil_args_and_kwargs_from_a_javascript_encoder_run_as_empty(
    producer: Producer, s: Scheduler
) -> None:
    payload = pack({"fn": "f", "args": None, "kwargs": None})
    producer.call("schedule", BUDGET, 1, "js", spec(), payload)
    assert decode_payload(payload) == ("f", (), {})
    seen: list[tuple[Any, ...]] = []
    worker = Worker(s, {"f": lambda *a, **kw: seen.append((a, kw))}, concurrency=1)
    with running(worker):
        wait_until(lambda: s.status("js").state is State.SUCCEEDED, what="js to run")
    assert seen == [((), {})]


@pytest.mark.parametrize("bad", [b"\xff", b"", b"x" * 513])
def test_cancel_retry_and_add_deps_refuse_an_id_no_worker_could_read(
    producer: Producer, redis_client: redis.Redis, namespace: str, bad: bytes
) -> None:
    producer.call("schedule", BUDGET, 1, "p", "in 0 0 1 0 1 1 0", GOOD, "q")
    before = namespace_keys(redis_client, namespace)
    for call in (
        ("cancel", BUDGET, bad),
        ("retry", BUDGET, bad, "1"),
        ("add_deps", BUDGET, bad, "1", "x"),
        ("add_deps", BUDGET, "p", "1", bad),
    ):
        with pytest.raises(redis.ResponseError, match=r"^BADARG (task_id|deps) "):
            producer.raw(*call)
    most = limits.MAX_EDGES_PER_CALL
    with pytest.raises(redis.ResponseError, match=rf"^BADARG deps at most {most} "):
        producer.raw("add_deps", BUDGET, "p", "1", *[f"n{i}" for i in range(most + 1)])
    assert namespace_keys(redis_client, namespace) == before


# --------------------------------------------------------------------------- junk records


JUNK_RECORDS = [
    b"not a record",
    b"",
    b"q|1|0|1|0|0|0|0|0|0|0|",  # no such state
    b"r|1|0|99999999999999999999|0|0|0|0|0|0|0|",  # max_attempts stored past 2^63
    b"r|1|0|0|0|0|0|0|0|0|0|",  # max_attempts 0
    b"r|1|0|1|0|0|0|7|0|0|0|",  # cancel_requested neither 0 nor 1
    b"r|1|0|1|0|0|0|0|0|0|0|\xff\xfe",  # a worker id that is not UTF-8
    b"r|1|0|1|0|0|99999999999|0|0|0|0|",  # priority beyond 32 bits
]


def packed(*values: object) -> bytes:
    """A record as the scripts write it: msgpack values one after the other."""
    return b"".join(msgpack.packb(value) for value in values)


READY = ("r", 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, "")
JUNK_RECORDS += [
    packed(*READY[:11]),  # eleven values
    packed(*READY)[:-1] + b"\xa5ab",  # a worker cut short
    packed("q", *READY[1:]),  # no such state
    packed("r", 1, 0, 1.5, *READY[4:]),  # max_attempts not an integer
    packed("r", "1", *READY[2:]),  # version a string
    packed("r", True, *READY[2:]),  # version a boolean
    packed(*READY[:7], 2, *READY[8:]),  # cancel_requested neither 0 nor 1
    packed(*READY[:6], 2**31, *READY[7:]),  # priority beyond 32 bits
    packed(*READY[:11]) + b"\xa2\xff\xfe",  # a worker id that is not UTF-8
    packed(*READY[:11], b"w"),  # a worker id that is not a string
]


def test_a_record_written_as_text_by_an_earlier_version_is_read_and_saved_as_msgpack(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    s.schedule("old", fn="f", args=(1,), priority=5, max_attempts=3, backoff=2)
    before = s.status("old")
    rec = records.decode_record(cast(bytes, redis_client.hget(s.keys.tasks, "old")))
    # The same record as earlier versions stored it: its fields joined by "|".
    text = f"r|{rec.version}|0|3|2000|{rec.run_at_ms}|5|0|{rec.updated_ms - rec.run_at_ms}|0|0|"
    redis_client.hset(s.keys.tasks, "old", text)
    # Earlier versions kept every payload in the payloads hash.
    assert rec.payload is not None
    redis_client.hset(s.keys.payloads, "old", rec.payload)
    assert records.decode_record(text.encode()) == dataclasses.replace(rec, payload=None)
    assert s.status("old") == before
    claims, _ = s.claim(1, "w")
    assert [(c.task_id, c.version, c.attempt, c.priority, c.args) for c in claims] == [
        ("old", rec.version, 1, 5, (1,))
    ]
    raw = cast(bytes, redis_client.hget(s.keys.tasks, "old"))
    assert raw[:1] == b"\xa1"  # saved as msgpack
    assert records.decode_record(raw).state is State.RUNNING
    assert s.complete(claims[0]) is model.Outcome.APPLIED
    assert s.status("old").state is State.SUCCEEDED


def put_junk_record(client: redis.Redis, s: Scheduler, task_id: str, raw: bytes) -> None:
    """Overwrite a scheduled task's record with junk, its queue entry left in place."""
    client.hset(s.keys.tasks, task_id, raw)


@pytest.mark.parametrize("raw", JUNK_RECORDS)
def test_status_of_a_junk_record_raises_a_script_error_naming_the_task(
    s: Scheduler, redis_client: redis.Redis, raw: bytes
) -> None:
    s.schedule("junk", fn="f")
    put_junk_record(redis_client, s, "junk", raw)
    with pytest.raises(ScriptError, match="corrupt task record of 'junk'"):
        s.status("junk")


@pytest.mark.parametrize("raw", JUNK_RECORDS)
def test_a_claim_quarantines_a_junk_record_and_claims_the_good_tasks_behind_it(
    s: Scheduler, redis_client: redis.Redis, raw: bytes
) -> None:
    s.schedule("junk", fn="f", priority=10)
    for i in range(3):
        s.schedule(f"good{i}", fn="f", args=(i,))
    put_junk_record(redis_client, s, "junk", raw)
    claims, _ = s.claim(10, "w")
    by_id = {c.task_id: c for c in claims}
    assert sorted(by_id) == ["good0", "good1", "good2", "junk"]
    junk = by_id.pop("junk")
    assert junk.payload_error is not None and "corrupt task record" in junk.payload_error
    assert all(c.payload_error is None and c.fn == "f" for c in by_id.values())
    # Every lease written belongs to a claim that was handed out.
    assert {m.decode() for m in cast(list[bytes], redis_client.zrange(s.keys.leases, 0, -1))} == {
        *by_id,
        "junk",
    }
    assert s.fail_many([(junk, junk.payload_error)]) == [model.Outcome.APPLIED]
    info = s.status("junk")
    assert info.state is State.FAILED and info.error is not None
    assert "corrupt task record" in info.error
    assert s.complete_many([(c, None) for c in by_id.values()]) == [model.Outcome.APPLIED] * 3


def test_junk_queue_members_are_dropped_and_the_claim_goes_on(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    redis_client.hset(s.keys.tasks, b"\xff\xfe", b"r|1|0|1|0|0|0|0|0|0|0|")
    member = b"%08x%014x" % (2147483647, 1) + b"\xff\xfe"
    junk = {b"garbage": 0, b"z" * 22 + b"id": 0, b"%08x%014x" % (0, 1): 0, member: 0}
    redis_client.zadd(s.keys.queue, junk)
    s.schedule("good", fn="f")
    claims, _ = s.claim(5, "w")
    assert [c.task_id for c in claims] == ["good"]
    assert redis_client.zcard(s.keys.queue) == 0
    # An id no report could name ends failed where it is.
    raw: Any = redis_client.hget(s.keys.tasks, b"\xff\xfe")
    assert records.decode_record(raw).state is State.FAILED


def test_a_junk_meta_counter_strands_no_task(s: Scheduler, redis_client: redis.Redis) -> None:
    for i in range(20):
        s.schedule(f"t{i}", fn="f")
    redis_client.hset(
        s.keys.meta,
        mapping={"count:ready": "junk", "count:running": "1.5", "max_running": "lots"},
    )
    claims, _ = s.claim(16, "w")
    assert len(claims) == 16
    leased = {m.decode() for m in cast(list[bytes], redis_client.zrange(s.keys.leases, 0, -1))}
    assert leased == {c.task_id for c in claims}
    meta: Any = redis_client.hgetall(s.keys.meta)
    assert meta[b"corrupt:count:ready"] == b"junk"
    assert meta[b"corrupt:count:running"] == b"1.5"
    s.stats()  # readable again


def test_a_junk_seq_is_repaired_above_every_version(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    first = s.schedule("a", fn="f")
    redis_client.hset(s.keys.meta, "seq", "nope")
    second = s.schedule("a", fn="f")
    assert second > first
    assert s.status("a").version == second


@pytest.mark.parametrize("raw", JUNK_RECORDS[:3])
def test_calls_naming_a_junk_record_refuse_naming_it_and_write_nothing(
    s: Scheduler, redis_client: redis.Redis, namespace: str, raw: bytes
) -> None:
    s.schedule("other", fn="f")
    s.schedule("junk", fn="f")
    put_junk_record(redis_client, s, "junk", raw)
    before = namespace_keys(redis_client, namespace)
    calls: list[Callable[[], object]] = [
        lambda: s.cancel("junk"),
        lambda: s.retry("junk"),
        lambda: s.add_deps("junk", ["other"]),
        lambda: s.schedule("junk", fn="f"),
        lambda: s.schedule_many([TaskSpec("new", "f", deps=["junk"])]),
    ]
    for call in calls:
        with pytest.raises(ScriptError, match="CORRUPT task record of junk"):
            call()
    assert namespace_keys(redis_client, namespace) == before


def test_a_report_batch_with_a_junk_record_applies_the_others(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    for i in range(3):
        s.schedule(f"t{i}", fn="f")
    claims, _ = s.claim(3, "w")
    claims.sort(key=lambda c: c.task_id)
    put_junk_record(redis_client, s, "t1", b"junk")
    outcomes = s.complete_many([(c, i) for i, c in enumerate(claims)])
    assert outcomes == [model.Outcome.APPLIED, model.Outcome.STALE, model.Outcome.APPLIED]
    assert [s.status(t).state for t in ("t0", "t2")] == [State.SUCCEEDED] * 2


def test_a_dependent_with_a_junk_record_does_not_stop_its_parent_from_ending(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    s.schedule("parent", fn="f")
    s.schedule("child", fn="f", deps=["parent"])
    s.schedule("sibling", fn="f", deps=["parent"])
    put_junk_record(redis_client, s, "child", b"junk")
    (claim,), _ = s.claim(1, "w")
    assert s.complete_many([(claim, None)]) == [model.Outcome.APPLIED]
    assert s.status("sibling").state is State.READY


class FailingOnStart(WorkerMetrics):
    def on_started(self, claim: Claim, wait_s: float) -> None:
        if claim.task_id == "boom":
            raise RuntimeError("a hook that chokes on one task")


def test_a_pool_thread_outlives_a_hook_that_fails_on_one_task(s: Scheduler) -> None:
    ran: list[str] = []
    s.schedule("boom", fn="f", args=("boom",), priority=1)
    s.schedule("after", fn="f", args=("after",))
    worker = Worker(s, {"f": ran.append}, concurrency=1, metrics=FailingOnStart())
    with running(worker):
        wait_until(lambda: s.status("after").state.terminal, what="the task after")
    assert ran == ["boom", "after"]
    assert s.status("boom").state is State.SUCCEEDED


# --------------------------------------------------------------------------- the fleet


def member(task_id: bytes, version: int = 1, priority: int = 0) -> bytes:
    return b"%08x%014x" % (2147483647 - priority, version) + task_id


def test_junk_in_every_field_of_a_namespace_fails_only_its_own_tasks_and_two_workers_run_every_good_task_once(  # noqa: E501
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace)
    k = s.keys
    # Due once both workers are up, and long enough that both take a share.
    good = [f"good-{i:03d}" for i in range(99)]
    s.schedule_many([TaskSpec(t, "record", args=(20,), delay=1.5) for t in good])
    s.schedule("good-child", fn="record", args=(20,), deps=["good-000"])
    good.append("good-child")

    # Records that do not parse, each with a queue entry and a payload.
    bad_records = [f"bad-record-{i}" for i in range(len(JUNK_RECORDS))]
    s.schedule_many([TaskSpec(t, "record", delay=1.5, priority=5) for t in bad_records])
    for task_id, raw in zip(bad_records, JUNK_RECORDS, strict=True):
        redis_client.hset(k.tasks, task_id, raw)
    # Payloads that do not decode, under good records.
    bad_payloads = {
        "bad-payload-0": b"\xc1",
        "bad-payload-1": pack([1, 2]),
        "bad-payload-2": pack({"fn": 5}),
        "bad-payload-3": pack({"fn": "record", "args": {"a": 1}}),
        "bad-payload-4": b"",
        "bad-payload-5": b"\x81\xa2fn\xa2\xff\xfe",  # fn not UTF-8
    }
    s.schedule_many([TaskSpec(t, "record", delay=1.5) for t in bad_payloads])
    for task_id, payload in bad_payloads.items():
        put_payload(redis_client, k, task_id, payload)
    # Queue members: junk, one for no task, and one whose id is not UTF-8.
    redis_client.hset(k.tasks, b"bad-\xff", b"r|1|0|1|0|0|0|0|0|0|0|")
    redis_client.zadd(
        k.queue, {b"garbage": 0, member(b"nobody"): 0, member(b"bad-\xff"): 0, b"z" * 30: 0}
    )
    # A running record gone to junk under its lease, and a lease of no task.
    redis_client.hset(k.tasks, "bad-leased", b"x|junk")
    redis_client.zadd(k.leases, {"bad-leased": 0, "ghost": 0})
    # Meta counters.
    redis_client.hset(
        k.meta,
        mapping={"count:ready": "junk", "count:running": "-", "seq": "x", "pseq": "1e9",
                 "max_running": "lots"},
    )  # fmt: skip
    # Done tokens, a dependency list, edges, a block cause, a propagation job.
    redis_client.hset(k.done, "good-001", b"junk \xff 1.x")
    redis_client.hset(k.deps, "good-child", b"zz\xff")
    redis_client.hset(k.blocked, "good-002", b"zzz")
    prefix = records.id_prefix
    redis_client.zadd(
        k.edges,
        {b"junk": 0, prefix("good-003") + b"wrnobody": 0, prefix("good-004") + b"wr\xff": 0,
         prefix("good-005") + b"wrbad-record-0": 0, prefix("good-006") + b"w": 0},
    )  # fmt: skip
    redis_client.zadd(k.propagating, {b"pnobody": 0, b"p\xff": 1})

    # A lease a loaded machine cannot miss: this test is about junk, not lost leases
    # (the junk lease entries are due at once whatever the lease).
    workers = [start_worker(redis_server.url, namespace, "--lease", "5") for _ in range(2)]
    with reaped(*workers):

        def settled() -> bool:
            assert all(w.poll() is None for w in workers), "a worker exited"
            done = Counter(t for t, *_ in rows(redis_client, runs_key(namespace)))
            return all(done[t] >= 1 for t in good) and all(
                _ended(s, t) for t in [*bad_records, *bad_payloads]
            )

        wait_until(settled, timeout=60, what="every task to end")
        wait_until(lambda: redis_client.zcard(k.leases) == 0, what="the leases to be handled")
        time.sleep(1.0)  # a last chance for a second run to show
        assert all(w.poll() is None for w in workers)
        counts = [stop_worker(w) for w in workers]

    runs = Counter(t for t, *_ in rows(redis_client, runs_key(namespace)))
    assert {t: n for t, n in runs.items() if n != 1} == {}
    assert set(runs) == set(good)
    for task_id in good:
        assert s.status(task_id).state is State.SUCCEEDED, task_id
    for task_id in bad_records:
        info = s.status(task_id)
        assert info.state is State.FAILED and info.error is not None, task_id
        assert "corrupt task record" in info.error, (task_id, info.error)
    for task_id in bad_payloads:
        info = s.status(task_id)
        assert info.state is State.FAILED and info.error is not None, task_id
        assert "payload decode error" in info.error, (task_id, info.error)
    quarantined: Any = redis_client.hget(k.tasks, b"bad-\xff")
    assert records.decode_record(quarantined).state is State.FAILED
    with pytest.raises(ScriptError, match="corrupt task record of 'bad-leased'"):
        s.status("bad-leased")
    assert sum(c["failed"] for c in counts) == len(bad_records) + len(bad_payloads)
    stats = s.stats()
    assert stats["counts"]["succeeded"] == len(good)
    meta: Any = redis_client.hgetall(k.meta)
    assert {f: meta[f] for f in (b"corrupt:count:ready", b"corrupt:seq")} == {
        b"corrupt:count:ready": b"junk",
        b"corrupt:seq": b"x",
    }
    assert redis_client.zcard(k.queue) == 0
    assert redis_client.zcard(k.propagating) == 0
    print(json.dumps({"counts": counts}))


def _ended(s: Scheduler, task_id: str) -> bool:
    try:
        return s.status(task_id).state.terminal
    except ScriptError:
        return False


def test_a_junk_cascade_progress_field_ends_that_cascade_and_nothing_else(
    s: Scheduler, redis_client: redis.Redis
) -> None:
    redis_client.zadd(s.keys.propagating, {"rgone": 0})
    redis_client.hset(s.keys.meta, "cascade:gone", "junk")
    s.schedule("parent", fn="f")
    s.schedule("child", fn="f", deps=["parent"])
    (claim,), _ = s.claim(1, "w")
    assert s.complete_many([(claim, None)]) == [model.Outcome.APPLIED]
    assert s.status("child").state is State.READY
    assert redis_client.zcard(s.keys.propagating) == 0
    assert not redis_client.hexists(s.keys.meta, "cascade:gone")
