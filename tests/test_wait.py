"""Waiting for an outcome: ``wait`` and ``result`` are told by the scripts that end a task.

A waiter registers the id in the ``waits`` sorted set, then reads the task, then listens
on the sharded ``ended`` channel; every script that ends a waited-for task publishes
``<state> <id>`` there. One subscription per scheduler serves all its waiters.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from distsched import Scheduler, State, TaskInfo, TaskSpec, model
from distsched.aio import AsyncScheduler
from distsched.errors import (
    ClosedError,
    InvalidArgument,
    NotFoundError,
    ScriptError,
    TaskBlocked,
    TaskCancelled,
    TaskFailed,
    Timeout,
)
from distsched.ops import protocol
from distsched.wire.calls import PROPAGATE_BUDGET, REAP_BATCH
from tests.conftest import RedisServer
from tests.test_cluster import cluster, three_masters  # noqa: F401  (the fixtures)

# Far below ops.protocol.WAIT_REFRESH_S: a waiter that wakes within this was told, not re-checking.
TOLD_WITHIN_S = 15.0


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


class Background:
    """A call on a thread of its own; ``outcome()`` is its value or raises its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:
            self.error = exc

    def outcome(self, timeout: float = TOLD_WITHIN_S) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the waiter was not woken"
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def waiting(
    api: Scheduler, client: redis.Redis, task_id: str, how: str = "wait", **kwargs: Any
) -> Iterator[Background]:
    """``api.<how>(task_id)`` on a thread, handed over once it is registered in ``waits``."""
    call = Background(lambda: getattr(api, how)(task_id, **kwargs))
    wait_until(lambda: client.zscore(api.keys.waits, task_id) is not None, what="registered")
    yield call


def claim_one(s: Scheduler, task_id: str) -> model.Claim:
    (claim,) = s.ready(1, "w")
    assert claim.task_id == task_id
    return claim


def raised_error() -> ValueError:
    try:
        raise ValueError("the disk is full")
    except ValueError as exc:
        return exc


# --------------------------------------------------------------------------- wait


def test_wait_returns_the_task_info_once_the_task_succeeds(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    with waiting(api, redis_client, "a") as call:
        sync_scheduler.complete(claim, {"rows": 3})
        info = call.outcome()
    assert isinstance(info, TaskInfo)
    assert (info.state, info.result) == (State.SUCCEEDED, {"rows": 3})


def test_wait_returns_once_the_task_fails(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f", max_attempts=2, backoff=0)
    with waiting(api, redis_client, "a") as call:
        # The first failure makes it ready again: no wake-up is due, the wait goes on.
        sync_scheduler.fail(claim_one(sync_scheduler, "a"), "first")
        time.sleep(0.2)
        assert call.thread.is_alive()
        sync_scheduler.fail(claim_one(sync_scheduler, "a"), "second")
        info = call.outcome()
    assert (info.state, info.attempt, info.error) == (State.FAILED, 2, "second")


def test_wait_returns_once_the_task_is_cancelled(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f", delay=60)
    with waiting(api, redis_client, "a") as call:
        assert sync_scheduler.cancel("a") is State.CANCELLED
        assert call.outcome().state is State.CANCELLED


def test_wait_returns_once_the_task_is_blocked_by_a_failed_dependency(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.submit_graph([TaskSpec("root", "f"), TaskSpec("leaf", "f", deps=["root"])])
    with waiting(api, redis_client, "leaf") as call:
        sync_scheduler.fail(claim_one(sync_scheduler, "root"), "broken")
        info = call.outcome()
    assert info.state is State.BLOCKED
    assert info.blocked_by is not None and info.blocked_by.path == ("root", "leaf")


def test_a_task_already_ended_is_answered_at_once_and_nothing_is_registered(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    sync_scheduler.complete(claim_one(sync_scheduler, "a"), 7)
    assert api.wait("a", timeout=0).state is State.SUCCEEDED
    assert api.result("a") == 7
    assert redis_client.exists(api.keys.waits) == 0


def test_wait_raises_timeout_when_the_task_does_not_end_in_time(api: Scheduler) -> None:
    api.schedule("a", fn="f", delay=60)
    with pytest.raises(Timeout) as caught:
        api.wait("a", timeout=0.3)
    assert caught.value.task_id == "a"
    assert api.status("a").state is State.READY
    with pytest.raises(Timeout):
        api.result("a", timeout=0)


def test_wait_and_result_raise_not_found_for_an_unknown_id(api: Scheduler) -> None:
    with pytest.raises(NotFoundError):
        api.wait("nobody", timeout=1)
    with pytest.raises(NotFoundError):
        api.result("nobody")


def test_a_negative_or_non_finite_timeout_is_refused(api: Scheduler) -> None:
    api.schedule("a", fn="f")
    for bad in (-1, float("nan"), float("inf"), "5"):
        with pytest.raises(InvalidArgument) as caught:
            api.wait("a", timeout=bad)  # type: ignore[arg-type]
        assert caught.value.field == "timeout"


def test_a_waiter_follows_a_task_replaced_by_a_new_version(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f", delay=60)
    with waiting(api, redis_client, "a") as call:
        version = sync_scheduler.schedule("a", fn="f")
        claim = claim_one(sync_scheduler, "a")
        sync_scheduler.complete(claim, "new")
        info = call.outcome()
    assert (info.version, info.result) == (version, "new")


# --------------------------------------------------------------------------- result


def test_result_returns_the_stored_result_of_a_succeeded_task(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    with waiting(api, redis_client, "a", how="result") as call:
        sync_scheduler.complete(claim, [1, "two"])
        assert call.outcome() == [1, "two"]


def test_result_raises_task_failed_with_the_remote_traceback(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    with waiting(api, redis_client, "a", how="result") as call:
        sync_scheduler.fail(claim, raised_error())
        with pytest.raises(TaskFailed) as caught:
            call.outcome()
    error = caught.value
    assert error.task_id == "a"
    assert error.error == "ValueError: the disk is full"
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "in raised_error" in error.traceback
    assert error.traceback in str(error)
    assert error.info is not None and error.info.state is State.FAILED


def test_result_raises_task_cancelled_for_a_cancelled_task(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f", delay=60)
    with waiting(api, redis_client, "a", how="result") as call:
        sync_scheduler.cancel("a")
        with pytest.raises(TaskCancelled) as caught:
            call.outcome()
    assert caught.value.task_id == "a"


def test_result_raises_task_blocked_with_the_root_cause_and_path(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.submit_graph(
        [
            TaskSpec("root", "f"),
            TaskSpec("mid", "f", deps=["root"]),
            TaskSpec("leaf", "f", deps=["mid"]),
        ]
    )
    with waiting(api, redis_client, "leaf", how="result") as call:
        sync_scheduler.cancel("root")
        with pytest.raises(TaskBlocked) as caught:
            call.outcome()
    assert (caught.value.root, caught.value.path) == ("root", ("root", "mid", "leaf"))
    assert "root -> mid -> leaf" in str(caught.value)


# --------------------------------------------------------------------------- the waits set


def test_the_waits_entry_goes_when_the_task_ends(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    # Once subscribed (a first wait starts the subscription), nothing wakes the waiter
    # but the notice: a waiter woken early may register again after the task ended, and
    # that entry would then only expire.
    with pytest.raises(Timeout):
        api.wait("a", timeout=0)
    wait_until(lambda: ended_subscribers(redis_client, api.keys.ended) == 1)
    redis_client.delete(api.keys.waits)
    with waiting(api, redis_client, "a") as call:
        sync_scheduler.complete(claim)
        call.outcome()
    assert redis_client.zscore(api.keys.waits, "a") is None


def test_a_waits_entry_lasts_past_the_timeout_and_housekeeping_drops_it_once_expired(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f", delay=60)
    before = sync_scheduler.server_time()
    with pytest.raises(Timeout):
        api.wait("a", timeout=0.2)
    until = redis_client.zscore(api.keys.waits, "a")
    assert until is not None
    # Registered until the end of the wait plus a margin: never dropped while waited for.
    assert until >= (before + 0.2) * 1000 + protocol.WAIT_MARGIN_MS
    sync_scheduler.housekeeping()
    assert redis_client.zscore(api.keys.waits, "a") is not None
    # Once its time has passed (set back here rather than waiting ten seconds)...
    redis_client.zadd(api.keys.waits, {"a": 1, "b": 2, "live": until})
    sync_scheduler.housekeeping()
    assert redis_client.zrange(api.keys.waits, 0, -1) == [b"live"]


def test_housekeeping_drops_expired_waits_a_bounded_number_per_call(
    sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    waits = sync_scheduler.keys.waits
    redis_client.zadd(waits, {f"gone{i}": i + 1 for i in range(REAP_BATCH + 5)})
    sync_scheduler.reap()
    assert redis_client.zcard(waits) == 5
    sync_scheduler.reap()
    assert redis_client.zcard(waits) == 0


# --------------------------------------------------------------------------- the race


def end_between(s: Any, ending: Callable[[], object], after: str) -> Callable[[], None]:
    """Make ``s`` end the task (on another thread, waited for) right after the waiter's
    registration (``after='register'``) or right after its read that follows it
    (``after='read'``), before it listens. Returns the undo."""
    inner = s._request
    seen = {"register": False, "done": False}

    def run_ending() -> None:
        thread = threading.Thread(target=ending)
        thread.start()
        thread.join(10)
        seen["done"] = True

    def step(request: protocol.Request) -> bool:
        if not isinstance(request, protocol.Commands) or seen["done"]:
            return False
        if request.commands[0][0] == "ZADD" and request.commands[0][1] == s.keys.waits:
            seen["register"] = True
            return after == "register"
        return seen["register"] and after == "read"

    if asyncio.iscoroutinefunction(inner):

        async def patched_async(request: protocol.Request) -> Any:
            reply = await inner(request)
            if step(request):
                run_ending()
            return reply

        s._request = patched_async
    else:

        def patched(request: protocol.Request) -> Any:
            reply = inner(request)
            if step(request):
                run_ending()
            return reply

        s._request = patched

    def undo() -> None:
        del s._request

    return undo


@pytest.mark.parametrize("after", ["register", "read"])
def test_a_task_that_ends_between_registration_and_listening_is_not_missed(
    api: Scheduler, sync_scheduler: Scheduler, after: str
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    target = getattr(api, "inner", api)
    undo = end_between(target, lambda: sync_scheduler.complete(claim, "late"), after)
    try:
        call = Background(lambda: api.result("a", timeout=TOLD_WITHIN_S * 2))
        assert call.outcome() == "late"
    finally:
        undo()


# --------------------------------------------------------------------------- many waiters


def ended_subscribers(client: redis.Redis, channel: str) -> int:
    reply: Any = client.execute_command("PUBSUB", "SHARDNUMSUB", channel)  # type: ignore[no-untyped-call]
    return int(reply[1])


WAITERS = 1000


def end_all(s: Scheduler, n: int) -> None:
    claims = s.ready(n, "w")
    assert len(claims) == n
    s.complete_many([(claim, claim.task_id) for claim in claims])


def test_a_thousand_waiting_threads_share_one_subscription_and_all_wake(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace) as s:
        s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(WAITERS)])
        calls = [Background(functools.partial(s.result, f"t{i}", 120)) for i in range(WAITERS)]
        wait_until(lambda: redis_client.zcard(s.keys.waits) == WAITERS, 60, "all registered")
        assert ended_subscribers(redis_client, s.keys.ended) == 1
        end_all(s, WAITERS)
        assert [call.outcome(60) for call in calls] == [f"t{i}" for i in range(WAITERS)]
        assert ended_subscribers(redis_client, s.keys.ended) == 1
    wait_until(lambda: ended_subscribers(redis_client, s.keys.ended) == 0, 10, "unsubscribed")


def test_a_thousand_gathered_waits_share_one_subscription_and_all_wake(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    async def story() -> list[Any]:
        async with AsyncScheduler.from_url(redis_server.url, namespace=namespace) as s:
            await s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(WAITERS)])
            results = asyncio.gather(*(s.result(f"t{i}", timeout=120) for i in range(WAITERS)))
            while redis_client.zcard(s.keys.waits) < WAITERS:
                await asyncio.sleep(0.05)
            assert ended_subscribers(redis_client, s.keys.ended) == 1
            with Scheduler(redis_client, namespace=namespace) as ender:
                await asyncio.to_thread(end_all, ender, WAITERS)
            values = await asyncio.wait_for(results, 60)
            assert ended_subscribers(redis_client, s.keys.ended) == 1
            return values

    assert asyncio.run(story()) == [f"t{i}" for i in range(WAITERS)]
    wait_until(
        lambda: ended_subscribers(redis_client, f"ds:{{{namespace}}}:ended") == 0,
        10,
        "unsubscribed",
    )


def test_waiters_read_again_when_their_subscription_comes_back(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    with waiting(api, redis_client, "a") as call:
        wait_until(lambda: ended_subscribers(redis_client, api.keys.ended) == 1)
        # The subscription's connection drops; the task ends while nobody listens.
        redis_client.client_kill_filter(_type="pubsub")
        sync_scheduler.complete(claim, "while away")
        assert call.outcome().result == "while away"


def test_closing_the_scheduler_ends_its_waits_with_closed_error(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    s.schedule("a", fn="f", delay=60)
    with waiting(s, redis_client, "a") as call:
        s.close()
        with pytest.raises(ClosedError):
            call.outcome()
    wait_until(lambda: ended_subscribers(redis_client, s.keys.ended) == 0, 10, "unsubscribed")


# --------------------------------------------------------------------------- command line


def cli_status(server: RedisServer, namespace: str, *args: str) -> Any:
    from tests.test_cli import invoke

    return invoke(server, namespace, "status", *args)


def test_status_wait_prints_the_final_status_and_exits_0_when_it_succeeded(
    redis_server: RedisServer,
    namespace: str,
    sync_scheduler: Scheduler,
    redis_client: redis.Redis,
) -> None:
    sync_scheduler.schedule("a", fn="f")
    claim = claim_one(sync_scheduler, "a")
    call = Background(lambda: cli_status(redis_server, namespace, "a", "--wait", "--json"))
    wait_until(lambda: redis_client.zscore(sync_scheduler.keys.waits, "a") is not None)
    sync_scheduler.complete(claim, 42)
    result = call.outcome()
    assert result.exit_code == 0, result.stderr
    assert (json.loads(result.stdout)["state"], json.loads(result.stdout)["result"]) == (
        "succeeded",
        42,
    )


@pytest.mark.parametrize("end", ["fail", "cancel"])
def test_status_wait_exits_1_when_the_task_did_not_succeed(
    redis_server: RedisServer, namespace: str, sync_scheduler: Scheduler, end: str
) -> None:
    sync_scheduler.schedule("a", fn="f")
    if end == "fail":
        sync_scheduler.fail(claim_one(sync_scheduler, "a"), "broken")
    else:
        sync_scheduler.cancel("a")
    result = cli_status(redis_server, namespace, "a", "--wait")
    assert result.exit_code == 1
    assert "state:" in result.stdout and ("failed" if end == "fail" else "cancelled") in (
        result.stdout
    )


def test_status_wait_exits_3_when_its_timeout_passes(
    redis_server: RedisServer, namespace: str, sync_scheduler: Scheduler
) -> None:
    sync_scheduler.schedule("a", fn="f", delay=60)
    result = cli_status(redis_server, namespace, "a", "--wait", "--timeout", "300ms")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "did not end within 0.3s" in result.stderr


def test_status_timeout_without_wait_is_a_usage_error(
    redis_server: RedisServer, namespace: str
) -> None:
    assert cli_status(redis_server, namespace, "a", "--timeout", "1s").exit_code == 2


def test_status_wait_of_an_unknown_id_is_a_one_line_error(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import assert_one_line_error

    assert_one_line_error(cli_status(redis_server, namespace, "ghost", "--wait"), "ghost")


# --------------------------------------------------------------------------- every script tells


def end_by_complete(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f")
    s.complete(claim_one(s, "x"))
    return "x", "succeeded"


def end_by_fail(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f")
    s.fail(claim_one(s, "x"), "no")
    return "x", "failed"


def end_by_reap(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f")
    claim_one(s, "x")
    s.expire_lease("x")
    return "x", "failed"


def end_by_cancel(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f", delay=60)
    s.cancel("x")
    return "x", "cancelled"


def end_by_confirm_cancel(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f")
    claim = claim_one(s, "x")
    s.cancel("x")
    s.confirm_cancel(claim)
    return "x", "cancelled"


def end_by_release(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f")
    claim = claim_one(s, "x")
    s.cancel("x")
    s.release([claim])
    return "x", "cancelled"


def end_by_blocking_a_dependent(s: Scheduler) -> tuple[str, str]:
    s.submit_graph([TaskSpec("root", "f"), TaskSpec("x", "f", deps=["root"])])
    s.cancel("root")
    return "x", "blocked"


def end_by_propagate(s: Scheduler) -> tuple[str, str]:
    # More dependents than one call settles: the last ones are blocked by propagate.lua.
    n = PROPAGATE_BUDGET + 10
    specs = [TaskSpec("root", "f")] + [TaskSpec(f"d{i}", "f", deps=["root"]) for i in range(n)]
    s.submit_graph(specs)
    s.cancel("root")
    return f"d{n - 1}", "blocked"


def end_by_schedule_on_a_failed_dependency(s: Scheduler) -> tuple[str, str]:
    end_by_fail(s)
    s.schedule("y", fn="f", delay=60)
    s.schedule("y", fn="f", deps=["x"])
    return "y", "blocked"


def end_by_add_deps(s: Scheduler) -> tuple[str, str]:
    end_by_fail(s)
    s.schedule("y", fn="f", deps=["z"], allow_unknown=True)
    s.add_deps("y", ["x"])
    return "y", "blocked"


def end_by_expire(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f", delay=60, ttl=0.01)
    time.sleep(0.05)
    assert s.housekeeping()["expired"] == 1
    return "x", "cancelled"


def end_by_expiring_at_claim(s: Scheduler) -> tuple[str, str]:
    s.schedule("x", fn="f", ttl=0.01)
    time.sleep(0.05)
    assert s.ready(1, "w") == []
    return "x", "cancelled"


ENDINGS = [
    end_by_complete,
    end_by_fail,
    end_by_reap,
    end_by_cancel,
    end_by_confirm_cancel,
    end_by_release,
    end_by_blocking_a_dependent,
    end_by_propagate,
    end_by_schedule_on_a_failed_dependency,
    end_by_add_deps,
    end_by_expire,
    end_by_expiring_at_claim,
]


@pytest.mark.parametrize("ending", ENDINGS, ids=lambda f: f.__name__)
def test_every_script_that_ends_a_waited_for_task_publishes_its_state_and_id(
    sync_scheduler: Scheduler, redis_client: redis.Redis, ending: Callable[[Scheduler], Any]
) -> None:
    keys = sync_scheduler.keys
    for task_id in ("x", "y", f"d{PROPAGATE_BUDGET + 9}"):
        redis_client.zadd(keys.waits, {task_id: 2**52})
    pubsub: Any = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.ended)
    try:
        wait_until(lambda: ended_subscribers(redis_client, keys.ended) == 1)
        task_id, state = ending(sync_scheduler)
        assert sync_scheduler.status(task_id).state.value == state
        told = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and f"{state} {task_id}".encode() not in told:
            message = pubsub.get_sharded_message(timeout=0.5)
            if message is not None:
                told.append(message["data"])
        assert f"{state} {task_id}".encode() in told
        assert redis_client.zscore(keys.waits, task_id) is None
    finally:
        pubsub.close()


def test_a_task_nobody_waits_for_publishes_nothing(
    sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    keys = sync_scheduler.keys
    pubsub: Any = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.ended)
    try:
        wait_until(lambda: ended_subscribers(redis_client, keys.ended) == 1)
        end_by_complete(sync_scheduler)
        end_by_blocking_a_dependent(sync_scheduler)
        assert pubsub.get_sharded_message(timeout=0.5) is None
    finally:
        pubsub.close()


# --------------------------------------------------------------------------- Redis Cluster


def test_waits_are_told_on_a_cluster_through_the_namespaces_shard_from_both_shells(
    cluster: RedisCluster,  # noqa: F811  (the fixture)
) -> None:
    seed = cluster.get_nodes()[-1]  # type: ignore[no-untyped-call]
    url = f"redis+cluster://{seed.host}:{seed.port}"
    ender = Scheduler(cluster, namespace="cluster-wait")
    owner = cluster.get_node_from_key(ender.keys.ended)  # type: ignore[no-untyped-call]
    node = redis.Redis(host=owner.host, port=owner.port)

    def subscribers() -> int:
        return ended_subscribers(node, ender.keys.ended)

    ender.schedule_many([TaskSpec(f"t{i}", "f") for i in range(20)])
    claims = {claim.task_id: claim for claim in ender.ready(20, "w")}
    try:
        with Scheduler.from_url(url, namespace="cluster-wait") as s:
            calls = [Background(functools.partial(s.result, f"t{i}", 30)) for i in range(10)]
            wait_until(lambda: node.zcard(s.keys.waits) == 10, 20, "registered")
            wait_until(lambda: subscribers() == 1, 10, "subscribed on the owner")
            ender.complete_many([(claims[f"t{i}"], i) for i in range(10)])
            assert [call.outcome() for call in calls] == list(range(10))

        async def story() -> list[Any]:
            async with AsyncScheduler.from_url(url, namespace="cluster-wait") as a:
                results = asyncio.gather(*(a.result(f"t{i}", 30) for i in range(10, 20)))
                while node.zcard(a.keys.waits) < 10 or subscribers() != 1:
                    await asyncio.sleep(0.05)
                reports = [(claims[f"t{i}"], i) for i in range(10, 20)]
                await asyncio.to_thread(ender.complete_many, reports)
                return await asyncio.wait_for(results, TOLD_WITHIN_S)

        assert asyncio.run(story()) == list(range(10, 20))
    finally:
        node.close()


def test_a_bad_id_is_refused_before_any_subscription_is_made(
    api: Scheduler, redis_client: redis.Redis
) -> None:
    for bad in ("", 5, "x" * 600):
        with pytest.raises(InvalidArgument) as caught:
            api.wait(bad)  # type: ignore[arg-type]
        assert caught.value.field == "task_id"
    time.sleep(0.2)
    assert ended_subscribers(redis_client, api.keys.ended) == 0


def test_result_of_a_stored_result_that_cannot_be_read_raises_script_error(
    api: Scheduler, sync_scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("a", fn="f")
    sync_scheduler.complete(claim_one(sync_scheduler, "a"), 1)
    redis_client.hset(api.keys.results, "a", b"R\xc1")  # 0xc1: never valid msgpack
    assert api.wait("a").state is State.SUCCEEDED
    with pytest.raises(ScriptError, match="succeeded, but stored result does not decode"):
        api.result("a")
