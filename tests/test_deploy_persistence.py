"""The Redis configuration deploy/ ships keeps the queue durable (§9).

§9: Redis persistence is the operator's choice; ``deploy/`` ships configurations with
AOF on. ``deploy/redis.conf`` is read as Redis reads it (the last line of a directive
wins), then given to a real redis-server, which must run with the append-only file on
and fsync at least every second; the compose files start every Redis with that file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import REPO_ROOT, RedisServer, require_extra

REDIS_CONF = REPO_ROOT / "deploy" / "redis.conf"
COMPOSE = sorted((REPO_ROOT / "deploy" / "compose").glob("*.yaml"))
# "no" leaves flushing to the kernel (up to about 30 s of acknowledged writes lost).
DURABLE_FSYNC = {"everysec", "always"}


def directives(path: Path) -> dict[str, str]:
    """Each directive's value as Redis takes it: lowercased name, the last line winning."""
    out: dict[str, str] = {}
    for line in path.read_text("utf-8").splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            out[words[0].lower()] = " ".join(words[1:]).strip('"').lower()
    return out


def test_the_shipped_redis_conf_turns_the_append_only_file_on_with_a_durable_fsync() -> None:
    conf = directives(REDIS_CONF)
    assert conf.get("appendonly") == "yes", "deploy/redis.conf must keep AOF on (§9)"
    # Redis's own default is everysec: a missing line is as good as the written one.
    assert conf.get("appendfsync", "everysec") in DURABLE_FSYNC


def test_a_redis_server_started_with_the_shipped_conf_runs_with_aof_on() -> None:
    server = RedisServer(config=REDIS_CONF)
    try:
        with server.client(decode_responses=True) as client:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync")["appendfsync"] in DURABLE_FSYNC
            assert client.info("persistence")["aof_enabled"] == 1
    finally:
        server.close()


@pytest.mark.parametrize("path", COMPOSE, ids=[p.name for p in COMPOSE])
def test_every_redis_of_a_compose_file_starts_with_the_shipped_conf(path: Path) -> None:
    yaml = require_extra("yaml")
    spec = cast(dict[str, Any], yaml.safe_load(path.read_text("utf-8")))
    redises = {
        name: service
        for name, service in spec["services"].items()
        if str(service.get("image", "")).startswith(("redis:", "valkey/"))
        and "redis-server" in (service.get("command") or [])
    }
    assert redises, f"{path.name} starts no redis-server"
    for name, service in redises.items():
        command = [str(a) for a in service["command"]]
        conf = command[command.index("redis-server") + 1]  # redis-server FILE [options]
        mounts = [str(v) for v in service.get("volumes", [])]
        assert f"../redis.conf:{conf}:ro" in mounts, (name, mounts)
