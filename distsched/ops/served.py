"""Functions no live worker serves, caught when their tasks are scheduled.

Workers announce the functions they serve in the namespace's ``served`` hash (name ->
last announcement, ms on the server clock; ``distsched.worker.served``). A scheduler
reads that hash at most every ``SERVED_CACHE_S`` seconds, so that scheduling stays
one round trip; when live workers announce functions and none of them is the one a
task names, it logs one warning per function name, with the closest served names as
suggestions (a misspelled name is the usual cause).
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from distsched.ops.explain import SERVED_LIVE_S
from distsched.wire.payload import _text

log = logging.getLogger("distsched")

# How long a read of the served functions is used before it is read again.
SERVED_CACHE_S = 5.0


def live_functions(served: Mapping[Any, Any], now: float) -> frozenset[str]:
    """The names in a ``served`` hash announced within ``SERVED_LIVE_S`` of ``now``."""
    live = set()
    for name, raw in served.items():
        try:
            at = int(raw) / 1000.0
        except (TypeError, ValueError):  # junk in the hash: not an announcement
            continue
        if now - at <= SERVED_LIVE_S:
            live.add(_text(name))
    return frozenset(live)


def unserved_message(fn: str, live: frozenset[str], namespace: str) -> str | None:
    """Why tasks of ``fn`` may not run: a sentence when live workers announce functions
    and none is ``fn``; None when one serves it or no live worker announced any."""
    if not live or fn in live:
        return None
    close = difflib.get_close_matches(fn, sorted(live), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""
    return (
        f"no live worker of namespace {namespace!r} serves function {fn!r}{hint}; "
        "its tasks wait until one does, and fail after a worker's unserved_timeout"
    )


class ServedCache:
    """One scheduler's last read of the live functions and the names it warned about."""

    def __init__(self) -> None:
        self.log = True
        self._lock = threading.Lock()
        self._live: frozenset[str] = frozenset()
        self._read_at: float | None = None
        self._warned: set[str] = set()

    def stale(self) -> bool:
        """Whether the served functions are to be read again before they are used."""
        read_at = self._read_at
        return read_at is None or time.monotonic() - read_at > SERVED_CACHE_S

    def store(self, live: frozenset[str]) -> None:
        self._live, self._read_at = live, time.monotonic()

    @property
    def live(self) -> frozenset[str]:
        return self._live

    def unchecked(self, fns: Iterable[object]) -> list[str]:
        """The names among ``fns`` that may need a warning: not warned about yet, and
        not served as of the last read (any of them while that read is stale)."""
        if not self.log:
            return []
        stale = self.stale()
        with self._lock:
            return sorted(
                {
                    fn
                    for fn in fns
                    if isinstance(fn, str)
                    and fn not in self._warned
                    and (stale or fn not in self._live)
                }
            )

    def warn(self, names: Iterable[str], namespace: str) -> None:
        """Log the warning of each name not served, once per name."""
        for fn in names:
            message = unserved_message(fn, self._live, namespace)
            if message is None:
                continue
            with self._lock:
                if fn in self._warned:
                    continue
                self._warned.add(fn)
            log.warning("%s", message, extra={"fn": fn, "namespace": namespace})
