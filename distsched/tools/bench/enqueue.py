"""(b) ``enqueue``: one ``schedule`` call per task against a raw LPUSH (and what the
producer's own thread spends on it), many threads through a batching producer, the
reports that end an attempt, and batched ``schedule_many``."""

from __future__ import annotations

import time

from distsched import model
from distsched.tools.bench import producers
from distsched.tools.bench.harness import Bench, us_text
from distsched.tools.bench.procs import NOOP
from distsched.wire.payload import encode_payload


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase("enqueue", "enqueue: schedule one task per call, then schedule_many")
    single_ns, batch_ns = bench.namespace("single"), bench.namespace("batched")
    with bench.scheduler(single_ns) as s:
        s.schedule("warm-up", fn=NOOP)
        # The floor of one call at a time: a raw LPUSH of the same msgpack payload,
        # from the same client, just before the schedule calls.
        payload = encode_payload(NOOP, [], {})
        raw_key = f"bench:{{{single_ns}}}:raw"
        t0 = time.perf_counter()
        for _ in range(cfg.schedule_calls):
            bench.client.lpush(raw_key, payload)
        lpush = cfg.schedule_calls / (time.perf_counter() - t0)
        bench.client.delete(raw_key)
        cpu_before = bench.cpu_us()
        with bench.server_time() as single_server:
            t0 = time.perf_counter()
            for i in range(cfg.schedule_calls):
                s.schedule(f"s{i}", fn=NOOP)
            single = cfg.schedule_calls / (time.perf_counter() - t0)
        single_cpu = bench.cpu_delta(cpu_before, cfg.schedule_calls)
        python_us = producers.one_call_cpu_us(s, "c", cfg.schedule_calls)
        build_us = producers.build_us(s, bench.client, cfg.schedule_calls)
        with bench.server_time() as batching_server:
            many = producers.batched(s, "m", cfg.schedule_calls)
        # Redis time of the smallest transition: one claim's lease extended per call.
        claim = s.next("bench")
        assert isinstance(claim, model.Claim)
        with bench.server_time() as heartbeat_server:
            t0 = time.perf_counter()
            for _ in range(cfg.schedule_calls):
                s.heartbeat(claim)
            heartbeats = cfg.schedule_calls / (time.perf_counter() - t0)
        # The reports that end an attempt, one per call: half the tasks succeed, half
        # fail (their only attempt: terminal, with the error stored).
        claims: list[model.Claim] = []
        while len(claims) < cfg.schedule_calls:
            got = s.ready(min(100, cfg.schedule_calls - len(claims)), "bench")
            if not got:
                break
            claims += got
        half = len(claims) // 2
        with bench.server_time() as complete_server:
            t0 = time.perf_counter()
            for c in claims[:half]:
                s.complete(c)
            completes = half / max(time.perf_counter() - t0, 1e-9)
        with bench.server_time() as fail_server:
            t0 = time.perf_counter()
            for c in claims[half:]:
                s.fail(c, "RuntimeError: bench failure")
            fails = (len(claims) - half) / max(time.perf_counter() - t0, 1e-9)
    bench.step(f"LPUSH: {lpush:,.0f} calls/s")
    bench.step(
        f"schedule: {single:,.0f} calls/s, {us_text(single_server)} in Redis/call, "
        f"{single_cpu or 0:.1f} us Redis CPU/call"
    )
    bench.step(
        f"schedule, Python per call: {build_us:.1f} us to check, build and pack it, "
        f"{python_us:.1f} us of thread CPU in all; {many.callers} threads, batching: "
        f"{many.per_s:,.0f} tasks/s in {batching_server.calls:,} calls, p99 {many.p99_ms:.2f} ms"
    )
    bench.step(f"heartbeat: {heartbeats:,.0f} calls/s, {us_text(heartbeat_server)} in Redis/call")
    bench.step(f"complete: {completes:,.0f} calls/s, {us_text(complete_server)} in Redis/call")
    bench.step(f"fail: {fails:,.0f} calls/s, {us_text(fail_server)} in Redis/call")
    with bench.scheduler(batch_ns) as s, bench.server_time() as batch_server:
        batched = cfg.enqueue_tasks / bench.fill(s, "b", cfg.enqueue_tasks)
    bench.step(f"schedule_many: {batched:,.0f} tasks/s")
    bench.clean(single_ns, batch_ns)
    ratio = single / bench.evalsha
    bench.sections["enqueue"] = {
        "single_calls": cfg.schedule_calls,
        "single_per_s": single,
        "single_vs_evalsha": ratio,
        "single_server_us_per_call": single_server.us_per_call,
        "single_redis_cpu_us_per_call": single_cpu,
        "python_us_per_call": python_us,
        "build_us_per_call": build_us,
        "batching": {
            "callers": many.callers,
            "tasks": many.tasks,
            "per_s": many.per_s,
            "script_calls": batching_server.calls,
            "p50_ms": many.p50_ms,
            "p99_ms": many.p99_ms,
            "vs_single": many.per_s / single,
        },
        "lpush_per_s": lpush,
        "single_vs_lpush": single / lpush,
        "heartbeat_per_s": heartbeats,
        "heartbeat_server_us_per_call": heartbeat_server.us_per_call,
        "complete_per_s": completes,
        "complete_server_us_per_call": complete_server.us_per_call,
        "fail_per_s": fails,
        "fail_server_us_per_call": fail_server.us_per_call,
        "batched_tasks": cfg.enqueue_tasks,
        "batch": cfg.batch,
        "batched_per_s": batched,
        "batched_server_us_per_call": batch_server.us_per_call,
    }
    bench.row(
        "enqueue",
        "schedule, one call per task",
        single,
        "calls/s",
        ratio=ratio,
        ratio_to="seq EVALSHA",
        target=">= 0.9x seq EVALSHA",
        met=ratio >= 0.9,
        server_us=single_server.us_per_call,
        cpu_us=single_cpu,
    )
    bench.row_at_most("enqueue", "  Redis CPU per schedule call", single_cpu, "us", 15.0)
    bench.row_at_most(
        "enqueue", "  server time per schedule call", single_server.us_per_call, "us", 15.0
    )
    bench.row_at_most(
        "enqueue", "  Python per schedule call: checks, the call, its bytes", build_us, "us", 15.0
    )
    bench.row("enqueue", "  the caller's thread CPU per schedule call, all of it", python_us, "us")
    bench.row(
        "enqueue",
        "  raw LPUSH of the same payload, one call at a time",
        lpush,
        "calls/s",
    )
    bench.row(
        "enqueue",
        "  schedule against the raw LPUSH",
        single,
        "calls/s",
        ratio=single / lpush,
        ratio_to="LPUSH",
        target=">= 0.8x LPUSH",
        met=single / lpush >= 0.8,
    )
    bench.row(
        "enqueue",
        f"schedule from {many.callers} threads, one batching producer",
        many.per_s,
        "tasks/s",
        ratio=many.per_s / single,
        ratio_to="one call per task",
        target=">= 5x one call per task",
        met=many.per_s / single >= 5,
        server_us=batching_server.us_per_call,
    )
    # Added latency: a batched call's p99 against one call sent alone.
    added = many.p99_ms - 1000 / single
    bench.row_at_most("enqueue", "  p99 latency added by batching", added, "ms", 2.0)
    bench.row(
        "enqueue",
        "heartbeat, one claim per call",
        heartbeats,
        "calls/s",
        server_us=heartbeat_server.us_per_call,
    )
    bench.row(
        "enqueue",
        "complete, one claim per call",
        completes,
        "calls/s",
        server_us=complete_server.us_per_call,
    )
    bench.row(
        "enqueue",
        "fail, one claim per call (last attempt)",
        fails,
        "calls/s",
        server_us=fail_server.us_per_call,
    )
    bench.row(
        "enqueue",
        f"schedule_many, batches of {cfg.batch}",
        batched,
        "tasks/s",
        ratio=batched / bench.evalsha,
        ratio_to="seq EVALSHA",
        target=">= 150,000/s",
        met=batched >= 150_000,
        server_us=batch_server.us_per_call,
    )
