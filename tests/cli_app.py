"""Task functions for the command-line tests (``distsched worker tests.cli_app:FUNCS``)."""

from __future__ import annotations

from distsched import current_task


def add(a: int, b: int) -> int:
    return a + b


def whoami() -> dict[str, object]:
    ctx = current_task()
    return {"task_id": ctx.task_id, "attempt": ctx.attempt}


FUNCS = {"add": add, "whoami": whoami}
FUNC_LIST = [add, whoami]
NOT_FUNCTIONS = 42
