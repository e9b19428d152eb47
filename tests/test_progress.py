"""Progress and checkpoints of a running task (lua/progress.lua): fenced by the attempt's
token, kept across the attempts of one version, shown to waiters without polling.

Each guarantee has its test: the fence (a stale attempt writes nothing), the version (a new
version sees neither the old progress nor the old checkpoint), the removal with the task
(purge and forget), and the resume in real processes (a worker killed mid-run, the next
attempt in another process does only the steps left)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from distsched import (
    InvalidArgument,
    LeaseLost,
    Outcome,
    Progress,
    Scheduler,
    State,
    Worker,
    current_task,
    limits,
)
from distsched.scripts import source
from distsched.wire.calls import progress_call
from tests.cluster_fixtures import wait_until
from tests.conftest import RedisServer, python_command, require_extra, subprocess_env
from tests.worker_procs import steps_key


def _claim_one(s: Scheduler, task_id: str = "job") -> Any:
    s.schedule(task_id, fn="f")
    (claim,) = s.ready(1, "w1")
    return claim


def test_a_running_attempt_reports_progress_that_status_shows(api: Scheduler) -> None:
    claim = _claim_one(api)
    assert api.progress("job") is None
    assert api.report_progress(claim, 0.25, "step 1 of 4") is Outcome.APPLIED
    info = api.status("job")
    assert info.progress is not None
    assert (info.progress.fraction, info.progress.note) == (0.25, "step 1 of 4")
    assert (info.progress.version, info.progress.attempt) == (claim.version, 1)
    assert abs(info.progress.updated_at - api.server_time()) < 5
    assert not info.checkpoint_kept
    assert api.progress("job") == info.progress


def test_a_checkpoint_is_kept_for_the_next_attempt_of_the_same_version(api: Scheduler) -> None:
    api.schedule("job", fn="f", max_attempts=3, backoff=0)
    (first,) = api.ready(1, "w1")
    assert api.checkpoint(first) is None
    assert api.save_checkpoint(first, {"done": [1, 2]}) is Outcome.APPLIED
    assert api.report_progress(first, 0.5, "half") is Outcome.APPLIED
    assert api.status("job").checkpoint_kept
    api.fail(first, "crashed")
    (second,) = api.ready(1, "w1")
    assert second.attempt == 2
    assert api.checkpoint(second) == {"done": [1, 2]}
    # The progress of the version stays shown, with the attempt that reported it.
    progress = api.progress("job")
    assert progress is not None and (progress.fraction, progress.attempt) == (0.5, 1)
    # A checkpoint alone keeps the version's fraction and note.
    assert api.save_checkpoint(second, {"done": [1, 2, 3]}) is Outcome.APPLIED
    progress = api.progress("job")
    assert progress is not None
    assert (progress.fraction, progress.note, progress.attempt) == (0.5, "half", 2)
    assert progress.checkpoint_bytes == len(b"\x81\xa4done\x93\x01\x02\x03")
    # None clears it.
    assert api.save_checkpoint(second, None) is Outcome.APPLIED
    assert api.checkpoint(second) is None
    assert not api.status("job").checkpoint_kept


def test_a_stale_attempt_writes_neither_progress_nor_checkpoint(
    api: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("job", fn="f", max_attempts=3, backoff=0)
    (first,) = api.ready(1, "w1")
    api.save_checkpoint(first, "from attempt 1")
    api.report_progress(first, 0.1, "one")
    api.expire_lease("job")  # the lease lapsed: attempt 1 no longer runs
    before = (
        redis_client.hget(api.keys.progress, "job"),
        redis_client.hget(api.keys.checkpoints, "job"),
    )
    assert api.report_progress(first, 0.9, "late") is Outcome.STALE
    assert api.save_checkpoint(first, "late") is Outcome.STALE
    (second,) = api.ready(1, "w1")
    assert second.attempt == 2
    assert api.report_progress(first, 0.9, "late") is Outcome.STALE
    assert api.save_checkpoint(first, "late") is Outcome.STALE
    after = (
        redis_client.hget(api.keys.progress, "job"),
        redis_client.hget(api.keys.checkpoints, "job"),
    )
    assert after == before
    assert api.checkpoint(second) == "from attempt 1"
    api.complete(second)
    assert api.report_progress(second, 1.0, "after the end") is Outcome.STALE
    assert api.report_progress(first, 1.0) is Outcome.STALE


def test_a_new_version_starts_without_the_old_progress_and_checkpoint(api: Scheduler) -> None:
    claim = _claim_one(api)
    api.report_progress(claim, 0.7, "most")
    api.save_checkpoint(claim, [1, 2, 3])
    api.complete(claim)
    api.schedule("job", fn="f")  # a new version of a finished task
    assert api.progress("job") is None
    assert api.status("job").progress is None
    (again,) = api.ready(1, "w1")
    assert again.version != claim.version
    assert api.checkpoint(again) is None
    # Its own reports replace what the old version left.
    api.report_progress(again, 0.1)
    progress = api.progress("job")
    assert progress is not None
    assert (progress.version, progress.fraction, progress.checkpoint_bytes) == (
        again.version,
        0.1,
        None,
    )


def test_forgetting_a_task_removes_its_progress_and_checkpoint(
    api: Scheduler, redis_client: redis.Redis
) -> None:
    claim = _claim_one(api)
    api.report_progress(claim, 1.0, "done")
    api.save_checkpoint(claim, "state")
    api.complete(claim)
    assert redis_client.hexists(api.keys.progress, "job")
    assert api.purge_tasks(["job"]) == 1
    assert not redis_client.hexists(api.keys.progress, "job")
    assert not redis_client.hexists(api.keys.checkpoints, "job")


def test_purging_past_the_retention_removes_progress_and_checkpoint(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    claim = _claim_one(scheduler)
    scheduler.report_progress(claim, 1.0, "done")
    scheduler.save_checkpoint(claim, "state")
    scheduler.complete(claim)
    scheduler.set_retention(0)  # stores it and purges
    scheduler.purge()
    assert not redis_client.hexists(scheduler.keys.tasks, "job")
    assert not redis_client.hexists(scheduler.keys.progress, "job")
    assert not redis_client.hexists(scheduler.keys.checkpoints, "job")


@pytest.mark.parametrize(
    ("fraction", "note", "field"),
    [
        (1.5, "", "fraction"),
        (-0.1, "", "fraction"),
        (float("nan"), "", "fraction"),
        (True, "", "fraction"),
        ("0.5", "", "fraction"),
        (0.5, "x" * (limits.MAX_PROGRESS_NOTE_BYTES + 1), "note"),
        (0.5, "é" * 101, "note"),
        (0.5, b"bytes", "note"),
    ],
)
def test_a_bad_progress_report_is_refused_naming_its_field(
    api: Scheduler, redis_client: redis.Redis, fraction: Any, note: Any, field: str
) -> None:
    claim = _claim_one(api)
    with pytest.raises(InvalidArgument) as caught:
        api.report_progress(claim, fraction, note)
    assert caught.value.field == field
    assert not redis_client.hexists(api.keys.progress, "job")


def test_a_checkpoint_too_large_is_refused_naming_the_field(
    api: Scheduler, redis_client: redis.Redis
) -> None:
    claim = _claim_one(api)
    with pytest.raises(InvalidArgument) as caught:
        api.save_checkpoint(claim, b"x" * limits.MAX_CHECKPOINT_BYTES)
    assert caught.value.field == "checkpoint"
    with pytest.raises(InvalidArgument) as caught:
        api.save_checkpoint(claim, object())
    assert caught.value.field == "checkpoint"
    assert not redis_client.hexists(api.keys.checkpoints, "job")
    # The largest that fits is kept.
    fits = b"x" * (limits.MAX_CHECKPOINT_BYTES - 5)
    assert api.save_checkpoint(claim, fits) is Outcome.APPLIED
    assert api.checkpoint(claim) == fits


def _send(s: Scheduler, args: list[Any]) -> Any:
    """The progress script called by hand, as a producer in another language would."""
    client = s.client
    return client.register_script(source("progress"))(keys=s.keys.for_script("progress"), args=args)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (["1.5", "", "0"], "fraction"),
        (["-0", "", "0"], None),
        (["nan", "", "0"], "fraction"),
        (["0x1", "", "0"], "fraction"),
        (["0.5", "x" * 201, "0"], "note"),
        (["0.5", "\xff", "0"], "note"),
        (["", "a note alone", "0"], "note"),
        (["", "", "0"], "ARGV"),
        (["", "", "2"], "checkpoint"),
        (["", "", "1"], "ARGV"),
        (["", "", "1", "x" * (limits.MAX_CHECKPOINT_BYTES + 1)], "checkpoint"),
    ],
)
def test_the_script_refuses_bad_values_naming_the_field_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, values: list[Any], field: str | None
) -> None:
    claim = _claim_one(scheduler)
    token = [claim.task_id, claim.version, claim.attempt]
    if values[1] == "\xff":
        values = [values[0], b"\xff", values[2]]
    if field is None:
        assert _send(scheduler, token + values) == [0, b"applied"]
        return
    with pytest.raises(redis.ResponseError) as caught:
        _send(scheduler, token + values)
    assert str(caught.value).startswith(f"BADARG {field}")
    assert not redis_client.hexists(scheduler.keys.progress, "job")
    assert not redis_client.hexists(scheduler.keys.checkpoints, "job")


def test_a_report_of_another_task_or_an_unknown_one_is_stale(scheduler: Scheduler) -> None:
    claim = _claim_one(scheduler)
    call = progress_call(scheduler.keys, claim, 0.5)
    assert _send(scheduler, ["other", *call.args[1:]]) == [0, b"stale"]
    assert _send(scheduler, [claim.task_id, claim.version + 1, *call.args[2:]]) == [0, b"stale"]
    assert _send(scheduler, [claim.task_id, claim.version, 2, *call.args[3:]]) == [0, b"stale"]
    assert scheduler.progress("job") is None


def test_waiters_see_each_progress_report_live(api: Scheduler) -> None:
    claim = _claim_one(api)
    seen: list[Progress] = []
    reported = threading.Event()

    def on_progress(p: Progress) -> None:
        seen.append(p)
        reported.set()

    def run() -> None:
        for i in (1, 2, 3):
            reported.wait(5)
            reported.clear()
            api.report_progress(claim, i / 4, f"step {i}")
        reported.wait(5)
        api.complete(claim, "ok")

    reported.set()  # the first report needs no earlier one
    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert api.result("job", timeout=10, on_progress=on_progress) == "ok"
    finally:
        runner.join(10)
    assert [(p.fraction, p.note) for p in seen] == [
        (0.25, "step 1"),
        (0.5, "step 2"),
        (0.75, "step 3"),
    ]


def test_a_function_reports_progress_and_resumes_from_its_checkpoint(
    scheduler: Scheduler,
) -> None:
    ran: list[int] = []

    def steps(n: int) -> int:
        ctx = current_task()
        done = ctx.checkpoint or 0
        for i in range(done, n):
            ran.append(i)
            ctx.save_checkpoint(i + 1)
            ctx.report_progress((i + 1) / n, f"step {i + 1} of {n}")
            if ctx.attempt == 1 and i == 1:
                raise RuntimeError("crash after step 2")
        return len(ran)

    scheduler.schedule("job", fn="steps", args=(5,), max_attempts=2, backoff=0)
    worker = Worker(scheduler, {"steps": steps}, concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        info = scheduler.wait("job", timeout=20)
    finally:
        worker.stop()
        thread.join(20)
    assert info.state is State.SUCCEEDED
    assert ran == [0, 1, 2, 3, 4]
    assert info.progress is not None
    assert (info.progress.fraction, info.progress.note, info.progress.attempt) == (
        1.0,
        "step 5 of 5",
        2,
    )


def test_a_stale_report_raises_lease_lost_in_the_function(
    scheduler: Scheduler,
) -> None:
    outcome: list[str] = []
    lapsed = threading.Event()
    go = threading.Event()

    async def slow() -> None:
        ctx = current_task()
        await ctx.report_progress_async(0.1, "first")
        lapsed.set()
        go.wait(10)
        try:
            await ctx.report_progress_async(0.2, "after the lease")
        except LeaseLost:
            outcome.append("lease lost")
            assert ctx.lease_lost
            raise

    scheduler.schedule("job", fn="slow", max_attempts=1)
    worker = Worker(scheduler, {"slow": slow}, concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert lapsed.wait(10)
        scheduler.expire_lease("job")
        go.set()
        info = scheduler.wait("job", timeout=20)
    finally:
        worker.stop()
        thread.join(20)
    assert outcome == ["lease lost"]
    assert info.state is State.FAILED
    assert info.progress is not None and info.progress.note == "first"


def test_the_context_outside_a_worker_cannot_report(redis_server: RedisServer) -> None:
    from distsched.context import TaskContext
    from distsched.model import Claim

    ctx = TaskContext(Claim("job", 1, 1, fn="f", args=(), kwargs={}, priority=0, run_at=0.0))
    with pytest.raises(RuntimeError):
        ctx.report_progress(0.5)


def test_status_why_and_the_dashboard_show_a_tasks_progress(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    from tests.test_cli import invoke

    claim = _claim_one(scheduler)
    scheduler.report_progress(claim, 0.4, "2 of 5 <b>files</b>")
    scheduler.save_checkpoint(claim, [1, 2])
    status = invoke(redis_server, namespace, "status", "job").stdout
    (line,) = [line for line in status.splitlines() if line.startswith("progress:")]
    assert "40% 2 of 5 <b>files</b> (attempt 1," in line
    assert line.endswith("; checkpoint 3 B kept")
    data = json.loads(invoke(redis_server, namespace, "status", "job", "--json").stdout)
    assert data["progress"]["fraction"] == 0.4 and data["progress"]["checkpoint_bytes"] == 3
    why = invoke(redis_server, namespace, "why", "job").stdout
    assert "Progress: 40% 2 of 5 <b>files</b> (attempt 1," in why
    assert scheduler.explain("job").progress == scheduler.progress("job")

    require_extra("starlette")
    require_extra("jinja2")
    from markupsafe import escape
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    with TestClient(create_app(scheduler)) as client:
        page = client.get("/task?id=job").text
        assert 'data-field="progress"' in page and escape("2 of 5 <b>files</b>") in page
        # The task page's live refresh carries it.
        fields = client.get("/api/task", params={"id": "job"}).json()["fields"]
        assert fields["progress"].startswith("40% 2 of 5 <b>files</b> (attempt 1,")


PROCS = Path(__file__).with_name("worker_procs.py")


def test_a_killed_attempt_resumes_from_its_checkpoint_in_another_worker_process(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    procs = [
        subprocess.Popen(
            python_command(
                str(PROCS),
                "worker",
                redis_server.url,
                namespace,
                "--lease",
                "1.5",
                "--concurrency",
                "1",
            ),
            env=subprocess_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    client = scheduler.client
    try:
        wait_until(lambda: len(scheduler.workers()) == 2, 60, "both worker processes to register")
        scheduler.schedule("job", fn="steps", args=(5, 2), max_attempts=3, backoff=0)
        wait_until(lambda: client.llen(steps_key(namespace)) == 2, 30, "two steps done")
        info = scheduler.status("job")
        assert info.checkpoint_kept and info.progress is not None
        assert (info.progress.fraction, info.progress.note) == (0.4, "step 2 of 5")
        assert info.worker is not None
        pid = int(info.worker.split(":")[1])
        (running,) = [p for p in procs if p.pid == pid]
        running.send_signal(signal.SIGKILL)  # mid-run: no report, the lease lapses
        running.communicate(timeout=30)
        final = scheduler.wait("job", timeout=30)
        (survivor,) = [p for p in procs if p.pid != pid]
        survivor.send_signal(signal.SIGTERM)
        survivor.communicate(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert final.state is State.SUCCEEDED and final.attempt == 2
    assert final.result == 3  # the steps left, not all five
    done = [
        raw.decode() if isinstance(raw, bytes) else raw
        for raw in client.lrange(steps_key(namespace), 0, -1)
    ]
    assert done == ["1:0", "1:1", "2:2", "2:3", "2:4"]
    assert final.progress is not None
    assert (final.progress.fraction, final.progress.attempt) == (1.0, 2)
