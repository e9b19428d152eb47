"""The ``distsched`` command line (§11, §12), the embedded Redis and ``distsched demo``."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import redis
from click.testing import CliRunner, Result

from distsched import Outcome, Scheduler, State
from distsched.cli import cli
from distsched.cli.worker import load_app
from distsched.model import Order, OrderSetting
from distsched.text import parse_duration
from distsched.tools.embedded import EmbeddedRedisUnavailable, embedded_redis
from distsched.worker.link import WorkerLink
from tests.conftest import (
    CLI_COMMAND,
    RedisServer,
    free_port,
    namespace_keys,
    put_payload,
    require_extra,
    require_redis_server,
    subprocess_env,
)

REPO = Path(__file__).resolve().parent.parent
COMMAND = CLI_COMMAND


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart by itself


def invoke(server: RedisServer, namespace: str, *args: str) -> Result:
    return _runner().invoke(
        cli,
        ["--redis", server.url, "--namespace", namespace, *args],
        catch_exceptions=False,
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
    )


def assert_one_line_error(result: Result, *words: str) -> str:
    """Exit code 1, nothing on stdout, one line on stderr naming ``words``."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def env_without_redis_url() -> dict[str, str]:
    return subprocess_env(DISTSCHED_REDIS_URL=None, DISTSCHED_NAMESPACE=None)


# --------------------------------------------------------------------------- schedule/status


def test_schedule_prints_the_version_and_stores_every_option(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    before = scheduler.server_time()
    result = invoke(
        redis_server, namespace, "schedule", "job-1", "--fn", "add",
        "--args", "[1, 2]", "--kwargs", '{"extra": "x"}', "--delay", "30",
        "--priority", "-7", "--max-attempts", "3", "--backoff", "0.5",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "1"
    info = scheduler.status("job-1")
    assert info.state is State.READY
    assert (info.fn, info.args, info.kwargs) == ("add", (1, 2), {"extra": "x"})
    assert (info.priority, info.max_attempts, info.backoff) == (-7, 3, 0.5)
    assert before + 30 - 0.01 <= info.run_at <= scheduler.server_time() + 30 + 0.01

    again = invoke(redis_server, namespace, "schedule", "job-1", "--fn", "add")
    assert again.stdout.strip() == "2"
    assert scheduler.status("job-1").version == 2


def test_schedule_run_at_takes_epoch_seconds_or_iso_8601_with_offset(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    ok = invoke(redis_server, namespace, "schedule", "e", "--fn", "f", "--run-at", "1.9e9")
    assert ok.exit_code == 0, ok.stderr
    assert scheduler.status("e").run_at == 1900000000.0
    ok = invoke(
        redis_server, namespace, "schedule", "e", "--fn", "f", "--run-at", "1.9000000001234e9"
    )
    assert scheduler.status("e").run_at == 1900000000.123
    for text in ("2030-01-01T09:00:00+02:00", "2030-01-01T07:00:00Z"):
        ok = invoke(redis_server, namespace, "schedule", "iso", "--fn", "f", "--run-at", text)
        assert ok.exit_code == 0, ok.stderr
        assert scheduler.status("iso").run_at == 1893481200.0


def test_a_run_at_given_in_milliseconds_is_refused_naming_the_field_and_the_fix(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    result = invoke(
        redis_server, namespace, "schedule", "t", "--fn", "f", "--run-at", "1796034212382"
    )
    line = assert_one_line_error(result, "--run-at", "9999", "milliseconds", "1796034212.382")
    assert "1796034212.382" in line
    assert namespace_keys(redis_client, namespace) == {}


def test_a_run_at_without_offset_gets_a_hint_that_is_itself_accepted(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    for given in ("2030-01-01", "2030-01-01T09:00", "2030-01-01 09:00:00.5"):
        line = assert_one_line_error(
            invoke(redis_server, namespace, "schedule", "t", "--fn", "f", "--run-at", given),
            "--run-at",
            "UTC offset",
        )
        hint = re.search(r"write e\.g\. (\S+)", line)
        assert hint is not None, line
        ok = invoke(
            redis_server, namespace, "schedule", "t", "--fn", "f", "--run-at", hint.group(1)
        )
        assert ok.exit_code == 0, ok.stderr
        expected = dt.datetime.fromisoformat(given).replace(tzinfo=dt.timezone.utc)
        assert scheduler.status("t").run_at == expected.timestamp()


def test_status_of_a_task_due_after_the_year_9999_prints_without_a_traceback(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    # A run_at past the year 9999 is refused (it reads as milliseconds); a delay reaches it.
    now = scheduler.server_time()
    scheduler.schedule("far", fn="f", delay=1796034212382 - now)
    scheduler.schedule("past", fn="f", delay=-1e12 - now)
    for task_id, shown in (("far", "in "), ("past", "")):
        text = invoke(redis_server, namespace, "status", task_id)
        assert text.exit_code == 0, text.stderr
        fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.stdout.splitlines())
        assert fields["run_at"].startswith(shown) and " d" in fields["run_at"]
        data = json.loads(invoke(redis_server, namespace, "status", task_id, "--json").stdout)
        assert data["run_at"] == scheduler.status(task_id).run_at
    assert invoke(redis_server, namespace, "stats").exit_code == 0


@pytest.mark.parametrize(
    ("option", "value", "seconds"),
    [
        ("--delay", "90", 90.0),
        ("--delay", "5m", 300.0),
        ("--delay", "1h30m", 5400.0),
        ("--delay", "2d", 172800.0),
        ("--delay", "1500ms", 1.5),
        ("--backoff", "2s", 2.0),
        ("--backoff", "250ms", 0.25),
        ("--backoff", "1m30s", 90.0),
    ],
)
def test_durations_take_units_or_bare_seconds(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler,
    option: str, value: str, seconds: float,
) -> None:  # fmt: skip
    before = scheduler.server_time()
    ok = invoke(redis_server, namespace, "schedule", "d", "--fn", "f", option, value)
    assert ok.exit_code == 0, ok.stderr
    info = scheduler.status("d")
    if option == "--backoff":
        assert info.backoff == seconds
    else:
        assert before + seconds - 0.01 <= info.run_at <= scheduler.server_time() + seconds + 0.01


@pytest.mark.parametrize("value", ["5x", "m5", "1m1h", "1.2.3s", "", "-3s"])
def test_a_bad_duration_is_refused_naming_the_option(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, value: str
) -> None:
    result = invoke(redis_server, namespace, "schedule", "d", "--fn", "f", "--backoff", value)
    assert_one_line_error(result, "--backoff")
    assert namespace_keys(redis_client, namespace) == {}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("1.5", 1.5), ("500ms", 0.5), ("90s", 90.0), ("30m", 1800.0),
     ("30min", 1800.0), ("12h", 43200.0), ("7d", 604800.0), ("1h30m", 5400.0),
     ("1d2h3m4s5ms", 93784.005), (" 2 H ", 7200.0)],
)  # fmt: skip
def test_parse_duration_reads_seconds_and_units(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


def test_status_shows_a_bounded_preview_of_a_large_payload_with_its_size(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    big = Scheduler(redis_client, namespace=namespace)
    payload = "x" * (50 * 2**20)
    # Beyond any limit the scripts take today: stored as an older client could have.
    big.schedule("big", fn="f")
    packed = msgpack.packb({"fn": "f", "args": [payload], "kwargs": {"small": 1}})
    put_payload(redis_client, big.keys, "big", packed)
    text = invoke(redis_server, namespace, "status", "big")
    assert text.exit_code == 0, text.stderr
    assert len(text.stdout) < 5000
    fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.stdout.splitlines())
    assert fields["args"].startswith('["xxxx')
    assert "50.0 MiB in all" in fields["args"]
    assert fields["kwargs"] == '{"small": 1}'

    full = invoke(redis_server, namespace, "status", "big", "--full")
    assert payload in full.stdout
    data = json.loads(invoke(redis_server, namespace, "status", "big", "--json").stdout)
    assert data["args"] == [payload]


def test_max_running_is_shown_set_and_removed(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("a", fn="f")
    shown = invoke(redis_server, namespace, "max-running")
    assert shown.stdout.strip().endswith(": unlimited")
    assert invoke(redis_server, namespace, "max-running", "3").exit_code == 0
    assert scheduler.stats()["max_running"] == 3
    assert invoke(redis_server, namespace, "max-running").stdout.strip().endswith(": 3")
    assert invoke(redis_server, namespace, "max-running", "0").exit_code == 0
    assert scheduler.stats()["max_running"] == 0
    assert invoke(redis_server, namespace, "max-running", "none").exit_code == 0
    assert scheduler.stats()["max_running"] is None
    for bad in ("-1", "two", "1.5"):
        assert_one_line_error(invoke(redis_server, namespace, "max-running", bad), bad)
    assert scheduler.stats()["max_running"] is None


def test_order_is_shown_set_to_priority_with_an_aging_and_back(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("a", fn="f")
    shown = invoke(redis_server, namespace, "order")
    assert shown.stdout.strip().endswith(": default")
    result = invoke(redis_server, namespace, "order", "priority", "--aging", "90s")
    assert result.exit_code == 0, result.stderr
    assert scheduler.order() == OrderSetting(Order.PRIORITY, 90.0)
    shown = invoke(redis_server, namespace, "order")
    assert shown.stdout.strip().endswith(": priority, aging 90 s per point")
    stats = invoke(redis_server, namespace, "stats")
    assert "priority (aging 90 s per point)" in stats.stdout
    assert re.search(r"priority 0\s+\d+\.\d{3} s", stats.stdout)  # a's wait
    assert invoke(redis_server, namespace, "order", "default").exit_code == 0
    assert scheduler.order().order is Order.DEFAULT
    bad = invoke(redis_server, namespace, "order", "priority", "--aging", "-5s")
    assert bad.exit_code != 0
    assert scheduler.order().order is Order.DEFAULT


def test_status_prints_readable_lines_and_json(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("s", fn="add", args=[1, 2], priority=4, delay=60, max_attempts=2)
    text = invoke(redis_server, namespace, "status", "s")
    assert text.exit_code == 0, text.stderr
    fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.stdout.splitlines())
    assert fields["state"] == "ready"
    assert fields["version"] == "1"
    assert fields["priority"] == "4"
    assert fields["max_attempts"] == "2"
    assert fields["fn"] == "add"
    assert fields["args"] == "[1, 2]"

    raw = invoke(redis_server, namespace, "status", "s", "--json")
    data = json.loads(raw.stdout)
    info = scheduler.status("s")
    assert data["state"] == "ready"
    assert data["args"] == [1, 2]
    assert (data["version"], data["priority"], data["run_at"]) == (1, 4, info.run_at)


def test_status_of_an_unknown_id_is_a_one_line_error(
    redis_server: RedisServer, namespace: str
) -> None:
    assert_one_line_error(invoke(redis_server, namespace, "status", "ghost"), "ghost", namespace)


# --------------------------------------------------------------------------- cancel


def test_cancel_of_a_queued_task_prints_cancelled(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("q", fn="add", delay=60)
    result = invoke(redis_server, namespace, "cancel", "q")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "cancelled"
    assert scheduler.status("q").state is State.CANCELLED
    assert scheduler.next("w").reason == "empty"  # type: ignore[union-attr]


def test_cancel_of_a_running_task_prints_running_and_records_the_request(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("r", fn="add")
    claim = scheduler.next("w")
    result = invoke(redis_server, namespace, "cancel", "r")
    assert result.stdout.strip() == "running"
    info = scheduler.status("r")
    assert info.state is State.RUNNING and info.cancel_requested
    assert scheduler.heartbeat(claim) is True  # type: ignore[arg-type]


def test_cancel_of_an_unknown_id_is_a_one_line_error_and_writes_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    before = namespace_keys(redis_client, namespace)
    assert_one_line_error(invoke(redis_server, namespace, "cancel", "nobody"), "nobody")
    assert namespace_keys(redis_client, namespace) == before


# --------------------------------------------------------------------------- stats


def test_stats_counts_tasks_per_state(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    for task_id in ("a", "b", "c"):
        scheduler.schedule(task_id, fn="add", delay=60)
    scheduler.cancel("c")
    scheduler.schedule("b", fn="add", delay=60)  # a replacement leaves one stale entry

    data = json.loads(invoke(redis_server, namespace, "stats", "--json").stdout)
    assert data["counts"]["ready"] == 2
    assert data["counts"]["cancelled"] == 1
    assert (data["queue_entries"], data["live_entries"], data["stale_entries"]) == (4, 2, 2)

    table = invoke(redis_server, namespace, "stats").stdout
    # Both queued tasks are due in a minute: scheduled, none ready yet.
    assert re.search(r"^scheduled\s+2$", table, re.M), table
    assert re.search(r"^ready\s+0$", table, re.M), table
    assert re.search(r"^cancelled\s+1$", table, re.M), table
    assert re.search(r"^queue entries\s+4 \(2 live, 2 stale\)$", table, re.M), table


# --------------------------------------------------------------------------- leases


def test_leases_list_shows_holder_attempt_and_time_left(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("held", fn="add", max_attempts=3)
    assert invoke(redis_server, namespace, "leases", "list").stdout.strip() == "no leases"
    scheduler.next("worker-alpha")
    out = invoke(redis_server, namespace, "leases", "list").stdout
    row = next(line for line in out.splitlines() if line.startswith("held"))
    task_id, holder, attempt, left, unit = row.split()
    assert (task_id, holder, attempt, unit) == ("held", "worker-alpha", "1/3", "s")
    assert 0 < float(left) <= scheduler.lease_s


def test_leases_expire_retries_while_attempts_remain_then_fails(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("x", fn="add", max_attempts=2, backoff=0)
    scheduler.next("w")
    first = invoke(redis_server, namespace, "leases", "expire", "x")
    assert first.exit_code == 0, first.stderr
    assert "ready" in first.stdout
    info = scheduler.status("x")
    assert (info.state, info.attempt, info.error) == (State.READY, 1, "lease expired")

    scheduler.next("w")
    second = invoke(redis_server, namespace, "leases", "expire", "x")
    assert "failed" in second.stdout
    info = scheduler.status("x")
    assert (info.state, info.attempt, info.error) == (State.FAILED, 2, "lease expired")

    assert_one_line_error(invoke(redis_server, namespace, "leases", "expire", "x"), "no lease")
    assert_one_line_error(invoke(redis_server, namespace, "leases", "expire", "zz"), "zz")


def test_leases_reap_hands_expired_leases_back(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, scheduler: Scheduler
) -> None:
    short = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    scheduler.schedule("gone", fn="add", max_attempts=2, backoff=0)
    scheduler.schedule("kept", fn="add", max_attempts=2, backoff=0)
    short.next("vanished")
    scheduler.next("alive")  # a 5 s lease: not expired, not reaped
    deadline = dict(scheduler.leases())["gone"]
    while scheduler.server_time() <= deadline:
        time.sleep(0.01)
    result = invoke(redis_server, namespace, "leases", "reap")
    assert result.stdout.strip() == "reaped 1 expired lease"
    assert scheduler.status("gone").state is State.READY
    assert scheduler.status("kept").state is State.RUNNING


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--priority", "2147483648"], "--priority"),
        (["--priority", "-2147483649"], "--priority"),
        (["--delay", "nan"], "--delay"),
        (["--delay", "inf"], "--delay"),
        (["--run-at", "2030-01-01T09:00:00"], "--run-at"),
        (["--run-at", "next tuesday"], "--run-at"),
        (["--run-at", "nan"], "--run-at"),
        (["--delay", "1", "--run-at", "1900000000"], "--delay"),
        (["--args", '{"a": 1}'], "--args"),
        (["--args", "[1,"], "--args"),
        (["--kwargs", "[1]"], "--kwargs"),
        (["--max-attempts", "0"], "--max-attempts"),
        (["--backoff", "-1"], "--backoff"),
        (["--backoff", "nan"], "--backoff"),
        (["--fn", ""], "--fn"),
    ],
)
def test_bad_schedule_input_names_the_field_and_writes_nothing(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    namespace: str,
    scheduler: Scheduler,
    extra: list[str],
    field: str,
) -> None:
    scheduler.schedule("keep", fn="add", args=[1, 2], delay=60)
    before = namespace_keys(redis_client, namespace)
    args = ["schedule", "keep", "--fn", "add", *extra]
    if extra[0] == "--fn":
        args = ["schedule", "keep", *extra]
    assert_one_line_error(invoke(redis_server, namespace, *args), field)
    assert namespace_keys(redis_client, namespace) == before


def test_bad_id_and_namespace_name_the_field(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    assert_one_line_error(invoke(redis_server, namespace, "schedule", "", "--fn", "f"), "ID")
    assert_one_line_error(invoke(redis_server, "a b", "stats"), "--namespace")
    assert namespace_keys(redis_client, namespace) == {}


def test_unparseable_numbers_are_click_usage_errors(
    redis_server: RedisServer, namespace: str
) -> None:
    result = invoke(redis_server, namespace, "schedule", "x", "--fn", "f", "--priority", "high")
    assert result.exit_code == 2
    assert "--priority" in result.stderr


def test_a_refused_port_is_a_one_line_connection_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["stats"], ["status", "x"], ["schedule", "x", "--fn", "f"], ["demo"]):
        result = _runner().invoke(cli, ["--redis", url, *args], catch_exceptions=False)
        assert_one_line_error(result, "cannot connect", url)


def test_a_malformed_url_is_a_one_line_error_naming_the_option() -> None:
    for url in ("http://127.0.0.1:6379", "redis://127.0.0.1:notaport/0"):
        result = _runner().invoke(cli, ["--redis", url, "stats"], catch_exceptions=False)
        assert_one_line_error(result, "--redis")


def test_the_url_and_namespace_come_from_the_environment(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    result = _runner().invoke(
        cli,
        ["schedule", "from-env", "--fn", "add"],
        env={"DISTSCHED_REDIS_URL": redis_server.url, "DISTSCHED_NAMESPACE": namespace},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert scheduler.status("from-env").state is State.READY


def test_a_password_in_the_url_is_not_printed() -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    line = assert_one_line_error(_runner().invoke(cli, ["--redis", url, "stats"]), "cannot connect")
    assert "s3cret" not in line


# --------------------------------------------------------------------------- worker


def test_worker_app_may_be_a_mapping_or_a_list_of_functions() -> None:
    from tests import cli_app

    assert load_app("tests.cli_app:FUNCS") == cli_app.FUNCS
    assert load_app("tests.cli_app:FUNC_LIST") == {"add": cli_app.add, "whoami": cli_app.whoami}


@pytest.mark.parametrize(
    "app", ["tests.no_such_module:FUNCS", "tests.cli_app:MISSING", "tests.cli_app:NOT_FUNCTIONS",
            "tests.cli_app"],
)  # fmt: skip
def test_worker_with_a_bad_app_is_a_one_line_error(
    redis_server: RedisServer, namespace: str, app: str
) -> None:
    assert_one_line_error(invoke(redis_server, namespace, "worker", app), "APP")


@pytest.mark.parametrize(
    ("option", "value"), [("--concurrency", "0"), ("--lease", "0"), ("--grace", "nan")]
)
def test_worker_with_a_bad_option_is_a_one_line_error(
    redis_server: RedisServer, namespace: str, option: str, value: str
) -> None:
    result = invoke(redis_server, namespace, "worker", "tests.cli_app:FUNCS", option, value)
    assert_one_line_error(result, option)


def test_worker_runs_tasks_in_a_subprocess_and_exits_zero_on_sigterm(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    for i in range(4):
        scheduler.schedule(f"add-{i}", fn="add", args=[i, 10])
    scheduler.schedule("who", fn="whoami")
    proc = subprocess.Popen(
        [*COMMAND, "--redis", redis_server.url, "--namespace", namespace,
         "worker", "tests.cli_app:FUNCS", "--concurrency", "2", "--lease", "5s", "--grace", "2s"],
        cwd=REPO, env=env_without_redis_url(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        ids = [f"add-{i}" for i in range(4)] + ["who"]
        while not all(scheduler.status(t).state is State.SUCCEEDED for t in ids):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not run the tasks"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert [scheduler.status(f"add-{i}").result for i in range(4)] == [10, 11, 12, 13]
    assert scheduler.status("who").result == {"task_id": "who", "attempt": 1}
    assert "Traceback" not in err
    assert scheduler.stats()["leases"] == 0


# --------------------------------------------------------------------------- embedded Redis


def test_embedded_fakeredis_runs_every_script_and_delivers_wake_ups() -> None:
    require_extra("fakeredis")
    require_extra("lupa")
    with embedded_redis("fakeredis") as server:
        assert server.kind == "fakeredis"
        s = Scheduler.from_url(server.url, namespace="emb", lease_s=5)
        pubsub = s.client.pubsub(ignore_subscribe_messages=True)
        try:
            # An idle worker listening on its own channel is woken by the new task.
            channel = s.keys.worker_channel("w")
            if WorkerLink(s).uses_sharded_pubsub():
                pubsub.ssubscribe(channel)
            else:
                pubsub.subscribe(channel)
            assert s.claim(1, "w", listening=True)[0] == []  # claim (+ idle)
            assert s.schedule("a", fn="add", args=[1, 2]) == 1  # schedule (+ wake)
            message = None
            deadline = time.monotonic() + 5
            while message is None and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=0.1)
            assert message is not None and message["channel"] == channel.encode()

            claim = s.next("w")  # claim
            assert claim.task_id == "a"  # type: ignore[union-attr]
            assert s.heartbeat(claim) is False  # type: ignore[arg-type]
            assert s.complete(claim, 3) is Outcome.APPLIED  # type: ignore[arg-type]
            assert s.status("a").result == 3

            s.schedule("b", fn="add", max_attempts=2, backoff=0)
            claim = s.next("w")
            assert s.fail(claim, "boom") is Outcome.APPLIED  # type: ignore[arg-type]
            claim = s.next("w")
            assert claim.attempt == 2  # type: ignore[union-attr]
            assert s.expire_lease("b") == 1  # reap
            assert s.status("b").state is State.FAILED

            s.schedule("c", fn="add")
            claim = s.next("w")
            assert s.cancel("c") is State.RUNNING  # cancel
            assert s.confirm_cancel(claim) is Outcome.APPLIED  # type: ignore[arg-type]
            assert s.status("c").state is State.CANCELLED

            s.schedule("d", fn="add")
            claim = s.next("w")
            assert s.release([claim]) == 1  # type: ignore[list-item]
            assert s.status("d").state is State.READY
            assert s.reap() == 0
        finally:
            pubsub.close()
            s.close()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()
    assert not any(t.name == "distsched-fakeredis" for t in threading.enumerate())


def test_embedded_redis_server_is_stopped_at_exit() -> None:
    require_redis_server()
    with embedded_redis() as server:
        assert server.kind == "redis-server"
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
    client = redis.Redis.from_url(server.url, socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()


def test_without_redis_server_or_fakeredis_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("distsched.tools.embedded.shutil.which", lambda name: None)
    monkeypatch.setitem(sys.modules, "fakeredis", None)
    with pytest.raises(EmbeddedRedisUnavailable) as info, embedded_redis():
        pass  # pragma: no cover
    assert "redis-server" in str(info.value) and "distsched[embedded]" in str(info.value)

    result = _runner().invoke(cli, ["demo"], env={"DISTSCHED_REDIS_URL": None})
    assert_one_line_error(result, "distsched[embedded]")


# --------------------------------------------------------------------------- demo


def run_demo_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, "demo", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_demo_runs_the_whole_story_on_a_given_redis_and_cleans_up(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    proc = run_demo_process("--redis", redis_server.url, env=env_without_redis_url())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo OK" in proc.stdout and "FAILED" not in proc.stdout
    namespace = re.search(r"namespace '(demo-[0-9a-f]+)'", proc.stdout).group(1)  # type: ignore[union-attr]
    assert namespace_keys(redis_client, namespace) == {}
    # The final table: every task with its state.
    assert re.search(r"^\s+vanishing\s+succeeded\s+\d+\s+2\s", proc.stdout, re.M), proc.stdout
    assert re.search(r"^\s+never-runs\s+cancelled\s", proc.stdout, re.M), proc.stdout


def test_demo_without_redis_server_on_path_runs_on_embedded_fakeredis() -> None:
    require_extra("fakeredis")
    require_extra("lupa")
    env = env_without_redis_url()
    dirs = [d for d in env.get("PATH", "").split(os.pathsep) if d]
    dirs = [d for d in dirs if shutil.which("redis-server", path=d) is None]
    env["PATH"] = os.pathsep.join(dirs) or os.defpath
    if shutil.which("redis-server", path=env["PATH"]) is not None:
        pytest.skip("cannot build a PATH without redis-server")
    proc = run_demo_process(env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fakeredis" in proc.stdout
    assert "demo OK" in proc.stdout


def test_timeline_timestamps_only_grow_in_the_demo_output(
    redis_server: RedisServer,
) -> None:
    from distsched.tools.demo import run_demo

    lines: list[str] = []
    assert run_demo(redis_server.url, lines.append) is True
    stamps = [float(m.group(1)) for m in map(re.compile(r"^\[\+\s*(\d+) ms\]").match, lines) if m]
    assert len(stamps) > 20
    assert stamps == sorted(stamps)
    assert not math.isnan(sum(stamps))
    assert not any(t.name.startswith("distsched-") for t in threading.enumerate())
