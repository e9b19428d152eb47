"""Worker hooks: ``before_task``, ``after_task`` and ``on_failure`` around every run,
where the function runs, never able to break the worker or change an outcome."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from distsched import Scheduler, State, Worker, current_task
from distsched.context import TaskContext
from distsched.errors import Cancelled, InvalidArgument, TaskFailed
from distsched.hooks import RunOutcome, WorkerHooks
from distsched.metrics import WorkerMetrics
from tests import hooks_app
from tests.conftest import CLI_COMMAND, RedisServer, running, subprocess_env


class Recorder(WorkerHooks):
    """Records every call with the thread (and asyncio task) it ran on."""

    def __init__(self, name: str = "rec") -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def _where(self) -> tuple[int, Any]:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        return threading.get_ident(), task

    def before_task(self, ctx: TaskContext) -> None:
        with self.lock:
            self.calls.append(("before", self.name, ctx.task_id, self._where()))

    def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
        with self.lock:
            self.calls.append(("after", self.name, ctx.task_id, outcome, result_or_error))

    def on_failure(self, ctx: TaskContext, exc: BaseException) -> None:
        with self.lock:
            self.calls.append(("failure", self.name, ctx.task_id, exc))

    def of(self, task_id: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[2] == task_id]


where_ran: dict[str, tuple[int, Any]] = {}


def here() -> tuple[int, Any]:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), task


def ok(x: int) -> int:
    where_ran[current_task().task_id] = here()
    return x * 2


async def ok_async(x: int) -> int:
    where_ran[current_task().task_id] = here()
    return x * 3


def boom() -> None:
    raise ValueError("bad input")


def stops() -> None:
    ctx = current_task()
    ctx.wait_cancelled(10)
    raise Cancelled("asked to")


FUNCS: dict[str, Callable[..., Any]] = {
    "ok": ok, "ok_async": ok_async, "boom": boom, "stops": stops, **hooks_app.FUNCS,
}  # fmt: skip


def test_hooks_are_told_before_and_after_a_successful_run_on_the_thread_that_ran_it(
    scheduler: Scheduler,
) -> None:
    rec = Recorder()
    scheduler.schedule("a", fn="ok", args=[21])
    with running(Worker(scheduler, FUNCS, concurrency=2, hooks=[rec])):
        assert scheduler.result("a", timeout=10) == 42
    wait_for(lambda: len(rec.of("a")) == 2)
    before, after = rec.of("a")
    assert before[:3] == ("before", "rec", "a")
    assert before[3] == where_ran["a"]  # the pool thread that ran the function
    assert after == ("after", "rec", "a", RunOutcome.SUCCEEDED, 42)


def test_hooks_of_an_async_function_run_in_its_task_on_the_event_loop(
    scheduler: Scheduler,
) -> None:
    rec = Recorder()
    scheduler.schedule("a", fn="ok_async", args=[2])
    with running(Worker(scheduler, FUNCS, hooks=[rec])):
        assert scheduler.result("a", timeout=10) == 6
    wait_for(lambda: len(rec.of("a")) == 2)
    before, after = rec.of("a")
    thread, task = before[3]
    assert task is not None  # inside an asyncio task...
    assert (thread, task) == where_ran["a"]  # ...the very one that ran the function
    assert after[3:] == (RunOutcome.SUCCEEDED, 6)


@pytest.mark.parametrize("fn", ["seen", "seen_async"])
def test_a_context_variable_set_in_before_task_is_seen_by_the_function(
    scheduler: Scheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fn: str
) -> None:
    monkeypatch.setenv("DISTSCHED_TEST_HOOKS_FILE", str(tmp_path / "hooks.log"))
    scheduler.schedule("a", fn=fn)
    with running(Worker(scheduler, FUNCS, hooks=[hooks_app.MarkHooks()])):
        assert scheduler.result("a", timeout=10) == "req-a"
    # And reset after the run: the worker's threads do not keep it.
    assert hooks_app.request_id.get() == ""


def test_a_failed_run_is_told_to_on_failure_then_after_task_with_the_exception(
    scheduler: Scheduler,
) -> None:
    rec = Recorder()
    scheduler.schedule("a", fn="boom")
    with running(Worker(scheduler, FUNCS, hooks=[rec])), pytest.raises(TaskFailed):
        scheduler.result("a", timeout=10)
    wait_for(lambda: len(rec.of("a")) == 3)
    _, failure, after = rec.of("a")
    assert failure[:3] == ("failure", "rec", "a")
    assert isinstance(failure[3], ValueError)
    assert after[3] is RunOutcome.FAILED and after[4] is failure[3]


def test_a_run_stopped_on_a_cancel_request_is_cancelled_not_a_failure(
    scheduler: Scheduler,
) -> None:
    rec = Recorder()
    scheduler.schedule("a", fn="stops")
    with running(Worker(scheduler, FUNCS, hooks=[rec])):
        wait_for(lambda: rec.of("a"))
        scheduler.cancel("a")
        assert scheduler.wait("a", timeout=10).state is State.CANCELLED
    wait_for(lambda: len(rec.of("a")) == 2)
    assert [c[0] for c in rec.of("a")] == ["before", "after"]
    assert rec.of("a")[1][3] is RunOutcome.CANCELLED


def test_before_task_runs_in_the_order_given_and_the_others_in_reverse(
    scheduler: Scheduler,
) -> None:
    shared = Recorder()
    first, second = Recorder("first"), Recorder("second")
    first.calls = second.calls = shared.calls
    first.lock = second.lock = shared.lock
    scheduler.schedule("a", fn="boom")
    with running(Worker(scheduler, FUNCS, hooks=[first, second])):
        scheduler.wait("a", timeout=10)
    wait_for(lambda: len(shared.calls) == 6)
    assert [(c[0], c[1]) for c in shared.calls] == [
        ("before", "first"), ("before", "second"),
        ("failure", "second"), ("failure", "first"),
        ("after", "second"), ("after", "first"),
    ]  # fmt: skip


class Broken(WorkerHooks):
    def before_task(self, ctx: TaskContext) -> None:
        raise RuntimeError("before is broken")

    def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
        raise RuntimeError("after is broken")

    def on_failure(self, ctx: TaskContext, exc: BaseException) -> None:
        raise RuntimeError("on_failure is broken")


def test_a_hook_that_raises_is_logged_and_changes_no_outcome(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    scheduler.schedule("good", fn="ok", args=[1])
    scheduler.schedule("bad", fn="boom")
    with (
        caplog.at_level(logging.ERROR, logger="distsched.worker"),
        running(Worker(scheduler, FUNCS, concurrency=1, hooks=[Broken(), rec])),
    ):
        assert scheduler.result("good", timeout=10) == 2
        with pytest.raises(TaskFailed, match="bad input"):
            scheduler.result("bad", timeout=10)
        # The worker goes on running tasks.
        scheduler.schedule("later", fn="ok", args=[5])
        assert scheduler.result("later", timeout=10) == 10
    broken = [r for r in caplog.records if "Broken" in r.getMessage()]
    assert {r.exc_info[1].args[0] for r in broken if r.exc_info and r.exc_info[1]} == {
        "before is broken",
        "after is broken",
        "on_failure is broken",
    }
    # The hooks after the broken one were still told.
    wait_for(lambda: len(rec.of("later")) == 2)


def test_worker_metrics_are_hooks_too(scheduler: Scheduler) -> None:
    class Metrics(WorkerMetrics):
        def __init__(self) -> None:
            self.told: list[tuple[str, RunOutcome]] = []

        def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
            self.told.append((ctx.task_id, outcome))

    metrics = Metrics()
    scheduler.schedule("a", fn="ok", args=[1])
    with running(Worker(scheduler, FUNCS, metrics=metrics)):
        scheduler.wait("a", timeout=10)
    wait_for(lambda: metrics.told == [("a", RunOutcome.SUCCEEDED)])


@pytest.mark.parametrize("bad", ["not a list", [object()], [1], 5])
def test_hooks_without_any_hook_method_are_refused(scheduler: Scheduler, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Worker(scheduler, FUNCS, hooks=bad)
    assert caught.value.field == "hooks"


def test_an_object_with_only_some_hook_methods_is_a_hook(scheduler: Scheduler) -> None:
    told: list[str] = []

    class OnlyBefore:
        def before_task(self, ctx: TaskContext) -> None:
            told.append(ctx.task_id)

    scheduler.schedule("a", fn="ok", args=[1])
    with running(Worker(scheduler, FUNCS, hooks=[OnlyBefore()])):
        assert scheduler.result("a", timeout=10) == 2
    assert told == ["a"]


# --------------------------------------------------------------------------- command line


def test_distsched_worker_loads_hooks_named_on_the_command_line(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler, tmp_path: Path
) -> None:
    marks = tmp_path / "hooks.log"
    scheduler.schedule("a", fn="seen")
    env = subprocess_env(DISTSCHED_TEST_HOOKS_FILE=str(marks))
    proc = subprocess.Popen(
        [
            *CLI_COMMAND, "--redis", redis_server.url, "--namespace", namespace,
            "worker", "tests.hooks_app:FUNCS", "--hooks", "tests.hooks_app:MarkHooks",
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert scheduler.result("a", timeout=30) == "req-a"
    finally:
        proc.terminate()
        proc.wait(30)
    assert marks.read_text().splitlines() == ["before a", "after a succeeded req-a"]


def test_a_hooks_spec_that_names_no_hook_is_a_one_line_error(
    redis_server: RedisServer, namespace: str
) -> None:
    from tests.test_cli import assert_one_line_error, invoke

    result = invoke(
        redis_server,
        namespace,
        "worker",
        "tests.hooks_app:FUNCS",
        "--hooks",
        "tests.hooks_app:seen",
    )
    assert_one_line_error(result, "hooks")


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_async_hook_methods_are_refused(scheduler: Scheduler) -> None:
    class AsyncHooks:
        async def before_task(self, ctx: TaskContext) -> None:
            """Never awaited by the worker."""

    with pytest.raises(InvalidArgument, match="plain functions"):
        Worker(scheduler, FUNCS, hooks=[AsyncHooks()])


def test_a_result_that_cannot_be_stored_is_told_as_the_failure_it_becomes(
    scheduler: Scheduler,
) -> None:
    rec = Recorder()
    scheduler.schedule("a", fn="unstorable")
    functions = {**FUNCS, "unstorable": lambda: object()}
    with running(Worker(scheduler, functions, hooks=[rec])), pytest.raises(TaskFailed):
        scheduler.result("a", timeout=10)
    wait_for(lambda: len(rec.of("a")) == 3)
    _, failure, after = rec.of("a")
    assert isinstance(failure[3], InvalidArgument)
    assert after[3] is RunOutcome.FAILED
    assert "result not storable" in (scheduler.status("a").error or "")
