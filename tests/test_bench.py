"""``distsched bench``: one run of every section, its JSON, and the exactly-once check.

Sizes are tiny: these tests check that the run completes, reports every figure
and cleans up after itself, never how fast anything is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from distsched import scripts
from distsched.cli import cli
from distsched.tools.bench import (
    SECTIONS,
    BenchConfig,
    Run,
    check_exactly_once,
    profile_slowlog,
)
from distsched.wire import calls
from tests.conftest import RedisServer

TINY = [
    "--evalsha-calls", "200", "--pipeline", "20", "--schedule-calls", "50",
    "--enqueue-tasks", "300", "--batch", "100", "--tasks", "200", "--concurrency", "4",
    "--delayed", "40", "--delay-min", "0.1", "--delay-max", "0.4", "--slots", "10",
    "--claim-sizes", "60,120", "--claims", "20", "--chain", "30", "--fanout", "30",
    "--dependents", "1500", "--memory-tasks", "200", "--wake-tasks", "30",
    "--wake-processes", "1,3", "--dashboard-tasks", "300", "--dashboard-drain", "200",
    "--fair-heavy", "300", "--fair-rounds", "3", "--fair-claims", "320",
    "--profile-tasks", "50", "--worst-scale", "0.01", "--worst-repeats", "1",
]  # fmt: skip


def bench(*args: str) -> Result:
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        runner = CliRunner()  # click >= 8.2 keeps stderr apart by itself
    return runner.invoke(
        cli,
        ["bench", *args],
        catch_exceptions=False,
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
    )


def check_report(report: dict[str, Any], throwaway: bool) -> None:
    assert set(report["sections"]) == set(SECTIONS)
    assert report["problems"] == []
    assert report["redis"]["throwaway"] is throwaway
    sections = report["sections"]
    assert sections["ceiling"]["sequential_per_s"] > 0
    runs = sections["e2e"]["runs"]
    threads = sections["e2e"]["concurrency"]
    assert [(run["processes"], run["fn"], run["concurrency"]) for run in runs] == [
        (1, "def", threads), (1, "async def", threads), (2, "def", threads), (1, "def", 1),
    ]  # fmt: skip
    for run in runs:
        # The one-thread run drains a third of the tasks: one at a time, each is slower.
        tasks = 200 if run["concurrency"] > 1 else 200 // 3
        assert run["tasks"] == tasks
        assert run["exactly_once_problems"] == []
        assert sum(counts["succeeded"] for counts in run["worker_counts"]) == tasks
        assert run["tasks_per_s"] > 0
        if report["redis"]["backend"] != "fakeredis":
            assert run["redis_cpu_us_per_task"] > 0
    enqueue = sections["enqueue"]
    assert enqueue["lpush_per_s"] > 0 and enqueue["single_vs_lpush"] > 0
    env = report["environment"]
    assert env["machine"]["cores"] >= 1 and env["machine"]["cpu_model"]
    assert env["libraries"]["redis"] and env["libraries"]["msgpack"]
    assert env["python"]
    assert sections["enqueue"]["single_calls"] == 50
    late = sections["lateness"]
    assert late["tasks"] == 40
    assert late["p50_ms"] <= late["p99_ms"] <= late["max_ms"]
    slots = late["slots"]
    assert slots["slots"] == 10 and slots["exactly_once_problems"] == []
    assert slots["p50_ms"] <= slots["p99_ms"] <= slots["max_ms"]
    assert [size["queued"] for size in sections["claim"]["sizes"]] == [60, 120]
    assert [size["queued"] for size in sections["claim"]["priority"]] == [60, 120]
    assert [size["queued"] for size in sections["claim"]["fair"]] == [60, 120]
    assert [size["keys"] for size in sections["claim"]["fair"]] == [2, 2]
    assert [size["queued"] for size in sections["claim"]["fair_priority"]] == [60, 120]
    claim = sections["claim"]
    for size in claim["sizes"] + claim["priority"] + claim["fair"] + claim["fair_priority"]:
        assert size["n1"]["claims"] == 20
        assert size["n100"]["claims"] == 20
    dag = sections["dag"]
    assert dag["chain"]["tasks"] == 30
    assert dag["fan"]["tasks"] == 32
    for mode in ("complete", "fail"):
        # 1,500 dependents at 1,000 edges per call: the task's own call, then propagation.
        assert dag[mode]["calls"] >= 2
        assert dag[mode]["max_ms"] > 0
    assert sections["memory"]["tasks"] == 200
    wake = sections["wake"]
    assert [run["processes"] for run in wake["runs"]] == [1, 3]
    for run in wake["runs"]:
        assert run["tasks"] == 30 and run["exactly_once_problems"] == []
        assert run["script_calls_per_task"] > 0
        assert run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    dashboard = sections["dashboard"]
    assert dashboard["tasks"] == 300
    few, many = dashboard["commands"]["100"], dashboard["commands"]["300"]
    if report["redis"]["backend"] == "redis-server":
        assert few == many and all(n > 0 for n in few.values())
    assert [run["polled"] for run in dashboard["drain"]] == [False, True]
    for run in dashboard["drain"]:
        assert run["tasks"] == 200 and run["exactly_once_problems"] == []
    assert dashboard["drain"][1]["polls"] > 0 and dashboard["drain"][1]["poll_errors"] == 0
    fairness = sections["fairness"]
    assert [run["fair"] for run in fairness["starvation"]] == [True, False]
    for run in fairness["starvation"]:
        assert run["light"] == 30 and run["unstarted"] == 0
        assert run["exactly_once_problems"] == []
        assert 0 <= run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    shares = fairness["shares"]
    assert shares["claims"] == 320
    assert [key["weight"] for key in shares["keys"]] == [1, 1, 2, 4, 8]
    assert sum(key["claims"] for key in shares["keys"]) == 320
    assert {row["section"] for row in report["rows"]} == set(SECTIONS)
    profile = sections["profile"]
    if throwaway and report["redis"]["backend"] == "redis-server":
        check_profile(report, tasks=50)
    else:
        assert "SLOWLOG" in profile["skipped"]


def check_profile(report: dict[str, Any], tasks: int) -> None:
    """The profile section's figures: per script, split into inner commands and Lua."""
    profile = report["sections"]["profile"]
    assert profile["tasks"] == tasks and profile["slowlog_full"] == []
    schedule, drain = profile["schedule"], profile["drain"]
    # A plain task takes the short script, one call each.
    assert schedule["scripts"]["enqueue"]["calls"] == tasks
    assert {"claim", "complete"} <= set(drain["scripts"])
    assert drain["exactly_once_problems"] == []
    for phase in (schedule, drain):
        total = sum(script["us"] for script in phase["scripts"].values())
        assert total == phase["script_us"] > 0
        assert 0 < phase["inner_us"] < phase["script_us"]
        assert phase["lua_us"] == phase["script_us"] - phase["inner_us"]
    assert drain["scripts"]["claim"]["calls_per_task"] > 0
    names = [row["name"] for row in report["rows"] if row["section"] == "profile"]
    assert "schedule: Redis time per call (enqueue)" in names
    assert "  of which the script's own Lua" in names
    assert any(name.startswith("drain: claim (") for name in names), names
    assert any(name.startswith("drain: complete (") for name in names), names
    assert "  Lua of the scripts, per drained task" in names


def test_bench_runs_every_section_on_a_given_redis_and_removes_its_namespaces(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server.client()
    try:
        client.set("someone-else:key", "kept")
        slowlog_before = client.config_get("slowlog-*")
        out = tmp_path / "bench.json"
        result = bench("--redis", redis_server.url, *TINY, "--json", str(out))
        assert result.exit_code == 0, result.stderr
        report = json.loads(out.read_text("utf-8"))
        check_report(report, throwaway=False)
        # The table on stdout, one progress line per section on stderr.
        assert "end to end, 2 worker processes, def" in result.stdout
        assert "end to end, 1 worker process, async def" in result.stdout
        assert "machine: " in result.stdout and "redis-py " in result.stdout
        assert "bytes" in result.stdout
        for i in range(1, len(SECTIONS) + 1):
            assert f"[{i}/{len(SECTIONS)}]" in result.stderr
        # A user's Redis: only the bench's own namespaces were removed, nothing flushed,
        # no setting changed.
        assert not list(client.scan_iter(match=f"ds:{{{report['namespace_prefix']}*"))
        assert client.get("someone-else:key") == b"kept"
        assert client.config_get("slowlog-*") == slowlog_before
        assert report["sections"]["profile"]["skipped"]
        assert "profile    skipped: " in result.stdout
    finally:
        client.delete("someone-else:key")
        client.close()


def test_bench_without_a_url_runs_on_a_throwaway_server(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = bench(*TINY, "--json", str(out))
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text("utf-8"))
    check_report(report, throwaway=True)
    assert report["redis"]["backend"] in ("redis-server", "fakeredis")
    assert "running on a throwaway" in result.stderr


def test_bench_quick_runs_every_section_and_reports_each_ones_rows(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    result = bench("--redis", redis_server.url, "--quick", "--json", str(out))
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text("utf-8"))
    assert report["problems"] == []
    assert report["config"]["tasks"] == BenchConfig.quick().tasks
    assert {row["section"] for row in report["rows"]} == set(SECTIONS)
    assert set(report["sections"]) == set(SECTIONS)
    names = [row["name"] for row in report["rows"]]
    for expected in (
        "  Redis CPU per schedule call",
        "  schedule against the raw LPUSH",
        "end to end, 1 worker process, def",
        "end to end, 1 worker process, async def",
        "end to end, 2 worker processes, def",
        "  Redis CPU per drained task (1 worker process, def)",
        "delayed task start - run_at, p99",
        "Redis memory per queued task, one small argument",
    ):
        assert expected in names, names
    # Every row is in the table on stdout, with the machine and library versions above it.
    for name in names:
        assert name.strip() in result.stdout
    assert "machine: " in result.stdout and "msgpack " in result.stdout
    for i in range(1, len(SECTIONS) + 1):
        assert f"[{i}/{len(SECTIONS)}]" in result.stderr


def test_bench_quick_on_its_own_server_profiles_redis_time_per_script(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("the profile section needs a throwaway redis-server")
    out = tmp_path / "bench.json"
    result = bench("--quick", "--json", str(out))
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text("utf-8"))
    assert report["problems"] == []
    check_profile(report, tasks=BenchConfig.quick().profile_tasks)
    restored = report["sections"]["profile"]["settings_restored"]
    assert set(restored) == {"slowlog-log-slower-than", "slowlog-max-len"}
    assert "schedule: Redis time per call" in result.stdout


def test_bench_quick_keeps_a_size_given_with_it(redis_server: RedisServer) -> None:
    # A size given with --quick is used, not the quick one: a bad one is refused as such.
    result = bench("--redis", redis_server.url, "--quick", "--tasks", "0")
    assert result.exit_code == 1
    assert "tasks" in result.stderr


def test_bench_refuses_a_fan_in_wider_than_the_dependency_limit() -> None:
    result = bench("--fanout", "10001")
    assert result.exit_code == 1
    assert "fanout" in result.stderr


# --------------------------------------------------------------------------- exactly once


def test_exactly_once_check_passes_when_every_task_ran_once() -> None:
    runs = [Run("b", 1, 1), Run("a", 1, 1), Run("c", 3, 1)]
    assert check_exactly_once(["a", "b", "c"], runs) == []


def test_exactly_once_check_reports_a_duplicate_run_and_a_missing_one() -> None:
    runs = [Run("a", 1, 1), Run("b", 1, 1), Run("b", 1, 1)]
    problems = check_exactly_once(["a", "b", "c"], runs)
    assert len(problems) == 2, problems
    duplicate = [p for p in problems if "'b'" in p]
    missing = [p for p in problems if "'c'" in p]
    assert len(duplicate) == 1 and "2 times" in duplicate[0]
    assert len(missing) == 1 and "never ran" in missing[0]


def test_exactly_once_check_reports_a_stray_run_and_a_run_on_a_later_attempt() -> None:
    runs = [Run("a", 1, 2), Run("zz", 1, 1)]
    problems = check_exactly_once(["a"], runs)
    assert len(problems) == 2, problems
    assert any("'a'" in p and "attempt 2" in p for p in problems)
    assert any("'zz'" in p and "not part of the run" in p for p in problems)


# --------------------------------------------------------------------------- SLOWLOG profile


def _entry(
    id: int, usec: int, command: bytes, address: bytes = b"127.0.0.1:5000", name: bytes = b""
) -> dict[str, Any]:
    return {
        "id": id,
        "start_time": 0,
        "duration": usec,
        "command": command,
        "client_address": address,
        "client_name": name,
    }


def test_slowlog_profile_counts_script_calls_by_script_and_their_commands_apart() -> None:
    claim = scripts.function_name("claim").encode()
    sha = "ab" * 20
    inner = b"?:0"
    entries = [
        # A claim and the two commands it ran (logged before it: each when it ended).
        _entry(1, 3, b"ZRANGE ds:{n}:queue 0 9", inner),
        _entry(2, 2, b"HSET ds:{n}:t:a state running", inner),
        _entry(3, 20, b"FCALL " + claim + b" 7 k1 k2 ... (40 more arguments)"),
        # A script whose name holds "_", from an older library (another hash).
        _entry(4, 1, b"HDEL ds:{n}:x a", inner),
        _entry(5, 6, b"FCALL distsched_0123456789abcdef_confirm_cancel 2 a b"),
        # The EVALSHA path, its argv cut by Redis.
        _entry(6, 4, b"HSET ds:{n}:t:b state done", inner),
        _entry(7, 10, f"EVALSHA {sha} 3 a b c".encode() + b" ... (33 more arguments)"),
        # Plain top-level commands are not script time.
        _entry(8, 5, b"HGETALL ds:{n}:meta"),
        # The bench's own polling, with a script and its command, is left out.
        _entry(9, 7, b"ZCARD ds:{n}:queue", inner),
        _entry(10, 9, b"FCALL " + claim + b" 7 k", name=b"bench-poller"),
        # As SLOWLOG shows a long argument: its first 128 bytes.
        _entry(11, 1, b"EVAL " + calls.SERVER_TIME_LUA.encode()[:128] + b"... 1 ds:{n}:meta"),
    ]
    # SLOWLOG GET lists the newest first.
    got = profile_slowlog(reversed(entries), {sha: "complete"}, skip_clients=["bench-poller"])
    assert got["entries"] == len(entries)
    assert got["scripts"] == {
        "claim": {"calls": 1, "us": 20},
        "confirm_cancel": {"calls": 1, "us": 6},
        "complete": {"calls": 1, "us": 10},
        "server clock (EVAL)": {"calls": 1, "us": 1},
    }
    assert got["script_us"] == 37 and got["script_calls"] == 4
    assert got["inner"] == {
        "ZRANGE": {"calls": 1, "us": 3},
        "HSET": {"calls": 2, "us": 6},
        "HDEL": {"calls": 1, "us": 1},
    }
    assert got["inner_us"] == 10
    assert got["other"] == {"HGETALL": {"calls": 1, "us": 5}}


def test_slowlog_profile_names_scripts_it_does_not_know_as_other() -> None:
    entries = [
        _entry(1, 4, b"FCALL mylib_myfunction 0"),
        _entry(2, 5, b"EVALSHA " + b"cd" * 20 + b" 0"),
    ]
    got = profile_slowlog(entries, {})
    assert got["scripts"] == {
        "other function mylib_myfunction": {"calls": 1, "us": 4},
        "other script cdcdcdcdcdcd": {"calls": 1, "us": 5},
    }
    assert got["inner"] == {} and got["other"] == {}
