"""A throwaway Redis for ``distsched demo`` and quick experiments.

:func:`embedded_redis` starts the best server available and yields its URL:

- a real ``redis-server`` from ``PATH`` on a free local port, in a temporary
  directory, with persistence off; it is shut down and its directory removed
  on exit;
- otherwise an in-process fakeredis server with Lua (the optional extra
  ``distsched[embedded]``) listening on a free local port in a background
  thread, shut down on exit.

Both speak the Redis protocol over TCP, so workers, pub/sub wake-ups and the
Lua scripts go through exactly the code paths a production Redis would see.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import redis

from distsched.errors import DistschedError

__all__ = ["EmbeddedRedis", "EmbeddedRedisUnavailable", "embedded_redis"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 10.0
# A free port can be taken by another process between our probe and the server's bind.
PORT_ATTEMPTS = 3
# How much one read of the in-process server's sockets takes at most.
CHUNK_BYTES = 64 * 1024

INSTALL_HINT = (
    "install Redis so that 'redis-server' is on PATH, or run: pip install 'distsched[embedded]'"
)


class EmbeddedRedisUnavailable(DistschedError):
    """Neither ``redis-server`` nor fakeredis with Lua is available."""


class EmbeddedRedis(NamedTuple):
    """A running throwaway server: its URL and a sentence saying what it is."""

    url: str
    description: str
    kind: str  # 'redis-server' or 'fakeredis'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _server_info(port: int) -> dict[str, Any] | None:
    """INFO server of whatever answers on ``port``, or None."""
    client = redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        info: dict[str, Any] = client.info("server")
        return info
    except redis.RedisError:
        return None
    finally:
        client.close()


@contextmanager
def _redis_server(binary: str) -> Iterator[EmbeddedRedis]:
    workdir = Path(tempfile.mkdtemp(prefix="distsched-embedded-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(PORT_ATTEMPTS):
            port = _free_port()
            proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    HOST,
                    "--dir",
                    str(workdir),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            info = None
            while proc.poll() is None and time.monotonic() < deadline:
                info = _server_info(port)
                if info is not None:
                    break
                time.sleep(0.02)
            # Another server may have taken the port first: only ours will do.
            if info is not None and info.get("process_id") == proc.pid:
                break
            _stop_process(proc)
            proc = None
        if proc is None or info is None:
            raise EmbeddedRedisUnavailable(f"{binary} did not start on a free local port")
        version = info.get("redis_version", "?")
        yield EmbeddedRedis(
            url=f"redis://{HOST}:{port}/0",
            description=(
                f"a throwaway redis-server {version} on {HOST}:{port} "
                "(temporary directory, no persistence; stopped and removed at exit)"
            ),
            kind="redis-server",
        )
    finally:
        if proc is not None:
            _stop_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    # SIGTERM exits at once (nothing to save: persistence is off), where the
    # SHUTDOWN command can linger for seconds.
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _import_fakeredis() -> Any:
    try:
        import fakeredis
    except ImportError:
        raise EmbeddedRedisUnavailable(
            f"no Redis to run on: 'redis-server' is not on PATH and fakeredis is not installed; "
            f"{INSTALL_HINT}"
        ) from None
    # fakeredis runs Lua scripts through lupa, an optional dependency of its own.
    if importlib.util.find_spec("lupa") is None:
        raise EmbeddedRedisUnavailable(
            "no Redis to run on: 'redis-server' is not on PATH and fakeredis is installed "
            f"without Lua support (lupa); {INSTALL_HINT}"
        )
    return fakeredis


class _ChunkReader:
    """A socket's reader whose ``readline`` hands over whatever has arrived, up to 64 KiB.

    fakeredis's handler feeds its parser one line at a time, and the parser joins each
    piece onto what it holds so far: a command carrying text of many lines (the
    Functions library, 2 MB in some 50,000 lines) took seconds to read. Its loop reads
    b"" as "nothing yet" (then waits on the socket) or, once the socket is readable,
    as the end; a non-blocking read with nothing there gives None, read as b"".
    """

    __slots__ = ("_file",)

    def __init__(self, file: Any) -> None:
        self._file = file

    def readline(self) -> bytes:
        data: bytes | None = self._file.read1(CHUNK_BYTES)
        return data or b""

    def fileno(self) -> int:
        return int(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def _handler_class(base: type[Any]) -> type[Any]:
    """fakeredis's connection handler, with TCP_NODELAY and reads by the chunk."""

    def setup(self: Any) -> None:
        base.setup(self)
        self.rfile = _ChunkReader(self.rfile)

    # TCP_NODELAY on the server side: a reply written in pieces would otherwise wait for
    # the client's delayed ACK, ~40 ms for every pipelined call.
    return type("ChunkHandler", (base,), {"disable_nagle_algorithm": True, "setup": setup})


@contextmanager
def _fakeredis_server(why: str) -> Iterator[EmbeddedRedis]:
    fakeredis = _import_fakeredis()
    # Port 0: the kernel picks a free port at bind time, so there is no race to lose.
    server = fakeredis.TcpFakeServer((HOST, 0))
    server.RequestHandlerClass = _handler_class(server.RequestHandlerClass)
    port = int(server.server_address[1])
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},  # how soon shutdown() is noticed
        name="distsched-fakeredis",
        daemon=True,
    )
    thread.start()
    try:
        try:
            version = importlib.metadata.version("fakeredis")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        yield EmbeddedRedis(
            url=f"redis://{HOST}:{port}/0",
            description=(
                f"an in-process fakeredis {version} server with Lua on {HOST}:{port} "
                f"({why}stopped at exit)"
            ),
            kind="fakeredis",
        )
    finally:
        # shutdown() stops serve_forever and tells connection handlers to finish;
        # server_close() closes the socket and joins the handler threads.
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def embedded_redis(backend: str = "auto") -> Iterator[EmbeddedRedis]:
    """Start a throwaway Redis; yield ``EmbeddedRedis(url, description, kind)``.

    ``backend`` is ``'auto'`` (``redis-server`` when it is on PATH, else
    fakeredis), ``'redis-server'`` or ``'fakeredis'``. Raises
    :class:`EmbeddedRedisUnavailable`, saying what to install, when the chosen
    backend cannot run.
    """
    if backend not in ("auto", "redis-server", "fakeredis"):
        raise ValueError(f"backend must be 'auto', 'redis-server' or 'fakeredis', not {backend!r}")
    binary = shutil.which("redis-server") if backend != "fakeredis" else None
    if backend == "redis-server" and binary is None:
        raise EmbeddedRedisUnavailable(f"'redis-server' is not on PATH; {INSTALL_HINT}")
    if binary is not None:
        manager = _redis_server(binary)
    else:
        manager = _fakeredis_server("redis-server is not on PATH; " if backend == "auto" else "")
    with manager as server:
        yield server
