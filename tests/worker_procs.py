"""Programs the race and shutdown tests run as separate processes.

``python tests/worker_procs.py claim URL NAMESPACE``
    Prints ``ready``, waits for a line on stdin (so that every process starts
    at once), then claims with ``ready(n)`` and reports with ``complete_many``
    until the queue is empty. Prints the claimed tokens as one JSON line.

``python tests/worker_procs.py worker URL NAMESPACE [--concurrency N] [--lease S]``
    Runs a ``Worker`` on the main thread (so SIGTERM/SIGINT trigger its
    shutdown) until signalled, then prints a JSON summary line. Functions:
    ``sleep(seconds, mark)`` counts live executions across the fleet in Redis;
    ``held(mark)`` never gets past its pool thread before shutdown releases it;
    ``steps(n, stall_after)`` does n steps from its checkpoint on, noting each
    (``attempt:step``) in Redis, and its first attempt stalls after ``stall_after``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any

import redis

from distsched import Scheduler, Worker, current_task
from distsched.worker import Job
from distsched.worker.execution import ThreadPool


def live_key(namespace: str) -> str:
    """Outside the namespace's own keys: the tests' count of functions executing now."""
    return f"test:{namespace}:live"


def started_key(namespace: str, mark: str) -> str:
    return f"test:{namespace}:started:{mark}"


def steps_key(namespace: str) -> str:
    """The steps ``steps`` did, ``attempt:step`` in the order done, across the fleet."""
    return f"test:{namespace}:steps"


def claim_main(url: str, namespace: str) -> int:
    s = Scheduler.from_url(url, namespace=namespace, lease_s=30.0)
    worker_id = f"claimer-{random.getrandbits(32):08x}"
    tokens: list[list[Any]] = []
    outcomes: list[str] = []
    try:
        # The scripts loaded and the connection made before the start, on a namespace of
        # its own: the first claim of each process is then as quick as the others'.
        with Scheduler.from_url(url, namespace=f"{namespace}-warm-{worker_id}") as warm:
            warm.ready(1, worker_id)
        s.server_time()
        print("ready", flush=True)
        # "go <epoch>": every process starts claiming at that moment, so that a process
        # handed its line first cannot drain the queue before the others read theirs.
        words = sys.stdin.readline().split()
        if len(words) > 1:
            time.sleep(max(0.0, float(words[1]) - time.time()))
        while True:
            # Every task was due before the start and nothing re-enters the queue,
            # so the first empty answer means the queue is drained for good.
            claims = s.ready(random.randint(1, 40), worker_id)
            if not claims:
                break
            tokens.extend([c.task_id, c.version, c.attempt] for c in claims)
            outcomes.extend(o.value for o in s.complete_many([(c, None) for c in claims]))
    finally:
        s.close()
    print(json.dumps({"tokens": tokens, "outcomes": outcomes}), flush=True)
    return 0


class HoldingPool(ThreadPool):
    """Pool threads that reach ``held`` jobs only after shutdown released them."""

    def execute(self, job: Job) -> None:
        if job.claim.fn == "held":
            deadline = time.monotonic() + 30.0
            while not job.released and time.monotonic() < deadline:
                time.sleep(0.01)
        super().execute(job)


class HoldingWorker(Worker):
    """A worker whose pool threads reach ``held`` jobs only after shutdown released them.

    It stands for a pool thread that has not yet picked up a claimed job when
    the shutdown begins, which is otherwise a window of microseconds.
    """

    thread_pool_class = HoldingPool


def worker_main(url: str, namespace: str, concurrency: int, lease_s: float) -> int:
    client = redis.Redis.from_url(url)
    s = Scheduler(client, namespace=namespace, lease_s=lease_s)
    lock = threading.Lock()
    peak_live = 0

    def sleep(seconds: float, mark: str = "") -> str:
        nonlocal peak_live
        live = int(client.incr(live_key(namespace)))
        with lock:
            peak_live = max(peak_live, live)
        if mark:
            client.incr(started_key(namespace, mark))
        try:
            time.sleep(seconds)
        finally:
            client.decr(live_key(namespace))
        return "slept"

    def held(mark: str = "held") -> None:
        client.incr(started_key(namespace, mark))

    def steps(n: int, stall_after: int) -> int:
        ctx = current_task()
        first = ctx.checkpoint or 0
        for i in range(first, n):
            client.rpush(steps_key(namespace), f"{ctx.attempt}:{i}")
            ctx.save_checkpoint(i + 1)
            ctx.report_progress((i + 1) / n, f"step {i + 1} of {n}")
            if ctx.attempt == 1 and i + 1 == stall_after:
                time.sleep(60)  # the test kills the process here
        return n - first

    worker = HoldingWorker(
        s, {"sleep": sleep, "held": held, "steps": steps}, concurrency=concurrency, grace=10.0
    )
    print("started", flush=True)
    try:
        worker.run()
    finally:
        s.close()
        client.close()
    print(
        json.dumps({"peak_running": worker.peak_running, "peak_live": peak_live, **worker.counts}),
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["claim", "worker"])
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.mode == "claim":
        return claim_main(args.url, args.namespace)
    return worker_main(args.url, args.namespace, args.concurrency, args.lease)


if __name__ == "__main__":
    sys.exit(main())
