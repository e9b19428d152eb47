"""``distsched bench``, section ``worst``: the longest call of each script at the caps.

The runs are at a tiny scale: they check that every script is measured, that a refused
call is recorded instead of stopping the run, and that the server's SLOWLOG settings
are put back, never how fast anything is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from distsched import scripts
from distsched.tools.bench.config import SECTIONS
from distsched.tools.bench.worst import longest_per_script, run_worst
from tests.conftest import RedisServer
from tests.test_bench import bench

SCALE = 0.005


def _entry(
    entry_id: int, duration_us: int, command: Any, address: bytes = b"127.0.0.1:5000"
) -> dict[str, Any]:
    return {
        "id": entry_id,
        "start_time": 1_700_000_000,
        "duration": duration_us,
        "command": command,
        "client_address": address,
        "client_name": b"",
    }


def test_longest_per_script_keeps_each_scripts_longest_call_by_function_or_sha() -> None:
    schedule = scripts.function_name("schedule").encode()
    sha = "ab" * 20
    entries = [
        _entry(1, 1_500, b"FCALL " + schedule + b" 9 k1 k2 ... (2000 more arguments)"),
        _entry(2, 4_000, b"FCALL " + schedule + b" 9 k1"),
        _entry(3, 2_000, b"FCALL " + schedule + b" 9 k1"),
        # An older library's function (another hash); a name holding "_".
        _entry(4, 700, b"FCALL distsched_0123456789abcdef_confirm_cancel 2 a b"),
        # The EVALSHA path, as a list of arguments.
        _entry(5, 900, [b"EVALSHA", sha.encode(), b"3", b"a"]),
        _entry(6, 300, f"EVALSHA {sha} 3 a b c".encode()),
        # A command a script ran: longer, but part of its script's call.
        _entry(7, 9_000, b"HSET ds:{n}:payloads a xxx", address=b"?:0"),
        # Neither distsched's scripts nor script calls at all.
        _entry(8, 8_000, b"FCALL mylib_myfunction 0"),
        _entry(9, 8_000, b"EVALSHA " + b"cd" * 20 + b" 0"),
        _entry(10, 8_000, b"CONFIG SET slowlog-log-slower-than -1"),
        _entry(11, 8_000, b"EVAL return redis.call('TIME') 0"),
    ]
    # SLOWLOG GET lists the newest first; the order does not matter.
    got = longest_per_script(reversed(entries), {sha: "claim"})
    assert got == {
        "schedule": {"ms": 4.0, "id": 2},
        "confirm_cancel": {"ms": 0.7, "id": 4},
        "claim": {"ms": 0.9, "id": 5},
    }


def test_longest_per_script_of_no_script_call_is_empty() -> None:
    assert longest_per_script([_entry(1, 5, b"PING")], {}) == {}


def test_worst_run_measures_every_script_and_puts_the_slowlog_settings_back(
    own_redis: RedisServer,
) -> None:
    client = own_redis.client()
    try:
        client.config_set("slowlog-log-slower-than", 12_345)
        client.config_set("slowlog-max-len", 77)
        client.set("someone-else:key", "kept")
        steps: list[str] = []
        report = run_worst(own_redis.url, "wt", scale=SCALE, repeats=2, step=steps.append)
        assert client.config_get("slowlog-*") == {
            "slowlog-log-slower-than": "12345",
            "slowlog-max-len": "77",
        }
        assert report["settings_restored"] == {
            "slowlog-log-slower-than": "12345",
            "slowlog-max-len": "77",
        }
        # Every case cleared its namespace; nothing else was touched.
        assert client.keys("ds:{wt-*") == []
        assert client.get("someone-else:key") == b"kept"
    finally:
        client.close()
    assert report["problems"] == []
    assert report["scale"] == SCALE and report["repeats"] == 2
    rows = {row["script"]: row for row in report["scripts"]}
    assert list(rows) == list(scripts.SCRIPT_NAMES)
    for name, row in rows.items():
        # Measured: a longest call with its input, or every call under the threshold.
        assert row["input"], name
        assert row["met"] is not None, name
        if row["ms"] is None:
            assert row["outcome"].startswith("under "), row
        else:
            assert row["ms"] > 0 and row["met"] == (row["ms"] < report["target_ms"])
    # Every input is listed with its longest call; a row's is the longest of its script's.
    for name, row in rows.items():
        if row["ms"] is not None:
            mine = [i["ms"] for i in report["inputs"] if i["script"] == name and i["ms"]]
            assert row["ms"] >= max(mine, default=0), name
    assert {i["script"] for i in report["inputs"]} == set(scripts.SCRIPT_NAMES)
    # The refused cycles are left out of the longest accepted call.
    for name in ("schedule", "add_deps"):
        accepted = [
            i["ms"] for i in report["inputs"] if i["script"] == name and i["outcome"] == "ok"
        ]
        assert rows[name]["accepted_ms"] == max((ms for ms in accepted if ms), default=None)
    # A cycle is refused, and the refusal is recorded (each run's) instead of stopping it.
    cycles = [item for item in report["refused"] if item["case"] == "cycle"]
    assert len(cycles) == 4
    assert all(item["outcome"].startswith("refused: CYCLE ") for item in cycles)
    assert steps[-1] == "schedules: done"


def test_bench_only_worst_on_its_own_server_reports_a_row_per_script(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("the worst section needs a throwaway redis-server")
    out = tmp_path / "bench.json"
    result = bench("--quick", "--only", "worst", "--json", str(out))
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text("utf-8"))
    assert list(report["sections"]) == ["worst"]
    assert report["config"]["worst_scale"] == 0.01 and report["config"]["worst_repeats"] == 1
    rows = [row for row in report["rows"] if row["section"] == "worst"]
    assert [row["name"].split(":")[0] for row in rows] == list(scripts.SCRIPT_NAMES)
    assert all(row["unit"] == "ms" and row["target"] == "< 50 ms" for row in rows)
    # The worst section is the last one.
    assert SECTIONS[-1] == "worst"
    assert f"[{len(SECTIONS)}/{len(SECTIONS)}] worst: " in result.stderr
    for name in scripts.SCRIPT_NAMES:
        assert f"worst    {name}: " in result.stdout


def test_bench_worst_on_a_given_redis_is_skipped_and_changes_no_setting(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server.client()
    try:
        before = client.config_get("slowlog-*")
        out = tmp_path / "bench.json"
        result = bench("--redis", redis_server.url, "--only", "worst", "--json", str(out))
        assert result.exit_code == 0, result.stderr
        assert client.config_get("slowlog-*") == before
    finally:
        client.close()
    report = json.loads(out.read_text("utf-8"))
    assert "bench's own server" in report["sections"]["worst"]["skipped"]
    assert "worst    skipped: " in result.stdout


@pytest.mark.parametrize(
    ("option", "value"),
    [("--only", "worst,nosuch"), ("--worst-scale", "0"), ("--worst-scale", "1.5")],
)
def test_bench_refuses_an_unknown_section_or_a_worst_scale_outside_0_to_1(
    option: str, value: str
) -> None:
    result = bench(option, value)
    assert result.exit_code == 1
    assert option.lstrip("-").replace("-", "_") in result.stderr
