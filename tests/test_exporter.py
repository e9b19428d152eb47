"""The depth exporter: each namespace's backlog over HTTP with no worker running, for an
autoscaler that scales workers from zero."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from distsched import Scheduler, TaskSpec
from distsched.exporter import STAGES, serve_depth
from tests.conftest import CLI_COMMAND, REPO_ROOT, RedisServer, subprocess_env


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def exporter(own_redis: RedisServer) -> Iterator[str]:
    """``distsched exporter`` over namespaces ``a`` and ``b`` in a process of its own: its
    base URL."""
    env = subprocess_env(DISTSCHED_REDIS_URL=own_redis.url, DISTSCHED_NAMESPACE="a")
    proc = subprocess.Popen(
        [*CLI_COMMAND, "exporter", "--port", "0", "--also", "b", "--interval", "0"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/depth", line)
        assert found, line + (proc.stderr.read() if proc.stderr else "")
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.terminate()
        proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_the_exporter_serves_each_namespaces_depth_by_stage_with_no_worker(
    own_redis: RedisServer, exporter: str
) -> None:
    with Scheduler.from_url(own_redis.url, namespace="a") as a:
        a.schedule_many([TaskSpec(f"now{i}", "f") for i in range(3)])
        a.schedule_many([TaskSpec(f"later{i}", "f", delay=3600) for i in range(2)])
        a.schedule("after", fn="f", deps=["now0"])
        [claim] = a.ready(1, "w")
        assert claim.task_id == "now0"
        with Scheduler.from_url(own_redis.url, namespace="b") as b:
            b.schedule("one", fn="f")
            status, body = get(exporter + "/depth")
            assert status == 200
            assert json.loads(body) == {
                "namespaces": {
                    "a": {"due": 2, "scheduled": 2, "running": 1, "pending": 1, "busy": 3},
                    "b": {"due": 1, "scheduled": 0, "running": 0, "pending": 0, "busy": 1},
                }
            }
            status, text = get(exporter + "/metrics")
            assert status == 200
            samples = dict(re.findall(r"^(distsched_namespace_depth\{.*\}) (\d+)$", text, re.M))
            assert samples['distsched_namespace_depth{namespace="a",stage="busy"}'] == "3"
            assert samples['distsched_namespace_depth{namespace="b",stage="due"}'] == "1"
            assert len(samples) == 2 * len(STAGES)
            # Read anew (an interval of 0): the next request sees what changed.
            a.complete(claim)
            b.schedule("two", fn="f")
            depth: Any = json.loads(get(exporter + "/depth")[1])["namespaces"]
            assert (depth["a"]["running"], depth["a"]["due"], depth["b"]["due"]) == (0, 3, 2)
    assert get(exporter + "/nothing")[0] == 404


def test_many_requests_within_the_interval_cost_redis_one_read(own_redis: RedisServer) -> None:
    client = own_redis.client()
    with Scheduler.from_url(own_redis.url, namespace="a") as s:
        s.schedule("t", fn="f")
        server = serve_depth([s], 0, interval_s=60.0)
        try:
            base = f"http://127.0.0.1:{server.port}"
            assert get(base + "/depth")[0] == 200
            before = int(client.info("stats")["total_commands_processed"])
            for _ in range(20):
                assert get(base + "/metrics")[0] == 200
            # The INFO call itself is the one command the server saw.
            assert int(client.info("stats")["total_commands_processed"]) - before == 1
        finally:
            server.close()
            client.close()


def test_an_unreachable_redis_is_an_error_an_autoscaler_keeps_its_decision_on_not_zero(
    namespace: str,
) -> None:
    server = RedisServer()
    s = Scheduler.from_url(server.url, namespace=namespace)
    exporter = serve_depth([s], 0, interval_s=0.0)
    try:
        base = f"http://127.0.0.1:{exporter.port}"
        assert get(base + "/depth")[0] == 200
        server.stop()
        deadline = time.monotonic() + 10
        status, body = get(base + "/depth")
        while status == 200 and time.monotonic() < deadline:
            status, body = get(base + "/depth")
        assert status == 503 and "redis unavailable" in body
    finally:
        exporter.close()
        s.close()
        server.close()
