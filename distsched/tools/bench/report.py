"""The report for people: the table, and the machine and libraries it was measured with."""

from __future__ import annotations

import logging
import math
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from typing import IO, Any

import redis

from distsched import __version__
from distsched.text import table
from distsched.tools.bench.harness import log


def _value_text(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ms":
        return f"{value:,.2f}"
    if unit.startswith("us/"):
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def format_table(report: dict[str, Any]) -> list[str]:
    """The report's rows as an aligned text table."""
    header = (
        "section", "measure", "value", "unit", "ratio", "server us/call", "Redis CPU us",
        "target", "met",
    )  # fmt: skip
    lines: list[tuple[str, ...]] = [header]
    for row in report["rows"]:
        ratio = f"{row['ratio']:.2f}x {row['ratio_to']}" if row["ratio"] is not None else ""
        server = "" if row["server_us"] is None else f"{row['server_us']:,.1f}"
        cpu = "" if row.get("cpu_us") is None else f"{row['cpu_us']:,.1f}"
        met = "" if row["met"] is None else ("yes" if row["met"] else "no")
        value = _value_text(row["value"], row["unit"])
        lines.append(
            (
                row["section"],
                row["name"],
                value,
                row["unit"],
                ratio,
                server,
                cpu,
                row["target"],
                met,
            )
        )
    return table(lines, right=frozenset({2, 5, 6}))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _library_version(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def environment(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured with: the machine, Python, the client libraries,
    and the Redis server."""
    try:
        server = client.info("server")
    except redis.RedisError:
        server = {}
    from redis.utils import HIREDIS_AVAILABLE

    return {
        "machine": {
            "cores": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "system": f"{platform.system()} {platform.release()}",
        },
        "python": platform.python_version(),
        "libraries": {
            "distsched": __version__,
            "redis": _library_version("redis"),
            "hiredis": _library_version("hiredis"),
            "msgpack": _library_version("msgpack"),
        },
        "hiredis_parser": bool(HIREDIS_AVAILABLE),
        "server": {
            "version": server.get("redis_version"),
            "valkey_version": server.get("valkey_version"),
            "mode": server.get("redis_mode"),
        },
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    """The environment of a report as lines of text."""
    machine, libs = env["machine"], env["libraries"]
    parser = "hiredis parser" if env["hiredis_parser"] else "pure-Python parser"
    server = env["server"]
    name = (
        f"Valkey {server['valkey_version']}"
        if server.get("valkey_version")
        else (f"Redis {server['version']}")
    )
    return [
        f"machine: {machine['cores']} cores, {machine['cpu_model']}, {machine['system']}",
        f"server: {name}; client: Python {env['python']}, redis-py {libs['redis']} "
        f"({parser}{', hiredis ' + libs['hiredis'] if libs['hiredis'] else ''}), "
        f"msgpack {libs['msgpack']}",
    ]


@contextmanager
def progress_lines(stream: IO[str]) -> Iterator[None]:
    """Write the bench's progress (its INFO log) to ``stream`` as plain lines meanwhile."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
