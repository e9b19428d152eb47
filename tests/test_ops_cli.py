"""Operations commands (§11): ``stats`` (live), ``leases``, ``retention``, and their
one-line errors, against a real redis-server."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from distsched import Scheduler, State
from distsched.cli import cli as cli_group
from tests.conftest import RedisServer, free_port, namespace_keys
from tests.test_cli import COMMAND, REPO, _runner, assert_one_line_error, env_without_redis_url
from tests.test_cli import invoke as cli


def line(output: str, pattern: str) -> re.Match[str]:
    found = re.search(pattern, output, re.M)
    assert found, f"no line matching {pattern!r} in:\n{output}"
    return found


@pytest.fixture
def busy(scheduler: Scheduler, redis_client: redis.Redis, namespace: str) -> Scheduler:
    """A namespace with a bit of everything an operator looks at.

    Running: run-a (a 5 s lease) and run-b (a 0.05 s lease, expired, not reaped).
    Queue: a cancelled task's entry due 20 s ago (stale, at the head), old-1 and
    old-2 due 5 s ago, old-3 replaced (one stale entry, one live), future in an hour.
    """
    s = scheduler
    short = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    s.set_max_running(4)
    s.set_retention(3600)
    s.schedule("run-a", fn="f", delay=-10)
    s.schedule("run-b", fn="f", delay=-9)
    assert [c.task_id for c in s.ready(1, "worker-a")] == ["run-a"]
    assert [c.task_id for c in short.ready(1, "worker-b")] == ["run-b"]
    s.schedule("stale-head", fn="f", delay=-20)
    s.cancel("stale-head")
    for task_id in ("old-1", "old-2", "old-3"):
        s.schedule(task_id, fn="f", delay=-5)
    s.schedule("old-3", fn="f", delay=-5)
    s.schedule("future", fn="f", delay=3600)
    deadline = dict(s.leases())["run-b"]
    while s.server_time() <= deadline:
        time.sleep(0.01)
    return s


# --------------------------------------------------------------------------- stats


def test_stats_shows_states_stale_ratio_oldest_due_capacity_leases_and_retention(
    redis_server: RedisServer, namespace: str, busy: Scheduler
) -> None:
    result = cli(redis_server, namespace, "stats", "--soon", "10")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    # "future" is queued but not due: scheduled, apart from the 3 due ones.
    line(out, r"^scheduled\s+1$")
    line(out, r"^ready\s+3$")
    line(out, r"^running\s+2$")
    line(out, r"^cancelled\s+1$")
    line(out, r"^queue entries\s+6 \(4 live, 2 stale\)$")
    line(out, r"^stale ratio\s+33\.3%$")
    # The stale entry due 20 s ago is skipped: the oldest live due task waits about 5 s.
    waited = float(line(out, r"^oldest due\s+(\d+\.\d+) s waiting to start$")[1])
    assert 5.0 <= waited < 20.0
    line(out, r"^running\s+2 \(max_running: 4\)$")
    line(out, r"^leases\s+2 \(1 expired, 1 expiring within 10 s\)$")
    line(out, r"^retention\s+3600 s \(1 h\)$")

    data = json.loads(cli(redis_server, namespace, "stats", "--json", "--soon", "10").stdout)
    assert data["counts"]["ready"] == 4
    assert (data["queue_entries"], data["live_entries"], data["stale_entries"]) == (6, 4, 2)
    assert data["stale_ratio"] == pytest.approx(2 / 6)
    assert 5.0 <= data["oldest_ready_age"] < 20.0
    assert (data["leases"], data["leases_expired"], data["leases_expiring"]) == (2, 1, 1)
    assert (data["running"], data["max_running"], data["retention_s"]) == (2, 4, 3600.0)
    assert abs(data["server_time"] - busy.server_time()) < 5


def test_stats_leases_expiring_counts_only_deadlines_within_the_window(
    redis_server: RedisServer, namespace: str, busy: Scheduler
) -> None:
    # run-a's lease has about 5 s left: outside a 1 s window, inside a 10 s one.
    narrow = json.loads(cli(redis_server, namespace, "stats", "--json", "--soon", "1").stdout)
    wide = json.loads(cli(redis_server, namespace, "stats", "--json", "--soon", "10").stdout)
    assert (narrow["leases_expiring"], wide["leases_expiring"]) == (0, 1)


def test_stats_without_due_tasks_shows_no_oldest_due(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("later", fn="f", delay=3600)
    out = cli(redis_server, namespace, "stats").stdout
    line(out, r"^oldest due\s+-$")
    line(out, r"^stale ratio\s+0\.0%$")
    line(out, r"^leases\s+0 \(0 expired, 0 expiring within 5 s\)$")
    line(out, r"^retention\s+86400 s \(1 d\)$")


def test_stats_watch_redraws_until_its_count(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("x", fn="f", delay=3600)
    result = cli(redis_server, namespace, "stats", "--watch", "--count", "3", "--interval", "0.05")
    assert result.exit_code == 0, result.stderr
    headers = re.findall(rf"^namespace '{namespace}' at .*Z$", result.stdout, re.M)
    assert len(headers) == 3
    assert len(re.findall(r"^scheduled\s+1$", result.stdout, re.M)) == 3

    result = cli(redis_server, namespace, "stats", "--watch", "--json", "--count", "2",
                 "--interval", "0.05")  # fmt: skip
    draws = [json.loads(row) for row in result.stdout.splitlines()]
    assert [d["counts"]["ready"] for d in draws] == [1, 1]
    assert draws[1]["server_time"] > draws[0]["server_time"]


def test_stats_watch_shows_changes_and_ends_cleanly_on_ctrl_c(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler, tmp_path: Path
) -> None:
    scheduler.schedule("first", fn="f", delay=3600)
    out_path = tmp_path / "watch.out"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [*COMMAND, "--redis", redis_server.url, "--namespace", namespace,
             "stats", "--watch", "--interval", "0.05"],
            cwd=REPO, env=env_without_redis_url(), stdout=out, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not re.search(r"^scheduled\s+1$", out_path.read_text(), re.M):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no first draw"
            time.sleep(0.02)
        scheduler.schedule("second", fn="f", delay=3600)
        while not re.search(r"^scheduled\s+2$", out_path.read_text(), re.M):
            assert time.monotonic() < deadline, "the change was never drawn"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err


# --------------------------------------------------------------------------- leases


def test_leases_list_shows_holder_attempt_and_time_left_or_how_long_ago_it_expired(
    redis_server: RedisServer, namespace: str, busy: Scheduler
) -> None:
    out = cli(redis_server, namespace, "leases", "list").stdout
    line(out, r"^task\s+holder\s+attempt\s+time left$")
    left = float(line(out, r"^run-a\s+worker-a\s+1/1\s+(\d+\.\d) s$")[1])
    assert 0 < left <= busy.lease_s
    line(out, r"^run-b\s+worker-b\s+1/1\s+expired \d+(\.\d)? m?s ago$")

    assert cli(redis_server, namespace, "leases", "reap").stdout.strip() == "reaped 1 expired lease"
    out = cli(redis_server, namespace, "leases", "list").stdout
    assert "run-b" not in out and "run-a" in out
    assert busy.status("run-b").state is State.FAILED


# --------------------------------------------------------------------------- retention


def test_retention_shows_and_sets_the_namespace_retention(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("x", fn="f", delay=3600)
    shown = cli(redis_server, namespace, "retention")
    assert shown.stdout.strip() == f"retention of namespace '{namespace}': 86400 s (1 d)"
    for value, seconds in (("90m", 5400.0), ("2h", 7200.0), ("7d", 604800.0),
                           ("500ms", 0.5), ("45", 45.0), ("0", 0.0)):  # fmt: skip
        result = cli(redis_server, namespace, "retention", value)
        assert result.exit_code == 0, result.stderr
        assert f"set to {seconds:g} s" in result.stdout
        assert scheduler.stats()["retention_s"] == seconds
    line(cli(redis_server, namespace, "stats").stdout, r"^retention\s+0 s$")


def test_setting_a_retention_prepares_a_namespace_not_used_yet(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    assert cli(redis_server, namespace, "retention", "1h").exit_code == 0
    assert scheduler.stats()["retention_s"] == 3600.0
    assert cli(redis_server, namespace, "retention").stdout.strip().endswith("3600 s (1 h)")


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", "-5m", "12 parsecs", ""])
def test_a_bad_retention_is_a_one_line_error_and_changes_nothing(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler, value: str
) -> None:
    scheduler.set_retention(60)
    result = cli(redis_server, namespace, "retention", value)
    assert_one_line_error(result, "SECONDS")
    assert scheduler.stats()["retention_s"] == 60.0


# --------------------------------------------------------------------------- errors


OPS_COMMANDS = [
    ["stats"],
    ["stats", "--watch", "--count", "2"],
    ["leases", "list"],
    ["leases", "reap"],
    ["retention"],
]


@pytest.mark.parametrize("args", OPS_COMMANDS, ids=" ".join)
def test_a_namespace_without_keys_is_a_one_line_error(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, args: list[str]
) -> None:
    result = cli(redis_server, namespace, *args)
    assert_one_line_error(result, f"namespace '{namespace}' does not exist", redis_server.url)
    assert namespace_keys(redis_client, namespace) == {}


@pytest.mark.parametrize("args", [*OPS_COMMANDS, ["retention", "10"]], ids=" ".join)
def test_a_refused_connection_is_a_one_line_error(args: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = _runner().invoke(cli_group, ["--redis", url, *args], catch_exceptions=False)
    assert_one_line_error(result, "cannot connect", url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/0",
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:{port}/notadb",
    ],
)
@pytest.mark.parametrize("args", [["stats"], ["leases", "list"], ["retention", "10"]], ids=" ".join)
def test_a_wrong_url_is_a_one_line_error_naming_the_option(url: str, args: list[str]) -> None:
    url = url.format(port=free_port())
    result = _runner().invoke(cli_group, ["--redis", url, *args], catch_exceptions=False)
    assert_one_line_error(result, "--redis")
