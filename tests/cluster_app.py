"""Task functions for the cluster fault tests (``distsched worker tests.cluster_app:FUNCS``).

Runs are written to a file named by ``DISTSCHED_TEST_RUNS``, not to Redis, so that
they survive whatever the tests do to the cluster: one line per run as it starts,
``<monotonic> <task id> <version> <attempt> <pid>`` (appends of one short line are
atomic across processes).
"""

from __future__ import annotations

import os
import time

from distsched import current_task


def record(ms: int = 0) -> int:
    ctx = current_task()
    line = f"{time.monotonic():.6f} {ctx.task_id} {ctx.version} {ctx.attempt} {os.getpid()}\n"
    with open(os.environ["DISTSCHED_TEST_RUNS"], "a", encoding="utf-8") as runs:
        runs.write(line)
    time.sleep(ms / 1000.0)
    return ctx.attempt


FUNCS = {"record": record}
