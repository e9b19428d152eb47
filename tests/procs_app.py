"""Task functions for the multi-process worker tests
(``distsched worker tests.procs_app:FUNCS --processes N``)."""

from __future__ import annotations

import os
import time

from distsched import current_task


def work(seconds: float) -> list[object]:
    """Sleep ``seconds`` (not woken by any signal, as busy code would); return the pid
    and the index the supervisor gave this process."""
    time.sleep(seconds)
    return [os.getpid(), os.environ.get("DISTSCHED_WORKER_PROCESS")]


def nap(seconds: float) -> str:
    """Sleep up to ``seconds``, stopping early (``Cancelled``) when signalled. It
    reports progress 0 first: a test waits for that to know the function runs (a claim
    alone may still be handed back unstarted by a shutdown)."""
    ctx = current_task()
    ctx.report_progress(0.0, "napping")
    ctx.wait_cancelled(seconds)
    ctx.raise_if_cancelled()
    return "rested"


FUNCS = {"work": work, "nap": nap}
