"""TLS: the scheduler, a worker and the CLI over ``rediss://`` to a TLS-only redis-server.

A throwaway CA and server certificate are made with ``openssl``. Without
``openssl`` or a redis-server built with TLS the tests are skipped with the
reason (under ``CI=true`` that is a failure, as for a missing redis-server).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distsched import Claim, Outcome, Scheduler, State, Worker
from distsched.aio import AsyncScheduler
from tests.conftest import IN_CI, free_port, require_redis_server, skip_valkey_without_tls
from tests.test_cli import _runner

OPENSSL = shutil.which("openssl")


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"TLS tests cannot run: {reason}, and CI=true requires them")
    pytest.skip(f"TLS tests cannot run: {reason}")


def openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    done = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"openssl {args[0]} failed: {done.stderr.strip()}")


def make_certificates(directory: Path) -> None:
    """ca.crt (self-signed) and server.crt/server.key for 127.0.0.1 and localhost."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=distsched test CA", cwd=directory)  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1", cwd=directory)  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.cnf",
            cwd=directory)  # fmt: skip


@dataclass
class TlsRedis:
    port: int
    ca: Path

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    binary = require_redis_server()
    skip_valkey_without_tls()
    if OPENSSL is None:
        unavailable("openssl is not on PATH")
    directory = tmp_path_factory.mktemp("tls")
    make_certificates(directory)
    port = free_port()
    log = directory / "redis.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
             "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
             "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no",
             "--dir", str(directory), "--save", "", "--appendonly", "no"],
            cwd=directory, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = TlsRedis(port=port, ca=directory / "ca.crt")
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                unavailable(f"redis-server refused --tls-port (built without TLS?): "
                            f"{log.read_text().strip()[-300:]}")  # fmt: skip
            try:
                probe = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
                with probe:
                    probe.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    text = log.read_text()
                    raise RuntimeError(f"TLS redis-server did not start: {text}") from None
                time.sleep(0.05)
        yield server
    finally:
        proc.kill()
        proc.wait(10)


def test_schedule_claim_complete_round_trip_over_rediss(tls_redis: TlsRedis) -> None:
    s = Scheduler.from_url(tls_redis.url, namespace="tls", lease_s=5)
    try:
        assert isinstance(s.client, redis.Redis)
        assert s.client.connection_pool.connection_class is redis.SSLConnection
        version = s.schedule("t1", fn="add", args=(1, 2))
        claim = s.next("w")
        assert isinstance(claim, Claim)
        assert (claim.task_id, claim.version, claim.args) == ("t1", version, (1, 2))
        assert s.heartbeat(claim) is False
        assert s.complete(claim, 3) is Outcome.APPLIED
        info = s.status("t1")
        assert (info.state, info.result) == (State.SUCCEEDED, 3)
    finally:
        s.close()


def test_a_worker_runs_tasks_and_hears_wake_ups_over_rediss(tls_redis: TlsRedis) -> None:
    s = Scheduler.from_url(tls_redis.url, namespace="tls-worker", lease_s=0.6)
    ran: list[int] = []
    worker = Worker(s, {"f": ran.append}, concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # Scheduled while the worker waits: the wake-up channel carries it over TLS.
        time.sleep(0.1)
        s.schedule("later", fn="f", args=(7,))
        deadline = time.monotonic() + 10
        while s.status("later").state is not State.SUCCEEDED:
            assert time.monotonic() < deadline, "the worker did not run the task"
            time.sleep(0.01)
    finally:
        worker.stop(grace=5)
        thread.join(30)
        s.close()
    assert ran == [7]


def test_the_async_scheduler_works_over_rediss(tls_redis: TlsRedis) -> None:
    async def main() -> State:
        s = AsyncScheduler.from_url(tls_redis.url, namespace="tls-aio")
        try:
            await s.schedule("a", fn="f")
            claim = await s.next("w")
            assert isinstance(claim, Claim)
            await s.complete(claim)
            return (await s.status("a")).state
        finally:
            await s.close()

    assert asyncio.run(main()) is State.SUCCEEDED


def test_the_cli_talks_to_a_tls_server(tls_redis: TlsRedis) -> None:
    from distsched.cli import cli

    runner = _runner()
    args = ["--redis", tls_redis.url, "--namespace", "tls-cli"]
    result = runner.invoke(cli, [*args, "schedule", "x", "--fn", "f"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    result = runner.invoke(cli, [*args, "stats", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert '"ready": 1' in result.stdout


def test_the_server_certificate_is_verified(tls_redis: TlsRedis) -> None:
    # Without the CA, the self-signed chain is refused: rediss:// verifies by default.
    unverified = Scheduler.from_url(
        f"rediss://127.0.0.1:{tls_redis.port}/0?socket_timeout=5", namespace="tls"
    )
    try:
        with pytest.raises(redis.ConnectionError, match=r"(?i)certificate"):
            unverified.stats()
    finally:
        unverified.close()


def test_plain_redis_is_refused_by_a_tls_only_server(tls_redis: TlsRedis) -> None:
    plain = Scheduler.from_url(
        f"redis://127.0.0.1:{tls_redis.port}/0?socket_timeout=5", namespace="tls"
    )
    try:
        with pytest.raises(redis.ConnectionError):
            plain.stats()
    finally:
        plain.close()
