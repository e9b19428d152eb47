"""(l) The ``worst`` section of ``distsched bench``: the longest single call of each script.

Redis runs one script at a time, so one long call stalls every client of the server.
The scripts bound their own work with the caps of :mod:`distsched.limits`; this section
builds, for every script, the worst input those caps accept (the most tasks, edges,
dependents, reports, bytes or entries one call may be given, and the graph shapes that
make a call walk the most), runs each such call a few times, and reads how long Redis
spent in it from SLOWLOG. The goal is no call over :data:`TARGET_MS`.

It changes SLOWLOG settings (restored after), so it runs on the bench's own server
only. Calls a server refuses (an input over a cap, a cycle) are measured too and
reported with the error; a section run never stops on one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distsched import scripts
from distsched.errors import DistschedError
from distsched.tools.bench.harness import Bench, log
from distsched.tools.bench.slowlog import is_script_client, script_of, text_of
from distsched.tools.bench.worst_cases import (
    CASES,
    SLOWER_THAN_US,
    SLOWLOG_MAX_LEN,
    Measured,
    Probe,
    describe,
)

# The goal for any single script call, whatever its input.
TARGET_MS = 50.0
SLOWLOG_SETTINGS = ("slowlog-log-slower-than", "slowlog-max-len")
# How long a call may take before the run gives up on it: far longer than any call should
# (redis-py's default, 5 s, would resend a long call on a new connection, found busy).
CALL_TIMEOUT_S = 600.0
# The longest input description (and refusal) a row of the worst section shows.
WORST_SHOWN = 110


def longest_per_script(
    entries: Iterable[dict[str, Any]], shas: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """The longest call of each script in SLOWLOG ``entries``: ``{script: {"ms", "id"}}``.

    A script call is an ``FCALL`` of ``distsched_<hash>_<script>`` or an ``EVALSHA`` of a
    script's SHA1 (``shas``: SHA1 to script name); the commands a script runs (logged
    from its own client, ``?:0``) and any other command are left out, as are calls of
    scripts that are not distsched's."""
    longest: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if is_script_client(entry.get("client_address")):
            continue
        script = script_of(entry.get("command"), shas)
        if script not in scripts.SCRIPT_NAMES:
            continue
        ms = int(entry["duration"]) / 1000.0
        best = longest.get(script)
        if best is None or ms > best["ms"]:
            longest[script] = {"ms": ms, "id": int(entry["id"])}
    return longest


def _longest_ms(item: Measured, shas: dict[str, str]) -> float | None:
    """The longest call of the script ``item`` measured, None when none was logged."""
    best = longest_per_script(item.entries, shas).get(item.script)
    return None if best is None else float(best["ms"])


def _row(
    script: str, best: dict[str, Any] | None, where: dict[int, Measured], measured: list[Measured]
) -> dict[str, Any]:
    """A script's line of the report: its longest call, with the input that made it."""
    if best is not None:
        item = where[best["id"]]
        return {
            "script": script,
            "ms": best["ms"],
            "input": item.input,
            "outcome": item.outcome,
            "case": item.case,
            "met": best["ms"] < TARGET_MS,
        }
    # None logged: every call of it was faster than SLOWER_THAN_US (or none was made).
    tried = [item for item in measured if item.script == script]
    return {
        "script": script,
        "ms": None,
        "input": tried[-1].input if tried else "",
        "outcome": (
            f"under {SLOWER_THAN_US / 1000:g} ms (not logged)" if tried else "not measured"
        ),
        "case": tried[-1].case if tried else "",
        "met": True if tried else None,
    }


@contextmanager
def slowlog_kept(client: redis.Redis) -> Iterator[dict[str, str]]:
    """Restore the server's SLOWLOG settings after the block, and empty its log."""
    got = client.config_get("slowlog-*")
    saved = {name: text_of(got[name]) for name in SLOWLOG_SETTINGS if name in got}
    try:
        client.config_set("slowlog-max-len", SLOWLOG_MAX_LEN)
        client.config_set("slowlog-log-slower-than", -1)
        yield saved
    finally:
        for name, value in saved.items():
            client.config_set(name, value)
        client.slowlog_reset()


def run_worst(
    url: str,
    prefix: str,
    scale: float = 1.0,
    repeats: int = 3,
    step: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Run every case ``repeats`` times on the Redis at ``url`` (each in a fresh namespace
    ``<prefix>-worst-...``, cleared after) and report the longest call of each script with
    its input.

    ``scale`` shrinks every count (1.0: the caps themselves). Changes the server's SLOWLOG
    settings while it runs: only for a server of one's own."""
    client = redis.Redis.from_url(url, socket_timeout=CALL_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
    try:
        return _run(client, prefix, scale, repeats, step)
    finally:
        client.close()


def _run(
    client: redis.Redis,
    prefix: str,
    scale: float,
    repeats: int,
    step: Callable[[str], None],
) -> dict[str, Any]:
    shas = {name: script.sha for name, script in scripts.Registry(client).scripts.items()}
    by_sha = {sha: name for name, sha in shas.items()}
    measured: list[Measured] = []
    problems: list[str] = []
    with slowlog_kept(client) as saved:
        for case, fn in CASES.items():
            for r in range(repeats):
                probe = Probe(client, f"{prefix}-worst-{case}-{r}", scale, case, measured)
                try:
                    fn(probe)
                except (redis.ResponseError, DistschedError) as exc:
                    # Setup refused (a cap this run's input went over): said, not fatal.
                    problems.append(f"{case}: setup refused: {describe(exc)}")
                finally:
                    probe.close()
            step(f"{case}: done")
    entries: list[dict[str, Any]] = []
    where: dict[int, Measured] = {}
    for item in measured:
        for entry in item.entries:
            entries.append(entry)
            where[int(entry["id"])] = item
    longest = longest_per_script(entries, by_sha)
    rows = [_row(name, longest.get(name), where, measured) for name in scripts.SCRIPT_NAMES]
    for row in rows:
        # The longest call whose input the script took, apart from any it refused.
        accepted = [
            ms
            for m in measured
            if m.script == row["script"]
            and m.outcome == "ok"
            and (ms := _longest_ms(m, by_sha)) is not None
        ]
        row["accepted_ms"] = max(accepted, default=None)
    return {
        "scale": scale,
        "repeats": repeats,
        "target_ms": TARGET_MS,
        "slower_than_us": SLOWER_THAN_US,
        "settings_restored": saved,
        "scripts": rows,
        # Every input measured, with the longest script call it made (None: none logged).
        "inputs": [
            {
                "case": m.case,
                "script": m.script,
                "input": m.input,
                "outcome": m.outcome,
                "ms": _longest_ms(m, by_sha),
            }
            for m in measured
        ],
        "refused": [
            {"case": m.case, "input": m.input, "outcome": m.outcome}
            for m in measured
            if m.outcome != "ok"
        ],
        "problems": problems,
    }


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "worst",
        f"worst: the longest call of each script at the caps (scale {cfg.worst_scale:g}, "
        f"{cfg.worst_repeats} runs each)",
    )
    why = bench.profile_unavailable()
    if why is not None:
        bench.skip("worst", why)
        return
    report = run_worst(bench.url, bench.prefix, cfg.worst_scale, cfg.worst_repeats, bench.step)
    bench.sections["worst"] = report
    target = f"< {TARGET_MS:g} ms"
    for row in report["scripts"]:
        shown = row["input"] if row["outcome"] == "ok" else f"{row['input']}: {row['outcome']}"
        shown = shown if len(shown) <= WORST_SHOWN else shown[: WORST_SHOWN - 3] + "..."
        bench.row(
            "worst", f"{row['script']}: {shown}", row["ms"], "ms", target=target, met=row["met"]
        )
    for problem in report["problems"]:
        bench.step(problem)
