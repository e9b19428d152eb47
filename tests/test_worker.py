"""The worker pool (§8) against a real redis-server: bound, context, cancellation, shutdown.

Workers run on real threads (and, for signals, in real processes). Waiting is
done by polling with generous deadlines; the few time bounds asserted are far
above the expected latency and only tell a prompt mechanism from a missing one
(a heartbeat against a lease expiry, a wake-up against a 30 s delay hint).
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from distsched import Scheduler, State, TaskInfo, Worker, current_task
from distsched.errors import LeaseLost
from tests.conftest import RedisServer, put_payload, python_command, running, subprocess_env
from tests.worker_procs import HoldingWorker, started_key

PROCS = Path(__file__).with_name("worker_procs.py")
LEASE_S = 0.6  # heartbeats every 0.2 s


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def wait_state(s: Scheduler, task_id: str, *states: State, timeout: float = 10.0) -> TaskInfo:
    wait_until(lambda: s.status(task_id).state in states, timeout, f"{task_id} in {states}")
    return s.status(task_id)


def distsched_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("distsched")]


@pytest.fixture
def fast(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    """A scheduler with a short lease, so heartbeats (lease / 3) come every 0.2 s."""
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    yield s
    s.close()


# --------------------------------------------------------------------------- pool bound


def test_pool_never_runs_more_functions_than_its_concurrency_nor_claims_beyond_free_slots(
    fast: Scheduler,
) -> None:
    n = 4
    lock = threading.Condition()
    live = 0
    peak = 0

    def work(i: int) -> int:
        nonlocal live, peak
        with lock:
            live += 1
            peak = max(peak, live)
            lock.notify_all()
            # Linger until the pool is full (or briefly), so the bound is actually reached.
            lock.wait_for(lambda: live >= n, timeout=0.3)
        time.sleep(0.01)
        with lock:
            live -= 1
        return i

    total = 40
    for i in range(total):
        fast.schedule(f"t{i}", fn="work", args=(i,))
    worker = Worker(fast, {"work": work}, concurrency=n)
    snapshots: list[dict[str, int]] = []
    with running(worker):

        def finished() -> bool:
            snapshots.append(worker.snapshot())
            return bool(fast.stats()["counts"]["succeeded"] == total)

        wait_until(finished, 30, "all tasks to succeed")
    assert peak == n
    assert worker.peak_running <= n
    # No task ever waits unstarted for a slot: executing plus claimed-but-unstarted never
    # exceeds the pool (a finished function's report may still be on its way).
    assert max(s["executing"] + s["unstarted"] for s in snapshots) <= n
    assert all(s["free"] == n - s["executing"] - s["unstarted"] for s in snapshots)
    assert worker.counts["claimed"] == total
    assert worker.counts["succeeded"] == total
    assert [fast.status(f"t{i}").result for i in range(total)] == list(range(total))


# --------------------------------------------------------------------------- task context


def test_def_and_async_def_functions_both_run_with_their_own_task_context(
    fast: Scheduler,
) -> None:
    def sync_fn(x: int) -> list[Any]:
        ctx = current_task()
        return [ctx.task_id, ctx.version, ctx.attempt, x, threading.current_thread().name]

    async def async_fn(x: int) -> list[Any]:
        ctx = current_task()
        await asyncio.sleep(0.05)  # let the other async tasks interleave
        again = current_task()
        assert again is ctx
        return [ctx.task_id, ctx.version, ctx.attempt, x]

    versions = {}
    for i in range(3):
        versions[f"s{i}"] = fast.schedule(f"s{i}", fn="sync_fn", args=(i,))
        versions[f"a{i}"] = fast.schedule(f"a{i}", fn="async_fn", args=(i,))
    worker = Worker(fast, {"sync_fn": sync_fn, "async_fn": async_fn}, concurrency=6)
    with running(worker):
        for task_id in versions:
            wait_state(fast, task_id, State.SUCCEEDED, State.FAILED)
    for i in range(3):
        s_info, a_info = fast.status(f"s{i}"), fast.status(f"a{i}")
        assert (s_info.state, a_info.state) == (State.SUCCEEDED, State.SUCCEEDED)
        assert s_info.result[:4] == [f"s{i}", versions[f"s{i}"], 1, i]
        assert s_info.result[4].startswith("distsched-pool-")
        assert a_info.result == [f"a{i}", versions[f"a{i}"], 1, i]


def test_current_task_outside_a_task_function_raises_lookup_error(fast: Scheduler) -> None:
    with pytest.raises(LookupError):
        current_task()
    seen: list[str] = []

    def fn() -> None:
        seen.append(current_task().task_id)

    fast.schedule("one", fn="fn")
    worker = Worker(fast, {"fn": fn}, concurrency=1)
    with running(worker):
        wait_state(fast, "one", State.SUCCEEDED)
    assert seen == ["one"]
    # The context does not leak out of the task into the caller's thread.
    with pytest.raises(LookupError):
        current_task()


# --------------------------------------------------------------------------- cancellation


def _looping_functions(
    started: threading.Event, signalled_at: list[float], stop_on_signal: bool
) -> dict[str, Callable[..., Any]]:
    """A def and an async def function that loop until signalled, then stop or finish."""

    def looping() -> str:
        ctx = current_task()
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.wait_cancelled(0.05):
            if time.monotonic() > deadline:
                return "never signalled"
        signalled_at.append(time.monotonic())
        if stop_on_signal:
            ctx.raise_if_cancelled()
        return "finished anyway"

    async def looping_async() -> str:
        ctx = current_task()
        started.set()
        deadline = time.monotonic() + 20
        while not await ctx.wait_cancelled_async(0.05):
            if time.monotonic() > deadline:
                return "never signalled"
        signalled_at.append(time.monotonic())
        if stop_on_signal:
            ctx.raise_if_cancelled()
        return "finished anyway"

    return {"looping": looping, "looping_async": looping_async}


@pytest.mark.parametrize("fn", ["looping", "looping_async"])
def test_running_function_gets_the_cancel_signal_within_a_heartbeat_and_ends_cancelled(
    fast: Scheduler, fn: str
) -> None:
    started = threading.Event()
    signalled_at: list[float] = []
    worker = Worker(fast, _looping_functions(started, signalled_at, True), concurrency=2)
    with running(worker):
        fast.schedule("job", fn=fn)
        assert started.wait(10)
        requested_at = time.monotonic()
        assert fast.cancel("job") is State.RUNNING
        info = wait_state(fast, "job", State.CANCELLED, State.SUCCEEDED, State.FAILED)
    assert info.state is State.CANCELLED
    assert info.cancel_requested
    # Delivered by the next heartbeat (every 0.2 s), long before the 0.6 s lease could lapse
    # twice; the bound is loose on purpose.
    assert signalled_at and signalled_at[0] - requested_at < 2 * LEASE_S + 0.3
    assert worker.counts["cancelled"] == 1
    assert fast.leases() == []


@pytest.mark.parametrize("fn", ["looping", "looping_async"])
def test_cancel_request_reaches_the_function_before_any_heartbeat_could(
    redis_client: redis.Redis, namespace: str, fn: str
) -> None:
    # A 60 s lease means heartbeats every 20 s: only the published request can arrive in time.
    slow = Scheduler(redis_client, namespace=namespace, lease_s=60.0)
    started = threading.Event()
    signalled_at: list[float] = []
    worker = Worker(slow, _looping_functions(started, signalled_at, True), concurrency=2)
    try:
        with running(worker):
            slow.schedule("job", fn=fn)
            assert started.wait(10)
            requested_at = time.monotonic()
            assert slow.cancel("job") is State.RUNNING
            info = wait_state(slow, "job", State.CANCELLED, State.SUCCEEDED, State.FAILED)
        assert info.state is State.CANCELLED
        assert signalled_at and signalled_at[0] - requested_at < 5.0
    finally:
        slow.close()


@pytest.mark.parametrize("fn", ["looping", "looping_async"])
def test_function_that_ignores_cancel_ends_succeeded_with_cancel_requested_kept(
    fast: Scheduler, fn: str
) -> None:
    started = threading.Event()
    signalled_at: list[float] = []
    worker = Worker(fast, _looping_functions(started, signalled_at, False), concurrency=2)
    with running(worker):
        fast.schedule("job", fn=fn)
        assert started.wait(10)
        assert fast.cancel("job") is State.RUNNING
        info = wait_state(fast, "job", State.CANCELLED, State.SUCCEEDED, State.FAILED)
    assert signalled_at
    assert info.state is State.SUCCEEDED
    assert info.result == "finished anyway"
    assert info.cancel_requested
    assert worker.counts["succeeded"] == 1


def test_cancelled_ready_task_never_runs_on_a_live_worker(fast: Scheduler) -> None:
    calls: list[str] = []
    fast.schedule("later", fn="fn", delay=0.5)
    worker = Worker(fast, {"fn": lambda: calls.append("ran")}, concurrency=2)
    with running(worker):
        assert fast.cancel("later") is State.CANCELLED
        fast.schedule("marker", fn="fn", delay=0.7)
        wait_state(fast, "marker", State.SUCCEEDED)
    assert calls == ["ran"]  # the marker only
    assert fast.status("later").state is State.CANCELLED


def test_heartbeats_go_on_when_a_round_is_refused_by_redis(
    fast: Scheduler, redis_client: redis.Redis
) -> None:
    # A corrupt record with an expired lease makes every reap of the namespace fail.
    redis_client.hset(fast.keys.tasks, "corrupt", "not a record")
    redis_client.zadd(fast.keys.leases, {"corrupt": 0})
    started = threading.Event()
    signalled_at: list[float] = []
    worker = Worker(fast, _looping_functions(started, signalled_at, True), concurrency=1)
    with running(worker):
        fast.schedule("job", fn="looping")
        assert started.wait(10)
        time.sleep(2 * LEASE_S)  # several heartbeat rounds, each with a refused reap
        assert fast.cancel("job") is State.RUNNING
        info = wait_state(fast, "job", State.CANCELLED, State.SUCCEEDED, State.FAILED)
    assert signalled_at
    assert (info.state, info.attempt) == (State.CANCELLED, 1)


# --------------------------------------------------------------------------- lease loss


def test_lost_lease_signals_the_running_function_and_its_late_report_is_stale(
    fast: Scheduler,
) -> None:
    first_started = threading.Event()
    seen: dict[str, Any] = {}

    def fragile() -> int:
        ctx = current_task()
        if ctx.attempt == 1:
            first_started.set()
            deadline = time.monotonic() + 20
            while not ctx.wait_cancelled(0.05) and time.monotonic() < deadline:
                pass
            seen.update(lease_lost=ctx.lease_lost, cancel_requested=ctx.cancel_requested)
            try:
                ctx.raise_if_cancelled()
            except LeaseLost:
                seen["raised"] = "LeaseLost"
                raise
        return ctx.attempt

    fast.schedule("job", fn="fragile", max_attempts=2, backoff=0)
    worker = Worker(fast, {"fragile": fragile}, concurrency=2)
    with running(worker):
        assert first_started.wait(10)
        assert fast.expire_lease("job") == 1
        wait_until(lambda: worker.counts["stale"] == 1, 10, "the stale report of attempt 1")
        info = wait_state(fast, "job", State.SUCCEEDED, State.FAILED)
    assert seen == {"lease_lost": True, "cancel_requested": True, "raised": "LeaseLost"}
    assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 2, 2)
    assert worker.counts["succeeded"] == 1
    assert worker.counts["failed"] == 0


# --------------------------------------------------------------------------- bad tasks


def test_a_claimed_task_of_an_unserved_function_goes_back_unstarted_and_the_worker_carries_on(
    fast: Scheduler,
) -> None:
    fast.schedule("elsewhere", fn="not_registered")
    fast.schedule("good", fn="ok")
    worker = Worker(fast, {"ok": lambda: "fine"}, concurrency=2)
    with running(worker):
        wait_until(lambda: worker.counts["unserved"] >= 1, 10, "the hand-back")
        wait_state(fast, "good", State.SUCCEEDED)
        # The worker carries on with later tasks.
        fast.schedule("after", fn="ok")
        after = wait_state(fast, "after", State.SUCCEEDED)
        info = fast.status("elsewhere")
        # Handed back, not failed: no attempt spent, no error, waiting for a worker that
        # serves the function (the default unserved_timeout is minutes).
        assert (info.state, info.attempt, info.error) == (State.READY, 0, None)
    assert after.result == "fine"
    assert worker.counts["failed"] == 0


def test_function_raising_a_base_exception_fails_its_task_and_the_worker_carries_on(
    fast: Scheduler,
) -> None:
    def sync_exit() -> None:
        raise SystemExit(3)

    async def async_cancelled() -> None:
        # e.g. an inner task of the function was cancelled and the error escaped
        raise asyncio.CancelledError()

    fast.schedule("sync", fn="sync_exit")
    fast.schedule("async", fn="async_cancelled")
    worker = Worker(
        fast, {"sync_exit": sync_exit, "async_cancelled": async_cancelled, "ok": lambda: 1}
    )
    with running(worker):
        infos = [wait_state(fast, t, State.FAILED, State.SUCCEEDED) for t in ("sync", "async")]
        fast.schedule("after", fn="ok")
        wait_state(fast, "after", State.SUCCEEDED)
    assert [(i.state, i.lease_deadline) for i in infos] == [(State.FAILED, None)] * 2
    assert infos[0].error is not None and "SystemExit" in infos[0].error
    assert infos[1].error is not None and "CancelledError" in infos[1].error


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xc1\x00garbage",  # 0xc1 is never used by msgpack
        msgpack.packb([1, 2, 3]),  # msgpack, but not a map
        msgpack.packb({"fn": 7, "args": []}),  # a map with a bad fn
    ],
    ids=["not-msgpack", "not-a-map", "bad-fn"],
)
def test_undecodable_payload_fails_that_task_only(
    fast: Scheduler, redis_client: redis.Redis, garbage: bytes
) -> None:
    calls: list[int] = []
    for i in range(5):
        fast.schedule(f"ok{i}", fn="record", args=(i,))
    fast.schedule("broken", fn="record", args=(99,), priority=1)
    # A foreign producer's bug: the payload is replaced behind the scheduler's back.
    put_payload(redis_client, fast.keys, "broken", garbage)
    worker = Worker(fast, {"record": calls.append}, concurrency=2)
    with running(worker):
        broken = wait_state(fast, "broken", State.FAILED, State.SUCCEEDED)
        for i in range(5):
            wait_state(fast, f"ok{i}", State.SUCCEEDED)
    assert broken.state is State.FAILED
    assert broken.error is not None and "payload" in broken.error
    assert sorted(calls) == list(range(5))


# --------------------------------------------------------------------------- shutdown


def test_stop_releases_unstarted_claims_then_lets_running_functions_finish(
    fast: Scheduler, redis_client: redis.Redis
) -> None:
    go = threading.Event()
    slow_started = threading.Semaphore(0)

    def slow(i: int) -> int:
        slow_started.release()
        assert go.wait(10)
        return i

    def held(mark: str = "held") -> None:
        redis_client.incr(started_key(fast.namespace, mark))

    # Two functions run; two more tasks are claimed but their pool threads have not picked
    # them up (HoldingWorker); two wait in the queue beyond the pool's four slots.
    fast.schedule("slow0", fn="slow", args=(0,), priority=10)
    fast.schedule("slow1", fn="slow", args=(1,), priority=10)
    fast.schedule("held0", fn="held", priority=5)
    fast.schedule("held1", fn="held", priority=5)
    fast.schedule("queued0", fn="slow", args=(2,))
    fast.schedule("queued1", fn="slow", args=(3,))
    before = set(threading.enumerate())
    worker = HoldingWorker(fast, {"slow": slow, "held": held}, concurrency=4)
    with running(worker, grace=10.0):
        assert slow_started.acquire(timeout=10) and slow_started.acquire(timeout=10)
        wait_until(lambda: fast.stats()["running"] == 4, 10, "four claims")
        worker.stop(grace=10.0)
        # Unstarted claims go back first, while the running functions are still running.
        for task_id in ("held0", "held1"):
            info = wait_state(fast, task_id, State.READY)
            assert (info.attempt, info.worker, info.lease_deadline) == (0, None, None)
        assert fast.status("slow0").state is State.RUNNING
        go.set()
        assert worker.wait_stopped(10)
    for task_id in ("slow0", "slow1"):
        assert fast.status(task_id).state is State.SUCCEEDED
    for task_id in ("queued0", "queued1"):
        info = fast.status(task_id)
        assert (info.state, info.attempt) == (State.READY, 0)
    assert redis_client.get(started_key(fast.namespace, "held")) is None
    assert worker.counts["released"] == 2
    assert worker.counts["succeeded"] == 2
    assert fast.stats()["running"] == 0
    assert fast.leases() == []
    assert set(threading.enumerate()) - before == set()
    assert distsched_threads() == []


@pytest.mark.parametrize("fn", ["looping", "looping_async"])
def test_functions_still_running_after_the_grace_period_receive_the_cancel_signal(
    fast: Scheduler, fn: str
) -> None:
    started = threading.Event()
    signalled_at: list[float] = []
    before = set(threading.enumerate())
    worker = Worker(fast, _looping_functions(started, signalled_at, True), concurrency=2)
    fast.schedule("job", fn=fn)  # max_attempts=1: a spent attempt would end it failed
    with running(worker):
        assert started.wait(10)
        stop_at = time.monotonic()
        worker.stop(grace=0.3)
        assert worker.wait_stopped(10)
    assert signalled_at and signalled_at[0] - stop_at >= 0.3
    info = fast.status("job")
    # Stopped by the worker's own shutdown: neither a failure nor a cancellation. The task
    # is back in the queue for another worker with its attempt given back.
    assert info.state is State.READY
    assert (info.attempt, info.cancel_requested, info.lease_deadline) == (0, False, None)
    assert info.error is None
    assert (worker.counts["released"], worker.counts["failed"]) == (1, 0)
    assert fast.stats()["running"] == 0
    assert set(threading.enumerate()) - before == set()
    assert distsched_threads() == []


def test_run_off_the_main_thread_installs_no_signal_handlers(fast: Scheduler) -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    ran = threading.Event()
    fast.schedule("one", fn="fn")
    worker = Worker(fast, {"fn": ran.set}, concurrency=1)
    with running(worker):
        assert ran.wait(10)
        assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_run_on_the_main_thread_handles_sigterm_and_sigint_then_restores_handlers(
    fast: Scheduler,
) -> None:
    assert threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    during: dict[signal.Signals, Any] = {}
    ran = threading.Event()
    worker = Worker(fast, {"fn": ran.set}, concurrency=1)

    def observe_then_stop() -> None:
        if ran.wait(10):
            during.update({s: signal.getsignal(s) for s in handlers})
        worker.stop(1.0)

    fast.schedule("one", fn="fn")
    helper = threading.Thread(target=observe_then_stop)
    helper.start()
    worker.run()
    helper.join(10)
    assert set(during) == set(handlers)
    assert all(during[s] is not handlers[s] and callable(during[s]) for s in handlers)
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def stderr_until(proc: subprocess.Popen[str], text: str, timeout: float) -> str:
    """What ``proc`` wrote to stderr up to the first line holding ``text``."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while not any(text in line for line in lines):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, left))
        line = proc.stderr.readline() if ready else ""
        assert line, f"{text!r} not written within {timeout} s: {''.join(lines)!r}"
        lines.append(line)
    return "".join(lines)


def _start_worker_process(url: str, namespace: str, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        python_command(str(PROCS), "worker", url, namespace, *extra),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_process_signalled_while_busy_finishes_running_tasks_and_releases_the_rest(
    redis_server: RedisServer,
    fast: Scheduler,
    redis_client: redis.Redis,
    signum: signal.Signals,
) -> None:
    ns = fast.namespace
    fast.schedule("run0", fn="sleep", args=(1.0, "run0"), priority=10)
    fast.schedule("run1", fn="sleep", args=(1.0, "run1"), priority=10)
    fast.schedule("held0", fn="held", priority=5)
    fast.schedule("held1", fn="held", priority=5)
    fast.schedule("queued", fn="sleep", args=(0.0, "queued"))
    proc = _start_worker_process(redis_server.url, ns, "--concurrency", "4")
    try:
        wait_until(
            lambda: (
                all(redis_client.get(started_key(ns, m)) for m in ("run0", "run1"))
                and fast.stats()["running"] == 4
            ),
            15,
            "two running functions and two unstarted claims",
        )
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["succeeded"], summary["released"]) == (2, 2)
    for task_id in ("run0", "run1"):
        info = fast.status(task_id)
        assert (info.state, info.result) == (State.SUCCEEDED, "slept")
    for task_id in ("held0", "held1", "queued"):
        info = fast.status(task_id)
        assert (info.state, info.attempt, info.lease_deadline) == (State.READY, 0, None)
    assert redis_client.get(started_key(ns, "held")) is None
    assert redis_client.get(started_key(ns, "queued")) is None
    assert fast.stats()["running"] == 0


def test_a_second_sigint_exits_at_once_leaving_the_lease_to_expire(
    redis_server: RedisServer, fast: Scheduler, redis_client: redis.Redis
) -> None:
    ns = fast.namespace
    fast.schedule("long", fn="sleep", args=(30.0, "long"))
    proc = _start_worker_process(redis_server.url, ns, "--concurrency", "1")
    try:
        wait_until(lambda: redis_client.get(started_key(ns, "long")), 15, "the task to start")
        proc.send_signal(signal.SIGINT)  # graceful: it would wait for the 30 s function
        # Python runs a handler once for signals that arrive before it ran: the second
        # goes only once the first was handled (on a busy machine that takes a while).
        said = stderr_until(proc, "SIGINT: stopping", 15)
        proc.send_signal(signal.SIGINT)  # the second one leaves now
        _, rest = proc.communicate(timeout=10)
        assert "second SIGINT: exiting now" in said + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    # Nothing was reported: the task is still running under its lease, which will expire.
    info = fast.status("long")
    assert info.state is State.RUNNING and info.lease_deadline is not None
    assert fast.expire_lease("long") == 1
    assert fast.status("long").state is State.FAILED


# --------------------------------------------------------------------------- wake-ups


@pytest.mark.parametrize("head", ["empty queue", "head due in 30 s"])
def test_waiting_worker_starts_a_newly_due_task_without_waiting_out_its_delay_hint(
    fast: Scheduler, redis_client: redis.Redis, head: str
) -> None:
    started_at: list[float] = []
    if head != "empty queue":
        fast.schedule("far", fn="mark", delay=30)
    worker = Worker(fast, {"mark": lambda: started_at.append(time.monotonic())}, concurrency=2)
    with running(worker):
        wait_until(
            lambda: redis_client.pubsub_shardnumsub(fast.keys.wake)[0][1] >= 1, 10, "a subscriber"
        )
        time.sleep(0.2)  # let the worker settle into its wait
        scheduled_at = time.monotonic()
        fast.schedule("now", fn="mark")
        wait_state(fast, "now", State.SUCCEEDED)
    # Woken by the submission, not by the 30 s (or unbounded) delay hint.
    assert started_at[0] - scheduled_at < 1.0
    if head != "empty queue":
        assert fast.status("far").state is State.READY


def test_delayed_task_never_starts_before_its_run_at_by_the_server_clock(
    fast: Scheduler,
) -> None:
    starts: dict[str, tuple[float, float]] = {}

    def mark() -> None:
        ctx = current_task()
        starts[ctx.task_id] = (fast.server_time(), ctx.claim.run_at)

    worker = Worker(fast, {"mark": mark}, concurrency=2)
    with running(worker):
        scheduled_at = fast.server_time()
        fast.schedule("delayed", fn="mark", delay=0.3)
        # Wake the worker while the delayed task is not due yet.
        time.sleep(0.1)
        fast.schedule("nudge", fn="mark")
        info = wait_state(fast, "delayed", State.SUCCEEDED)
        wait_state(fast, "nudge", State.SUCCEEDED)
    started, run_at = starts["delayed"]
    assert run_at == info.run_at
    assert run_at >= scheduled_at + 0.3 - 0.002  # rounded to the millisecond
    assert started >= run_at
