"""Queued tasks not due yet count as ``scheduled``, apart from the due ``ready`` ones: in
``stats()``, ``distsched stats``, the dashboard overview and the metrics; in the default
and the priority order, with fairness keys and across stripes. Real Redis."""

from __future__ import annotations

import json

import pytest
import redis

from distsched import Scheduler
from distsched.dashboard import reads
from distsched.dashboard.app import overview_fields
from distsched.metrics import PrometheusMetrics
from distsched.model import stage_counts
from tests.conftest import RedisServer
from tests.test_cli import invoke


def _queue_two_due_three_later(s: Scheduler, prefix: str = "", **options: object) -> None:
    for i in range(2):
        s.schedule(f"{prefix}now-{i}", fn="f", **options)  # type: ignore[arg-type]
    for i in range(3):
        s.schedule(f"{prefix}later-{i}", fn="f", delay=3600, **options)  # type: ignore[arg-type]


def test_tasks_not_due_yet_count_as_scheduled_and_the_due_ones_as_ready(
    scheduler: Scheduler,
) -> None:
    _queue_two_due_three_later(scheduler)
    stats = scheduler.stats()
    assert (stats["scheduled"], stats["due"]) == (3, 2)
    # The per-state count keeps every queued task, as before.
    assert stats["counts"]["ready"] == 5
    assert list(stage_counts(stats).items())[:3] == [("pending", 0), ("scheduled", 3), ("ready", 2)]


def test_a_replaced_later_version_no_longer_counts_once_the_new_one_is_due(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("moved", fn="f", delay=3600)
    scheduler.schedule("moved", fn="f")
    stats = scheduler.stats()
    # The stale later entry may not make the count exceed the queued tasks.
    assert stats["scheduled"] + stats["due"] == stats["counts"]["ready"] == 1


def test_replaced_and_cancelled_later_versions_are_not_counted_as_scheduled(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("moved-later", fn="f", delay=600)
    scheduler.schedule("moved-later", fn="f", delay=1200)  # leaves a stale later entry
    scheduler.schedule("dropped", fn="f", delay=600)
    scheduler.cancel("dropped")
    scheduler.schedule("due", fn="f")
    stats = scheduler.stats()
    assert stats["stale_entries"] == 2
    assert (stats["scheduled"], stats["due"]) == (1, 1)


def test_the_priority_order_counts_its_delayed_set_as_scheduled(scheduler: Scheduler) -> None:
    scheduler.set_order("priority")
    _queue_two_due_three_later(scheduler)
    claims, _ = scheduler.claim(1, "w-1")  # moves the due entries into the ready set
    assert len(claims) == 1
    stats = scheduler.stats()
    assert (stats["scheduled"], stats["due"]) == (3, 1)


def test_a_fair_namespace_counts_each_keys_later_tasks(scheduler: Scheduler) -> None:
    _queue_two_due_three_later(scheduler, "a-", key="tenant-a")
    _queue_two_due_three_later(scheduler, "b-", key="tenant-b")
    scheduler.schedule("default-later", fn="f", delay=600)
    stats = scheduler.stats()
    assert (stats["scheduled"], stats["due"]) == (7, 4)


def test_a_striped_namespace_adds_up_its_stripes(redis_client: redis.Redis, namespace: str) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        for i in range(6):
            s.schedule(f"later-{i}", fn="f", delay=3600)
            s.schedule(f"now-{i}", fn="f")
        stats = s.stats()
        assert (stats["scheduled"], stats["due"], stats["counts"]["ready"]) == (6, 6, 12)


def test_stats_on_the_command_line_the_dashboard_and_the_metrics_show_scheduled_apart(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    _queue_two_due_three_later(scheduler)
    text = invoke(redis_server, namespace, "stats")
    assert text.exit_code == 0, text.stderr
    rows = dict(line.split() for line in text.stdout.split("\n\n")[0].splitlines()[1:])
    assert (rows["scheduled"], rows["ready"]) == ("3", "2")
    data = json.loads(invoke(redis_server, namespace, "stats", "--json").stdout)
    assert (data["scheduled"], data["due"], data["counts"]["ready"]) == (3, 2, 5)
    fields = overview_fields(reads.overview_json(reads.overview(scheduler)))
    assert (fields["count-scheduled"], fields["count-ready"]) == ("3", "2")
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(registry).on_stats(scheduler.overview())
    for state, want in (("scheduled", 3), ("ready", 2)):
        got = registry.get_sample_value("distsched_namespace_tasks", {"state": state})
        assert got == want
