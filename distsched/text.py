"""Text for people: tables, times, durations, JSON-safe values, redacted URLs.

Shared by the command line and the tools, so a time or a duration reads the
same wherever it is printed. Nothing here raises on stored data: a value that
cannot be shown as asked is shown as it is.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import re
import reprlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgpack

from distsched import times
from distsched.errors import InvalidArgument
from distsched.limits import MAX_PAYLOAD_DEPTH
from distsched.tracebacks import _FRAME, _exception_lines, _last_frame, one_line
from distsched.validate import check_epoch
from distsched.wire.payload import CUT_MARK

# A URL's user information: ``scheme://user:password@``, up to the last ``@`` before
# the host (a password may hold an ``@``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s@:]*):([^/?#\s]*)@")
# A secret in a query string or in ``key=value`` text: ``?password=...``, ``&token=...``.
_SECRET_PARAM = re.compile(
    r"(?i)\b((?:password|passwd|pwd|pass|token|secret|auth|api[_-]?key|access[_-]?key)=)"
    # The value ends at a separator, a space, or a colon that ends a word ("URL: why").
    r"(?:[^&#;\s:]|:(?![\s]|$))*"
)
REDACTED = "***"


def redact(url: str) -> str:
    """``url`` without its password (``user:***@``, ``?password=***``), fit to print."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """``text`` with every password it holds as ``***``: the password of each URL in it
    (``scheme://user:***@host``) and every secret parameter (``password=***``,
    ``token=***``, ...), whether or not the URL parses."""
    text = _USERINFO.sub(lambda m: f"{m[1]}{m[2]}:{REDACTED}@", text)
    return _SECRET_PARAM.sub(lambda m: f"{m[1]}{REDACTED}", text)


# --------------------------------------------------------------------------- terminal

# What a terminal would act on rather than show: C0 controls (ESC starts clear-screen,
# title and hyperlink sequences), DEL, C1 controls (0x9b is a one-byte CSI), line and
# paragraph separators, bidirectional overrides (text shown in another order than it
# is stored) and lone surrogates.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE_KEEP_NEWLINES = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
    "\u2066-\u2069\ud800-\udfff]"
)


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    if match[0] in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[match[0]]
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: object, keep_newlines: bool = False) -> str:
    r"""``text`` fit to print on a terminal: every control character shown as an escape
    (``\x1b``, ``\x9b``, ``\u202e``), so that stored data can neither move the cursor,
    clear the screen, set the title nor hide a link; newlines too unless
    ``keep_newlines``."""
    pattern = _UNSAFE_KEEP_NEWLINES if keep_newlines else _UNSAFE
    return pattern.sub(_escaped, str(text))


def json_line(data: Any) -> str:
    """``data`` (plain JSON data) as one line of JSON fit for a terminal: non-ASCII text
    as it is, but every control character escaped (JSON escapes C0 itself; C1 controls,
    separators and bidirectional overrides too here, as ``\\u`` escapes)."""
    text = json.dumps(data, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


# How much of a stored string (an id, a worker id, an error) one line shows by default.
CUT_CHARS = 200


def cut(text: str, limit: int | None = CUT_CHARS, flag: str = "--full") -> str:
    """``text`` cut to ``limit`` characters (None: all of it), saying how much was left
    out and the ``flag`` that shows it all."""
    if limit is None or len(text) <= limit:
        return text
    more = len(text[limit:].encode("utf-8", "surrogatepass"))
    return f"{text[:limit]}… ({more} more bytes; {flag} to see all)"


def show(text: object, limit: int | None = CUT_CHARS, flag: str = "--full") -> str:
    """A stored string on one line of a terminal: cut to ``limit``, then escaped."""
    return escape(cut(str(text), limit, flag))


def error_summary(error: str) -> str:
    """A stored error on one line: for a traceback, its ``Type: message`` and the
    frame that raised (``at file:line in function``); any other text as it is."""
    lines = error.splitlines()
    last = _last_frame(lines)
    if last is None:
        return one_line(error)
    frame = _FRAME.match(lines[last])
    assert frame is not None
    rest = _exception_lines(lines, last)
    where = f"at {frame['file']}:{frame['line']} in {frame['fn']}"
    return one_line(f"{' '.join(rest) or '?'} ({where})")


def table(rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Rows as aligned columns, two spaces apart; columns in ``right`` align right."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


# How deep arrays and maps are shown; deeper ones show as CUT_MARK. Every payload the
# scripts accept (MAX_PAYLOAD_DEPTH) shows whole.
SHOW_DEPTH = MAX_PAYLOAD_DEPTH
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, CUT_CHARS, CUT_CHARS


def short_repr(value: object) -> str:
    """``repr(value)``, bounded in size and depth (never a RecursionError)."""
    try:
        return _REPR.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def jsonable(value: Any, depth: int = SHOW_DEPTH) -> Any:
    """``value`` as plain JSON data: bytes as text (or ``{"hex": ...}``), tuples as
    lists, dataclasses as objects, NaN and infinities as strings.

    Arrays and maps deeper than ``depth`` show as ``"…"``; a value JSON has no form for
    (a msgpack ``Timestamp`` or ``ExtType`` another language stored) as its ``repr``."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        return _bytes_json(value)
    if isinstance(value, msgpack.ExtType):
        return short_repr(value)
    if _holds_values(value):
        return _container_json(value, depth) if depth > 0 else CUT_MARK
    if isinstance(value, enum.Enum):
        return jsonable(value.value, depth)
    return short_repr(value)


def _bytes_json(value: bytes) -> Any:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}


def _holds_values(value: object) -> bool:
    """A dict, list, tuple or dataclass instance: what ``jsonable`` shows to a depth."""
    return isinstance(value, (dict, list, tuple)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def _container_json(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        return {_key(k): jsonable(v, depth - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth - 1) for v in value]
    return {f.name: jsonable(getattr(value, f.name), depth - 1) for f in dataclasses.fields(value)}


def _key(key: object) -> str:
    return key if isinstance(key, str) else short_repr(key)


def finite_or_none(value: Any) -> Any:
    """``value`` with NaN and infinities (a figure that could not be measured) as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


# --------------------------------------------------------------------------- times


def iso(epoch: float | None) -> str:
    """An epoch in seconds as ISO-8601 UTC with milliseconds; ``-`` for None
    (:func:`distsched.times.absolute`)."""
    return times.absolute(epoch)


def relative(epoch: float, now: float) -> str:
    """``in 11 h``, ``3 min ago`` or ``now``, from ``now`` (:func:`distsched.times.relative`)."""
    return times.relative(epoch, now)


def parse_when(value: str, field: str) -> float | _dt.datetime:
    """Epoch seconds, or an ISO-8601 datetime that carries its UTC offset."""
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        return check_epoch(number, field)
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            field,
            f"{value!r} is neither epoch seconds nor an ISO-8601 datetime "
            "(e.g. 2030-01-01T09:00:00+00:00)",
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        # A date alone parses too: the hint must be a form that is accepted.
        example = when.replace(tzinfo=_dt.timezone.utc).isoformat()
        raise InvalidArgument(
            field, f"{value!r} has no UTC offset; write e.g. {example} (a naive time is ambiguous)"
        )
    return when


class Clock(Protocol):
    def server_time(self) -> float: ...


def clock_offset(clock: Clock, samples: int = 25) -> tuple[float, float]:
    """(server clock - local clock, round trip) in seconds, from the fastest of
    ``samples`` reads of ``clock.server_time()`` (a scheduler's, say)."""
    best: tuple[float, float] | None = None
    for _ in range(max(1, samples)):
        t0 = time.time()
        server = clock.server_time()
        t1 = time.time()
        sample = (server - (t0 + t1) / 2.0, t1 - t0)
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None
    return best


# --------------------------------------------------------------------------- durations

DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_HINT = "seconds, or with units, e.g. 500ms, 90s, 30m, 1h30m, 12h, 7d"


def parse_duration(value: str, field: str) -> float:
    """Seconds: a bare number, or numbers with units, ``500ms``, ``90s``, ``1h30m``, ``7d``."""
    text = value.strip().lower().replace(" ", "")
    seconds = _bare_seconds(text)
    if seconds is None:
        seconds = _with_units(text)
    if seconds is None:
        raise InvalidArgument(field, f"{value!r} is not a duration ({DURATION_HINT})")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(field, f"must be a finite duration >= 0, got {value!r}")
    return seconds


def _bare_seconds(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _with_units(text: str) -> float | None:
    """Sum of ``<number><unit>`` parts, each unit at most once, largest first."""
    order = ["d", "h", "min", "m", "s", "ms"]
    total, position, last = 0.0, 0, -1
    while position < len(text):
        start = position
        while position < len(text) and (text[position].isdigit() or text[position] == "."):
            position += 1
        number = text[start:position]
        unit_start = position
        while position < len(text) and text[position].isalpha():
            position += 1
        unit = text[unit_start:position]
        if not number or unit not in DURATION_UNITS:
            return None
        rank = order.index(unit)
        # "m" and "min" are one unit.
        if unit in ("m", "min"):
            rank = order.index("min")
        if rank <= last:
            return None
        last = rank
        try:
            total += float(number) * DURATION_UNITS[unit]
        except ValueError:
            return None
    return total if text else None


def duration(seconds: float) -> str:
    """``5400 s (1.5 h)``: seconds, with the largest unit that fits."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds:g} s ({seconds / size:.4g} {unit})"
    return f"{seconds:g} s"


# --------------------------------------------------------------------------- sizes


def size(n: int) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ``50.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def progress_text(progress: Any, now: float, limit: int | None = CUT_CHARS) -> str:
    """A task's last progress (``model.Progress``) for people: ``40% step 2 of 5
    (attempt 1, 3 s ago); checkpoint 12 B``; ``-`` for None."""
    if progress is None:
        return "-"
    parts = []
    if progress.fraction is not None:
        parts.append(f"{progress.fraction * 100:.0f}%")
    if progress.note:
        parts.append(show(progress.note, limit))
    text = " ".join(parts) or "no fraction reported"
    text += f" (attempt {progress.attempt}, {relative(progress.updated_at, now)})"
    if progress.checkpoint_bytes:
        text += f"; checkpoint {size(progress.checkpoint_bytes)} kept"
    return text


def preview(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters (None: all of it), saying how large it is."""
    if limit is None or len(text) <= limit:
        return text
    whole = size(len(text.encode("utf-8", "surrogatepass")))
    return f"{text[:limit]}... ({whole} in all, {len(text) - limit} characters not shown)"
