"""What a test leaves behind: threads, child processes and sockets it started and never ended.

Each test owns what it starts. ``conftest.py`` takes a :func:`snapshot` before every test
and calls :func:`leaks` after it, so a leak fails the test that caused it, by name,
instead of a later one (an unclosed socket found by the garbage collector during another
test is reported by pytest against that other test). Linux only: elsewhere the process
and socket parts find nothing.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import redis
from redis.connection import AbstractConnection

PROC = Path("/proc")

# Clients or connections finalized while connected, as "host:port", since the last look.
_dropped: list[str] = []


@dataclass(frozen=True)
class Snapshot:
    threads: frozenset[threading.Thread]
    children: frozenset[int]
    sockets: frozenset[str]


def _children() -> dict[int, str]:
    """This process's live (not zombie) children: pid -> command line."""
    me = os.getpid()
    out: dict[int, str] = {}
    if not PROC.is_dir():
        return out
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            if int(ppid) != me or state == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip()
        except (OSError, ValueError):
            continue  # it ended meanwhile
        out[int(entry.name)] = cmdline.decode("utf-8", "replace")
    return out


def _sockets() -> set[str]:
    """The inodes of this process's open sockets ("socket:[N]")."""
    out: set[str] = set()
    fds = PROC / "self" / "fd"
    if not fds.is_dir():
        return out
    for fd in os.listdir(fds):
        try:
            target = os.readlink(fds / fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _endpoints(sockets: set[str]) -> list[str]:
    """``sockets`` described by their TCP addresses where /proc/net knows them."""
    inodes = {s[len("socket:[") : -1]: s for s in sockets}
    found: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                found[fields[9]] = f"tcp :{local} -> :{remote}" if remote else f"tcp :{local}"
    return sorted(found.get(i, "non-TCP socket") for i in inodes)


def snapshot() -> Snapshot:
    return Snapshot(frozenset(threading.enumerate()), frozenset(_children()), frozenset(_sockets()))


def watch_dropped_connections() -> None:
    """Note every redis-py client or connection garbage-collected while still connected.

    A client dropped without ``close()`` is a leak whichever way its memory goes: freed
    at once, it closes its pool quietly; freed in a cycle, the collector finalizes the
    client, its connections and their sockets in no set order, and may warn during
    whatever test runs then. Looking at whichever of the client or a connection goes
    first finds it every time, against the test that dropped it.
    """
    # redis-py leaves both finalizers untyped.
    client_del = cast(Callable[[object], None], redis.Redis.__del__)
    connection_del = cast(Callable[[object], None], AbstractConnection.__del__)

    def connected(conn: object) -> bool:
        # A real socket only: fakeredis's in-process connections hold no descriptor.
        return isinstance(getattr(conn, "_sock", None), socket.socket)

    def note(kwargs: dict[str, object]) -> None:
        _dropped.append(f"{kwargs.get('host', '')}:{kwargs.get('port', kwargs.get('path'))}")

    def client_gone(self: redis.Redis) -> None:
        pool = getattr(self, "connection_pool", None)
        if pool is not None and getattr(self, "auto_close_connection_pool", False):
            held = [
                *getattr(pool, "_available_connections", ()),
                *getattr(pool, "_in_use_connections", ()),
            ]
            if any(connected(conn) for conn in held):
                note(pool.connection_kwargs)
        client_del(self)

    def connection_gone(self: AbstractConnection) -> None:
        if connected(self):
            note(vars(self))
        connection_del(self)

    redis.Redis.__del__ = client_gone  # type: ignore[method-assign]
    AbstractConnection.__del__ = connection_gone  # type: ignore[method-assign]


def _left(before: Snapshot) -> list[str]:
    # Garbage holding a socket is closed here, and its ResourceWarning is reported by
    # pytest against the test being torn down.
    gc.collect()
    found = []
    if _dropped:
        found.append("redis connections dropped without close(): " + ", ".join(_dropped))
    threads = [t for t in threading.enumerate() if t not in before.threads and t.is_alive()]
    if threads:
        found.append("threads still running: " + ", ".join(repr(t) for t in threads))
    children = {p: c for p, c in _children().items() if p not in before.children}
    if children:
        found.append(
            "child processes still running: "
            + "; ".join(f"{p}: {c}" for p, c in sorted(children.items()))
        )
    sockets = _sockets() - before.sockets
    if sockets:
        found.append("sockets still open: " + ", ".join(_endpoints(sockets)))
    return found


def leaks(before: Snapshot, grace: float = 5.0) -> list[str]:
    """What was started since ``before`` and still runs after ``grace`` seconds.

    The grace lets a thread or process that was told to stop finish ending.
    """
    deadline = time.monotonic() + grace
    while True:
        found = _left(before)
        if not found or time.monotonic() >= deadline:
            _dropped.clear()  # reported once, against this test
            return found
        time.sleep(0.05)
