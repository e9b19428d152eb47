"""Task functions the tests run in workers (``distsched worker tests.worker_app:FUNCS``,
``tests.worker_app:PIPELINE``)."""

from __future__ import annotations

import os

from distsched import current_task


def nap(seconds: float) -> str:
    """Sleep up to ``seconds``, stopping early (``Cancelled``) when signalled. It
    reports progress 0 first: a test waits for that to know the function runs (a claim
    alone may still be handed back unstarted by a shutdown)."""
    ctx = current_task()
    ctx.report_progress(0.0, "napping")
    ctx.wait_cancelled(seconds)
    ctx.raise_if_cancelled()
    return "rested"


def step(name: str, fail_once: str | None = None, wait_for: str | None = None) -> str:
    """One step of a pipeline. With ``fail_once`` (a file path), the first call raises
    and leaves that file behind, so the next call (a retry) succeeds. With ``wait_for``
    (a file path), it waits until that file exists (a test lets it finish)."""
    if fail_once is not None and not os.path.exists(fail_once):
        with open(fail_once, "w") as marker:
            marker.write(name)
        raise RuntimeError(f"source unavailable for {name}")
    ctx = current_task()
    while wait_for is not None and not os.path.exists(wait_for):
        ctx.wait_cancelled(0.02)
        ctx.raise_if_cancelled()
    return f"{name} done"


FUNCS = {"nap": nap}
# The dashboard's browser test runs a pipeline of these.
PIPELINE = {"step": step}
