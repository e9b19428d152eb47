"""Unknown functions caught early: scheduling a task for a function that live workers
announce none of logs one warning per name and scheduler (with a did-you-mean), without
a read of the served functions per call; the CLI's schedule says it on stderr; a worker
logs one line at a task's first hand-back, none at the later ones. Real Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis

from distsched import Scheduler, TaskSpec, Worker
from distsched.aio import AsyncScheduler
from distsched.ops.explain import SERVED_LIVE_S
from distsched.worker.link import WorkerLink
from distsched.worker.served import ServedFunctions
from tests.conftest import RedisServer, running
from tests.test_cli import invoke
from tests.test_worker import wait_until


def announce(scheduler: Scheduler, *functions: str) -> None:
    """A live worker's announcement of ``functions``, as workers make it."""
    ServedFunctions(WorkerLink(scheduler), functions, 0.0).announce()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "distsched" and r.levelno == logging.WARNING
    ]


@pytest.fixture
def own(own_redis: RedisServer) -> Iterator[tuple[Scheduler, redis.Redis]]:
    """A scheduler on a Redis of its own, whose command counts are this test's alone."""
    client = own_redis.client()
    scheduler = Scheduler(client, namespace="shop")
    yield scheduler, client
    scheduler.close()
    client.close()


def hgetall_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


def test_a_misspelled_function_is_warned_about_once_with_the_closest_served_name(
    own: tuple[Scheduler, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, client = own
    announce(scheduler, "process_order", "send_email")
    before = hgetall_calls(client)
    for i in range(20):
        scheduler.schedule(f"t{i}", fn="proces_order")
        scheduler.schedule(f"ok{i}", fn="send_email")
    (warning,) = warnings_of(caplog)
    assert "'proces_order'" in warning and "did you mean 'process_order'?" in warning
    assert "'shop'" in warning
    # Forty schedules read the served functions once: they are kept a few seconds.
    assert hgetall_calls(client) - before == 1


def test_no_warning_while_no_live_worker_announced_any_function(
    scheduler: Scheduler, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler.schedule("early", fn="anything")
    # An announcement older than SERVED_LIVE_S is a worker gone, not a live one.
    old_ms = int((scheduler.server_time() - SERVED_LIVE_S - 5) * 1000)
    redis_client.hset(scheduler.keys.served, "anything_else", old_ms)
    other = Scheduler(redis_client, namespace=scheduler.namespace)
    try:
        other.schedule("late", fn="anything")
        assert other.unserved("anything") is None
    finally:
        other.close()
    assert warnings_of(caplog) == []


def test_each_scheduler_warns_once_and_warn_unserved_turns_it_off(
    scheduler: Scheduler, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    announce(scheduler, "resize")
    scheduler.schedule_many([TaskSpec("a", "resise"), TaskSpec("b", "resise")])
    scheduler.submit_graph([TaskSpec("c", "resise")])
    assert len(warnings_of(caplog)) == 1
    quiet = Scheduler(redis_client, namespace=scheduler.namespace)
    try:
        quiet.warn_unserved = False
        quiet.schedule("d", fn="resise")
    finally:
        quiet.close()
    assert len(warnings_of(caplog)) == 1
    assert scheduler.unserved("resize") is None
    assert "did you mean 'resize'?" in (scheduler.unserved("resise") or "")


def test_a_striped_namespace_and_the_async_shell_warn_alike(
    redis_server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace, stripes=3) as s:
        announce(s, "thumbnail")
        for i in range(6):
            s.schedule(f"t{i}", fn="thumbnale")
        assert len(warnings_of(caplog)) == 1

    async def story() -> None:
        a = AsyncScheduler.from_url(redis_server.url, namespace=namespace)
        try:
            await a.schedule("x", fn="thumbnale")
            assert "did you mean 'thumbnail'?" in (await a.unserved("thumbnale") or "")
        finally:
            await a.close()

    asyncio.run(story())
    assert len(warnings_of(caplog)) == 2


def test_the_cli_schedule_says_it_on_stderr_once_and_still_schedules(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    announce(scheduler, "billing.charge")
    result = invoke(redis_server, namespace, "schedule", "job", "--fn", "billing.charg")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip().isdigit()
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("warning: ") and "did you mean 'billing.charge'?" in line
    served = invoke(redis_server, namespace, "schedule", "job2", "--fn", "billing.charge")
    assert served.exit_code == 0 and served.stderr == ""


def test_a_worker_logs_one_line_at_the_first_hand_back_of_an_unserved_task(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="distsched.worker.tasks")
    scheduler.warn_unserved = False
    scheduler.schedule("job", fn="procss")
    worker = Worker(scheduler, {"process": lambda: None}, unserved_timeout=60)
    with running(worker):
        wait_until(lambda: worker.counts["unserved"] >= 2, what="two hand-backs")
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "distsched.worker.tasks" and "handed back" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    assert "did you mean 'process'?" in lines[0]
