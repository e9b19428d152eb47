"""Races across threads and processes against a real redis-server (§5, §6, §8).

Every racer uses its own connection; the assertions check the invariants the
scripts promise whatever the interleaving: one winner between cancel and claim,
one claim per (version, attempt), and the fleet-wide ``max_running`` bound.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from distsched import Outcome, Scheduler, State, TaskSpec
from tests.conftest import RedisServer, python_command, subprocess_env
from tests.worker_procs import live_key

PROCS = Path(__file__).with_name("worker_procs.py")


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.005)


def schedule_batch(s: Scheduler, ids: list[str], fn: str = "f", **kw: Any) -> None:
    for start in range(0, len(ids), 500):
        s.schedule_many([TaskSpec(i, fn, **kw) for i in ids[start : start + 500]])


def race_cancel_against_claim(
    server: RedisServer, namespace: str, cancel_order: list[str]
) -> tuple[list[str], dict[str, State]]:
    """One thread claims one task at a time while another cancels ``cancel_order``."""
    claimed: list[str] = []
    answers: dict[str, State] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def racer(body: Callable[[Scheduler], None]) -> None:
        client = server.client()
        s = Scheduler(client, namespace=namespace, lease_s=60)
        try:
            barrier.wait()
            body(s)
        except BaseException as exc:  # handed to the test
            errors.append(exc)
        finally:
            s.close()
            client.close()

    def claim_all(s: Scheduler) -> None:
        while claims := s.ready(1, "racer"):
            claimed.extend(c.task_id for c in claims)

    def cancel_all(s: Scheduler) -> None:
        for task_id in cancel_order:
            answers[task_id] = s.cancel(task_id)

    threads = [threading.Thread(target=racer, args=(body,)) for body in (claim_all, cancel_all)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return claimed, answers


def test_cancel_racing_claim_has_exactly_one_winner_per_task(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    won_by_cancel = won_by_claim = 0
    for round_no, order in enumerate(["reverse", "shuffled", "forward"]):
        ids = [f"r{round_no}-{i:04d}" for i in range(300)]
        schedule_batch(scheduler, ids)
        cancel_order = {
            "forward": ids,
            "reverse": ids[::-1],
            "shuffled": random.sample(ids, len(ids)),
        }[order]
        claimed, answers = race_cancel_against_claim(redis_server, namespace, cancel_order)
        assert len(claimed) == len(set(claimed)), "a task was claimed twice"
        for task_id in ids:
            info = scheduler.status(task_id)
            if answers[task_id] is State.CANCELLED:
                # Cancel won: never claimed, never ran.
                assert task_id not in claimed
                assert (info.state, info.attempt) == (State.CANCELLED, 0)
                won_by_cancel += 1
            else:
                # Claim won: cancel only recorded the request for the running function.
                assert answers[task_id] is State.RUNNING
                assert task_id in claimed
                assert (info.state, info.attempt, info.cancel_requested) == (
                    State.RUNNING,
                    1,
                    True,
                )
                won_by_claim += 1
    # Both sides really raced: each won some (the reverse round meets in the middle).
    assert won_by_cancel and won_by_claim
    stats = scheduler.stats()
    assert stats["counts"]["running"] == won_by_claim == stats["leases"]
    assert stats["counts"]["cancelled"] == won_by_cancel
    assert stats["counts"]["ready"] == 0


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        python_command(str(PROCS), *args),
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reap(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_four_processes_claim_each_of_2000_tasks_exactly_once(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    ids = [f"t{i:05d}" for i in range(2000)]
    schedule_batch(scheduler, ids)
    procs = [_spawn("claim", redis_server.url, namespace) for _ in range(4)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        start = time.time() + 1.0
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {start}\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        _reap(procs)
    tokens = [tuple(t) for r in results for t in r["tokens"]]
    outcomes = Counter(o for r in results for o in r["outcomes"])
    per_id = Counter(t[0] for t in tokens)
    assert sorted(per_id) == ids
    assert set(per_id.values()) == {1}, "a task was claimed more than once"
    assert {t[2] for t in tokens} == {1}
    assert outcomes == {Outcome.APPLIED.value: 2000}
    # More than one process took part, so the claims really raced.
    assert sum(1 for r in results if r["tokens"]) >= 2
    stats = scheduler.stats()
    assert stats["counts"]["succeeded"] == 2000
    assert (stats["running"], stats["counts"]["ready"], stats["leases"]) == (0, 0, 0)


def test_max_running_bounds_running_tasks_across_two_worker_processes(
    redis_server: RedisServer, namespace: str, redis_client: redis.Redis
) -> None:
    limit, total = 3, 24
    s = Scheduler(redis_client, namespace=namespace, lease_s=5.0, max_running=limit)
    try:
        procs = [
            _spawn("worker", redis_server.url, namespace, "--concurrency", "4") for _ in range(2)
        ]
        try:
            # Both processes claim from the start (a slow start under load would leave all
            # the work to one), and each task runs long enough for the bound to be reached.
            wait_until(lambda: len(s.workers()) == 2, 60, "both worker processes to register")
            schedule_batch(s, [f"t{i:02d}" for i in range(total)], fn="sleep", args=(0.2,))
            samples: list[int] = []

            def all_succeeded() -> bool:
                stats = s.stats()
                samples.append(stats["running"])
                return bool(stats["counts"]["succeeded"] == total)

            wait_until(all_succeeded, 60, "every task to succeed")
            summaries = []
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                out, err = proc.communicate(timeout=30)
                assert proc.returncode == 0, err
                summaries.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            _reap(procs)
        assert max(samples) <= limit
        # Measured inside the functions, across both processes: the bound was reached, not passed.
        assert max(sm["peak_live"] for sm in summaries) == limit
        assert sum(sm["succeeded"] for sm in summaries) == total
        assert all(sm["succeeded"] for sm in summaries), "one process did all the work"
        assert int(redis_client.get(live_key(namespace)) or 0) == 0
    finally:
        s.close()
