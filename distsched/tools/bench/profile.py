"""(k) ``profile``: where Redis time goes per script, from SLOWLOG."""

from __future__ import annotations

from typing import Any

import redis

from distsched import scripts
from distsched.client import Scheduler
from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import NOOP
from distsched.tools.bench.slowlog import profile_slowlog, text_of

# The profile section logs every command: SLOWLOG must hold the whole of a phase, about
# this many entries per task (script calls and their inner commands) and a margin.
PROFILE_ENTRIES_PER_TASK = 20
PROFILE_ENTRIES_MARGIN = 10_000
# The name of the profile section's own client, whose polling SLOWLOG entries leave out.
PROFILE_CLIENT = "distsched-bench-profile"
# Inner commands shown one per row, the costliest first.
PROFILE_TOP_COMMANDS = 5


def run(bench: Bench) -> None:
    cfg = bench.config
    n = cfg.profile_tasks
    bench.phase(
        "profile",
        f"profile: Redis time per script (SLOWLOG), {n:,} schedule calls, "
        "then those tasks drained by one worker process",
    )
    why = bench.profile_unavailable()
    if why is not None:
        bench.skip("profile", why)
        return
    namespace = bench.namespace("profile")
    max_len = n * PROFILE_ENTRIES_PER_TASK + PROFILE_ENTRIES_MARGIN
    shas = {script.sha: name for name, script in scripts.Registry(bench.client).scripts.items()}
    ids = [f"p{i}" for i in range(n)]
    saved = _slowlog_settings(bench)
    # The bench's own polling during the drain goes through a client of its own name,
    # so that its commands are not counted as the drain's.
    own = redis.Redis.from_url(bench.url, client_name=PROFILE_CLIENT)
    try:
        bench.client.config_set("slowlog-max-len", max_len)
        bench.client.config_set("slowlog-log-slower-than", 0)
        with Scheduler(own, namespace=namespace) as s:
            bench.client.slowlog_reset()
            for task_id in ids:
                s.schedule(task_id, fn=NOOP)
            enqueue = _slowlog_read(bench, max_len)
            bench.step(f"schedule: {len(enqueue):,} SLOWLOG entries")
            bench.client.slowlog_reset()
            drain = bench.drain("profile", namespace, s, ids, 1)
            drained = _slowlog_read(bench, max_len)
            bench.step(f"drain: {len(drained):,} SLOWLOG entries")
    finally:
        for name, value in saved.items():
            bench.client.config_set(name, value)
        bench.client.slowlog_reset()  # its entries' memory back
        own.close()
    bench.clean(namespace)
    cut = [
        phase for phase, got in (("schedule", enqueue), ("drain", drained)) if len(got) >= max_len
    ]
    if cut:
        # Figures too low, not a wrong run: said, and kept in the JSON.
        bench.step(f"WARNING: SLOWLOG of {max_len:,} entries was full ({', '.join(cut)})")
    sched = profile_slowlog(enqueue, shas)
    dr = profile_slowlog(drained, shas, skip_clients=[PROFILE_CLIENT])
    _profile_rows(bench, n, sched, dr)
    bench.sections["profile"] = {
        "tasks": n,
        "slowlog_max_len": max_len,
        "slowlog_full": cut,
        "settings_restored": saved,
        "schedule": _per(sched, n),
        "drain": {
            **_per(dr, n),
            "tasks_per_s": drain["tasks_per_s"],
            "exactly_once_problems": drain["exactly_once_problems"],
        },
    }


def _slowlog_settings(bench: Bench) -> dict[str, str]:
    got = bench.client.config_get("slowlog-*")
    return {
        name: str(text_of(got[name]))
        for name in ("slowlog-log-slower-than", "slowlog-max-len")
        if name in got
    }


def _slowlog_read(bench: Bench, count: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = bench.client.slowlog_get(count)
    return entries


def _profile_rows(bench: Bench, n: int, sched: dict[str, Any], dr: dict[str, Any]) -> None:
    # The schedule phase runs one script per call (enqueue.lua for its plain tasks; a
    # read of the server clock may add a call): the inner commands are nearly all its own.
    scripts: dict[str, dict[str, Any]] = sched["scripts"]
    name, script = max(scripts.items(), key=lambda kv: int(kv[1]["calls"]), default=("none", {}))
    calls = max(1, int(script.get("calls", 0)))
    schedule_us = script.get("us", 0)
    bench.row("profile", f"schedule: Redis time per call ({name})", schedule_us / calls, "us/call")
    bench.row(
        "profile", "  of which commands run by the script", sched["inner_us"] / calls, "us/call"
    )
    bench.row(
        "profile",
        "  of which the script's own Lua",
        (schedule_us - sched["inner_us"]) / calls,
        "us/call",
    )
    bench.step(
        f"schedule: {schedule_us / calls:.1f} us/call, "
        f"{sched['inner_us'] / calls:.1f} us of it in its commands"
    )
    for name, value in sorted(dr["scripts"].items(), key=lambda kv: -kv[1]["us"]):
        bench.row(
            "profile",
            f"drain: {name} ({value['calls'] / n:.2f} calls/task), Redis time per drained task",
            value["us"] / n,
            "us/task",
        )
    bench.row(
        "profile", "  commands run by scripts, per drained task", dr["inner_us"] / n, "us/task"
    )
    top = sorted(dr["inner"].items(), key=lambda kv: -kv[1]["us"])[:PROFILE_TOP_COMMANDS]
    for name, value in top:
        bench.row(
            "profile",
            f"  {name} per drained task ({value['calls'] / n:.2f} calls/task)",
            value["us"] / n,
            "us/task",
        )
    bench.row(
        "profile",
        "  Lua of the scripts, per drained task",
        (dr["script_us"] - dr["inner_us"]) / n,
        "us/task",
    )
    bench.step(
        f"drain: {dr['script_us'] / n:.1f} us/task in scripts, "
        f"{dr['inner_us'] / n:.1f} us of it in their commands"
    )


def _per(profile: dict[str, Any], n: int) -> dict[str, Any]:
    """A ``profile_slowlog`` result with its figures per task too."""

    def each(items: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
        return {
            key: {**value, "calls_per_task": value["calls"] / n, "us_per_task": value["us"] / n}
            for key, value in sorted(items.items(), key=lambda kv: -kv[1]["us"])
        }

    return {
        "entries": profile["entries"],
        "scripts": each(profile["scripts"]),
        "inner": each(profile["inner"]),
        "other": each(profile["other"]),
        "script_us": profile["script_us"],
        "inner_us": profile["inner_us"],
        "lua_us": profile["script_us"] - profile["inner_us"],
        "script_calls": profile["script_calls"],
        "script_us_per_task": profile["script_us"] / n,
        "inner_us_per_task": profile["inner_us"] / n,
        "lua_us_per_task": (profile["script_us"] - profile["inner_us"]) / n,
    }
