"""A stored error text read as a person reads it: the line that says what went wrong.

Below every layer that shows errors (wire records, the CLI, the dashboard), so each
reads a traceback the same way.
"""

from __future__ import annotations

import re

__all__ = ["exception_line", "one_line"]


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(text).split())


_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in (?P<fn>.*)$')


def _last_frame(lines: list[str]) -> int | None:
    return max((i for i, ln in enumerate(lines) if _FRAME.match(ln)), default=None)


def _exception_lines(lines: list[str], last: int) -> list[str]:
    """The ``Type: message`` lines after the frame at ``last``, past its source lines."""
    rest = lines[last + 1 :]
    while rest and rest[0].startswith(" "):
        rest.pop(0)
    return rest


def exception_line(error: str) -> str:
    """The error a stored error text reports, on one line: for a traceback, its
    ``Type: message`` (what ``raise`` said, not ``Traceback (most recent call last):``);
    for any other text, its first line."""
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if not lines[0].startswith("Traceback ("):
        return one_line(lines[0])
    last = _last_frame(lines)
    # A traceback whose frames are not in the usual shape: its last line.
    found = _exception_lines(lines, last) if last is not None else []
    return one_line(" ".join(found) or lines[-1])
