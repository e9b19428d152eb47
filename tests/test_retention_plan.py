"""The retention plan: the memory ended tasks take, and will take at today's rate."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from distsched import InvalidArgument, Scheduler, TaskSpec, Worker
from distsched.cli import cli
from distsched.retention import RetentionPlan
from tests.conftest import RedisServer, running


@pytest.fixture
def client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of a server of the test's own (its memory is the test's)."""
    own = redis.Redis(port=own_redis.port)
    yield own
    own.close()


def end_tasks(s: Scheduler, count: int, prefix: str = "task", arg: str = "x") -> None:
    """Schedule, claim and complete ``count`` tasks, 500 at a time."""
    for first in range(0, count, 500):
        ids = range(first, min(count, first + 500))
        s.schedule_many([TaskSpec(f"{prefix}-{i:07d}", "send", args=[arg, i]) for i in ids])
        claims = s.ready(500, "w1")
        s.complete_many([(c, {"sent": True}) for c in claims])


@pytest.mark.parametrize("arg", ["user@example.com", "x" * 2000])
def test_the_bytes_per_ended_task_are_within_a_quarter_of_what_redis_says_they_use(
    client: redis.Redis, arg: str
) -> None:
    with Scheduler(client, namespace="plan") as s:
        s.schedule("warm", fn="f")
        before = int(client.info("memory")["used_memory"])
        end_tasks(s, 5000, arg=arg)
        used = (int(client.info("memory")["used_memory"]) - before) / 5000
        plan = s.retention_plan()
    assert plan.ended_kept == 5000
    assert plan.bytes_per_ended_task is not None
    assert abs(plan.bytes_per_ended_task - used) / used < 0.25, (plan, used)
    assert plan.kept_bytes == round(plan.bytes_per_ended_task * 5000)
    assert plan.used_memory is not None and plan.maxmemory == 0
    assert plan.fraction_of_maxmemory is None and not plan.over(0.01)


def test_the_projection_is_the_rate_of_endings_times_the_retention(client: redis.Redis) -> None:
    with Scheduler(client, namespace="plan") as s:
        started = time.monotonic()
        end_tasks(s, 2000)
        elapsed = time.monotonic() - started
        s.set_retention(7200)
        long = s.retention_plan()
        s.set_retention(3600)
        short = s.retention_plan()
    # 2,000 endings over at most the time they took (a second at the least).
    assert long.ended_per_s >= 2000 / max(elapsed, 1.0) * 0.9
    assert long.ended_per_s <= 2000 / 1.0
    assert long.bytes_per_ended_task is not None
    per_day = long.bytes_per_ended_task * long.ended_per_s * 7200
    assert long.projected_bytes == pytest.approx(per_day, rel=1e-6)
    assert short.projected_bytes == pytest.approx(long.projected_bytes / 2, rel=0.2)


def test_a_namespace_with_nothing_ended_projects_nothing(scheduler: Scheduler) -> None:
    scheduler.schedule("t", fn="f")
    plan = scheduler.retention_plan()
    assert (plan.ended_kept, plan.ended_per_s, plan.bytes_per_ended_task) == (0, 0.0, None)
    assert (plan.kept_bytes, plan.projected_bytes) == (0, 0)


def test_a_striped_namespace_plans_over_every_stripe(redis_client: redis.Redis) -> None:
    with Scheduler(redis_client, namespace="plan-striped", stripes=3) as s:
        end_tasks(s, 600, prefix="striped")
        plan = s.retention_plan()
    assert plan.ended_kept == 600
    assert plan.bytes_per_ended_task is not None and plan.bytes_per_ended_task > 0


@pytest.mark.parametrize("sample", [0, 65, "8", 1.5])
def test_a_bad_sample_is_refused_naming_it(scheduler: Scheduler, sample: object) -> None:
    with pytest.raises(InvalidArgument, match="sample"):
        scheduler.retention_plan(sample)  # type: ignore[arg-type]


def over_maxmemory(client: redis.Redis) -> Scheduler:
    """A namespace whose 2,000 endings a second ago, kept a day, would fill 64 MB."""
    client.config_set("maxmemory", 64 * 1024 * 1024)
    s = Scheduler(client, namespace="plan")
    end_tasks(s, 2000)
    return s


def test_stats_warns_when_the_projection_exceeds_the_warning_share_of_maxmemory(
    own_redis: RedisServer, client: redis.Redis
) -> None:
    s = over_maxmemory(client)
    plan: RetentionPlan = s.retention_plan()
    assert plan.maxmemory == 64 * 1024 * 1024
    assert plan.fraction_of_maxmemory is not None and plan.fraction_of_maxmemory > 1
    args = ["--redis", own_redis.url, "--namespace", "plan", "stats"]
    shown = CliRunner().invoke(cli, args, catch_exceptions=False).stdout
    assert "WARNING: over 80% of maxmemory" in shown
    assert "2000 kept" in shown
    s.set_retention(0.001)
    calm = CliRunner().invoke(cli, args, catch_exceptions=False).stdout
    assert "WARNING" not in calm and "% of maxmemory" in calm
    s.close()


def test_a_worker_logs_a_warning_when_the_projection_exceeds_its_share_of_maxmemory(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    s = over_maxmemory(client)
    caplog.set_level(logging.WARNING, "distsched.worker")
    worker = Worker(s, {"f": lambda: None}, heartbeat_s=0.1, memory_warning=0.5)
    with running(worker):
        deadline = time.monotonic() + 10
        while "of maxmemory" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "of maxmemory (warning above 50%)" in caplog.text
    caplog.clear()
    quiet = Worker(s, {"f": lambda: None}, heartbeat_s=0.1, memory_warning=None)
    with running(quiet):
        time.sleep(0.5)
    assert "maxmemory" not in caplog.text
    s.close()


@pytest.mark.parametrize("fraction", [0, 1.5, "0.5", True])
def test_a_bad_memory_warning_is_refused_naming_it(scheduler: Scheduler, fraction: object) -> None:
    with pytest.raises(InvalidArgument, match="memory_warning"):
        Worker(scheduler, {"f": lambda: None}, memory_warning=fraction)  # type: ignore[arg-type]


def test_the_dashboards_overview_shows_the_ended_tasks_memory_and_its_projection(
    client: redis.Redis,
) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    s = over_maxmemory(client)
    with TestClient(create_app(s)) as web:
        fields = web.get("/api/overview").json()["fields"]
        page = web.get("/").text
    assert fields["memory-ended"].startswith("2,000 kept, ")
    assert "endings/s" in fields["memory-projected"]
    assert "% of maxmemory" in fields["memory-projected"]
    assert fields["memory-projected"] in page
    s.close()
