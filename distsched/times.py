"""Times for people, the same in the command line and the dashboard.

Text for people reads a time relative to now (``in 11 h``, ``3 min ago``); text for
machines (``--json``, a dashboard's hover title) carries the absolute instant. A span
of seconds reads in the largest unit that fits (``850 ms``, ``4.2 s``, ``11 h``).
"""

from __future__ import annotations

import datetime as _dt
import math

_UNITS = (("d", 86400.0), ("h", 3600.0), ("min", 60.0))


def span(seconds: float | None, parts: int = 1) -> str:
    """A length of time: ``850 ms``, ``4.2 s``, ``42 s``, ``3 min``, ``11 h``, ``2 d``;
    with ``parts=2`` the next unit as well (``3 min 5 s``, ``11 h 3 min``). ``-`` for
    None or a value that is not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    sign = "-" if seconds < 0 else ""
    v = abs(seconds)
    if v < 1:
        return f"{sign}{v * 1000:.0f} ms"
    if v < 10 or (v < 60 and parts > 1):
        return f"{sign}{v:.1f} s"
    if round(v) < 60:
        return f"{sign}{round(v)} s"
    v = max(v, 60.0)  # 59.7 s reads as 1 min, not 60 s
    for i, (unit, size) in enumerate(_UNITS):
        if v >= size:
            whole = int(v // size)
            if parts < 2:
                return f"{sign}{whole} {unit}"
            rest_unit, rest_size = _UNITS[i + 1] if i + 1 < len(_UNITS) else ("s", 1.0)
            return f"{sign}{whole} {unit} {int(v % size // rest_size)} {rest_unit}"
    return f"{sign}{v:.0f} s"  # pragma: no cover


def relative(epoch: float | None, now: float) -> str:
    """``epoch`` seen from ``now``: ``in 11 h``, ``3 min ago``, ``now`` (within half a
    second); ``-`` for None."""
    if epoch is None or not math.isfinite(epoch):
        return "-"
    delta = epoch - now
    if abs(delta) < 0.5:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(-delta)} ago"


def absolute(epoch: float | None) -> str:
    """An epoch in seconds as ISO-8601 UTC with milliseconds (``2026-12-02T06:40:12.345Z``);
    ``-`` for None. An instant outside the years 1 to 9999 is shown as the side it falls on.
    """
    if epoch is None:
        return "-"
    try:
        when = _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return "after 9999-12-31" if epoch > 0 else "before 0001-01-01"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
