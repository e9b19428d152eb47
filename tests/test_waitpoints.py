"""Waitpoints: tasks no worker runs, completed or failed by a call from any service,
once per version, timing out into a failure that blocks their dependents."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from distsched import Outcome, Scheduler, State
from distsched.cli.why import _why_lines
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.ops.namespace import Ops
from distsched.scripts import function_name, library
from tests.conftest import python_command, require_extra, subprocess_env
from tests.test_cli import invoke

PROCS = Path(__file__).with_name("waitpoint_procs.py")

TIMED_OUT = "timed out waiting for completion"


@pytest.fixture
def clock(redis_server: Any, namespace: str) -> Iterator[Scheduler]:
    """A sync scheduler of the test's namespace, to move its test clock."""
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    yield s
    s.close()


def why(s: Scheduler, task_id: str) -> str:
    """What ``distsched why`` says of the task."""
    return "\n".join(_why_lines(s.explain(task_id)))


def advance(s: Scheduler, seconds: float) -> None:
    s._drive(s._ops.call(Ops.advance_clock, round(seconds * 1000)))


def test_an_approval_step_releases_its_dependent_with_the_payload_as_its_result(
    api: Scheduler,
) -> None:
    api.schedule("build", fn="f")
    api.create_waitpoint("approve", timeout=300, deps=["build"])
    api.schedule("deploy", fn="f", deps=["approve"])
    with pytest.raises(ConflictError, match="own dependencies"):
        api.complete_waitpoint("approve", {"ok": True})
    claim = api.next("w")
    assert not isinstance(claim, type(None)) and getattr(claim, "task_id", None) == "build"
    assert api.complete(claim) is Outcome.APPLIED  # type: ignore[arg-type]
    info = api.status("approve")
    assert info.state is State.PENDING and info.waitpoint is not None
    assert info.waitpoint.waiting and info.waitpoint.timeout == 300.0
    assert info.waitpoint.times_out_at == pytest.approx(info.updated_at + 300)
    assert info.remaining == 0 and info.deps == ("build",)
    # No worker ever claims the waitpoint.
    assert getattr(api.next("w"), "reason", None) is not None
    assert api.complete_waitpoint("approve", {"ok": True}, by="alice") is Outcome.APPLIED
    assert api.result("approve") == {"ok": True}
    done = api.status("approve")
    assert done.state is State.SUCCEEDED and done.waitpoint is not None
    assert done.waitpoint.by == "alice" and not done.waitpoint.waiting
    claim = api.next("w")
    assert getattr(claim, "task_id", None) == "deploy"


def test_a_second_completion_is_duplicate_and_an_old_versions_is_stale(api: Scheduler) -> None:
    v1 = api.create_waitpoint("w", timeout=60)
    assert api.complete_waitpoint("w", 1, version=v1) is Outcome.APPLIED
    assert api.complete_waitpoint("w", 2) is Outcome.DUPLICATE
    assert api.fail_waitpoint("w", "no") is Outcome.DUPLICATE
    assert api.result("w") == 1
    with pytest.raises(ConflictError):
        api.retry("w")  # succeeded: nothing to retry
    api.create_waitpoint("w", timeout=60)
    api.cancel("w")
    v3 = api.retry("w")
    info = api.status("w")
    assert info.state is State.PENDING and info.version == v3
    assert info.waitpoint is not None and info.waitpoint.waiting
    assert api.complete_waitpoint("w", 9, version=v1) is Outcome.DUPLICATE
    assert api.complete_waitpoint("w", 9, version=v3 - 1) is Outcome.STALE
    assert api.fail_waitpoint("w", "rejected", version=v3, by="bob") is Outcome.APPLIED
    failed = api.status("w")
    assert failed.state is State.FAILED and failed.error == "rejected"
    assert failed.waitpoint is not None and failed.waitpoint.by == "bob"
    assert api.complete_waitpoint("w", 1) is Outcome.DUPLICATE


def test_a_timeout_ends_it_failed_and_blocks_its_dependents_with_the_reason(
    api: Scheduler, clock: Scheduler
) -> None:
    api.create_waitpoint("w", timeout=60)
    api.schedule("after", fn="f", deps=["w"])
    advance(clock, 59)
    assert api.expire() == 0
    assert api.status("w").state is State.PENDING
    advance(clock, 2)
    assert api.expire() == 1
    w = api.status("w")
    assert (w.state, w.error) == (State.FAILED, TIMED_OUT)
    after = api.status("after")
    assert after.state is State.BLOCKED and after.blocked_by is not None
    assert after.blocked_by.root == "w"
    assert "timed out waiting for completion" in why(api, "after")
    # A completion after the timeout changes nothing.
    assert api.complete_waitpoint("w", 1) is Outcome.STALE
    # A retry waits again, its timeout counted from the retry.
    api.retry("w")
    assert api.status("after").state is State.PENDING
    advance(clock, 30)
    assert api.expire() == 0
    assert api.complete_waitpoint("w", "late but in time") is Outcome.APPLIED
    assert api.status("after").state is State.READY


def test_its_timeout_counts_from_when_its_own_dependencies_succeeded(
    api: Scheduler, clock: Scheduler
) -> None:
    api.schedule("build", fn="f")
    api.create_waitpoint("w", timeout=60, deps=["build"])
    advance(clock, 100)
    assert api.expire() == 0  # still waiting for the build: the clock has not started
    claim = api.next("worker")
    api.complete(claim)  # type: ignore[arg-type]
    advance(clock, 59)
    assert api.expire() == 0
    # A completion that comes after the timeout but before the housekeeping times it out.
    advance(clock, 2)
    assert api.complete_waitpoint("w", 1) is Outcome.STALE
    assert api.status("w").error == TIMED_OUT
    assert api.expire() == 0


def test_cancel_and_forget_work_on_a_waitpoint(api: Scheduler, redis_server: Any) -> None:
    api.create_waitpoint("w", timeout=60)
    api.schedule("after", fn="f", deps=["w"])
    assert api.cancel("w") is State.CANCELLED
    assert api.status("after").state is State.BLOCKED
    assert api.complete_waitpoint("w") is Outcome.STALE
    assert api.purge_tasks(["w"]) == 1
    with pytest.raises(NotFoundError):
        api.complete_waitpoint("w")
    # Its timer goes when the housekeeping reaches it.
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.zscore(api.keys.deadlines, "ww") is not None
    finally:
        client.close()


def test_status_and_explain_say_what_a_waitpoint_waits_for(api: Scheduler) -> None:
    api.schedule("build", fn="f", delay=3600)
    api.create_waitpoint("w", timeout=180, deps=["build"])
    assert "waits for its own dependencies" in why(api, "w")
    api.create_waitpoint("solo", timeout=200)
    text = why(api, "solo")
    assert "waiting for an external completion" in text and "times out in 3 min" in text
    with pytest.raises(ConflictError, match="not a waitpoint"):
        api.complete_waitpoint("build")


def test_claims_never_take_a_waitpoint_and_it_holds_no_slot(
    api: Scheduler, clock: Scheduler
) -> None:
    clock.set_max_running(3)
    api.create_waitpoint("w", timeout=60, fn="approve")
    for i in range(3):
        api.schedule(f"t{i}", fn="approve")
    # The pending waitpoint counts against no bound: the three tasks all start.
    claims = api.ready(10, "worker-1")
    assert sorted(c.task_id for c in claims) == ["t0", "t1", "t2"]
    assert not api.ready(10, "worker-2")
    assert api.status("w").state is State.PENDING
    assert api.stats()["running"] == 3


def _race(redis_server: Any, namespace: str, modes: list[str], rounds: int) -> list[list[str]]:
    procs = [
        subprocess.Popen(
            python_command(str(PROCS), mode, redis_server.url, namespace, "w", str(rounds)),
            env=subprocess_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in modes
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def test_processes_racing_to_complete_a_waitpoint_get_exactly_one_applied(
    redis_server: Any, scheduler: Scheduler, namespace: str
) -> None:
    rounds = 30
    for i in range(rounds):
        scheduler.create_waitpoint(f"w-{i}", timeout=600)
        scheduler.schedule(f"after-{i}", fn="f", deps=[f"w-{i}"])
    # One process through the Python client, two as a producer in another language
    # would send waitpoint.lua (EVALSHA, keys and arguments written by hand).
    results = _race(redis_server, namespace, ["python", "wire", "wire"], rounds)
    for i in range(rounds):
        outcomes = Counter(r[i] for r in results)
        assert outcomes == {"applied": 1, "duplicate": 2}, (i, outcomes)
        info = scheduler.status(f"w-{i}")
        assert info.state is State.SUCCEEDED and info.waitpoint is not None
        assert scheduler.result(f"w-{i}") == {"by": info.waitpoint.by}
        assert scheduler.status(f"after-{i}").state is State.READY
    assert scheduler.stats()["counts"]["ready"] == rounds


def test_bad_input_is_refused_naming_the_field(api: Scheduler, redis_server: Any) -> None:
    api.create_waitpoint("w", timeout=60)
    for call, field in (
        (lambda: api.create_waitpoint("x", timeout=0), "waitpoint"),
        (lambda: api.schedule("x", waitpoint=60, ttl=5), "ttl"),
        (lambda: api.complete_waitpoint("w", object()), "payload"),
        (lambda: api.complete_waitpoint("w", version=0), "version"),
        (lambda: api.fail_waitpoint("w", ""), "error"),
        (lambda: api.complete_waitpoint("w", by="x" * 300), "by"),
        (lambda: api.complete_waitpoint("", 1), "task_id"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert caught.value.field == field
    client = redis.Redis.from_url(redis_server.url)
    try:
        keys = api.keys.for_script("waitpoint")
        name = function_name("waitpoint")
        client.function_load(library(), replace=True)
        for args, field in (
            ([250, "finish", "w", "", b"", ""], "action"),
            ([250, "complete", "", "", b"", ""], "task_id"),
            ([250, "complete", "w", "x", b"", ""], "version"),
            ([250, "complete", "w", "", b"\x92\x01", ""], "payload"),
            ([250, "complete", "w", "", b"\xa2\xff\xfe", ""], "payload"),
            ([250, "fail", "w", "", b"", ""], "error"),
            ([250, "fail", "w", "", b"\xff", ""], "error"),
            ([250, "complete", "w", "", b"", "x" * 300], "by"),
            ([250, "complete", "w"], "ARGV"),
            ([0, "complete", "w", "", b"", ""], "budget"),
        ):
            with pytest.raises(redis.ResponseError, match=f"^BADARG {field} "):
                client.fcall(name, len(keys), *keys, *args)
        with pytest.raises(redis.ResponseError, match=r"^BADARG timeout of x "):
            # The spec option is checked by schedule.lua too.
            client.fcall(
                function_name("schedule"),
                len(api.keys.for_script("schedule")),
                *api.keys.for_script("schedule"),
                250,
                1,
                "x",
                "in 0 0 1 0 0 0 0 wait=0",
                msgpack.packb({"fn": "f"}),
            )
    finally:
        client.close()
    info = api.status("w")
    assert info.state is State.PENDING and info.attempts == ()


def test_the_cli_creates_completes_and_fails_waitpoints_and_status_says_what_they_wait_for(
    redis_server: Any, namespace: str
) -> None:
    def cli(*args: str) -> Any:
        return invoke(redis_server, namespace, *args)

    assert cli("waitpoint", "create", "ok", "--timeout", "3m").stdout.strip() == "1"
    assert cli("waitpoint", "create", "no", "--timeout", "3m").exit_code == 0
    status = cli("status", "ok")
    assert "waiting for an external completion, times out in 2 min" in status.stdout
    assert "times out in" in cli("why", "ok").stdout
    done = cli("waitpoint", "complete", "ok", "--payload", '{"approved": true}', "--by", "ann")
    assert done.stdout.strip() == "applied"
    again = cli("waitpoint", "complete", "ok", "--payload", "1")
    assert again.stdout.strip() == "duplicate"
    assert cli("waitpoint", "fail", "no", "--error", "rejected").stdout.strip() == "applied"
    assert "ended succeeded by ann" in cli("status", "ok").stdout
    assert "rejected" in cli("status", "no").stdout
    bad = cli("waitpoint", "complete", "ok", "--payload", "{")
    assert bad.exit_code != 0 and "payload" in bad.stderr
    missing = cli("waitpoint", "complete", "nothing")
    assert missing.exit_code != 0 and "no task 'nothing'" in missing.stderr


def test_the_dashboard_task_page_shows_a_waitpoint(scheduler: Scheduler) -> None:
    require_extra("jinja2")
    testclient = require_extra("starlette.testclient")
    from distsched.dashboard import create_app

    scheduler.create_waitpoint("approve", timeout=600)
    with testclient.TestClient(create_app(scheduler)) as client:
        page = client.get("/task", params={"id": "approve"})
    assert page.status_code == 200
    assert "waiting for an external completion, times out in" in page.text
