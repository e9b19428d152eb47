"""Times for people: relative in the command line's text and the dashboard (``in 11 h``,
``3 min ago``), the exact instant in ``--json`` and on the dashboard's hover; one
module (``distsched.times``) formats them for both. Real Redis."""

from __future__ import annotations

import json
import re

import pytest

from distsched import Scheduler, times
from distsched.text import relative
from tests.conftest import RedisServer, require_extra
from tests.test_cli import invoke


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.25, "250 ms"),
        (4.2, "4.2 s"),
        (42.4, "42 s"),
        (59.7, "1 min"),
        (180, "3 min"),
        (39791.513, "11 h"),
        (3 * 86400 + 5, "3 d"),
    ],
)
def test_a_span_reads_in_the_largest_unit_that_fits(seconds: float, shown: str) -> None:
    assert times.span(seconds) == shown


def test_a_time_reads_relative_to_now_and_the_text_module_says_the_same() -> None:
    assert times.relative(1000 + 39791.513, 1000) == "in 11 h"
    assert times.relative(1000 - 180, 1000) == "3 min ago"
    assert times.relative(1000.2, 1000) == "now"
    assert times.relative(None, 1000) == "-"
    assert relative(1000 + 39791.513, 1000) == "in 11 h"
    assert times.absolute(0.5) == "1970-01-01T00:00:00.500Z"
    assert times.span(3725, parts=2) == "1 h 2 min"


def test_status_text_is_relative_and_its_json_is_absolute(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    scheduler.schedule("later", fn="f", delay=39800)
    text = invoke(redis_server, namespace, "status", "later")
    assert text.exit_code == 0, text.stderr
    fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.stdout.splitlines())
    assert fields["run_at"].startswith("in 11 h ")
    assert fields["updated_at"] == "now"
    data = json.loads(invoke(redis_server, namespace, "status", "later", "--json").stdout)
    assert data["run_at"] == scheduler.status("later").run_at  # epoch seconds


def test_why_and_tasks_say_how_long_ago_a_task_failed(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    scheduler.schedule("job", fn="f")
    claims, _ = scheduler.claim(1, "w-1")
    scheduler.fail(claims[0], "boom")
    why = invoke(redis_server, namespace, "why", "job").stdout
    assert "it failed now after 1 of 1 attempts: boom" in why
    assert not re.search(r"\d{4}-\d\d-\d\dT", why)
    listing = invoke(redis_server, namespace, "tasks", "--state", "failed").stdout
    assert re.search(r"^job\s+f\s+failed\s+1/1\s+now\s+boom$", listing, re.M), listing


def test_the_dashboard_shows_relative_times_with_the_exact_time_on_hover(
    scheduler: Scheduler,
) -> None:
    require_extra("starlette")
    require_extra("jinja2")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    scheduler.schedule("later", fn="f", delay=39800)
    exact = times.absolute(scheduler.status("later").run_at)
    with TestClient(create_app(scheduler)) as client:
        page = client.get("/task?id=later").text
    assert f'<time datetime="{exact}" title="{exact}">in 11 h</time>' in page
