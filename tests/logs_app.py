"""Task functions for the log tests (``distsched worker tests.logs_app:FUNCS``)."""

from __future__ import annotations


def ok(x: int) -> int:
    return x + 1


def boom(row: int) -> None:
    raise ValueError(f"bad row {row}")


FUNCS = {"ok": ok, "boom": boom}
