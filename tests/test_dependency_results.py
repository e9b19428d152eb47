"""Data along dependency edges against a real redis-server: a task reads the results of
its dependencies (by id, or all of them in one bounded call) through its task context,
and operators read the same through the scheduler. The bounds are in
``tests/test_script_bounds.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from markupsafe import escape

from distsched import (
    DependencyResult,
    DependencyUnavailable,
    NotADependencyError,
    Scheduler,
    State,
    TaskFailed,
    Tasks,
    TaskSpec,
    Worker,
    current_task,
)
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.worker.link import WorkerLink
from tests.conftest import RedisServer, require_extra
from tests.test_cli import assert_one_line_error, invoke


def run_by_hand(s: Scheduler, outcomes: dict[str, Any]) -> None:
    """Claim every ready task and report it: an Exception value fails it, anything else
    is its result."""
    claims = s.ready(len(outcomes), "w")
    assert sorted(c.task_id for c in claims) == sorted(outcomes)
    for claim in claims:
        value = outcomes[claim.task_id]
        if isinstance(value, Exception):
            s.fail(claim, value)
        else:
            s.complete(claim, value)


def diamond(s: Scheduler) -> None:
    """a and b required, c optional (one attempt), all three due now; join waits."""
    s.schedule_many(
        [
            TaskSpec("a", "f"),
            TaskSpec("b", "f"),
            TaskSpec("c", "f", max_attempts=1),
            TaskSpec("join", "f", deps=["a", "b"], optional_deps=["c"]),
        ]
    )


def test_a_task_reads_all_its_dependencies_results_in_one_call_in_the_order_given(
    api: Scheduler,
) -> None:
    diamond(api)
    run_by_hand(api, {"a": {"n": 1}, "b": [1, 2], "c": ValueError("c broke")})
    entries = api.dependency_results("join")
    assert list(entries) == ["a", "b", "c"]
    a, b, c = entries.values()
    assert a == DependencyResult("a", False, State.SUCCEEDED, a.version, {"n": 1}, None)
    assert (b.result, b.optional, b.succeeded) == ([1, 2], False, True)
    # The optional dependency that failed is there, marked failed, with its error.
    assert (c.optional, c.state, c.result, c.succeeded) == (True, State.FAILED, None, False)
    assert c.error is not None and c.error.endswith("ValueError: c broke")
    assert list(api.dependency_results("join", ids=["c", "a"])) == ["c", "a"]


def test_a_task_asking_for_a_task_it_does_not_depend_on_is_refused_naming_it(
    api: Scheduler,
) -> None:
    diamond(api)
    api.schedule("stranger", fn="f")
    run_by_hand(api, {"a": 1, "b": 2, "c": 3, "stranger": "secret"})
    with pytest.raises(NotADependencyError) as refused:
        api.dependency_results("join", ids=["a", "stranger"])
    assert (refused.value.task_id, refused.value.dependency) == ("join", "stranger")
    assert "'stranger' is not a dependency of task 'join'" in str(refused.value)
    # Its dependencies do not read the other way round either.
    with pytest.raises(NotADependencyError):
        api.dependency_results("a", ids=["join"])
    assert api.dependency_results("a") == {}
    with pytest.raises(NotFoundError):
        api.dependency_results("nobody")
    with pytest.raises(InvalidArgument, match="ids"):
        api.dependency_results("join", ids=["a", "a"])
    with pytest.raises(InvalidArgument, match="ids"):
        api.dependency_results("join", ids=[])


def test_a_dependency_scheduled_again_shows_its_new_version_without_a_result(
    api: Scheduler,
) -> None:
    diamond(api)
    run_by_hand(api, {"a": "old", "b": 2, "c": 3})
    first = api.dependency_results("join", ids=["a"])["a"]
    new_version = api.schedule("a", fn="f", delay=3600)
    entry = api.dependency_results("join", ids=["a"])["a"]
    assert (entry.state, entry.version, entry.result) == (State.READY, new_version, None)
    assert first.version is not None and new_version > first.version
    api.purge_tasks(["b"])
    gone = api.dependency_results("join", ids=["b"])["b"]
    assert (gone.state, gone.version, gone.result) == (None, None, None)
    assert gone.error == "no such task (purged or forgotten)"


def test_a_running_attempt_reads_only_while_the_task_keeps_its_version(
    scheduler: Scheduler,
) -> None:
    diamond(scheduler)
    run_by_hand(scheduler, {"a": 1, "b": 2, "c": 3})
    [join] = scheduler.ready(1, "w")
    link = WorkerLink(scheduler)
    assert link.dependency_results("join", join.version, ["b"])["b"].result == 2
    with pytest.raises(ConflictError, match="another version"):
        link.dependency_results("join", join.version + 1)


def parent(x: int) -> int:
    return x * 10


def broken() -> None:
    raise RuntimeError("optional parent broke")


def sync_join() -> dict[str, Any]:
    ctx = current_task()
    entries = ctx.dependency_results()
    try:
        ctx.dependency_result("bad")
    except TaskFailed as exc:
        bad = exc.error
    return {
        "sum": sum(e.result for e in entries.values() if e.succeeded),
        "p2": ctx.dependency_result("p2"),
        "states": {dep: str(e.state) for dep, e in entries.items()},
        "bad": bad,
    }


async def async_join() -> dict[str, Any]:
    ctx = current_task()
    entries, p3 = await asyncio.gather(
        ctx.dependency_results_async(), ctx.dependency_result_async("p3")
    )
    try:
        await ctx.dependency_result_async("bad")
    except TaskFailed as exc:
        bad = exc.error
    return {
        "sum": sum(e.result for e in entries.values() if e.succeeded),
        "p2": p3 - 10,
        "states": {dep: str(e.state) for dep, e in entries.items()},
        "bad": bad,
    }


def test_a_join_reads_its_three_parents_results_in_a_worker_run_sync_and_async(
    scheduler: Scheduler,
) -> None:
    deps, optional = ["p1", "p2", "p3"], ["bad"]
    scheduler.schedule_many(
        [
            *(TaskSpec(f"p{i}", "parent", args=(i,)) for i in (1, 2, 3)),
            TaskSpec("bad", "broken", max_attempts=1),
            TaskSpec("join", "sync_join", deps=deps, optional_deps=optional),
            TaskSpec("ajoin", "async_join", deps=deps, optional_deps=optional),
        ]
    )
    functions: dict[str, Any] = {"parent": parent, "broken": broken}
    functions.update(sync_join=sync_join, async_join=async_join)
    Worker(scheduler, functions, concurrency=2).run_until_idle()
    for join in ("join", "ajoin"):
        assert scheduler.result(join, timeout=5) == {
            "sum": 60,
            "p2": 20,
            "states": {"p1": "succeeded", "p2": "succeeded", "p3": "succeeded", "bad": "failed"},
            "bad": "RuntimeError: optional parent broke",
        }


def test_a_context_outside_a_worker_says_it_cannot_read(scheduler: Scheduler) -> None:
    scheduler.schedule("t", fn="f")
    [claim] = scheduler.ready(1, "w")
    from distsched.context import TaskContext

    with pytest.raises(RuntimeError, match="read inside a task run by a distsched Worker"):
        TaskContext(claim).dependency_results()
    with pytest.raises(DependencyUnavailable, match="its current version is ready"):
        from distsched.wire.replies import dependency_value

        dependency_value(DependencyResult("x", False, State.READY, 3))


def test_the_dep_results_command_prints_each_dependency_and_refuses_a_stranger(
    redis_server: RedisServer, scheduler: Scheduler
) -> None:
    diamond(scheduler)
    run_by_hand(scheduler, {"a": {"n": 1}, "b": [1, 2], "c": ValueError("c broke")})
    shown = invoke(redis_server, scheduler.namespace, "dep-results", "join")
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["a", "b", "c [optional]"]
    assert lines[0].startswith("a: succeeded (version ") and lines[0].endswith(' {"n": 1}')
    assert lines[2].startswith("c [optional]: failed") and "ValueError: c broke" in lines[2]
    as_json = invoke(
        redis_server, scheduler.namespace, "dep-results", "join", "--id", "b", "--json"
    )
    [entry] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert entry == {
        "id": "b",
        "optional": False,
        "state": "succeeded",
        "version": entry["version"],
        "result": [1, 2],
        "error": None,
    }
    refused = invoke(redis_server, scheduler.namespace, "dep-results", "join", "--id", "zz")
    assert_one_line_error(refused, "'zz' is not a dependency of task 'join'")


def test_the_task_page_shows_what_its_dependencies_hold_as_text(scheduler: Scheduler) -> None:
    testclient = require_extra("starlette.testclient")
    require_extra("jinja2")
    from distsched.dashboard import create_app

    diamond(scheduler)
    hostile = "<img src=x onerror=alert(1)>"
    run_by_hand(scheduler, {"a": hostile, "b": [1, 2], "c": ValueError("c <b>broke</b>")})
    with testclient.TestClient(create_app(scheduler)) as client:
        page = client.get("/task", params={"id": "join"}).text
        section = page.split('id="dep-results"')[1].split("</table>")[0]
        assert section.count("<tr>") == 3
        assert "<img src=x" not in page and escape(f'"{hostile}"') in section
        assert "succeeded: <code>[1, 2]</code>" in section
        assert "(optional)" in section and escape("ValueError: c <b>broke</b>") in section
        # A task without dependencies has no such section.
        assert 'id="dep-results"' not in client.get("/task", params={"id": "a"}).text


typed = Tasks()


@typed.task()
def word_count(text: str) -> int:
    return len(text.split())


@typed.task()
def longest(first: str, second: str) -> str:
    counts = {dep: word_count.dependency_result(dep) for dep in (first, second)}
    return max(counts, key=lambda dep: counts[dep])


def test_a_typed_task_reads_a_dependencys_result_through_its_handle(scheduler: Scheduler) -> None:
    typed.bind(scheduler)
    try:
        word_count.schedule("short", "one two")
        word_count.schedule("long", "one two three four")
        longest.options(deps=["short", "long"]).schedule("pick", "short", "long")
        Worker(scheduler, typed, concurrency=2).run_until_idle()
        assert longest.result("pick", timeout=5) == "long"
    finally:
        typed.bind(None)
