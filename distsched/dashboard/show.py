"""Stored values as bounded text for the pages, whatever they hold.

A value read from Redis may have been written by another language or by hand: a msgpack
extension (a timestamp), arrays nested thousands deep, strings of megabytes. Nothing here
recurses, raises on such a value, or builds more text than it was asked for.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from distsched.core import MAX_TASK_ID_BYTES

_EPOCH = _dt.datetime(1970, 1, 1)
# Arrays and maps shown inside each other before the rest is elided ("[…]").
MAX_DEPTH = 64


@dataclass(frozen=True)
class Cut:
    """A text as shown: ``text`` is at most the limit asked; ``total`` counts the whole."""

    text: str
    total: int

    @property
    def cut(self) -> bool:
        return len(self.text) < self.total

    def __str__(self) -> str:
        return self.text + ("\u2026" if self.cut else "")


def cut(text: object, limit: int) -> Cut:
    """``text`` (None: empty) cut to ``limit`` characters."""
    s = "" if text is None else text if isinstance(text, str) else str(text)
    return Cut(s[:limit], len(s))


def linkable(task_id: str) -> bool:
    """Whether a page can be asked for ``task_id`` (a longer id, stored by other means,
    names no task that can be looked up)."""
    return len(task_id) <= MAX_TASK_ID_BYTES and (
        len(task_id.encode("utf-8", "surrogatepass")) <= MAX_TASK_ID_BYTES
    )


def _scalar(value: Any, room: int) -> str:
    """One value that holds no other, as JSON-like text of at most about ``room`` chars."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        text = str(value) if -(10**50) < value < 10**50 else f"{float(value):.6g}"
        return text
    if isinstance(value, float):
        return json.dumps(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return json.dumps(value[: room + 1], ensure_ascii=False)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value[: room + 4])
        try:
            return json.dumps(raw.decode("utf-8"), ensure_ascii=False)
        except UnicodeDecodeError:
            return '{"hex": "' + raw[: room // 2 + 1].hex() + '"}'
    if isinstance(value, msgpack.Timestamp):
        try:
            day = _EPOCH + _dt.timedelta(seconds=value.seconds)
            when = f"{day:%Y-%m-%dT%H:%M:%S}.{value.nanoseconds:09d}Z"
        except (ValueError, OverflowError):  # outside the years 1 to 9999
            when = f"{value.seconds} s {value.nanoseconds} ns after the epoch"
        return f"Timestamp({when})"
    if isinstance(value, msgpack.ExtType):
        return f"ExtType({value.code}, {bytes(value.data[: room // 2 + 1]).hex()})"
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    try:
        return repr(value)[: room + 1]
    except Exception:  # a repr that fails: its type is what is known
        return f"<{type(value).__name__}>"


@dataclass
class _Open:
    """A list or map being written: its remaining items, and how many were written."""

    items: Iterator[Any]
    is_map: bool
    close: str
    written: int = 0


def _pieces(value: Any, room: int) -> Iterator[str]:
    """The text of ``value`` in pieces, depth first, without recursion."""
    stack: list[_Open] = []
    current: Any = value
    while True:
        if isinstance(current, msgpack.ExtType):  # a tuple, but one value
            yield _scalar(current, room)
        elif isinstance(current, (list, tuple, dict)) and len(stack) >= MAX_DEPTH:
            yield "{\u2026}" if isinstance(current, dict) else "[\u2026]"
        elif isinstance(current, (list, tuple)):
            stack.append(_Open(iter(current), False, "]"))
            yield "["
        elif isinstance(current, dict):
            stack.append(_Open(iter(current.items()), True, "}"))
            yield "{"
        else:
            yield _scalar(current, room)
        # The next value: the next item of the innermost open list or map.
        while stack:
            top = stack[-1]
            item: Any = next(top.items, _END)
            if item is _END:
                stack.pop()
                yield top.close
                continue
            if top.written:
                yield ", "
            top.written += 1
            if top.is_map:
                key, current = item
                yield _scalar(key, room)
                yield ": "
            else:
                current = item
            break
        else:
            return


_END = object()


def value(data: Any, limit: int) -> Cut:
    """``data`` as JSON-like text cut to ``limit`` characters; ``total`` is ``limit + 1``
    when the text was longer (the rest is not built, so its length is not known)."""
    out: list[str] = []
    length = 0
    for piece in _pieces(data, limit):
        out.append(piece)
        length += len(piece)
        if length > limit:
            return Cut("".join(out)[:limit], limit + 1)
    return Cut("".join(out), length)
