"""Contract promises that are easy to break quietly, each pinned by a test that fails
when the promise is broken.

Against real redis-server processes, through the public API only. Times are compared
on the Redis server's clock (``Scheduler.server_time``), which is the clock the
contract says decides due-ness and lease expiry (§3, §6).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner
from redis.exceptions import NoPermissionError

from distsched import Claim, Scheduler, State, TaskInfo, TaskSpec, Wait, Worker, current_task
from distsched.aio import AsyncScheduler
from distsched.cli import cli
from distsched.errors import CycleError
from distsched.model import WaitReason
from tests.conftest import RedisServer, namespace_keys, running

W = "guard-worker"


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def wait_state(s: Scheduler, task_id: str, *states: State, timeout: float = 10.0) -> TaskInfo:
    wait_until(lambda: s.status(task_id).state in states, timeout, f"{task_id} in {states}")
    return s.status(task_id)


def sleep_until_server_time(s: Scheduler, when: float) -> None:
    """Sleep (monotonic) until the server's clock reads at least ``when``."""
    while True:
        left = when - s.server_time()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def stat(stats: Any, name: str) -> int:
    """One figure of ``Scheduler.stats()``, whether it is a mapping or an object."""
    if isinstance(stats, dict):
        return int(stats[name])
    return int(getattr(stats, name))


# --------------------------------------------------------------------------- §7 cycles


def test_submitting_a_task_that_closes_a_cycle_through_an_awaited_optional_edge_is_refused(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    scheduler.submit("a", fn="f")
    scheduler.submit("b", fn="f", optional_deps=["a"])
    assert scheduler.status("b").state is State.PENDING  # b still awaits a
    before = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        scheduler.submit("a", fn="f", deps=["b"])
    assert list(info.value.path) == ["a", "b", "a"]
    assert namespace_keys(redis_client, namespace) == before
    assert scheduler.status("a").state is State.READY


def test_add_deps_that_closes_a_cycle_through_an_awaited_optional_edge_is_refused(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    scheduler.submit("root", fn="f")
    scheduler.submit("a", fn="f", deps=["root"])
    scheduler.submit("b", fn="f", optional_deps=["a"])
    assert scheduler.status("a").state is State.PENDING
    before = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        scheduler.add_deps("a", ["b"])
    assert list(info.value.path) == ["a", "b", "a"]
    assert namespace_keys(redis_client, namespace) == before
    assert scheduler.status("a").deps == ("root",)


# --------------------------------------------------------------------------- §5 cancellation


# The worker's wake-up listener thread ends with the refused subscription (NOPERM is
# not a transient error to it); this test is about the heartbeat path, not about that.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_running_function_sees_a_cancel_request_from_the_heartbeat_alone(
    own_redis: RedisServer,
) -> None:
    """The worker's Redis user may not subscribe, so no wake-up message can carry the
    request: only the heartbeat reply can, within about one heartbeat interval."""
    namespace = "t" + uuid.uuid4().hex[:12]
    user, password = f"worker-{namespace}", uuid.uuid4().hex
    admin = own_redis.client()
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", f">{password}",
        "resetkeys", "~ds:*", "resetchannels",
        "-@all", "+@read", "+@write", "+@scripting", "+@connection", "+@pubsub", "+time",
    )  # fmt: skip
    worker_client = own_redis.client(username=user, password=password)
    # The premise: this user's subscription to the wake-up channel is refused.
    probe = worker_client.pubsub()
    with pytest.raises(NoPermissionError):
        probe.subscribe(f"ds:{{{namespace}}}:wake")
        probe.get_message(timeout=1.0)
    probe.close()

    lease_s, heartbeat_s = 0.9, 0.3
    producer = Scheduler(admin, namespace=namespace, lease_s=lease_s)
    s = Scheduler(worker_client, namespace=namespace, lease_s=lease_s)
    started = threading.Event()
    seen: list[float] = []

    def watch() -> None:
        ctx = current_task()
        started.set()
        if ctx.wait_cancelled(10.0):
            seen.append(time.monotonic())
        ctx.raise_if_cancelled()

    # Scheduled before the worker starts: it cannot be woken by a later submission.
    producer.schedule("long", fn="watch")
    worker = Worker(s, {"watch": watch}, concurrency=1, heartbeat_s=heartbeat_s)
    try:
        with running(worker):
            assert started.wait(10.0), "the task never started"
            requested_at = time.monotonic()
            assert producer.cancel("long") is State.RUNNING
            info = wait_state(producer, "long", State.CANCELLED, State.SUCCEEDED, State.FAILED)
        assert seen, "the function never saw the cancel request"
        assert seen[0] - requested_at < heartbeat_s + 0.5
        assert info.state is State.CANCELLED
        assert info.cancel_requested
    finally:
        s.close()
        producer.close()
        worker_client.close()
        admin.close()


# --------------------------------------------------------------------------- §3 clocks


@pytest.fixture(params=[3600.0, -3600.0], ids=["client-clock-an-hour-ahead", "an-hour-behind"])
def skewed_clock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> float:
    """This process's wall clock off by an hour; ``time.monotonic`` is left alone."""
    skew: float = request.param
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    return skew


def test_a_delay_is_counted_on_the_server_clock_whatever_the_clients_clock(
    scheduler: Scheduler, skewed_clock: float
) -> None:
    assert abs(time.time() - scheduler.server_time()) > 3000  # the skew is in effect
    t0 = scheduler.server_time()
    scheduler.schedule("d", fn="f", delay=1.0)
    t1 = scheduler.server_time()
    run_at = scheduler.status("d").run_at
    assert t0 + 1.0 - 0.001 <= run_at <= t1 + 1.0 + 0.001
    assert_due_at(scheduler, "d", run_at)


def test_an_absolute_run_at_is_compared_with_the_server_clock_whatever_the_clients_clock(
    scheduler: Scheduler, skewed_clock: float
) -> None:
    run_at = scheduler.server_time() + 1.0
    scheduler.schedule("at", fn="f", run_at=run_at)
    assert abs(scheduler.status("at").run_at - run_at) <= 0.001
    assert_due_at(scheduler, "at", scheduler.status("at").run_at)


def assert_due_at(s: Scheduler, task_id: str, run_at: float) -> None:
    """Not claimable while the server's clock is before ``run_at``; claimable after."""
    got = s.next(W)
    assert isinstance(got, Wait) and got.reason == "not_due", got
    assert got.delay is not None and 0.5 < got.delay <= 1.001
    sleep_until_server_time(s, run_at - 0.4)
    got = s.next(W)
    assert isinstance(got, Wait) and got.reason == "not_due", got
    sleep_until_server_time(s, run_at + 0.005)
    got = s.next(W)
    assert isinstance(got, Claim) and got.task_id == task_id, got


def test_a_lease_expires_on_the_server_clock_whatever_the_clients_clock(
    redis_client: redis.Redis, namespace: str, skewed_clock: float
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=1.0)
    try:
        s.schedule("leased", fn="f")
        t0 = s.server_time()
        claim = s.next(W)
        t1 = s.server_time()
        assert isinstance(claim, Claim)
        deadline = s.status("leased").lease_deadline
        assert deadline is not None and t0 + 1.0 - 0.001 <= deadline <= t1 + 1.0 + 0.001
        assert s.reap() == 0
        sleep_until_server_time(s, t0 + 0.6)
        assert s.reap() == 0
        assert s.status("leased").state is State.RUNNING
        sleep_until_server_time(s, deadline + 0.005)
        assert s.reap() == 1
        info = s.status("leased")
        assert info.state is State.FAILED and info.error == "lease expired"
    finally:
        s.close()


# --------------------------------------------------------------------------- §3 wake-ups


def script_calls(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    names = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)


def test_an_idle_worker_waits_for_wake_ups_instead_of_polling(own_redis: RedisServer) -> None:
    admin = own_redis.client()
    client = own_redis.client()
    namespace = "t" + uuid.uuid4().hex[:12]
    # A 30 s lease: the heartbeat rounds (every 10 s) stay out of the counted window.
    s = Scheduler(client, namespace=namespace, lease_s=30.0)
    producer = Scheduler(admin, namespace=namespace, lease_s=30.0)
    starts: dict[str, float] = {}

    def mark() -> None:
        starts[current_task().task_id] = s.server_time()

    producer.schedule("far", fn="mark", delay=3600)
    worker = Worker(s, {"mark": mark}, concurrency=2)
    try:
        with running(worker):
            wait_until(lambda: admin.pubsub_shardnumsub(s.keys.wake)[0][1] >= 1, 10, "a subscriber")
            time.sleep(0.5)  # the first claims and heartbeat round are done
            before = script_calls(admin)
            time.sleep(2.0)
            idle_calls = script_calls(admin) - before
            # A task due now, scheduled while the worker is idle, starts at once.
            for i in range(5):
                producer.schedule(f"now-{i}", fn="mark")
                wait_state(producer, f"now-{i}", State.SUCCEEDED)
                time.sleep(0.05 + 0.09 * i)  # submissions land at different moments
        # A worker polling every 0.5 s makes 4 claim calls in 2 s.
        assert idle_calls <= 2, f"{idle_calls} script calls from an idle worker in 2 s"
        for i in range(5):
            latency = starts[f"now-{i}"] - producer.status(f"now-{i}").run_at
            assert latency < 0.2, f"now-{i} started {latency:.3f} s after its run_at"
        assert producer.status("far").state is State.READY
    finally:
        s.close()
        producer.close()
        client.close()
        admin.close()


# --------------------------------------------------------------------------- §4 compaction


def test_workers_compact_a_stale_majority_queue_without_an_explicit_compact(
    scheduler: Scheduler, namespace: str
) -> None:
    n = 1200
    # A live entry at the head, not due: claims stop there and never reach the stale
    # entries behind it, so only compaction can remove them.
    scheduler.schedule("head", fn="f", delay=1800)
    for _ in range(3):
        scheduler.schedule_many([TaskSpec(f"t{i}", "f", delay=3600) for i in range(n)])
    stats = scheduler.stats()
    assert stat(stats, "queue_entries") == 3 * n + 1
    assert stat(stats, "stale_entries") == 2 * n
    worker = Worker(scheduler, {"f": lambda: None}, concurrency=1, heartbeat_s=0.1)
    with running(worker):
        wait_until(
            lambda: stat(scheduler.stats(), "stale_entries") == 0, 5.0, "the stale entries gone"
        )
    stats = scheduler.stats()
    assert stat(stats, "queue_entries") == n + 1
    assert scheduler.status("t0").state is State.READY


# --------------------------------------------------------------------------- §6 backoff


async def _schedule_async(url: str, namespace: str) -> None:
    client = aredis.Redis.from_url(url)
    s = AsyncScheduler(client, namespace=namespace)
    try:
        await s.schedule("t", fn="f", max_attempts=2)
    finally:
        await s.close()
        await client.aclose()


def _schedule_cli(server: RedisServer, namespace: str) -> None:
    result = CliRunner().invoke(
        cli,
        ["--redis", server.url, "--namespace", namespace,
         "schedule", "t", "--fn", "f", "--max-attempts", "2"],
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output


PRODUCERS: dict[str, Callable[[Scheduler, RedisServer], object]] = {
    "schedule": lambda s, _: s.schedule("t", fn="f", max_attempts=2),
    "submit": lambda s, _: s.submit("t", fn="f", max_attempts=2),
    "submit_graph": lambda s, _: s.submit_graph([TaskSpec("t", "f", max_attempts=2)]),
    "async schedule": lambda s, server: asyncio.run(_schedule_async(server.url, s.namespace)),
    "cli schedule": lambda s, server: _schedule_cli(server, s.namespace),
}


@pytest.mark.parametrize("produce", list(PRODUCERS))
def test_the_default_backoff_makes_attempt_2_due_one_second_after_attempt_1_ended(
    scheduler: Scheduler, redis_server: RedisServer, produce: str
) -> None:
    PRODUCERS[produce](scheduler, redis_server)
    assert scheduler.status("t").backoff == 1.0
    claim = scheduler.next(W)
    assert isinstance(claim, Claim)
    t0 = scheduler.server_time()
    scheduler.fail(claim, "boom")
    t1 = scheduler.server_time()
    info = scheduler.status("t")
    assert info.state is State.READY
    assert t0 + 1.0 - 0.05 <= info.run_at <= t1 + 1.0 + 0.05


# --------------------------------------------------------------------------- §4 replacement


def test_a_due_task_replaced_by_a_later_version_is_not_claimable_until_the_new_time(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("r", fn="f", delay=-5)
    v2 = scheduler.schedule("r", fn="f", delay=1.0)
    run_at = scheduler.status("r").run_at
    got = scheduler.next(W)
    assert isinstance(got, Wait) and got.reason == "not_due", got
    assert scheduler.ready(5, W) == []
    sleep_until_server_time(scheduler, run_at + 0.005)
    got = scheduler.next(W)
    assert isinstance(got, Claim) and (got.task_id, got.version) == ("r", v2), got
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)


def test_a_running_worker_runs_a_replaced_due_task_once_at_its_new_time(
    scheduler: Scheduler,
) -> None:
    runs: list[tuple[int, int, float]] = []

    def mark() -> None:
        ctx = current_task()
        runs.append((ctx.version, ctx.attempt, scheduler.server_time()))

    # No capacity while the task is written twice, so the idle worker cannot take the
    # first version before it is replaced; then capacity comes back and wakes it.
    scheduler.set_max_running(0)
    worker = Worker(scheduler, {"mark": mark}, concurrency=2)
    with running(worker):
        time.sleep(0.2)  # the worker is waiting for capacity
        scheduler.schedule("r", fn="mark", delay=-5)
        v2 = scheduler.schedule("r", fn="mark", delay=1.0)
        run_at = scheduler.status("r").run_at
        scheduler.set_max_running(10)
        time.sleep(0.5)
        assert runs == [], "the replaced version ran"
        assert scheduler.status("r").state is State.READY
        wait_state(scheduler, "r", State.SUCCEEDED)
        time.sleep(0.3)  # no second run follows
    assert len(runs) == 1
    version, attempt, started = runs[0]
    assert (version, attempt) == (v2, 1)
    assert started >= run_at
