"""§12: every bad argument is refused with an error naming its field, and nothing is written."""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Worker
from distsched.errors import (
    ClosedError,
    ConflictError,
    InvalidArgument,
    PayloadTooLarge,
)
from tests.conftest import RedisServer, namespace_keys, put_payload

W = "w"


@pytest.fixture
def busy(scheduler: Scheduler) -> Scheduler:
    """A namespace with some state: a ready, a running and a finished task."""
    scheduler.schedule_many([TaskSpec("done", "f"), TaskSpec("run", "f"), TaskSpec("wait", "f")])
    done, _ = scheduler.ready(2, W)
    scheduler.complete(done, "ok")
    return scheduler


def assert_refused(
    client: redis.Redis, s: Scheduler, field: str, call: Callable[[], object]
) -> InvalidArgument:
    before = namespace_keys(client, s.namespace)
    with pytest.raises(InvalidArgument) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert field in str(info.value)
    assert namespace_keys(client, s.namespace) == before
    return info.value


BAD_TASK_IDS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("int", 5),
    ("bytes", b"abc"),
    ("none", None),
    ("over 512 bytes", "x" * 513),
    ("over 512 bytes of 2-byte chars", "é" * 257),
    ("lone surrogate", "a\ud800b"),
]

BAD_SCHEDULE_ARGS: list[tuple[str, dict[str, Any]]] = [
    ("priority", {"priority": 2**31}),
    ("priority", {"priority": -(2**31) - 1}),
    ("priority", {"priority": True}),
    ("priority", {"priority": 1.0}),
    ("priority", {"priority": "1"}),
    ("priority", {"priority": None}),
    ("run_at", {"run_at": math.nan}),
    ("run_at", {"run_at": math.inf}),
    ("run_at", {"run_at": -math.inf}),
    ("run_at", {"run_at": 1e300}),
    ("run_at", {"run_at": "2030-01-01"}),
    ("run_at", {"run_at": True}),
    ("run_at", {"run_at": dt.datetime(2030, 1, 1)}),  # naive
    ("delay", {"delay": math.nan}),
    ("delay", {"delay": math.inf}),
    ("delay", {"delay": -math.inf}),
    ("delay", {"delay": "5"}),
    ("delay", {"run_at": 1.0, "delay": 1.0}),
    ("max_attempts", {"max_attempts": 0}),
    ("max_attempts", {"max_attempts": -1}),
    ("max_attempts", {"max_attempts": 1.5}),
    ("max_attempts", {"max_attempts": True}),
    ("backoff", {"backoff": -0.001}),
    ("backoff", {"backoff": math.nan}),
    ("backoff", {"backoff": math.inf}),
    ("backoff", {"backoff": "1"}),
    ("fn", {"fn": ""}),
    ("fn", {"fn": 5}),
    ("args", {"args": "abc"}),
    ("args", {"args": 5}),
    ("args", {"args": (object(),)}),
    ("args", {"args": ({1, 2},)}),
    ("kwargs", {"kwargs": {1: "x"}}),
    ("kwargs", {"kwargs": [("a", 1)]}),
    ("kwargs", {"kwargs": {"a": object()}}),
]


@pytest.mark.parametrize(("case", "task_id"), BAD_TASK_IDS, ids=[c for c, _ in BAD_TASK_IDS])
def test_a_bad_task_id_is_refused_naming_task_id_and_nothing_is_written(
    busy: Scheduler, redis_client: redis.Redis, case: str, task_id: Any
) -> None:
    s = busy
    assert_refused(redis_client, s, "task_id", lambda: s.schedule(task_id, fn="f"))
    assert_refused(redis_client, s, "task_id", lambda: s.schedule_many([TaskSpec(task_id, "f")]))
    assert_refused(redis_client, s, "task_id", lambda: s.cancel(task_id))
    assert_refused(redis_client, s, "task_id", lambda: s.status(task_id))
    assert_refused(redis_client, s, "task_id", lambda: s.expire_lease(task_id))


def test_a_task_id_of_exactly_512_utf8_bytes_is_accepted(scheduler: Scheduler) -> None:
    task_id = "é" * 256
    scheduler.schedule(task_id, fn="f")
    got = scheduler.next(W)
    assert isinstance(got, Claim) and got.task_id == task_id


@pytest.mark.parametrize(
    ("field", "kwargs"), BAD_SCHEDULE_ARGS, ids=[f"{f}={v!r}" for f, v in BAD_SCHEDULE_ARGS]
)
def test_a_bad_schedule_argument_is_refused_naming_its_field_and_nothing_is_written(
    busy: Scheduler, redis_client: redis.Redis, field: str, kwargs: dict[str, Any]
) -> None:
    s = busy
    call = {"fn": "f", **kwargs}
    assert_refused(redis_client, s, field, lambda: s.schedule("wait", **call))
    assert_refused(redis_client, s, field, lambda: s.schedule("new", **call))
    assert_refused(redis_client, s, field, lambda: s.schedule_many([TaskSpec("new", **call)]))


def test_a_payload_over_max_payload_bytes_is_refused(
    redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace, max_payload_bytes=100)
    try:
        s.schedule("small", fn="f", args=("x" * 50,))
        err = assert_refused(
            redis_client, s, "args", lambda: s.schedule("big", fn="f", args=("x" * 200,))
        )
        assert isinstance(err, PayloadTooLarge)
    finally:
        s.close()


def test_a_batch_with_one_invalid_task_writes_nothing_at_all(
    busy: Scheduler, redis_client: redis.Redis
) -> None:
    s = busy
    good = TaskSpec("fine", "f")
    assert_refused(
        redis_client,
        s,
        "priority",
        lambda: s.schedule_many([good, TaskSpec("x", "f", priority=2**40)]),
    )
    assert_refused(redis_client, s, "task_id", lambda: s.schedule_many([good, TaskSpec("", "f")]))


def test_duplicate_ids_in_one_batch_are_refused(busy: Scheduler, redis_client: redis.Redis) -> None:
    s = busy
    specs = [TaskSpec("x", "f"), TaskSpec("y", "f"), TaskSpec("x", "g")]
    err = assert_refused(redis_client, s, "task_id", lambda: s.schedule_many(specs))
    assert "x" in str(err)


@pytest.mark.parametrize("specs", ["abc", b"abc", 5, [("a", "f")], [None]])
def test_schedule_many_refuses_anything_but_a_sequence_of_taskspecs(
    busy: Scheduler, redis_client: redis.Redis, specs: Any
) -> None:
    assert_refused(redis_client, busy, "specs", lambda: busy.schedule_many(specs))


def test_a_batch_naming_a_running_task_raises_conflict_and_writes_nothing(
    busy: Scheduler, redis_client: redis.Redis
) -> None:
    s = busy
    before = namespace_keys(redis_client, s.namespace)
    with pytest.raises(ConflictError):
        s.schedule_many([TaskSpec("fresh", "f"), TaskSpec("wait", "f"), TaskSpec("run", "f")])
    assert namespace_keys(redis_client, s.namespace) == before


# --------------------------------------------------------------------------- claims


@pytest.mark.parametrize("n", [0, -1, True, 1.5, "2", None])
def test_a_bad_claim_count_is_refused_naming_n(
    busy: Scheduler, redis_client: redis.Redis, n: Any
) -> None:
    assert_refused(redis_client, busy, "n", lambda: busy.ready(n, W))
    assert_refused(redis_client, busy, "n", lambda: busy.claim(n, W))


@pytest.mark.parametrize("worker_id", ["", 5, None, b"w", "w\udc80"])
def test_a_bad_worker_id_is_refused_naming_worker_id(
    busy: Scheduler, redis_client: redis.Redis, worker_id: Any
) -> None:
    assert_refused(redis_client, busy, "worker_id", lambda: busy.next(worker_id))
    assert_refused(redis_client, busy, "worker_id", lambda: busy.ready(2, worker_id))


def test_reports_refuse_what_is_not_a_claim_or_cannot_be_stored(
    busy: Scheduler, redis_client: redis.Redis
) -> None:
    s = busy
    running = s.status("run")
    assert running.state is State.RUNNING
    token = Claim("run", running.version, running.attempt, "f", (), {}, 0, 0.0)
    assert_refused(redis_client, s, "claim", lambda: s.complete(("run", 1, 1)))  # type: ignore[arg-type]
    assert_refused(redis_client, s, "claim", lambda: s.heartbeat("run"))  # type: ignore[arg-type]
    assert_refused(redis_client, s, "claim", lambda: s.release([None]))  # type: ignore[list-item]
    assert_refused(redis_client, s, "result", lambda: s.complete(token, object()))
    assert_refused(redis_client, s, "error", lambda: s.fail(token, 42))
    assert s.complete(token, "fine") is Outcome.APPLIED


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, None, "10"])
def test_a_bad_reap_limit_is_refused_naming_limit(
    busy: Scheduler, redis_client: redis.Redis, limit: Any
) -> None:
    assert_refused(redis_client, busy, "limit", lambda: busy.reap(limit))


# --------------------------------------------------------------------------- constructors


@pytest.mark.parametrize("lease_s", [0, -1, math.nan, math.inf, "1", None, True])
def test_a_bad_lease_is_refused_naming_lease_s(
    redis_client: redis.Redis, redis_server: RedisServer, namespace: str, lease_s: Any
) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scheduler(redis_client, namespace=namespace, lease_s=lease_s)
    assert info.value.field == "lease_s"
    with pytest.raises(InvalidArgument) as info:
        Scheduler.from_url(redis_server.url, namespace=namespace, lease_s=lease_s)
    assert info.value.field == "lease_s"
    assert namespace_keys(redis_client, namespace) == {}


def test_a_sub_second_lease_is_accepted(redis_client: redis.Redis, namespace: str) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    try:
        assert s.lease_s == 0.05
        s.schedule("t", fn="f")
        t0 = s.server_time()
        claim = s.next("w")
        t1 = s.server_time()
        assert isinstance(claim, Claim)
        # The lease is 50 ms on the server clock: not rounded to 0 or to a second.
        deadline = s.status("t").lease_deadline
        assert deadline is not None and t0 + 0.049 <= deadline <= t1 + 0.051
        assert s.reap() == 0
        while s.server_time() <= deadline:
            time.sleep(0.01)
        assert s.reap() == 1
        info = s.status("t")
        assert (info.state, info.error) == (State.FAILED, "lease expired")
    finally:
        s.close()


@pytest.mark.parametrize("ns", ["", "a{b", "a}b", "{x}", "with space", "tab\t", 5, None, "n" * 129])
def test_a_bad_namespace_is_refused_naming_namespace(
    redis_client: redis.Redis, redis_server: RedisServer, ns: Any
) -> None:
    keys_before = sorted(redis_client.keys("*"))
    with pytest.raises(InvalidArgument) as info:
        Scheduler(redis_client, namespace=ns)
    assert info.value.field == "namespace"
    with pytest.raises(InvalidArgument) as info:
        Scheduler.from_url(redis_server.url, namespace=ns, max_running=3)
    assert info.value.field == "namespace"
    assert sorted(redis_client.keys("*")) == keys_before


@pytest.mark.parametrize("max_running", [-1, 1.5, True, "3"])
def test_a_bad_max_running_is_refused_naming_max_running(
    redis_client: redis.Redis, redis_server: RedisServer, namespace: str, max_running: Any
) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scheduler(redis_client, namespace=namespace, max_running=max_running)
    assert info.value.field == "max_running"
    with pytest.raises(InvalidArgument) as info:
        Scheduler.from_url(redis_server.url, namespace=namespace, max_running=max_running)
    assert info.value.field == "max_running"
    s = Scheduler(redis_client, namespace=namespace)
    try:
        with pytest.raises(InvalidArgument) as info:
            s.set_max_running(max_running)
        assert info.value.field == "max_running"
    finally:
        s.close()
    assert namespace_keys(redis_client, namespace) == {}


@pytest.mark.parametrize("limit", [0, -5, 1.5, "100", None, True])
def test_a_bad_max_payload_bytes_is_refused(
    redis_client: redis.Redis, namespace: str, limit: Any
) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scheduler(redis_client, namespace=namespace, max_payload_bytes=limit)
    assert info.value.field == "max_payload_bytes"


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/0", "127.0.0.1:6379", "", 5])
def test_a_bad_url_is_refused_naming_url(url: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scheduler.from_url(url, namespace="x")
    assert info.value.field == "url"


# --------------------------------------------------------------------------- foreign payloads


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1not msgpack",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"fn": "", "args": []}),
        msgpack.packb({"fn": "f", "args": "not a list"}),
        msgpack.packb({"fn": "f", "args": [], "kwargs": {1: 2}}),
        b"",
    ],
    ids=["garbage", "array", "empty fn", "args not array", "int kwargs key", "empty"],
)
def test_an_undecodable_payload_yields_a_claim_with_payload_error_and_touches_no_other_task(
    scheduler: Scheduler, redis_client: redis.Redis, raw: bytes
) -> None:
    s = scheduler
    s.schedule("bad", fn="f", priority=1)
    s.schedule("good", fn="f", args=(1,), priority=0)
    put_payload(redis_client, s.keys, "bad", raw)
    good_before = s.status("good")
    claims = s.ready(2, W)
    assert [c.task_id for c in claims] == ["bad", "good"]
    bad, good = claims
    assert bad.payload_error and bad.fn == "" and bad.args == ()
    assert good.payload_error is None and (good.fn, good.args) == ("f", (1,))
    assert s.status("good").version == good_before.version
    assert s.fail(bad, bad.payload_error) is Outcome.APPLIED
    assert s.status("bad").state is State.FAILED
    assert s.status("good").state is State.RUNNING


def test_a_worker_fails_an_undecodable_task_with_a_decode_error_and_runs_the_others(
    redis_server: RedisServer, namespace: str
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    client = s.client
    ran: list[int] = []
    try:
        s.schedule_many([TaskSpec("bad", "f", args=(0,)), TaskSpec("good", "f", args=(1,))])
        put_payload(client, s.keys, "bad", b"\xc1\xc1")
        worker = Worker(s, {"f": ran.append}, concurrency=2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not (s.status("bad").state.terminal and s.status("good").state.terminal):
                assert time.monotonic() < deadline
                time.sleep(0.01)
        finally:
            worker.stop(grace=5)
            thread.join(30)
        bad = s.status("bad")
        assert bad.state is State.FAILED and bad.error and "decode" in bad.error
        assert s.status("good").state is State.SUCCEEDED
        assert ran == [1]
    finally:
        s.close()


# --------------------------------------------------------------------------- close


def test_every_call_after_close_raises_closed(scheduler: Scheduler) -> None:
    s = scheduler
    s.schedule("a", fn="f")
    c = s.next(W)
    assert isinstance(c, Claim)
    s.close()
    s.close()  # closing twice is harmless
    calls: list[Callable[[], object]] = [
        lambda: s.schedule("b", fn="f"),
        lambda: s.schedule_many([TaskSpec("b", "f")]),
        lambda: s.schedule_many([]),
        lambda: s.cancel("a"),
        lambda: s.ready(1, W),
        lambda: s.claim(1, W),
        lambda: s.next(W),
        lambda: s.heartbeat(c),
        lambda: s.heartbeat_many([c]),
        lambda: s.heartbeat_many([]),
        lambda: s.complete(c),
        lambda: s.complete_many([(c, None)]),
        lambda: s.complete_many([]),
        lambda: s.fail(c, "x"),
        lambda: s.fail_many([(c, "x")]),
        lambda: s.fail_many([]),
        lambda: s.confirm_cancel(c),
        lambda: s.release([c]),
        lambda: s.release([]),
        lambda: s.reap(),
        lambda: s.expire_lease("a"),
        lambda: s.status("a"),
        lambda: s.stats(),
        lambda: s.leases(),
        lambda: s.server_time(),
        lambda: s.set_max_running(3),
    ]
    for call in calls:
        with pytest.raises(ClosedError):
            call()


def test_close_of_a_url_scheduler_closes_its_connections(redis_server: RedisServer) -> None:
    s = Scheduler.from_url(redis_server.url, namespace="closing")
    s.stats()
    s.close()
    with pytest.raises(ClosedError):
        s.stats()
