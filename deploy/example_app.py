"""A tiny distsched application for trying the deployment files.

Workers run it with ``distsched worker example_app:FUNCTIONS`` (this folder on
``PYTHONPATH``); replace it with your own module, whose attribute maps function
names to callables as here.
"""

from __future__ import annotations

import time


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def sleep(seconds: float) -> float:
    """Sleep, as a stand-in for slow work; returns how long it slept."""
    time.sleep(seconds)
    return seconds


FUNCTIONS = {"add": add, "sleep": sleep}
