"""A call in flight when the scheduler is closed or its connection drops (§8, §12).

Each scheduler, sync and asyncio, talks to a real redis-server through a proxy
(tests/proxy.py) that holds the server's reply: the call is then in flight, applied by
the server, for as long as the test needs, on a thread of its own. The test closes the
scheduler meanwhile (the call must still finish with its real answer), or cuts the
connection (the call must raise the library's retryable error, and sending it again
must leave one runnable copy of the task).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis

from distsched import Scheduler, State, TaskSpec, Wait, Worker, current_task
from distsched.aio import AsyncScheduler
from distsched.errors import ClosedError, DistschedError, NotFoundError, Unavailable
from distsched.worker.common import RESUME_PROBE_S
from tests.cluster_fixtures import wait_until
from tests.conftest import BlockingAsync, RedisServer, running
from tests.proxy import Proxy

CALL_S = 60.0  # redis-py's own retries of a refused connection take seconds


class Background:
    """A call on a thread of its own; ``outcome()`` is its value or raises its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name="test-call")
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def outcome(self, timeout: float = CALL_S) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[Proxy]:
    with Proxy(redis_server.port) as p:
        yield p


@pytest.fixture(params=["sync", "async"])
def proxied(request: pytest.FixtureRequest, proxy: Proxy, namespace: str) -> Iterator[Scheduler]:
    """A scheduler of each shell connected through the proxy, connected and warmed up
    (its scripts loaded), so that the next call is one request."""
    if request.param == "sync":
        s = Scheduler.from_url(proxy.url, namespace=namespace, lease_s=5.0)
        try:
            s.schedule("warm", fn="f")
            yield s
        finally:
            s.close()
    else:
        blocking = BlockingAsync(proxy.url, namespace=namespace, lease_s=5.0)
        try:
            blocking_s = cast(Scheduler, blocking)
            blocking_s.schedule("warm", fn="f")
            yield blocking_s
        finally:
            blocking.shutdown()


@pytest.fixture
def direct(redis_client: redis.Redis, namespace: str) -> Scheduler:
    """The same namespace, straight to the server: what is stored, whatever the proxy does."""
    return Scheduler(redis_client, namespace=namespace)


def in_flight(proxy: Proxy, call: Callable[[], Any]) -> Background:
    """Start ``call`` on a thread and return once its request reached the server; its
    reply is held until ``proxy.release()``."""
    proxy.hold()
    started = Background(call)
    proxy.wait_request()
    return started


def wait_stored(direct: Scheduler, task_id: str) -> int:
    """The version of ``task_id`` once the server has it."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return direct.status(task_id).version
        except NotFoundError:
            assert time.monotonic() < deadline, f"the server never applied {task_id}"
            time.sleep(0.01)


def test_close_lets_a_call_in_flight_on_another_thread_finish_with_its_answer(
    proxy: Proxy, proxied: Scheduler, direct: Scheduler
) -> None:
    """§8: ``close()`` — every later call raises ``ClosedError``; calls in flight finish."""
    call = in_flight(proxy, lambda: proxied.schedule("t", fn="f", args=[1]))
    proxied.close()
    proxy.release()
    version = call.outcome()
    info = direct.status("t")
    assert (info.version, info.state, info.args) == (version, State.READY, (1,))
    # Versions count the namespace's writes: the next is the one after, so the call was
    # answered on its own connection, not sent again on another.
    assert direct.schedule("probe", fn="f") == version + 1
    with pytest.raises(ClosedError):
        proxied.schedule("later", fn="f")
    with pytest.raises(NotFoundError):
        direct.status("later")


def test_a_connection_dropped_mid_call_raises_the_retryable_error_and_a_retry_keeps_one_copy(
    proxy: Proxy, proxied: Scheduler, direct: Scheduler
) -> None:
    """§12: losing the connection mid-call raises a connection error the caller can retry;
    a retried ``schedule`` at worst writes a newer version of the same id, never two
    runnable copies."""
    call = in_flight(proxy, lambda: proxied.schedule("t", fn="f", args=[1]))
    first = wait_stored(direct, "t")  # applied: only the reply is lost
    proxy.go_down()
    with pytest.raises(Unavailable) as caught:
        call.outcome()
    # The library's own transient error, which code catching redis-py's catches too.
    assert isinstance(caught.value, DistschedError)
    assert isinstance(caught.value, redis.ConnectionError)

    proxy.come_back()
    version = proxied.schedule("t", fn="f", args=[2])
    assert version > first  # a newer version of the same id
    claims = [c for c in direct.ready(10, "w") if c.task_id == "t"]
    assert [(c.version, c.args) for c in claims] == [(version, (2,))]
    assert isinstance(direct.next("w2"), Wait)  # no other copy left to claim


# ---------------------------------------------------------------------- a worker's resume


def test_while_redis_is_away_a_worker_tries_again_within_the_probe_pause_and_runs_on_after(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pauses between a worker's tries stay short however long Redis is away, so it
    claims again within RESUME_PROBE_S of Redis's return; one warning per outage."""
    server = RedisServer(appendonly=True)
    s = Scheduler.from_url(server.url, namespace=namespace, lease_s=10.0)
    ran: list[str] = []

    def work() -> None:
        ran.append(current_task().task_id)
        time.sleep(0.02)

    s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(400)])
    worker = Worker(s, {"f": work}, concurrency=2)
    try:
        with caplog.at_level(logging.DEBUG, "distsched.worker"), running(worker):
            wait_until(lambda: len(ran) >= 5, 10, "the first tasks to run")
            server.stop()  # SHUTDOWN: the append-only file keeps every write
            time.sleep(2.0)
            server.start()
            wait_until(lambda: len(ran) >= 400, 60, "every task to run after Redis came back")
    finally:
        s.close()
        server.close()
    consumer = [r for r in caplog.records if "; retrying in " in r.getMessage()]
    pauses = [float(r.getMessage().rsplit(" ", 1)[1].rstrip("s")) for r in consumer]
    assert len(pauses) >= 4, pauses
    assert max(pauses) <= RESUME_PROBE_S, pauses
    assert sum(r.levelno >= logging.WARNING for r in consumer) == 1
    assert any("reachable again after" in r.getMessage() for r in caplog.records)
    assert sorted(ran) == sorted(f"t{i}" for i in range(400))


def test_a_url_scheduler_opens_the_connections_its_calls_in_flight_need_unless_the_url_caps_them(
    redis_server: RedisServer,
) -> None:
    """redis-py 8.2 fails a call beyond 100 connections in one pool: a scheduler made from
    a URL must not (a thousand waiting threads, or a worker's slots, would fail at random);
    ``max_connections`` in the URL still caps it."""
    sizes = []
    for url in (redis_server.url, f"{redis_server.url}?max_connections=7"):
        with Scheduler.from_url(url, namespace="pool") as s:
            assert isinstance(s.client, redis.Redis)
            sizes.append(s.client.connection_pool.max_connections)
    assert (sizes[0] >= 2**31, sizes[1]) == (True, 7)

    async def asyncio_pools() -> list[int]:
        sizes = []
        for url in (redis_server.url, f"{redis_server.url}?max_connections=7"):
            async with AsyncScheduler.from_url(url, namespace="pool") as a:
                assert isinstance(a.client, redis.asyncio.Redis)
                sizes.append(a.client.connection_pool.max_connections)
        return sizes

    uncapped, capped = asyncio.run(asyncio_pools())
    assert (uncapped >= 2**31, capped) == (True, 7)
