"""Task functions for the time-limit tests run by ``distsched worker`` processes
(``tests.time_limits_app:FUNCS``)."""

from __future__ import annotations

import os
import time


def stuck(seconds: float) -> None:
    """Sleep ``seconds`` and ignore every stop signal, as a hung call would."""
    time.sleep(seconds)


async def blocking(seconds: float) -> None:
    """Block the worker's event loop for ``seconds``: no cancellation can reach it."""
    time.sleep(seconds)


def pid() -> int:
    """The pid of the worker process that ran it."""
    return os.getpid()


FUNCS = {"stuck": stuck, "blocking": blocking, "pid": pid}
