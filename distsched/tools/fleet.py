"""A local fleet: a Redis Cluster and distsched workers on this machine.

:class:`LocalFleet` starts ``masters`` ``redis-server --cluster-enabled`` nodes on free
local ports (append-only persistence on, each in its own folder), joins them with
``redis-cli --cluster create``, then starts ``workers`` ``distsched worker APP``
processes from the installed ``distsched`` program. :meth:`LocalFleet.stop` stops
the workers with SIGTERM (their graceful shutdown) and then the nodes with SHUTDOWN.

From a shell, ``python -m distsched.tools.fleet APP`` (or ``deploy/local-fleet.sh``)
runs one in the foreground until Ctrl-C or SIGTERM; see ``--help``. It is a way to
try a deployment, or to test an application against a cluster, not a way to run
production (see deploy/ for that).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis

from distsched.errors import DistschedError

__all__ = ["FleetConfig", "FleetError", "LocalFleet", "main"]

log = logging.getLogger("distsched.tools.fleet")

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
# Milliseconds without an answer before a node counts as failed.
NODE_TIMEOUT_MS = 5000


class FleetError(DistschedError):
    """A node or worker of the local fleet did not start."""


@dataclass
class FleetConfig:
    """What :class:`LocalFleet` starts.

    ``app`` is the workers' APP (``module:attribute``); ``worker_args`` are added to
    each ``distsched worker`` command line (``--concurrency 4``, ...). ``env`` is
    added to the workers' environment (``PYTHONPATH`` for the application, ...).
    ``directory`` holds the nodes' data and the processes' logs (default: a new
    temporary folder, removed by :meth:`LocalFleet.stop` unless ``keep``).
    """

    app: str
    masters: int = 3
    workers: int = 2
    namespace: str = "default"
    grace_s: float = 10.0
    worker_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    directory: Path | None = None
    keep: bool = False
    redis_server: str = "redis-server"
    redis_cli: str = "redis-cli"
    distsched: str | None = None
    """The ``distsched`` program (default: the one next to this Python, else on PATH)."""


def _which(program: str, what: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise FleetError(f"{what} {program!r} is not found")
    return found


def _distsched_program() -> str:
    beside = Path(sys.executable).parent / "distsched"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return _which("distsched", "the distsched program")


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port + 10000))
            except OSError:
                continue
        return port


def _wait(condition: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise FleetError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class LocalFleet:
    """A Redis Cluster and distsched workers on this machine; a context manager."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.ports: list[int] = []
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self._own_dir = config.directory is None
        self.directory = config.directory or Path(tempfile.mkdtemp(prefix="distsched-fleet-"))

    @property
    def url(self) -> str:
        """The cluster's URL for ``--redis`` / ``DISTSCHED_REDIS_URL`` (through one node)."""
        return f"redis+cluster://{HOST}:{self.ports[0]}"

    def env(self) -> dict[str, str]:
        """The environment a ``distsched`` command needs to talk to this fleet."""
        env = dict(os.environ)
        env.update(self.config.env)
        env["DISTSCHED_REDIS_URL"] = self.url
        env["DISTSCHED_NAMESPACE"] = self.config.namespace
        return env

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the nodes, join them into a cluster, then start the workers.

        On failure everything already started is stopped and :class:`FleetError`
        (or the ``OSError`` of a program that cannot run) is raised.
        """
        cfg = self.config
        if cfg.masters < 3:
            raise FleetError("a Redis Cluster needs at least 3 masters")
        server = _which(cfg.redis_server, "the Redis server")
        cli = _which(cfg.redis_cli, "the Redis client")
        program = cfg.distsched or _distsched_program()
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            for _ in range(cfg.masters):
                self._start_node(server)
            addresses = [f"{HOST}:{port}" for port in self.ports]
            done = subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise FleetError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
            for port in self.ports:
                _wait(functools.partial(self._cluster_ok, port), f"the cluster at port {port}")
            for i in range(cfg.workers):
                self._start_worker(program, i)
        except BaseException:
            self.stop()
            raise
        log.info("local fleet up: %s, %d workers", self.url, len(self.workers))

    def _start_node(self, server: str) -> None:
        port = _cluster_port()
        folder = self.directory / f"node-{port}"
        folder.mkdir()
        args = [
            server, "--port", str(port), "--bind", HOST, "--dir", str(folder),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--appendonly", "yes", "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(folder / "redis.log"),
        ]  # fmt: skip
        self.nodes.append(subprocess.Popen(args, stdin=subprocess.DEVNULL))
        self.ports.append(port)
        _wait(lambda: self._ping(port), f"redis-server on port {port}")

    def _admin(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, socket_timeout=2, socket_connect_timeout=2)

    def _ping(self, port: int) -> bool:
        with self._admin(port) as client:
            return bool(client.ping())

    def _cluster_ok(self, port: int) -> bool:
        with self._admin(port) as client:
            info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    def _start_worker(self, program: str, i: int) -> None:
        cfg = self.config
        log_path = self.directory / f"worker-{i}.log"
        args = [
            program, "worker", cfg.app, "--grace", f"{cfg.grace_s:g}",
            "--worker-id", f"fleet-{i}", *cfg.worker_args,
        ]  # fmt: skip
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                args,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        self.workers.append(proc)

    def stop(self) -> None:
        """Stop the workers (SIGTERM, their graceful shutdown), then the nodes.

        A worker still running ``grace_s`` plus a margin after SIGTERM is killed.
        Safe to call twice.
        """
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.grace_s + 15.0
        for proc in self.workers:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d outlived its grace: killed", proc.pid)
                proc.kill()
                proc.wait()
        for port, proc in zip(self.ports, self.nodes, strict=False):
            if proc.poll() is None:
                with contextlib.suppress(redis.RedisError), self._admin(port) as client:
                    client.shutdown()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_dir and not self.config.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def worker_exit_codes(self) -> list[int | None]:
        """Each worker's exit code, None while it runs."""
        return [proc.poll() for proc in self.workers]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m distsched.tools.fleet",
        description="Run a local Redis Cluster and distsched workers in the foreground "
        "until Ctrl-C or SIGTERM, then stop them cleanly. Options it does not know "
        "(--concurrency 4, --metrics-port 0, ...) go to every `distsched worker`.",
    )
    parser.add_argument("app", help="the workers' APP, module:attribute")
    parser.add_argument("--masters", type=int, default=3, help="cluster masters (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--grace", type=float, default=10.0, help="workers' --grace, seconds")
    parser.add_argument("--dir", type=Path, help="data and logs (default: a temporary folder)")
    parser.add_argument("--redis-server", default="redis-server", help="server program")
    parser.add_argument("--redis-cli", default="redis-cli", help="client program")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    config = FleetConfig(
        app=args.app,
        masters=args.masters,
        workers=args.workers,
        namespace=args.namespace,
        grace_s=args.grace,
        worker_args=extra,
        directory=args.dir,
        keep=args.dir is not None,
        redis_server=args.redis_server,
        redis_cli=args.redis_cli,
        env={
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
            )
        },
    )
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fleet = LocalFleet(config)
    try:
        fleet.start()
    except (FleetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"DISTSCHED_REDIS_URL={fleet.url}", flush=True)
        print(f"DISTSCHED_NAMESPACE={config.namespace}", flush=True)
        print(f"logs and data: {fleet.directory}; Ctrl-C stops the fleet", flush=True)
        while not stopping.wait(1.0):
            if all(code is not None for code in fleet.worker_exit_codes()):
                print("every worker exited: stopping", file=sys.stderr)
                return 1
    finally:
        fleet.stop()
        print("local fleet stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
