"""``distsched why`` and ``explain`` on a failed task name the exception raised, not the
``Traceback (most recent call last):`` line a stored traceback starts with. Real Redis."""

from __future__ import annotations

import json

from distsched import Scheduler
from distsched.tracebacks import exception_line
from tests.conftest import RedisServer
from tests.test_cli import invoke


def _raised(error: Exception) -> Exception:
    """``error`` raised from two frames deep, so its traceback has frames."""

    def inner() -> None:
        raise error

    def outer() -> None:
        inner()

    try:
        outer()
    except Exception as caught:
        return caught
    raise AssertionError("not raised")  # pragma: no cover


def _fail_with(scheduler: Scheduler, task_id: str, error: object) -> None:
    scheduler.schedule(task_id, fn="f", max_attempts=1)
    claims, _ = scheduler.claim(1, "w-1")
    scheduler.fail(claims[0], error)


def test_why_of_a_task_that_raised_prints_the_exception_line_of_its_traceback(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    _fail_with(scheduler, "job", _raised(KeyError("missing-key")))
    exp = scheduler.explain("job")
    assert exp.error == "KeyError: 'missing-key'"
    result = invoke(redis_server, namespace, "why", "job")
    assert result.exit_code == 0, result.stderr
    assert "KeyError: 'missing-key'" in result.stdout
    assert "Traceback" not in result.stdout
    data = json.loads(invoke(redis_server, namespace, "why", "job", "--json").stdout)
    assert data["error"] == "KeyError: 'missing-key'"


def test_a_chained_exception_shows_the_one_raised_last(scheduler: Scheduler) -> None:
    try:
        try:
            raise ValueError("first")
        except ValueError as first:
            raise RuntimeError("second") from first
    except RuntimeError as chained:
        _fail_with(scheduler, "chained", chained)
    assert scheduler.explain("chained").error == "RuntimeError: second"


def test_an_error_given_as_plain_text_shows_its_first_line(scheduler: Scheduler) -> None:
    _fail_with(scheduler, "text", "disk full\nsecond line")
    assert scheduler.explain("text").error == "disk full"


def test_the_exception_line_of_a_traceback_with_a_multi_line_message_is_whole() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "job.py", line 3, in run\n'
        "    raise ValueError(msg)\n"
        "ValueError: line one\n"
        "line two"
    )
    assert exception_line(text) == "ValueError: line one line two"
    assert exception_line("Traceback (most recent call last):\nOddError") == "OddError"
