"""Part of (b) ``enqueue``: what a producer's process spends per ``schedule``, and many
threads scheduling one task each through a batching producer (distsched/batching.py)."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from distsched import Scheduler, scripts
from distsched.tools.bench.procs import NOOP
from distsched.validate import task_spec
from distsched.wire.calls import enqueue_call

CALLERS = 32


@dataclass(frozen=True)
class Batched:
    """Many threads through one batching producer: the rate and each call's latency."""

    callers: int
    tasks: int
    per_s: float
    p50_ms: float
    p99_ms: float


def build_us(s: Scheduler, client: redis.Redis, calls: int) -> float:
    """Microseconds of Python to check one plain task, build its script call and pack it
    as the bytes the client sends (hiredis packs where installed), without sending it:
    what a ``schedule`` costs its caller besides the round trip."""
    options = {"fn": NOOP, "args": [1]}
    function = scripts.function_name("enqueue")
    connection: Any = client.connection_pool.get_connection()
    try:
        started = time.thread_time()
        for i in range(calls):
            call = enqueue_call(s.keys, [task_spec(f"p{i}", options)], s.max_payload_bytes)
            connection.pack_command("FCALL", function, len(call.keys), *call.keys, *call.args)
        return (time.thread_time() - started) / calls * 1e6
    finally:
        client.connection_pool.release(connection)


def one_call_cpu_us(s: Scheduler, prefix: str, calls: int) -> float:
    """The calling thread's CPU per ``schedule`` sent one at a time (checks, the call's
    building, the client library and its system calls)."""
    started = time.thread_time()
    for i in range(calls):
        s.schedule(f"{prefix}{i}", fn=NOOP)
    return (time.thread_time() - started) / calls * 1e6


def batched(s: Scheduler, prefix: str, tasks: int) -> Batched:
    """``tasks`` schedules from ``CALLERS`` threads through one batching producer."""
    each = max(1, tasks // CALLERS)
    latencies: list[list[float]] = [[] for _ in range(CALLERS)]
    start = threading.Barrier(CALLERS + 1)

    def produce(t: int) -> None:
        own = latencies[t]
        start.wait()
        for i in range(each):
            t0 = time.perf_counter()
            producer.schedule(f"{prefix}{t}-{i}", fn=NOOP)
            own.append(time.perf_counter() - t0)

    with s.batching() as producer:
        threads = [threading.Thread(target=produce, args=(t,)) for t in range(CALLERS)]
        for thread in threads:
            thread.start()
        start.wait()
        t0 = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - t0
    every = sorted(x for own in latencies for x in own)
    return Batched(
        callers=CALLERS,
        tasks=len(every),
        per_s=len(every) / elapsed,
        p50_ms=statistics.median(every) * 1000,
        p99_ms=every[min(len(every) - 1, int(len(every) * 0.99))] * 1000,
    )
