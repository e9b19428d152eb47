"""The worker's log (one line per attempt, with structured fields), the ``--log-level``
and ``--log-format`` options of ``distsched worker``, and the stored error's traceback."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from distsched import Scheduler, State, TaskInfo, Worker, current_task
from distsched.wire.payload import ERROR_MAX_BYTES, error_text
from distsched.worker.logs import TASK_FIELDS
from tests.conftest import CLI_COMMAND, CliProcess, RedisServer, running

PASSWORD = "s3cret-pw"


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def wait_state(s: Scheduler, task_id: str, state: State) -> TaskInfo:
    wait_until(lambda: s.status(task_id).state is state, what=f"{task_id} {state}")
    return s.status(task_id)


def boom(row: int) -> None:
    raise ValueError(f"bad row {row}")


def bottom(depth: int) -> None:
    if depth == 0:
        raise KeyError("the very bottom")
    upper(depth - 1)


def upper(depth: int) -> None:
    # Two functions in turn: no run of identical frames for the traceback to fold.
    bottom(depth)


def task_records(caplog: pytest.LogCaptureFixture, task_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "task_id", None) == task_id]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in TASK_FIELDS}


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, "distsched"):
        yield caplog


# --------------------------------------------------------------------------- records


def test_a_function_that_raises_logs_exactly_one_error_with_its_traceback_and_the_task_fields(
    scheduler: Scheduler, logged: pytest.LogCaptureFixture
) -> None:
    version = scheduler.schedule("t", fn="boom", args=[7])
    with running(Worker(scheduler, {"boom": boom}, concurrency=1)):
        wait_state(scheduler, "t", State.FAILED)
        wait_until(lambda: task_records(logged, "t"), what="the task's log line")
    errors = [r for r in logged.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    (record,) = errors
    assert record.name.startswith("distsched.")
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
    assert "in boom" in logging.Formatter().formatException(record.exc_info)
    got = fields(record)
    assert isinstance(got.pop("duration"), float)
    assert got == {
        "task_id": "t", "fn": "boom", "version": version, "attempt": 1,
        "outcome": "failed", "error": "ValueError: bad row 7",
    }  # fmt: skip
    assert "'t'" in record.getMessage() and "bad row 7" in record.getMessage()


def test_a_failed_attempt_that_will_run_again_is_a_warning_and_the_last_one_an_error(
    scheduler: Scheduler, logged: pytest.LogCaptureFixture
) -> None:
    scheduler.schedule("t", fn="boom", args=[1], max_attempts=2, backoff=0)
    with running(Worker(scheduler, {"boom": boom}, concurrency=1)):
        wait_state(scheduler, "t", State.FAILED)
        wait_until(lambda: len(task_records(logged, "t")) == 2, what="two log lines")
    first, last = task_records(logged, "t")
    assert (first.levelno, first.attempt, first.outcome) == (logging.WARNING, 1, "retried")  # type: ignore[attr-defined]
    assert first.exc_info is not None
    assert (last.levelno, last.attempt, last.outcome) == (logging.ERROR, 2, "failed")  # type: ignore[attr-defined]
    assert last.exc_info is not None


def test_a_success_is_one_debug_line_with_its_duration(
    scheduler: Scheduler, logged: pytest.LogCaptureFixture
) -> None:
    version = scheduler.schedule("t", fn="ok", args=[1])
    with running(Worker(scheduler, {"ok": lambda x: x + 1}, concurrency=1)):
        wait_state(scheduler, "t", State.SUCCEEDED)
        wait_until(lambda: task_records(logged, "t"), what="the task's log line")
    (record,) = task_records(logged, "t")
    assert record.levelno == logging.DEBUG and record.exc_info is None
    got = fields(record)
    assert isinstance(got.pop("duration"), float)
    assert got == {
        "task_id": "t", "fn": "ok", "version": version, "attempt": 1,
        "outcome": "succeeded", "error": None,
    }  # fmt: skip
    assert not [r for r in logged.records if r.levelno >= logging.WARNING]


def test_the_worker_logs_a_start_up_line_and_a_shutdown_summary_at_info(
    scheduler: Scheduler, logged: pytest.LogCaptureFixture
) -> None:
    scheduler.schedule("t", fn="ok", args=[1])
    worker = Worker(scheduler, {"ok": lambda x: x + 1, "other": print}, concurrency=3)
    with running(worker):
        wait_state(scheduler, "t", State.SUCCEEDED)
    infos = [r for r in logged.records if r.levelno == logging.INFO]
    start, stop = infos[0], infos[-1]
    text = start.getMessage()
    assert worker.worker_id in text and repr(scheduler.namespace) in text
    assert "concurrency 3" in text and "ok, other" in text and "redis://" in text
    assert stop.getMessage() == f"worker {worker.worker_id} stopped (claimed 1, succeeded 1)"


def test_a_lost_lease_is_a_warning_and_the_late_failure_of_that_run_no_error(
    redis_client: redis.Redis, namespace: str, logged: pytest.LogCaptureFixture
) -> None:
    s = Scheduler(redis_client, namespace=namespace, lease_s=0.6)
    first_started = threading.Event()

    def fragile() -> int:
        ctx = current_task()
        if ctx.attempt == 1:
            first_started.set()
            ctx.wait_cancelled(20)
            ctx.raise_if_cancelled()
        return ctx.attempt

    s.schedule("t", fn="fragile", max_attempts=2, backoff=0)
    worker = Worker(s, {"fragile": fragile}, concurrency=2)
    with running(worker):
        assert first_started.wait(10)
        assert s.expire_lease("t") == 1
        wait_until(lambda: worker.counts["stale"] == 1 and worker.counts["succeeded"] == 1)
    s.close()
    first = [r for r in task_records(logged, "t") if r.attempt == 1]  # type: ignore[attr-defined]
    assert first and all(
        (r.levelno, r.outcome) == (logging.WARNING, "lease_lost")  # type: ignore[attr-defined]
        for r in first
    ), [(r.levelname, r.getMessage()) for r in first]
    assert not [r for r in logged.records if r.levelno >= logging.ERROR]
    (second,) = [r for r in task_records(logged, "t") if r.attempt == 2]  # type: ignore[attr-defined]
    assert (second.levelno, second.outcome) == (logging.DEBUG, "succeeded")  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- stored error


def test_the_stored_error_keeps_the_type_the_message_and_the_frame_that_raised(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("t", fn="boom", args=[3])
    with running(Worker(scheduler, {"boom": boom}, concurrency=1)):
        info = wait_state(scheduler, "t", State.FAILED)
    assert info.error is not None
    assert info.error.startswith("Traceback (most recent call last):")
    assert 'in boom\n    raise ValueError(f"bad row {row}")' in info.error
    assert info.error.endswith("\nValueError: bad row 3")


def test_the_stored_error_of_a_deep_recursion_is_at_most_16_kb_and_keeps_the_innermost_frame(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("t", fn="deep", args=[300])
    with running(Worker(scheduler, {"deep": bottom}, concurrency=1)):
        info = wait_state(scheduler, "t", State.FAILED)
    assert info.error is not None
    assert len(info.error.encode("utf-8")) <= ERROR_MAX_BYTES
    lines = info.error.splitlines()
    assert lines[-1] == "KeyError: 'the very bottom'"
    assert lines[-3].startswith("  File ") and lines[-3].endswith("in bottom")
    assert lines[-2].strip() == 'raise KeyError("the very bottom")'
    assert "cut" in lines[0]  # the outermost frames went, and it says so


def test_distsched_status_shows_the_error_and_where_it_was_raised_and_full_the_traceback(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    from tests.test_cli import invoke

    scheduler.schedule("t", fn="boom", args=[5])
    with running(Worker(scheduler, {"boom": boom}, concurrency=1)):
        stored = wait_state(scheduler, "t", State.FAILED).error
    assert stored is not None
    shown = invoke(redis_server, namespace, "status", "t")
    assert shown.exit_code == 0, shown.output
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.startswith("error:")]
    raised_at = f"{__file__}:{boom.__code__.co_firstlineno + 1}"
    assert line.split(None, 1)[1] == f"ValueError: bad row 5 (at {raised_at} in boom)"
    full = invoke(redis_server, namespace, "status", "t", "--full")
    assert stored in full.stdout


def test_an_exception_never_raised_is_stored_as_its_type_and_message() -> None:
    assert error_text(ValueError("bad row 7")) == "ValueError: bad row 7"


def test_a_huge_message_is_cut_but_the_innermost_frame_is_kept() -> None:
    try:
        boom("x" * 100_000)  # type: ignore[arg-type]
    except ValueError as exc:
        text = error_text(exc)
    assert len(text.encode("utf-8")) <= ERROR_MAX_BYTES
    assert "in boom" in text and "ValueError: bad row xxx" in text


# --------------------------------------------------------------------------- the command


@pytest.fixture
def acl_redis() -> Iterator[RedisServer]:
    """A redis-server with a user that needs a password (the default user stays open)."""
    server = RedisServer("--user", "alice", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    yield server
    server.close()


class WorkerCommand(CliProcess):
    """``distsched worker tests.logs_app:FUNCS`` with its stderr in a file."""

    def __init__(self, url: str, namespace: str, tmp: Path, *options: str) -> None:
        super().__init__(
            tmp / "worker.err",
            [*CLI_COMMAND, "--redis", url, "--namespace", namespace, "worker",
             "tests.logs_app:FUNCS", "--lease", "5s", "--grace", "2s", *options],
        )  # fmt: skip

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(20) == 0, self.stderr()
        return self.stderr()


@pytest.fixture
def worker_command(
    acl_redis: RedisServer, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerCommand]]:
    made: list[WorkerCommand] = []
    url = f"redis://alice:{PASSWORD}@127.0.0.1:{acl_redis.port}/0"

    def make(*options: str) -> WorkerCommand:
        made.append(WorkerCommand(url, namespace, tmp_path, *options))
        return made[-1]

    yield make
    for command in made:
        command.close()


@pytest.fixture
def acl_scheduler(acl_redis: RedisServer, namespace: str) -> Iterator[Scheduler]:
    client = redis.Redis(port=acl_redis.port)
    s = Scheduler(client, namespace=namespace)
    yield s
    s.close()
    client.close()


def test_the_json_format_is_one_object_per_line_with_the_task_fields_and_no_password(
    acl_scheduler: Scheduler, worker_command: Callable[..., WorkerCommand], namespace: str
) -> None:
    s = acl_scheduler
    ok_version = s.schedule("fine", fn="ok", args=[1])
    s.schedule("broken", fn="boom", args=[9])
    command = worker_command("--log-format", "json", "--log-level", "debug")
    wait_state(s, "fine", State.SUCCEEDED)
    wait_state(s, "broken", State.FAILED)
    wait_until(lambda: '"broken"' in command.stderr(), what="the failure's line")
    err = command.stop()
    assert PASSWORD not in err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    start = next(ln for ln in lines if "worker_id" in ln and "namespace" in ln)
    assert (start["level"], start["namespace"], start["concurrency"]) == ("INFO", namespace, 8)
    assert start["functions"] == ["boom", "ok"]
    assert start["redis"].startswith("redis://alice:***@127.0.0.1:")
    by_task = {ln["task_id"]: ln for ln in lines if "task_id" in ln}
    assert by_task.keys() == {"fine", "broken"}
    fine, broken = by_task["fine"], by_task["broken"]
    assert (fine["level"], fine["logger"], fine["fn"]) == ("DEBUG", "distsched.worker.tasks", "ok")
    assert (fine["version"], fine["attempt"], fine["outcome"]) == (ok_version, 1, "succeeded")
    assert fine["duration"] >= 0 and fine["error"] is None and "traceback" not in fine
    assert (broken["level"], broken["outcome"], broken["error"]) == (
        "ERROR", "failed", "ValueError: bad row 9"
    )  # fmt: skip
    assert "in boom" in broken["traceback"] and broken["traceback"].startswith("Traceback")
    assert " stopped (" in lines[-1]["message"] and lines[-1]["level"] == "INFO"


def test_the_text_format_at_level_error_still_shows_the_sigterm_line(
    worker_command: Callable[..., WorkerCommand], acl_scheduler: Scheduler
) -> None:
    acl_scheduler.schedule("fine", fn="ok", args=[1])
    command = worker_command("--log-level", "ERROR")
    wait_state(acl_scheduler, "fine", State.SUCCEEDED)  # running: its handlers are installed
    err = command.stop()
    lines = err.splitlines()
    assert any("WARNING" in ln and "SIGTERM" in ln and "stopping" in ln for ln in lines), err
    assert not any(" INFO " in ln for ln in lines), err
