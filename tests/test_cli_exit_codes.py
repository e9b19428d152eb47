"""The command line's one exit-code table, the same refusal of an unknown namespace by
every command that reads one, and ``namespace wipe``. Real Redis."""

from __future__ import annotations

import ast
import re

import pytest

from distsched import Scheduler
from distsched.cli.common import Exit
from tests.conftest import REPO_ROOT, RedisServer
from tests.test_cli import assert_one_line_error, invoke

DOC = REPO_ROOT / "docs" / "pages" / "reference" / "exit-codes.md"
CLI_DIR = REPO_ROOT / "distsched" / "cli"

# Every command that reads a namespace as a whole, with what it needs to run.
READERS = [
    ("stats",),
    ("tasks", "--state", "failed"),
    ("tasks", "--state", "ready"),
    ("retry", "--state", "failed"),
    ("purge", "--state", "failed"),
    ("workers",),
    ("keys", "list"),
    ("keys", "show", "tenant"),
    ("schedules", "list"),
    ("retention",),
    ("max-running",),
    ("order",),
    ("namespace", "wipe", "--yes"),
]


def test_the_documented_exit_code_table_is_the_one_the_commands_use() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", DOC.read_text(), re.M)
    assert [(int(code), name) for code, name in rows] == [(e.value, e.name) for e in Exit]


def test_no_command_exits_with_a_code_of_its_own() -> None:
    """Every exit other than an error's goes through ``leave`` with an ``Exit``."""
    for path in CLI_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "exit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                pytest.fail(f"{path.name}:{node.lineno} exits with a literal code")


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_misspelled_namespace_is_refused_alike_by_every_command_that_reads_one(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str, args: tuple[str, ...]
) -> None:
    scheduler.schedule("job", fn="f")  # the real namespace exists; its misspelling does not
    typo = namespace + "x"
    result = invoke(redis_server, typo, *args)
    assert result.exit_code == Exit.FAILED
    assert_one_line_error(result, f"namespace {typo!r} does not exist")
    assert scheduler.exists()


def test_a_usage_error_exits_2_and_a_wait_that_times_out_exits_3(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    assert invoke(redis_server, namespace, "tasks").exit_code == Exit.USAGE
    assert invoke(redis_server, namespace, "no-such-command").exit_code == Exit.USAGE
    scheduler.schedule("slow", fn="f")
    result = invoke(redis_server, namespace, "status", "slow", "--wait", "--timeout", "0.05")
    assert result.exit_code == Exit.TIMEOUT
    unknown = invoke(redis_server, namespace, "status", "nothing")
    assert unknown.exit_code == Exit.FAILED


def test_wipe_without_yes_deletes_nothing_and_says_how_much_there_is(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    for i in range(3):
        scheduler.schedule(f"t{i}", fn="f")
    result = invoke(redis_server, namespace, "namespace", "wipe")
    assert_one_line_error(result, "3 task(s)", "--yes")
    assert scheduler.stats()["counts"]["ready"] == 3


def test_wipe_with_yes_deletes_every_key_of_the_namespace_and_nothing_else(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    other = Scheduler.from_url(redis_server.url, namespace=namespace + "-other")
    try:
        other.schedule("kept", fn="f")
        scheduler.schedule("a", fn="f", delay=60)
        scheduler.schedule("b", fn="f", deps=["a"])
        scheduler.set_retention(60)
        scheduler.add_schedule("tick", "f", interval=60)
        result = invoke(redis_server, namespace, "namespace", "wipe", "--yes")
        assert result.exit_code == Exit.OK, result.stderr
        assert result.stdout == f"namespace {namespace!r} wiped\n"
        assert not scheduler.exists()
        assert scheduler.client.keys(f"ds:{{{namespace}}}:*") == []
        assert other.status("kept").state.value == "ready"
    finally:
        other.close()


def test_wipe_removes_every_stripe_of_a_striped_namespace(
    redis_server: RedisServer, namespace: str
) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace, stripes=3) as s:
        for i in range(9):
            s.schedule(f"t{i}", fn="f")
        result = invoke(redis_server, namespace, "namespace", "wipe", "--yes")
        assert result.exit_code == Exit.OK, result.stderr
        assert s.client.keys(f"ds:{{{namespace}*") == []
