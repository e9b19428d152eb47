"""(a) ``ceiling``: the most script calls one client gets from this Redis."""

from __future__ import annotations

import time

from distsched.tools.bench.harness import Bench


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase("ceiling", "ceiling: EVALSHA of 'return 1' from one client")
    sha = bench.client.script_load("return 1")
    for _ in range(100):
        bench.client.evalsha(sha, 0)
    with bench.server_time() as seq_server:
        t0 = time.perf_counter()
        for _ in range(cfg.evalsha_calls):
            bench.client.evalsha(sha, 0)
        sequential = cfg.evalsha_calls / (time.perf_counter() - t0)
    bench.step(f"sequential: {sequential:,.0f} calls/s")
    pipe = bench.client.pipeline(transaction=False)
    rounds = max(1, cfg.evalsha_calls // cfg.pipeline)
    with bench.server_time() as pipe_server:
        t0 = time.perf_counter()
        for _ in range(rounds):
            for _ in range(cfg.pipeline):
                pipe.evalsha(sha, 0)
            pipe.execute()
        pipelined = rounds * cfg.pipeline / (time.perf_counter() - t0)
    bench.step(f"pipelined: {pipelined:,.0f} calls/s")
    bench.sections["ceiling"] = {
        "sequential_calls": cfg.evalsha_calls,
        "sequential_per_s": sequential,
        "sequential_server_us_per_call": seq_server.us_per_call,
        "pipeline": cfg.pipeline,
        "pipelined_calls": rounds * cfg.pipeline,
        "pipelined_per_s": pipelined,
        "pipelined_server_us_per_call": pipe_server.us_per_call,
    }
    bench.row(
        "ceiling",
        "EVALSHA 'return 1', sequential",
        sequential,
        "calls/s",
        server_us=seq_server.us_per_call,
    )
    bench.row(
        "ceiling",
        f"EVALSHA 'return 1', pipelines of {cfg.pipeline}",
        pipelined,
        "calls/s",
        ratio=pipelined / sequential,
        ratio_to="sequential",
        server_us=pipe_server.us_per_call,
    )
