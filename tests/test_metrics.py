"""Worker metrics exported for Prometheus, scraped over HTTP from a real worker.

Each test gets a fresh ``CollectorRegistry``, so metrics never collide between
tests. Values are read from the text exposition exactly as Prometheus would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from distsched import Claim, Scheduler, State, TaskSpec, Worker, current_task
from distsched.metrics import (
    INSTALL_HINT,
    MetricsServer,
    MetricsUnavailable,
    PrometheusMetrics,
    serve_metrics,
)
from distsched.worker.link import WorkerLink
from tests.conftest import (
    CLI_COMMAND,
    RedisServer,
    free_port,
    python_command,
    require_extra,
    subprocess_env,
)

prometheus_client = require_extra("prometheus_client")
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMAND = CLI_COMMAND
LEASE_S = 0.6  # heartbeats (and so gauge refreshes and housekeeping) every 0.2 s

Sample = tuple[str, tuple[tuple[str, str], ...]]


def sample(name: str, **labels: str) -> Sample:
    return (name, tuple(sorted(labels.items())))


def scrape(port: int) -> dict[Sample, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode("utf-8")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def scraped_until(port: int, expected: dict[Sample, float], timeout: float = 15.0) -> None:
    """Scrape until every expected sample has its value, then compare them all at once."""
    got: dict[Sample, float] = {}

    def matches() -> bool:
        nonlocal got
        try:
            got = scrape(port)
        except urllib.error.URLError:  # not listening yet
            return False
        return all(got.get(key) == value for key, value in expected.items())

    deadline = time.monotonic() + timeout
    while not matches() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {key: got.get(key) for key in expected} == expected


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def endpoint(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server = serve_metrics(0, registry=registry)
    yield server
    server.close()


@pytest.fixture
def fast(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    yield s
    s.close()


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, name="test-worker-run")
    thread.start()
    return thread


def stop(worker: Worker, thread: threading.Thread) -> None:
    worker.stop(grace=5)
    thread.join(30)
    assert not thread.is_alive()


def wait_state(s: Scheduler, task_id: str, state: State) -> None:
    wait_for(lambda: s.status(task_id).state is state, what=f"{task_id} {state.value}")


# --------------------------------------------------------------------------- worker


def ok() -> str:
    return "ok"


def boom() -> None:
    raise RuntimeError("boom")


def wait_cancel() -> None:
    ctx = current_task()
    ctx.wait_cancelled(10)
    ctx.raise_if_cancelled()


def outlive_lease() -> str:
    """Goes on after its lease is lost (as careless code would): its report is stale."""
    ctx = current_task()
    deadline = time.monotonic() + 10
    while not ctx.lease_lost and time.monotonic() < deadline:
        time.sleep(0.01)
    return "late"


FUNCTIONS = {"ok": ok, "boom": boom, "wait_cancel": wait_cancel, "outlive_lease": outlive_lease}


def test_a_worker_exports_its_outcomes_latencies_and_the_namespace_gauges(
    fast: Scheduler,
    redis_client: redis.Redis,
    namespace: str,
    registry: CollectorRegistry,
    endpoint: MetricsServer,
) -> None:
    s = fast
    # A worker that vanished: its lease expires and the metered worker's housekeeping
    # reaps it; the second attempt then runs on the metered worker.
    short = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    s.schedule("orphan", fn="ok", max_attempts=2, backoff=0)
    assert [c.task_id for c in short.ready(1, "vanished")] == ["orphan"]
    s.schedule_many(
        [TaskSpec(f"ok{i}", "ok") for i in range(3)]
        + [TaskSpec("boom", "boom"), TaskSpec("cancel-me", "wait_cancel"),
           TaskSpec("lost", "outlive_lease"),
           TaskSpec("future-1", "ok", delay=3600), TaskSpec("future-2", "ok", delay=3600)]
    )  # fmt: skip
    s.submit("child", fn="ok", deps=["boom"])  # blocked once boom fails

    worker = Worker(s, FUNCTIONS, concurrency=8, metrics=PrometheusMetrics(registry))
    thread = run_in_thread(worker)
    try:
        wait_state(s, "cancel-me", State.RUNNING)
        assert s.cancel("cancel-me") is State.RUNNING
        wait_state(s, "lost", State.RUNNING)
        assert s.expire_lease("lost") == 1  # as if reaped: the holder's token is stale now
        expected = {
            sample("distsched_tasks_claimed_total"): 7.0,
            sample("distsched_tasks_succeeded_total"): 4.0,
            sample("distsched_tasks_failed_total"): 1.0,
            sample("distsched_tasks_cancelled_total"): 1.0,
            sample("distsched_reports_rejected_total", reason="stale"): 1.0,
            sample("distsched_reports_rejected_total", reason="duplicate"): 0.0,
            sample("distsched_leases_lost_total"): 1.0,
            sample("distsched_leases_expired_total"): 1.0,
            sample("distsched_task_run_seconds_count", fn="ok"): 4.0,
            sample("distsched_task_run_seconds_count", fn="boom"): 1.0,
            sample("distsched_task_run_seconds_count", fn="wait_cancel"): 1.0,
            sample("distsched_task_run_seconds_count", fn="outlive_lease"): 1.0,
            sample("distsched_task_start_wait_seconds_count"): 7.0,
            # The same waits per priority bucket; every bucket is exported from the start.
            sample("distsched_task_ready_wait_seconds_count", priority="0"): 7.0,
            sample("distsched_task_ready_wait_seconds_count", priority=">=1000"): 0.0,
            # Namespace gauges, refreshed by the heartbeat thread from stats().
            sample("distsched_namespace_tasks", state="succeeded"): 4.0,
            sample("distsched_namespace_tasks", state="failed"): 2.0,  # boom, lost
            sample("distsched_namespace_tasks", state="cancelled"): 1.0,
            sample("distsched_namespace_tasks", state="blocked"): 1.0,
            # The two future tasks are queued but not due: scheduled, not ready.
            sample("distsched_namespace_tasks", state="scheduled"): 2.0,
            sample("distsched_namespace_tasks", state="ready"): 0.0,
            sample("distsched_namespace_tasks", state="running"): 0.0,
            sample("distsched_queue_entries"): 2.0,
            sample("distsched_queue_stale_entries"): 0.0,
            sample("distsched_namespace_leases"): 0.0,
            sample("distsched_worker_slots", state="free"): 8.0,
            sample("distsched_worker_slots", state="executing"): 0.0,
        }
        scraped_until(endpoint.port, expected)
        metrics = scrape(endpoint.port)
    finally:
        stop(worker, thread)
        short.close()
    assert worker.counts["stale"] == 1
    # Every due task started within seconds of its run_at (server clock): the waits
    # are measured on the clock that decided due-ness, not skewed by hours or epochs.
    assert metrics[sample("distsched_task_start_wait_seconds_bucket", le="10.0")] == 7.0
    # One claim latency per claim call, each a single script call.
    claims = metrics[sample("distsched_claim_latency_seconds_count")]
    assert claims >= 1
    assert metrics[sample("distsched_claim_latency_seconds_bucket", le="2.5")] == claims


class ReplyLostLink(WorkerLink):
    """The first completion is applied by Redis but its reply never arrives, as when a
    connection drops mid-call: the worker sends it again and hears 'duplicate'."""

    lost = False

    def complete_encoded(self, reports: Any) -> Any:
        outcomes = super().complete_encoded(reports)
        if not self.lost:
            self.lost = True
            raise redis.ConnectionError("connection reset after the reply was sent")
        return outcomes


class ReplyLostWorker(Worker):
    link_class = ReplyLostLink


def test_a_report_repeated_after_a_lost_reply_counts_as_duplicate(
    redis_client: redis.Redis,
    namespace: str,
    registry: CollectorRegistry,
    endpoint: MetricsServer,
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    s.schedule("once", fn="ok")
    worker = ReplyLostWorker(s, FUNCTIONS, concurrency=2, metrics=PrometheusMetrics(registry))
    thread = run_in_thread(worker)
    try:
        scraped_until(
            endpoint.port,
            {
                sample("distsched_tasks_claimed_total"): 1.0,
                sample("distsched_tasks_succeeded_total"): 0.0,
                sample("distsched_reports_rejected_total", reason="duplicate"): 1.0,
                sample("distsched_reports_rejected_total", reason="stale"): 0.0,
                sample("distsched_namespace_tasks", state="succeeded"): 1.0,
            },
        )
        assert s.status("once").state is State.SUCCEEDED
    finally:
        stop(worker, thread)
        s.close()


def test_a_worker_without_metrics_never_imports_prometheus_client() -> None:
    code = "import sys, distsched.worker; print('prometheus_client' in sys.modules)"
    out = subprocess.run(
        python_command("-c", code),
        capture_output=True, text=True, check=True, cwd=REPO, env=subprocess_env(),
    )  # fmt: skip
    assert out.stdout.strip() == "False"


def test_without_prometheus_client_metrics_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, namespace: str
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now fails
    with pytest.raises(MetricsUnavailable, match="prometheus-client"):
        PrometheusMetrics()
    with pytest.raises(MetricsUnavailable, match="distsched\\[metrics\\]"):
        serve_metrics(0)

    from tests.test_cli import assert_one_line_error, invoke

    result = invoke(redis_server, namespace, "worker", "tests.cli_app:FUNCS", "--metrics-port", "0")
    line = assert_one_line_error(result, "prometheus-client")
    assert INSTALL_HINT in line


def test_worker_cli_refuses_a_metrics_port_in_use_with_one_line(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import assert_one_line_error, invoke

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = invoke(
            redis_server, namespace, "worker", "tests.cli_app:FUNCS", "--metrics-port", port
        )
    assert_one_line_error(result, "cannot serve metrics", f"127.0.0.1:{port}")


def test_worker_cli_serves_metrics_on_the_given_port_until_it_stops(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler, tmp_path: Path
) -> None:
    port = free_port()
    scheduler.schedule_many([TaskSpec(f"add-{i}", "add", args=[i, 1]) for i in range(3)])
    env = subprocess_env({k: v for k, v in os.environ.items() if not k.startswith("DISTSCHED_")})
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*COMMAND, "--redis", redis_server.url, "--namespace", namespace,
             "worker", "tests.cli_app:FUNCS", "--lease", "0.6", "--metrics-port", str(port)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        scraped_until(
            port,
            {
                sample("distsched_tasks_claimed_total"): 3.0,
                sample("distsched_tasks_succeeded_total"): 3.0,
                sample("distsched_task_run_seconds_count", fn="add"): 3.0,
                sample("distsched_namespace_tasks", state="succeeded"): 3.0,
            },
            timeout=20,
        )
        # The endpoint is a process's: it carries the standard process metrics too.
        assert sample("process_cpu_seconds_total") in scrape(port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"metrics at http://127.0.0.1:{port}/metrics" in log.read_text()
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_the_ready_wait_is_exported_per_priority_bucket(registry: CollectorRegistry) -> None:
    metrics = PrometheusMetrics(registry)
    for priority, wait in [(0, 0.002), (3, 0.2), (3, 20.0), (-7, 1.0), (42, 1.0), (5000, 1.0)]:
        claim = Claim("t", 1, 1, "f", (), {}, priority, 0.0)
        metrics.on_started(claim, wait)

    def count(label: str) -> float | None:
        value: float | None = registry.get_sample_value(
            "distsched_task_ready_wait_seconds_count", {"priority": label}
        )
        return value

    assert [count(label) for label in ("0", "3", "<0", "10-99", ">=1000", "9")] == [
        1.0, 2.0, 1.0, 1.0, 1.0, 0.0,
    ]  # fmt: skip
    slow = registry.get_sample_value(
        "distsched_task_ready_wait_seconds_bucket", {"priority": "3", "le": "10.0"}
    )
    assert slow == 1.0  # the 20 s wait of a priority-3 task stands out


def test_a_worker_exports_the_oldest_due_wait_and_the_tasks_it_failed_as_unserved(
    fast: Scheduler, registry: CollectorRegistry, endpoint: MetricsServer
) -> None:
    s = fast
    s.schedule("orphan", fn="nobody")
    worker = Worker(
        s, {"ok": ok}, concurrency=2, unserved_timeout=0, metrics=PrometheusMetrics(registry)
    )
    thread = run_in_thread(worker)
    try:
        wait_state(s, "orphan", State.FAILED)
        scraped_until(endpoint.port, {sample("distsched_tasks_unserved_total"): 1.0})
        # Nothing may start now: the next due task waits, and the gauge shows it.
        s.set_max_running(0)
        s.schedule("stuck", fn="ok")
        wait_for(
            lambda: scrape(endpoint.port)[sample("distsched_oldest_due_wait_seconds")] > 0.5,
            what="the oldest due wait to grow",
        )
        s.set_max_running(None)
        wait_state(s, "stuck", State.SUCCEEDED)
        scraped_until(endpoint.port, {sample("distsched_oldest_due_wait_seconds"): 0.0})
    finally:
        stop(worker, thread)
