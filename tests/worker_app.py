"""Task functions for the worker's signal tests (``distsched worker tests.worker_app:FUNCS``)."""

from __future__ import annotations

from distsched import current_task


def nap(seconds: float) -> str:
    """Sleep up to ``seconds``, stopping early (``Cancelled``) when signalled."""
    ctx = current_task()
    ctx.wait_cancelled(seconds)
    ctx.raise_if_cancelled()
    return "rested"


FUNCS = {"nap": nap}
