"""(f) ``dag``: a long chain, a wide fan-out/fan-in, and the longest script call while
many dependents are released or blocked."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from distsched import model
from distsched.client import Scheduler
from distsched.model import TaskSpec
from distsched.ops import protocol
from distsched.ops.base import once
from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import NOOP
from distsched.tools.bench.slowlog import command_name
from distsched.wire import calls

# Batches for graph submissions and the dependents' fill: big enough to be fast,
# small enough that no single submission is a long script call.
GRAPH_BATCH = 5_000
# Parts a large graph is submitted in when no call may hold Redis long.
GRAPH_PART = 1_000


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "dag",
        f"dependencies: a {cfg.chain:,}-task chain, a {cfg.fanout:,}-wide "
        f"fan-out/fan-in, {cfg.dependents:,} dependents released and blocked",
    )
    section: dict[str, Any] = {}
    # A chain: each task depends on the one before.
    namespace = bench.namespace("chain")
    ids = [f"c{i}" for i in range(cfg.chain)]
    specs = [TaskSpec(ids[0], NOOP)] + [
        TaskSpec(ids[i], NOOP, deps=[ids[i - 1]]) for i in range(1, cfg.chain)
    ]
    chain = _submit_whole(bench, specs)
    with bench.scheduler(namespace) as s:
        chain.update(_submit_parts(bench, s, specs))
        chain.update(bench.drain("dag", namespace, s, ids, 1))
    bench.clean(namespace)
    section["chain"] = chain
    bench.step(f"chain: {chain['tasks_per_s'] or 0:,.0f} tasks/s")
    # Fan-out/fan-in: root -> fanout tasks -> sink.
    namespace = bench.namespace("fan")
    mids = [f"m{i}" for i in range(cfg.fanout)]
    specs = [TaskSpec("root", NOOP)]
    specs += [TaskSpec(m, NOOP, deps=["root"]) for m in mids]
    specs.append(TaskSpec("sink", NOOP, deps=mids))
    fan = _submit_whole(bench, specs)
    with bench.scheduler(namespace) as s:
        fan.update(_submit_parts(bench, s, specs))
        fan.update(bench.drain("dag", namespace, s, ["root", *mids, "sink"], 1))
    bench.clean(namespace)
    section["fan"] = fan
    bench.step(f"fan-out/fan-in: {fan['tasks_per_s'] or 0:,.0f} tasks/s")
    # The longest script call: one task's end settles many dependents.
    for mode in ("complete", "fail"):
        section[mode] = _settle_many(bench, mode)
        bench.step(
            f"{cfg.dependents:,} dependents, {mode}: longest script call "
            f"{section[mode]['max_ms']:.1f} ms over {section[mode]['calls']} calls"
        )
    bench.sections["dag"] = section
    for key, label in (
        ("chain", f"{cfg.chain:,}-task chain, 1 worker process"),
        ("fan", f"fan-out/fan-in 1 -> {cfg.fanout:,} -> 1, 1 worker process"),
    ):
        data = section[key]
        bench.row("dag", label, data["tasks_per_s"], "tasks/s")
        bench.row_at_most(
            "dag",
            f"  submit in parts of {GRAPH_PART:,}: longest script call",
            data["part_max_ms"],
            "ms",
            50.0,
        )
        bench.row(
            "dag",
            f"  submit_graph of all {data['tasks']:,} tasks at once (atomic)",
            data["submit_ms"],
            "ms",
            server_us=data["submit_server_us"],
        )
    for mode, verb in (("complete", "releasing"), ("fail", "blocking")):
        data = section[mode]
        bench.row_at_most(
            "dag",
            f"longest script call {verb} {cfg.dependents:,} dependents",
            data["max_ms"],
            "ms",
            50.0,
            server_us=data["server_us_per_call"],
        )
        if data["slowlog_max_ms"] is not None:
            bench.row_at_most(
                "dag", "  same, server side (SLOWLOG)", data["slowlog_max_ms"], "ms", 50.0
            )


def _submit_whole(bench: Bench, specs: Sequence[TaskSpec]) -> dict[str, Any]:
    """submit_graph of a whole graph in one atomic script call (in a namespace of its
    own, removed afterwards): what holding Redis for the whole graph costs."""
    namespace = bench.namespace("whole")
    with bench.scheduler(namespace) as s, bench.server_time() as server:
        t0 = time.perf_counter()
        s.submit_graph(specs)
        elapsed = time.perf_counter() - t0
    bench.clean(namespace)
    return {
        "tasks": len(specs),
        "submit_ms": elapsed * 1000.0,
        "submit_server_us": server.us_per_call,
    }


def _submit_parts(bench: Bench, s: Scheduler, specs: Sequence[TaskSpec]) -> dict[str, Any]:
    """submit_graph in parts, dependencies first, as a large graph should be submitted
    when Redis must not be held long: the longest script call in ms. A task with more
    dependencies than one part is itself placed in parts: each call is timed alone."""
    times = []
    for start in range(0, len(specs), GRAPH_PART):
        op = s._ops.submit_graph(specs[start : start + GRAPH_PART])
        step = protocol.advance(op, None)
        while not isinstance(step, protocol.Done):
            t0 = time.perf_counter()
            reply = s._send(step)
            if isinstance(step, calls.Call):
                times.append((time.perf_counter() - t0) * 1000.0)
            step = protocol.advance(op, reply)
    return {"part_max_ms": max(times), "parts": len(times)}


def _submit_graph(bench: Bench, s: Scheduler, specs: Sequence[TaskSpec]) -> list[float]:
    """submit_graph in batches (each batch only names tasks already known); ms per call."""
    times = []
    for start in range(0, len(specs), GRAPH_BATCH):
        t0 = time.perf_counter()
        s.submit_graph(specs[start : start + GRAPH_BATCH])
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def _settle_many(bench: Bench, mode: str) -> dict[str, Any]:
    cfg = bench.config
    namespace = bench.namespace(f"settle-{mode}")
    with bench.scheduler(namespace) as s:
        s.submit("root", fn=NOOP)
        ids = [f"d{i}" for i in range(cfg.dependents)]
        submit = _submit_graph(bench, s, [TaskSpec(i, NOOP, deps=["root"]) for i in ids])
        claim = s.next("bench")
        assert isinstance(claim, model.Claim)
        mark = _slowlog_mark(bench)
        call = (
            calls.complete_call(s.keys, [(claim, None)])
            if mode == "complete"
            else calls.fail_call(s.keys, [(claim, "bench")])
        )
        # Each script call timed alone, as the client sees it: the task's own
        # transition, then the bounded propagation calls until nothing is left.
        times = []
        with bench.server_time() as server:
            t0 = time.perf_counter()
            s._drive(once(call))
            times.append(time.perf_counter() - t0)
            left = 1
            while left:
                t0 = time.perf_counter()
                left, _ = s._drive(once(calls.propagate_call(s.keys)))
                times.append(time.perf_counter() - t0)
        slowlog_max = _slowlog_max_ms(bench, mark)
        counts = s.stats()["counts"]
    bench.clean(namespace)
    expected = "ready" if mode == "complete" else "blocked"
    if counts[expected] != cfg.dependents:
        bench.problem(
            "dag",
            [f"after {mode}: {counts[expected]} of {cfg.dependents} dependents {expected}"],
        )
    return {
        "dependents": cfg.dependents,
        "calls": len(times),
        "max_ms": max(times) * 1000.0,
        "mean_ms": sum(times) / len(times) * 1000.0,
        "total_s": sum(times),
        "server_us_per_call": server.us_per_call,
        "slowlog_max_ms": slowlog_max,
        "slowlog_threshold_ms": _slowlog_threshold_ms(bench),
        "submit_max_ms": max(submit),
    }


def _slowlog_threshold_ms(bench: Bench) -> float | None:
    try:
        value = bench.client.config_get("slowlog-log-slower-than").get("slowlog-log-slower-than")
    except redis.RedisError:
        return None
    return None if value is None else int(value) / 1000.0


def _slowlog_mark(bench: Bench) -> int | None:
    """The newest SLOWLOG entry id now (-1: empty; None: no SLOWLOG here)."""
    try:
        if bench.throwaway:
            # Our own server: log every script call slower than 1 ms, and keep them all.
            # Top-level commands only: a script's inner commands are never logged.
            bench.client.config_set("slowlog-log-slower-than", 1000)
            bench.client.config_set("slowlog-max-len", 10_000)
        entries = bench.client.slowlog_get(1)
    except redis.RedisError:
        return None
    return int(entries[0]["id"]) if entries else -1


def _slowlog_max_ms(bench: Bench, mark: int | None) -> float | None:
    if mark is None:
        return None
    try:
        entries = bench.client.slowlog_get(10_000)
    except redis.RedisError:
        return None
    durations = [
        int(e["duration"])
        for e in entries
        if int(e["id"]) > mark and command_name(e.get("command")) in (b"EVALSHA", b"EVAL")
    ]
    return max(durations) / 1000.0 if durations else None
