"""Changing a queued task in place (``amend``) and pausing one task (``pause_task``,
``resume_task``): ``lua/amend.lua``, ``lua/pause.lua``, ``lua/lib/inplace.lua``.

Every behaviour runs in the three places a queued task can live: the queue of the
default order, the ready set of the priority order, and the sections of ``fairq`` of a
fairness key (with the priority order, the key's ranked section).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from distsched import Change, Scheduler, State, TaskSpec
from distsched.errors import InvalidArgument, NotFoundError
from distsched.keys import Keys, stripe_of
from distsched.model import Reason
from distsched.ops.base import once
from distsched.wire import calls
from tests.conftest import RedisServer, python_command, require_extra, subprocess_env
from tests.test_cli import assert_one_line_error, invoke

PROCS = Path(__file__).with_name("worker_procs.py")

# default: the queue; priority: the ready set (ranked); fair: a key's section of fairq,
# in the priority order (so its ranked section) and with default-key tasks beside it.
MODES = ["default", "priority", "fair"]


def set_mode(s: Scheduler, mode: str) -> dict[str, Any]:
    """Put the namespace in ``mode``; the options its tasks are scheduled with."""
    if mode in ("priority", "fair"):
        s.set_order("priority", aging=1.0)
    if mode == "fair":
        return {"key": "tenant"}
    return {}


# One due time in the past for the tasks of an ordering test: the default order is
# (due time, -priority, version), so only tasks due at the same ms are ordered by priority.
DUE = float(int(time.time()) - 60)


def claim_ids(s: Scheduler, n: int = 100) -> list[str]:
    return [c.task_id for c in s.ready(n, "w")]


@pytest.mark.parametrize("mode", MODES)
def test_a_task_amended_to_a_higher_priority_is_claimed_first_and_equal_ones_keep_their_order(
    api: Scheduler, mode: str
) -> None:
    opts = set_mode(api, mode)
    versions = {i: api.schedule(i, fn="f", run_at=DUE, **opts) for i in "abcd"}
    changed = api.amend("c", priority=5)
    assert (changed.change, changed.state, changed.version) == (
        Change.APPLIED,
        State.READY,
        versions["c"],
    )
    assert api.status("c").priority == 5
    # Back to the others' priority: its version puts it back between b and d.
    api.amend("c", priority=5)
    api.amend("c", priority=0)
    api.amend("b", priority=2)
    assert claim_ids(api) == ["b", "a", "c", "d"]
    assert api.stats()["stale_entries"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_due_time_amended_makes_a_task_due_or_not_due(api: Scheduler, mode: str) -> None:
    opts = set_mode(api, mode)
    api.schedule("later", fn="f", delay=3600, **opts)
    api.schedule("now", fn="f", **opts)
    assert api.amend("now", delay=3600).applied
    assert claim_ids(api) == []
    assert api.explain("now").reason is Reason.NOT_DUE
    assert api.amend("later", run_at=time.time() - 10).applied
    assert claim_ids(api) == ["later"]
    assert api.stats()["counts"]["ready"] == 1


def test_an_amend_for_another_version_changes_nothing(api: Scheduler) -> None:
    old = api.schedule("a", fn="f")
    new = api.schedule("a", fn="f")
    changed = api.amend("a", priority=9, version=old)
    assert (changed.change, changed.version) == (Change.CONFLICT, new)
    assert api.status("a").priority == 0
    assert api.amend("a", priority=9, version=new).applied
    assert api.status("a").priority == 9


def test_amend_says_when_the_task_is_not_queued_or_unknown_and_changes_nothing(
    api: Scheduler,
) -> None:
    api.schedule("a", fn="f", max_attempts=3)
    [claim] = api.ready(1, "w")
    # Priority of a running task: refused whole, the budget given with it too.
    changed = api.amend("a", priority=4, max_attempts=5)
    assert (changed.change, changed.state) == (Change.NOT_QUEUED, State.RUNNING)
    assert api.status("a").max_attempts == 3
    api.complete(claim)
    assert api.amend("a", max_attempts=9).change is Change.NOT_QUEUED
    gone = api.amend("nope", priority=1)
    assert (gone.change, gone.state, gone.version) == (Change.NOT_FOUND, None, None)


def test_the_attempt_budget_changes_before_a_retry_never_below_the_attempt_to_come(
    api: Scheduler,
) -> None:
    api.schedule("a", fn="f", max_attempts=3, backoff=0)
    [claim] = api.ready(1, "w")
    # Running attempt 1: a budget of 1 makes it the last.
    assert api.amend("a", max_attempts=1).applied
    assert api.amend("a", max_attempts=4).applied
    api.fail(claim, "boom")
    assert api.status("a").state is State.READY
    # Attempt 2 runs next: a budget below it is refused, naming the field.
    with pytest.raises(InvalidArgument) as refused:
        api.amend("a", max_attempts=1)
    assert refused.value.field == "max_attempts"
    assert api.amend("a", max_attempts=2).applied
    [claim] = api.ready(1, "w")
    assert claim.attempt == 2
    api.fail(claim, "boom again")
    assert api.status("a").state is State.FAILED


@pytest.mark.parametrize("mode", MODES)
def test_a_paused_task_is_never_claimed_and_resume_gives_it_back_its_place(
    api: Scheduler, mode: str
) -> None:
    opts = set_mode(api, mode)
    for i in "abc":
        api.schedule(i, fn="f", run_at=DUE, **opts)
    if mode == "fair":
        api.schedule("plain", fn="f")  # of the default key
    assert api.pause_task("b").applied
    assert api.pause_task("b").change is Change.UNCHANGED
    info = api.status("b")
    assert info.paused and info.state is State.READY and info.paused_at is not None
    assert api.explain("b").reasons[0] is Reason.PAUSED
    assert api.stats()["counts"]["ready"] == 4 if mode == "fair" else 3
    assert api.resume_task("b").applied
    assert api.resume_task("b").change is Change.UNCHANGED
    assert not api.status("b").paused
    assert [i for i in claim_ids(api) if i != "plain"] == ["a", "b", "c"]
    # Paused again, it stays out of every claim until resumed.
    api.schedule("d", fn="f", **opts)
    api.pause_task("d")
    assert claim_ids(api) == []
    assert api.stats()["counts"]["ready"] == 1
    # Amended while paused: only its record changes, resume puts it at its new place.
    assert api.amend("d", priority=3, delay=0).applied
    assert claim_ids(api) == []
    assert api.status("d").priority == 3
    api.resume_task("d")
    assert claim_ids(api) == ["d"]


@pytest.mark.parametrize("mode", MODES)
def test_a_paused_pending_task_stays_pending_when_its_dependencies_release_it(
    api: Scheduler, mode: str
) -> None:
    opts = set_mode(api, mode)
    api.schedule("parent", fn="f", **opts)
    api.schedule("child", fn="f", deps=["parent"], **opts)
    assert api.pause_task("child").applied
    assert api.status("child").remaining == 1
    [claim] = api.ready(1, "w")
    api.complete(claim)
    info = api.status("child")
    assert (info.state, info.paused, info.remaining) == (State.PENDING, True, 0)
    reasons = api.explain("child").reasons
    assert reasons[0] is Reason.PAUSED and Reason.WAITING_ON_DEPS not in reasons
    assert claim_ids(api) == []
    resumed = api.resume_task("child")
    assert (resumed.change, resumed.state) == (Change.APPLIED, State.READY)
    assert claim_ids(api) == ["child"]
    counts = api.stats()["counts"]
    assert (counts["pending"], counts["ready"], counts["running"]) == (0, 0, 1)


def test_a_paused_pending_task_resumed_before_its_dependencies_still_waits_for_them(
    api: Scheduler,
) -> None:
    api.schedule("parent", fn="f", delay=3600)
    api.schedule("child", fn="f", deps=["parent"])
    api.pause_task("child")
    resumed = api.resume_task("child")
    assert (resumed.change, resumed.state) == (Change.APPLIED, State.PENDING)
    assert api.status("child").remaining == 1
    assert api.explain("child").reason is Reason.WAITING_ON_DEPS


def test_cancel_retry_a_new_version_and_purge_work_on_a_paused_task(
    api: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    api.schedule("a", fn="f")
    api.pause_task("a")
    assert api.cancel("a") is State.CANCELLED
    assert not api.status("a").paused
    assert api.resume_task("a").change is Change.NOT_QUEUED
    api.pause_task("a")  # not queued: nothing to pause
    api.retry("a")
    assert not api.status("a").paused
    assert claim_ids(api) == ["a"]
    api.schedule("b", fn="f")
    api.pause_task("b")
    api.schedule("b", fn="f")  # a new version is not paused
    assert not api.status("b").paused
    assert claim_ids(api) == ["b"]
    api.schedule("c", fn="f")
    api.pause_task("c")
    api.cancel("c")
    assert api.purge_tasks(["c"]) == 1
    client = redis_server.client()
    try:
        assert not client.hexists(Keys(namespace).paused, "c")
    finally:
        client.close()
    assert api.pause_task("c").change is Change.NOT_FOUND


def test_the_paused_tasks_are_listed_and_the_pending_listing_marks_them(
    api: Scheduler,
) -> None:
    api.schedule("r1", fn="f")
    api.schedule("r2", fn="f")
    api.schedule("p", fn="f", deps=["r1"])
    api.schedule("gone", fn="f")
    for task_id in ("r2", "p", "gone"):
        api.pause_task(task_id)
    api.schedule("gone", fn="f")  # its pause was for the old version
    listed = api.paused_tasks()
    assert sorted(i.task_id for i in listed) == ["p", "r2"]
    assert all(i.paused and i.paused_at is not None for i in listed)
    pending = api.tasks("pending").items
    assert [(i.task_id, i.paused, i.remaining) for i in pending] == [("p", True, 1)]
    ready = [i.task_id for i in api.tasks("ready").items]
    assert sorted(ready) == ["gone", "r1"]  # a paused ready task has no queue entry
    assert [i.task_id for i in api.paused_tasks(limit=1)] in (["r2"], ["p"])
    with pytest.raises(InvalidArgument) as refused:
        api.paused_tasks(limit=0)
    assert refused.value.field == "limit"


def test_an_expired_deadline_ends_a_paused_task(api: Scheduler) -> None:
    api.schedule("a", fn="f", ttl=0.05)
    api.pause_task("a")
    time.sleep(0.1)
    api.expire()
    info = api.status("a")
    assert (info.state, info.paused) == (State.CANCELLED, False)


def test_pause_and_amend_go_to_the_stripe_of_the_task(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        ids = [f"t{i}" for i in range(12)]
        assert len({stripe_of(i, 3) for i in ids}) == 3
        for i in ids:
            s.schedule(i, fn="f")
        for i in ids[::2]:
            assert s.pause_task(i).applied
        for i in ids[1::2]:
            assert s.amend(i, priority=1).applied
        assert all(s.status(i).paused for i in ids[::2])
        first = [c.task_id for c in s.ready(100, "w")]
        assert sorted(first) == sorted(ids[1::2])
        for i in ids[::2]:
            assert s.resume_task(i).applied
        assert sorted(c.task_id for c in s.ready(100, "w")) == sorted(ids[::2])


def test_bad_arguments_are_refused_before_anything_is_sent_naming_the_field(
    scheduler: Scheduler,
) -> None:
    bad: list[tuple[str, dict[str, Any]]] = [
        ("priority", {"priority": 2**31}),
        ("priority", {"priority": "1"}),
        ("priority", {}),
        ("max_attempts", {"max_attempts": 0}),
        ("version", {"priority": 1, "version": -1}),
        ("delay", {"run_at": 1.0, "delay": 1.0}),
        ("run_at", {"run_at": float("nan")}),
    ]
    for field_name, options in bad:
        with pytest.raises(InvalidArgument) as refused:
            scheduler.amend("a", **options)
        assert refused.value.field == field_name, options
    with pytest.raises(InvalidArgument) as refused:
        scheduler.pause_task("")
    assert refused.value.field == "task_id"
    with pytest.raises(InvalidArgument) as refused:
        scheduler.resume_task("a", version=True)
    assert refused.value.field == "version"


def test_the_scripts_refuse_bad_arguments_naming_the_field_and_write_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    scheduler.schedule("a", fn="f")
    keys = Keys(namespace)
    before = redis_client.hgetall(keys.tasks), redis_client.zrange(keys.queue, 0, -1)
    amend = calls.amend_call(keys, "a", priority=1)
    cases: list[tuple[str, list[Any], str]] = [
        ("amend", ["a", "", str(2**31), "", "", ""], "priority"),
        ("amend", ["a", "", "1e3", "", "", ""], "priority"),
        ("amend", ["a", "x", "1", "", "", ""], "version"),
        ("amend", ["a", "", "", "at", "99999999999999999999", ""], "run_at"),
        ("amend", ["a", "", "", "in", "4503599627370497", ""], "delay"),
        ("amend", ["a", "", "", "soon", "1", ""], "run_at"),
        ("amend", ["a", "", "", "", "", "0"], "max_attempts"),
        ("amend", ["a", "", "", "", "", ""], "amend"),
        ("amend", [b"\xff", "", "1", "", "", ""], "task_id"),
        ("pause", ["stop", "a", ""], "action"),
        ("pause", ["pause", "a", "-1"], "version"),
        ("pause", ["pause", "", ""], "task_id"),
    ]
    for script, args, field_name in cases:
        call = amend if script == "amend" else calls.pause_call(keys, "pause", "a")
        with pytest.raises(InvalidArgument) as refused:
            scheduler._drive(once(calls.Call(script, call.keys, args)))
        assert refused.value.field == field_name, args
    assert (redis_client.hgetall(keys.tasks), redis_client.zrange(keys.queue, 0, -1)) == before


def test_status_of_an_unknown_task_is_still_not_found(scheduler: Scheduler) -> None:
    with pytest.raises(NotFoundError):
        scheduler.status("nope")


# --------------------------------------------------------------------------- command line


def test_the_command_line_amends_pauses_and_resumes_a_task(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    version = scheduler.schedule("a", fn="f", max_attempts=2)
    result = invoke(redis_server, namespace, "amend", "a", "--priority", "5", "--delay", "1h")
    assert (result.exit_code, result.stdout) == (0, f"applied ready {version}\n")
    info = scheduler.status("a")
    assert info.priority == 5 and info.run_at > time.time() + 3000
    result = invoke(redis_server, namespace, "pause", "a")
    assert (result.exit_code, result.stdout) == (0, f"applied ready {version}\n")
    assert scheduler.status("a").paused
    result = invoke(redis_server, namespace, "pause", "a")
    assert (result.exit_code, result.stdout) == (0, f"unchanged ready {version}\n")
    assert "paused" in invoke(redis_server, namespace, "status", "a").stdout
    assert "paused" in invoke(redis_server, namespace, "why", "a").stdout
    result = invoke(redis_server, namespace, "resume", "a", "--version", str(version + 1))
    assert_one_line_error(result, "'a'", f"version {version}", "nothing changed")
    result = invoke(redis_server, namespace, "resume", "a", "--version", str(version))
    assert (result.exit_code, result.stdout) == (0, f"applied ready {version}\n")
    assert_one_line_error(invoke(redis_server, namespace, "pause", "zz"), "no task 'zz'")
    result = invoke(redis_server, namespace, "amend", "a", "--max-attempts", "0")
    assert_one_line_error(result, "--max-attempts")
    invoke(redis_server, namespace, "pause", "a")
    result = invoke(redis_server, namespace, "paused")
    assert result.exit_code == 0 and "\na " in result.stdout and "ready" in result.stdout
    result = invoke(redis_server, namespace, "paused", "--json")
    assert [i["task_id"] for i in json.loads(result.stdout)["items"]] == ["a"]
    scheduler.cancel("a")
    result = invoke(redis_server, namespace, "amend", "a", "--priority", "1")
    assert_one_line_error(result, "'a' is cancelled", "nothing changed")


# --------------------------------------------------------------------------- dashboard


def test_the_dashboard_task_page_shows_a_pause_and_its_buttons_pause_and_resume(
    scheduler: Scheduler,
) -> None:
    require_extra("starlette")
    require_extra("jinja2")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app
    from tests.test_dashboard import TOKEN, login

    version = scheduler.schedule("a", fn="f")
    with TestClient(create_app(scheduler, allow_actions=True, token=TOKEN)) as client:
        csrf = login(client)
        page = client.get("/task?id=a").text
        assert 'id="action-pause"' in page and 'data-field="paused">no<' in page
        reply = client.post(
            "/actions/pause", data={"id": "a", "csrf": csrf, "version": str(version)}
        )
        assert reply.status_code == 200 and "Paused: no worker claims it" in reply.text
        assert 'id="action-resume"' in reply.text and 'data-field="paused">since' in reply.text
        assert scheduler.status("a").paused
        # A page showing another version than the task's: nothing changes.
        stale = {"id": "a", "csrf": csrf, "version": str(version + 1)}
        assert "Not possible in the task" in client.post("/actions/resume", data=stale).text
        assert scheduler.status("a").paused
        reply = client.post(
            "/actions/resume", data={"id": "a", "csrf": csrf, "version": str(version)}
        )
        assert "Resumed: back in its place" in reply.text
        assert not scheduler.status("a").paused
        assert client.post("/actions/pause", data={"id": "zz", "csrf": csrf}).status_code == 404
        # Without a session, no button and no pause.
        client.cookies.clear()
        assert 'id="action-pause"' not in client.get("/task?id=a").text
        assert client.post("/actions/pause", data={"id": "a", "csrf": csrf}).status_code == 403
    assert not scheduler.status("a").paused


# --------------------------------------------------------------------------- processes


def _spawn(url: str, namespace: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        python_command(str(PROCS), "claim", url, namespace),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )


def _claim_race(procs: list[subprocess.Popen[str]], during: Any = None) -> list[str]:
    """``procs`` (started, each waiting for its start line) drain the queue together,
    ``during`` running meanwhile; the ids they claimed, once per claim."""
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    start = time.time() + 0.2
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"go {start}\n")
        proc.stdin.flush()
    if during is not None:
        time.sleep(max(0.0, start - time.time()))
        during()
    claimed = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        claimed += [t[0] for t in json.loads(out.strip().splitlines()[-1])["tokens"]]
    return claimed


def test_a_fleet_of_claiming_processes_never_claims_a_paused_task_and_claims_it_once_resumed(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    # The priority order with a fairness key: half the tasks in the key's sections of
    # fairq, half (the default key) in queue and ranked.
    opts = set_mode(scheduler, "fair")
    ids = [f"t{i:04d}" for i in range(600)]
    specs = [TaskSpec(i, "f", **(opts if n % 2 else {})) for n, i in enumerate(ids)]
    scheduler.schedule_many(specs)
    paused_first = ids[::20] + ids[1::20]
    for i in paused_first:
        assert scheduler.pause_task(i).applied
    # Paused while the fleet claims: each one either ran first or never runs.
    racing = ids[5::20] + ids[6::20]
    answers: dict[str, Change] = {}

    def pause_racing() -> None:
        for i in racing:
            answers[i] = scheduler.pause_task(i).change

    # Both rounds' processes start together (a process takes seconds to start here).
    procs = [_spawn(redis_server.url, namespace) for _ in range(5)]
    try:
        claimed = _claim_race(procs[:3], pause_racing)
        per_id = Counter(claimed)
        assert set(per_id.values()) == {1}
        assert not set(paused_first) & set(per_id)
        paused_won = {i for i, change in answers.items() if change is Change.APPLIED}
        assert not paused_won & set(per_id)
        held = set(paused_first) | paused_won
        assert set(per_id) == set(ids) - held
        assert scheduler.stats()["counts"]["ready"] == len(held)
        for i in held:
            assert scheduler.resume_task(i).applied
        again = _claim_race(procs[3:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert sorted(again) == sorted(held)
    assert scheduler.stats()["counts"]["succeeded"] == len(ids)
