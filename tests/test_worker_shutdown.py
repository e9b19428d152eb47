"""A worker's shutdown (§8): a run it stops is not a failure, and signals say what
happens. Real threads, real ``distsched worker`` processes, real redis-server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from distsched import Scheduler, State, Worker, current_task
from tests.conftest import CliProcess, RedisServer, running
from tests.test_worker import wait_state, wait_until

LEASE_S = 0.6
REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "distsched"
# The installed entry point when there is one, else this interpreter (whatever PATH holds).
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "distsched.cli"]


@pytest.fixture
def fast(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    yield s
    s.close()


def until_stopping(then: Callable[[], Any]) -> dict[str, Callable[..., Any]]:
    """A ``def`` and an ``async def`` function that report progress 0 (they run), wait
    for the worker's shutdown signal (ignoring a cancel request), then do ``then()``."""

    def waits() -> Any:
        ctx = current_task()
        ctx.report_progress(0.0, "waiting")
        deadline = time.monotonic() + 20
        while not ctx.worker_stopping and time.monotonic() < deadline:
            ctx.wait_cancelled(0.02)
        return then()

    async def waits_async() -> Any:
        ctx = current_task()
        await ctx.report_progress_async(0.0, "waiting")
        deadline = time.monotonic() + 20
        while not ctx.worker_stopping and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return then()

    return {"waits": waits, "waits_async": waits_async}


def raise_cancelled() -> None:
    current_task().raise_if_cancelled()


def raise_other() -> None:
    raise RuntimeError("connection closed under me")


def stop_after_grace(worker: Worker, s: Scheduler, task_id: str) -> None:
    # The function runs: a claim no pool thread picked up yet would be handed back
    # unstarted by the shutdown, not stopped.
    wait_until(lambda: s.progress(task_id) is not None, 10, f"{task_id}'s function running")
    worker.stop(grace=0.1)
    assert worker.wait_stopped(10)


@pytest.mark.parametrize("fn", ["waits", "waits_async"])
@pytest.mark.parametrize("then", [raise_cancelled, raise_other], ids=["Cancelled", "other"])
def test_a_run_stopped_by_the_shutdown_goes_back_to_ready_without_spending_an_attempt(
    fast: Scheduler, fn: str, then: Callable[[], Any]
) -> None:
    # The default max_attempts=1: had the stopped run cost an attempt, the task would
    # have ended failed for good.
    version = fast.schedule("deploy", fn=fn)
    worker = Worker(fast, until_stopping(then), concurrency=2)
    with running(worker):
        stop_after_grace(worker, fast, "deploy")
    info = fast.status("deploy")
    assert (info.state, info.version, info.attempt) == (State.READY, version, 0)
    assert (info.error, info.cancel_requested, info.lease_deadline) == (None, False, None)
    assert (worker.counts["released"], worker.counts["failed"]) == (1, 0)
    assert fast.leases() == []

    # The next worker (after the deploy) runs it as its first attempt.
    ran: list[int] = []
    successor = Worker(fast, {fn: lambda: ran.append(current_task().attempt)}, concurrency=1)
    with running(successor):
        after = wait_state(fast, "deploy", State.SUCCEEDED, State.FAILED)
    assert (after.state, after.attempt, ran) == (State.SUCCEEDED, 1, [1])


@pytest.mark.parametrize("then", [raise_cancelled, raise_other], ids=["Cancelled", "other"])
def test_a_run_stopped_by_the_shutdown_ends_cancelled_when_a_cancel_was_requested(
    fast: Scheduler, then: Callable[[], Any]
) -> None:
    fast.schedule("doomed", fn="waits")
    worker = Worker(fast, until_stopping(then), concurrency=1)
    with running(worker):
        wait_state(fast, "doomed", State.RUNNING)
        assert fast.cancel("doomed") is State.RUNNING
        stop_after_grace(worker, fast, "doomed")
    info = fast.status("doomed")
    assert (info.state, info.cancel_requested, info.lease_deadline) == (
        State.CANCELLED, True, None,
    )  # fmt: skip
    assert worker.counts["failed"] == 0


def test_a_function_that_returns_after_the_shutdown_signal_succeeded(fast: Scheduler) -> None:
    fast.schedule("finisher", fn="waits")
    worker = Worker(fast, until_stopping(lambda: "done in time"), concurrency=1)
    with running(worker):
        stop_after_grace(worker, fast, "finisher")
    info = fast.status("finisher")
    assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 1, "done in time")


def test_a_run_that_failed_before_the_shutdown_signal_is_a_failure(fast: Scheduler) -> None:
    failing = threading.Event()

    def fails() -> None:
        failing.set()
        raise ValueError("bad input")

    fast.schedule("broken", fn="fails")
    worker = Worker(fast, {"fails": fails}, concurrency=1)
    with running(worker):
        assert failing.wait(10)
        info = wait_state(fast, "broken", State.FAILED, State.READY)
    assert info.state is State.FAILED
    assert info.error is not None and "bad input" in info.error


# --------------------------------------------------------------------------- signals


class WorkerProcess(CliProcess):
    """``distsched worker tests.worker_app:FUNCS`` with its stderr in a file."""

    def __init__(self, server: RedisServer, namespace: str, tmp: Path, grace: float) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCHED_")}
        super().__init__(
            tmp / "worker.err",
            [*COMMAND, "--redis", server.url, "--namespace", namespace, "worker",
             "tests.worker_app:FUNCS", "--lease", str(LEASE_S), "--grace", str(grace)],
            env,
        )  # fmt: skip

    def wait_for_line(self, *parts: str) -> str:
        def found() -> str | None:
            return next(
                (ln for ln in self.stderr().splitlines() if all(p in ln for p in parts)), None
            )

        wait_until(found, 15, f"a line with {parts} in {self.stderr()!r}")
        line = found()
        assert line is not None
        return line


@pytest.fixture
def worker_process(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> Iterator[Callable[[float], WorkerProcess]]:
    made: list[WorkerProcess] = []

    def make(grace: float) -> WorkerProcess:
        made.append(WorkerProcess(redis_server, namespace, tmp_path, grace))
        return made[-1]

    yield make
    for proc in made:
        proc.close()


def test_the_first_ctrl_c_logs_the_grace_and_the_second_exits_leaving_tasks_to_their_leases(
    scheduler: Scheduler, worker_process: Callable[[float], WorkerProcess]
) -> None:
    worker = worker_process(30.0)
    scheduler.schedule("long", fn="nap", args=(60,))
    wait_until(lambda: scheduler.progress("long") is not None, 20, "the function running")
    worker.proc.send_signal(signal.SIGINT)
    first = worker.wait_for_line("WARNING", "SIGINT")
    assert "stopping" in first and "30s grace" in first and "Ctrl-C again" in first
    assert worker.proc.poll() is None  # waiting for the 60 s function: grace 30 s
    worker.proc.send_signal(signal.SIGINT)
    assert worker.proc.wait(10) == 130
    second = worker.wait_for_line("WARNING", "second SIGINT")
    assert "1 running tasks are left to their leases" in second
    info = scheduler.status("long")
    assert info.state is State.RUNNING and info.lease_deadline is not None


def test_sigterm_logs_the_grace_and_the_stopped_run_goes_back_to_ready(
    scheduler: Scheduler, worker_process: Callable[[float], WorkerProcess]
) -> None:
    worker = worker_process(0.2)
    version = scheduler.schedule("long", fn="nap", args=(60,))
    wait_state(scheduler, "long", State.RUNNING, timeout=20)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(20) == 0, worker.stderr()
    line = worker.wait_for_line("WARNING", "SIGTERM")
    assert "stopping" in line and "0.2s grace" in line
    info = scheduler.status("long")
    assert (info.state, info.version, info.attempt) == (State.READY, version, 0)
