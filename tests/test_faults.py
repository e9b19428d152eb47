"""Faults with real processes and a real Redis (§6, §8, §12).

Workers are killed with SIGKILL, frozen with SIGSTOP and stopped with SIGTERM;
``redis-server`` is shut down and restarted under them. What is asserted is what
the contract promises afterwards: no task lost, every rerun explained by a lease
expiry, stale reports refused, nothing run twice that had not lost its lease.
Waiting is done by polling with generous deadlines; no timing is asserted.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distsched import Claim, Scheduler, State, TaskSpec, Worker
from distsched.ops.protocol import Request
from distsched.wire.calls import Call
from tests.conftest import RedisServer, namespace_keys, python_command, running, subprocess_env
from tests.fault_procs import ends_key, reports_key, rows, runs_key, seen_key

PROCS = Path(__file__).with_name("fault_procs.py")
LEASE_S = 0.5


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def start_worker(url: str, namespace: str, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        python_command(str(PROCS), url, namespace, "--lease", str(LEASE_S), *extra),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    return proc


def stop_worker(proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, int]:
    """SIGTERM ``proc``; check that it exits 0 and return its counts."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker exited {proc.returncode}"
    summary: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return summary


@contextmanager
def reaped(*procs: subprocess.Popen[str]) -> Iterator[None]:
    """Never leave a worker process behind, whatever the test did."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def done_tokens(s: Scheduler, task_id: str) -> list[str]:
    """The tokens of the task's applied reports, "version.attempt", from its history."""
    return [
        f"{a.version}.{a.attempt}"
        for a in s.status(task_id).attempts
        if a.outcome in ("succeeded", "failed", "cancelled")
    ]


class CountingScheduler(Scheduler):
    """Records every script call: (monotonic start, script name, answered)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[float, str, bool]] = []

    def _request(self, request: Request) -> Any:
        if not isinstance(request, Call):
            return super()._request(request)
        started = time.monotonic()
        try:
            reply = super()._request(request)
        except Exception:
            self.calls.append((started, request.script, False))
            raise
        self.calls.append((started, request.script, True))
        return reply


# --------------------------------------------------------------------------- kill -9


# It starts 23 worker processes one after another; on a machine busy with something
# else each start takes seconds, so it gets more than the suite's 120 s.
@pytest.mark.timeout(360)
def test_workers_killed_mid_run_lose_no_task_and_every_rerun_follows_a_lease_expiry(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    kills_wanted = 22
    rng = random.Random(20240611)
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    produced: list[str] = []
    producer_errors: list[BaseException] = []
    stop_producing = threading.Event()

    def produce() -> None:
        # Keep a backlog, so that each kill lands in a full pool.
        try:
            while not stop_producing.is_set():
                if s.stats()["counts"]["ready"] < 12:
                    ids = [f"k{len(produced) + j:04d}" for j in range(4)]
                    s.schedule_many(
                        [
                            TaskSpec(i, "record", args=(rng.randint(20, 50),), max_attempts=100,
                                     backoff=0)
                            for i in ids
                        ]
                    )  # fmt: skip
                    produced.extend(ids)
                stop_producing.wait(0.01)
        except BaseException as exc:  # handed to the test
            producer_errors.append(exc)

    producer = threading.Thread(target=produce, name="test-producer")
    producer.start()
    killed: set[int] = set()
    try:
        for _ in range(kills_wanted):
            before = redis_client.llen(runs_key(namespace))
            proc = start_worker(redis_server.url, namespace, "--concurrency", "4")
            with reaped(proc):
                wait_until(
                    lambda: redis_client.llen(runs_key(namespace)) > before,  # noqa: B023
                    what="the new worker to start a task",
                )
                time.sleep(rng.uniform(0.02, 0.3))
                proc.kill()
                proc.communicate()
            assert proc.returncode == -signal.SIGKILL
            killed.add(proc.pid)
    finally:
        stop_producing.set()
        producer.join(30)
    assert not producer_errors, producer_errors

    final = start_worker(redis_server.url, namespace, "--concurrency", "4")
    with reaped(final):
        wait_until(
            lambda: s.stats()["counts"]["succeeded"] == len(produced),
            60,
            "a clean worker to finish every task",
        )
        stop_worker(final)

    stats = s.stats()
    assert (stats["running"], stats["leases"], stats["counts"]["ready"]) == (0, 0, 0)
    runs: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for task_id, version, attempt, pid in rows(redis_client, runs_key(namespace)):
        runs[str(task_id)].append((int(version), int(attempt), int(pid)))
    stale_reports = {
        (str(r[0]), r[1], r[2])
        for r in rows(redis_client, reports_key(namespace))
        if r[4] == "stale"
    }
    assert {r[4] for r in rows(redis_client, reports_key(namespace))} <= {"applied", "stale"}

    reruns = 0
    for task_id in produced:
        info = s.status(task_id)
        assert info.state is State.SUCCEEDED, (task_id, info.state, info.error)
        # Exactly one report was applied: the final attempt's. A killed worker's late
        # report, had one reached Redis, would show here as a second token.
        assert done_tokens(s, task_id) == [f"{info.version}.{info.attempt}"]
        pid, attempt = info.result
        assert attempt == info.attempt
        task_runs = runs[task_id]
        assert (info.version, info.attempt, pid) in task_runs
        tokens = [(v, a) for v, a, _ in task_runs]
        assert len(set(tokens)) == len(tokens), f"{task_id} ran twice with one token"
        assert all(v == info.version for v, _ in tokens)
        for version, attempt, run_pid in task_runs:
            if attempt == info.attempt:
                continue
            # An earlier run lost its lease: its process was killed, or its report was
            # refused as stale (a live worker that missed its heartbeats).
            reruns += 1
            assert attempt < info.attempt
            assert run_pid in killed or (task_id, version, attempt) in stale_reports, (
                task_id,
                task_runs,
            )
    for task_id, _version, attempt in stale_reports:
        assert s.status(task_id).attempt > attempt
    # The kills did land in a busy pool: many runs were cut short and rerun.
    assert reruns >= kills_wanted // 2
    print(
        f"\nkill -9: kills={len(killed)} tasks={len(produced)} "
        f"runs={sum(map(len, runs.values()))} reruns={reruns} "
        f"stale_reports={len(stale_reports)} lost=0"
    )


# --------------------------------------------------------------------------- redis restart


def test_clean_restart_keeps_every_acknowledged_task_in_queue_order_and_the_worker_carries_on(
    namespace: str,
) -> None:
    server = RedisServer(appendonly=True)
    s = CountingScheduler.from_url(server.url, namespace=namespace, lease_s=1.0)
    assert isinstance(s, CountingScheduler)
    check = server.client()
    try:
        s.schedule("done", fn="rec", args=("done",))
        claim = s.next("manual")
        assert isinstance(claim, Claim)
        s.complete(claim, "ok")
        s.schedule("gone", fn="rec", args=("gone",), delay=3600)
        s.cancel("gone")
        rng = random.Random(7)
        priorities = [rng.randint(-3, 3) for _ in range(30)]
        # One run_at for all, in the near future: the queue order is then (-priority,
        # submission), and nothing is claimed before the restart.
        due = s.server_time() + 2.0
        s.schedule_many(
            [
                TaskSpec(f"q{i:02d}", "rec", args=(f"q{i:02d}",), run_at=due, priority=p)
                for i, p in enumerate(priorities)
            ]
        )
        expected = [f"q{i:02d}" for i in sorted(range(30), key=lambda i: (-priorities[i], i))]
        ran: list[str] = []
        worker = Worker(s, {"rec": ran.append}, concurrency=1)
        with running(worker):
            wait_until(
                lambda: any(c[1] == "claim" and c[2] for c in s.calls),
                what="the worker to wait for the queue head",
            )
            # Idle workers re-register on each claim: the idle set's scores move by design.
            wait_until(lambda: check.zcard(s.keys.idle) == 1, what="the worker to go idle")
            idle = s.keys.idle.encode()
            # So does the worker's registry entry, rewritten on every heartbeat.
            registry = s.keys.workers.encode()
            before = namespace_keys(check, namespace)
            before.pop(idle)
            before.pop(registry, None)
            check.close()
            server.stop()
            server.start()
            check = server.client()
            assert s.server_time() < due, "the restart took longer than the test allows"
            after = namespace_keys(check, namespace)
            after.pop(idle, None)
            after.pop(registry, None)
            assert after == before
            wait_until(lambda: len(ran) == 30, 30, "the worker to run every task after the restart")
        assert ran == expected
        for task_id in expected:
            info = s.status(task_id)
            assert (info.state, info.attempt) == (State.SUCCEEDED, 1)
        assert (s.status("done").state, s.status("done").result) == (State.SUCCEEDED, "ok")
        assert s.status("gone").state is State.CANCELLED
    finally:
        check.close()
        s.close()
        server.close()


# --------------------------------------------------------------------------- redis outage


def test_worker_rides_out_an_unreachable_redis_without_spinning_and_loses_no_task(
    namespace: str,
) -> None:
    outage_s = 3.0
    server = RedisServer(appendonly=True)
    # redis-py's own retries would hide a short outage from the worker; with them off,
    # the worker's own backoff is what keeps it from spinning.
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    s = CountingScheduler(client, namespace=namespace, lease_s=5.0)
    started: list[str] = []
    ran: list[str] = []

    def work(task_id: str, seconds: float) -> str:
        started.append(task_id)
        time.sleep(seconds)
        ran.append(task_id)
        return task_id

    try:
        # Two tasks run across the stop (their reports meet the outage); six come due
        # during it (claims meet the outage).
        s.schedule_many([TaskSpec(f"slow{i}", "work", args=(f"slow{i}", 1.0)) for i in range(2)])
        due = s.server_time() + 1.0
        s.schedule_many(
            [TaskSpec(f"late{i}", "work", args=(f"late{i}", 0.01), run_at=due) for i in range(6)]
        )
        worker = Worker(s, {"work": work}, concurrency=4)
        with running(worker) as thread:
            wait_until(lambda: len(started) == 2, what="both slow tasks to start")
            stopped_at = time.monotonic()
            cpu_before = time.process_time()
            server.stop()
            time.sleep(outage_s)
            cpu_used = time.process_time() - cpu_before
            restarted_at = time.monotonic()
            server.start()
            assert thread.is_alive()
            wait_until(lambda: len(ran) == 8, 30, "every task after the restart")
            wait_until(
                lambda: s.stats()["counts"]["succeeded"] == 8, 30, "every report after the restart"
            )
        during = [c for c in s.calls if stopped_at <= c[0] < restarted_at]
        failed_claims = [c for c in during if c[1] == "claim" and not c[2]]
        print(
            f"\noutage {outage_s:.1f}s: script calls={len(during)} "
            f"failed claims={len(failed_claims)} cpu={cpu_used:.3f}s"
        )
        # It kept trying by itself, with pauses between attempts: a tight retry loop
        # would make thousands of calls and burn a core for the whole outage.
        assert len(failed_claims) >= 2
        assert len(during) <= 60
        assert cpu_used < 0.3 * outage_s
        assert sorted(ran) == sorted(set(ran)), "a task ran twice"
        for task_id in [f"slow{i}" for i in range(2)] + [f"late{i}" for i in range(6)]:
            info = s.status(task_id)
            assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 1, task_id)
        assert s.stats()["leases"] == 0
    finally:
        s.close()
        client.close()
        server.close()


# --------------------------------------------------------------------------- frozen worker


def test_frozen_worker_loses_its_lease_its_function_is_told_and_its_late_completion_is_stale(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    s.schedule("t", fn="watch", max_attempts=3, backoff=0)
    first = start_worker(redis_server.url, namespace, "--concurrency", "2")
    second: subprocess.Popen[str] | None = None
    with reaped(first):
        wait_until(lambda: redis_client.llen(runs_key(namespace)) == 1, what="attempt 1 to start")
        # Frozen: no heartbeat goes out while its function is still "running".
        first.send_signal(signal.SIGSTOP)
        try:
            second = start_worker(redis_server.url, namespace, "--concurrency", "2")
            with reaped(second):
                wait_until(
                    lambda: s.status("t").state is State.SUCCEEDED, what="attempt 2 to succeed"
                )
                info = s.status("t")
                assert (info.attempt, info.result) == (2, "attempt 2")
                second_counts = stop_worker(second)
        finally:
            first.send_signal(signal.SIGCONT)
        wait_until(
            lambda: redis_client.llen(reports_key(namespace)) == 2,
            what="the thawed worker's report",
        )
        first_counts = stop_worker(first)
    [seen] = rows(redis_client, seen_key(namespace))
    assert seen == [True, True, first.pid], "the function was not told its lease was lost"
    reports = rows(redis_client, reports_key(namespace))
    assert second is not None
    assert ["t", 1, 2, "complete", "applied", second.pid] in reports
    assert ["t", 1, 1, "complete", "stale", first.pid] in reports
    assert first_counts["stale"] == 1 and first_counts["succeeded"] == 0
    assert second_counts["succeeded"] == 1
    info = s.status("t")
    assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 2, "attempt 2")
    assert done_tokens(s, "t") == ["1.2"]


# --------------------------------------------------------------------------- SIGTERM


def test_sigterm_to_a_busy_worker_finishes_running_tasks_and_spends_no_attempt_on_the_rest(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    total = 40
    ids = [f"b{i:02d}" for i in range(total)]
    s.schedule_many([TaskSpec(i, "record", args=(300,)) for i in ids])
    proc = start_worker(redis_server.url, namespace, "--concurrency", "4", "--grace", "10")
    with reaped(proc):
        wait_until(
            lambda: redis_client.llen(ends_key(namespace)) >= 4 and s.stats()["running"] == 4,
            what="a full pool after the first tasks finished",
        )
        ends_at_signal = redis_client.llen(ends_key(namespace))
        counts = stop_worker(proc)
    starts = rows(redis_client, runs_key(namespace))
    ends = rows(redis_client, ends_key(namespace))
    # Every run that had started finished (none was cut off), some of them after the signal.
    assert sorted(map(tuple, starts)) == sorted(map(tuple, ends))
    assert len(ends) > ends_at_signal
    assert len({r[0] for r in starts}) == len(starts), "a task ran twice"
    ran = {str(r[0]) for r in starts}
    assert counts["succeeded"] == len(ran)
    for task_id in ids:
        info = s.status(task_id)
        if task_id in ran:
            assert (info.state, info.attempt) == (State.SUCCEEDED, 1), task_id
        else:
            # Claimed but not started, or never claimed: back in the queue, no attempt spent.
            assert (info.state, info.attempt, info.lease_deadline) == (State.READY, 0, None)
    assert s.stats()["running"] == 0 and s.stats()["leases"] == 0
    assert len(ran) < total

    # The rest runs once each on the next worker, at their first attempt.
    proc = start_worker(redis_server.url, namespace, "--concurrency", "4")
    with reaped(proc):
        wait_until(lambda: s.stats()["counts"]["succeeded"] == total, 30, "the rest to run")
        stop_worker(proc)
    starts = rows(redis_client, runs_key(namespace))
    assert sorted(str(r[0]) for r in starts) == ids
    assert all(s.status(i).attempt == 1 for i in ids)
    print(f"\nSIGTERM: ran before={len(ran)} released={counts['released']} of {total}")
