"""Each namespace's backlog over HTTP, for autoscalers, with no worker running.

A fleet scaled to zero has no worker to export its queue: ``distsched exporter`` (or
:func:`serve_depth`) reads the depth of one or more namespaces from Redis itself and
serves it as

- ``GET /depth``: JSON, ``{"namespaces": {"<ns>": {"due": 3, "scheduled": 1, "running": 2,
  "pending": 0, "busy": 5}}}``, which KEDA's ``metrics-api`` scaler reads with a
  ``valueLocation`` such as ``namespaces.emails.busy``;
- ``GET /metrics``: the same as Prometheus gauges,
  ``distsched_namespace_depth{namespace="emails",stage="due"} 3``, for KEDA's
  ``prometheus`` scaler or an alert.

``busy`` is due plus running: the work that wants a worker slot now. Each namespace is read
once per interval however many clients ask (one ``Scheduler.stats()`` each), so scrapers
cost Redis nothing more. The server needs no extra: it is the standard library's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from distsched.client import Scheduler

log = logging.getLogger("distsched.exporter")

# How long one read of the namespaces serves every request, by default.
DEFAULT_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Depth:
    """One namespace's backlog by stage, as served."""

    due: int
    """Ready tasks due now."""
    scheduled: int
    """Ready tasks due later (delayed, backing off before a retry)."""
    running: int
    """Tasks a worker holds."""
    pending: int
    """Tasks waiting for their dependencies."""
    busy: int
    """``due + running``: the work that wants a worker slot now."""


STAGES = tuple(Depth.__dataclass_fields__)


def depth_of(scheduler: Scheduler) -> Depth:
    """The depth of ``scheduler``'s namespace now."""
    stats = scheduler.stats()
    running = stats["counts"]["running"]
    return Depth(
        due=stats["due"],
        scheduled=stats["scheduled"],
        running=running,
        pending=stats["counts"]["pending"],
        busy=stats["due"] + running,
    )


class DepthReader:
    """The depth of each namespace, read at most once per ``interval_s``, whoever asks."""

    def __init__(
        self, schedulers: Sequence[Scheduler], interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        self.schedulers = list(schedulers)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._depths: dict[str, Depth] = {}

    def read(self) -> dict[str, Depth]:
        """Each namespace's depth, at most ``interval_s`` old; raises what Redis raised
        when it cannot be read now."""
        with self._lock:
            if time.monotonic() - self._read_at >= self.interval_s:
                self._depths = {s.namespace: depth_of(s) for s in self.schedulers}
                self._read_at = time.monotonic()
            return dict(self._depths)


def depth_json(depths: dict[str, Depth]) -> dict[str, Any]:
    return {"namespaces": {ns: asdict(d) for ns, d in depths.items()}}


def prometheus_text(depths: dict[str, Depth]) -> str:
    """The Prometheus text exposition of ``depths``."""
    lines = [
        "# HELP distsched_namespace_depth Tasks of the namespace per stage "
        "(due, scheduled, running, pending; busy = due + running).",
        "# TYPE distsched_namespace_depth gauge",
    ]
    for namespace, depth in depths.items():
        label = namespace.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        for stage in STAGES:
            value = getattr(depth, stage)
            lines.append(
                f'distsched_namespace_depth{{namespace="{label}",stage="{stage}"}} {value}'
            )
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: _DepthHTTPServer

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path not in ("/depth", "/metrics"):
            self._send(404, "text/plain; charset=utf-8", b"not found: /depth or /metrics\n")
            return
        try:
            depths = self.server.reader.read()
        except Exception as exc:
            # An autoscaler keeps its last decision on an error; it must not read 0.
            log.warning("reading the namespaces' depth failed: %s", exc)
            self._send(503, "text/plain; charset=utf-8", f"redis unavailable: {exc}\n".encode())
            return
        if path == "/depth":
            body = json.dumps(depth_json(depths)).encode()
            self._send(200, "application/json", body)
        else:
            self._send(
                200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(depths).encode()
            )

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _DepthHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], reader: DepthReader) -> None:
        super().__init__(address, _Handler)
        self.reader = reader


class DepthServer:
    """``/depth`` and ``/metrics`` of some namespaces, served on a daemon thread."""

    def __init__(self, httpd: _DepthHTTPServer) -> None:
        self._httpd = httpd
        self.addr: str = str(httpd.server_address[0])
        self.port: int = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="distsched-exporter", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


def serve_depth(
    schedulers: Sequence[Scheduler],
    port: int,
    addr: str = "127.0.0.1",
    interval_s: float = DEFAULT_INTERVAL_S,
) -> DepthServer:
    """Serve the depth of each scheduler's namespace at ``http://addr:port/depth`` and
    ``/metrics`` (port 0: any free port) until :meth:`DepthServer.close`."""
    return DepthServer(_DepthHTTPServer((addr, port), DepthReader(schedulers, interval_s)))
