"""Failed tasks grouped by error (``Scheduler.failures``), and a group retried or removed
in bounded steps (``retry_failures``, ``purge_failures``), from the API, the command
line and the dashboard, against a real redis-server."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from distsched import Scheduler, State, TaskSpec
from distsched.errors import InvalidArgument, NotFoundError
from distsched.model import FailureGroup
from distsched.ops.failures import FAILURES_BATCH_MAX, error_group, merge_groups
from tests.conftest import RedisServer, namespace_keys, require_extra
from tests.test_cli import assert_one_line_error, invoke

TIMEOUT = 'Traceback (most recent call last):\n  File "app.py", line 3, in fetch\n'
TIMEOUT += "ConnectionError: timeout after {n}s talking to 10.0.0.{n}\n"
MISSING = "KeyError: 'user-{n}' (request 3f2a9c1e-{n:04d}-4bcd-9e21-0123456789ab)"
GROUP_TIMEOUT = "ConnectionError: timeout after #s talking to #"
GROUP_MISSING = "KeyError: 'user-#' (request #)"


def fail_all(s: Scheduler, errors: dict[str, str], fn: str = "f") -> None:
    """Schedule the tasks of ``errors`` and fail each with its error (one attempt)."""
    s.schedule_many([TaskSpec(task_id, fn=fn) for task_id in errors])
    claims = s.ready(len(errors), "w")
    assert len(claims) == len(errors)
    s.fail_many([(c, errors[c.task_id]) for c in claims])


def two_groups(s: Scheduler, timeouts: int = 12, missing: int = 5) -> None:
    errors = {f"t{i}": TIMEOUT.format(n=i) for i in range(timeouts)}
    errors.update({f"m{i}": MISSING.format(n=i) for i in range(missing)})
    fail_all(s, errors)


def all_groups(s: Scheduler, count: int = 7) -> tuple[tuple[FailureGroup, ...], int, int]:
    """Every group, the failed tasks examined and the calls it took."""
    groups: list[FailureGroup] = []
    cursor: str | None = None
    examined = calls = 0
    while True:
        page = s.failures(cursor=cursor, count=count)
        calls += 1
        assert page.examined <= count
        groups.extend(page.groups)
        examined += page.examined
        cursor = page.cursor
        if cursor is None:
            return merge_groups(groups), examined, calls


# --------------------------------------------------------------------------- the groups


def test_an_error_group_is_the_last_line_with_numbers_and_hex_ids_as_hashes() -> None:
    assert error_group(TIMEOUT.format(n=7)) == GROUP_TIMEOUT
    assert error_group(MISSING.format(n=12)) == GROUP_MISSING
    assert error_group("ValueError:   bad\n\n  ") == "ValueError: bad"
    assert error_group("deadbeef is a word, 2024-01-31T10:00:00 a time") == (
        "deadbeef is a word, #T# a time"
    )
    assert error_group(None) == error_group("  \n") == "(no error)"
    assert len(error_group("E: " + "x" * 500)) == 200
    # A group key is its own group: the listed key can be given back as it is.
    for text in (TIMEOUT.format(n=3), MISSING.format(n=3), "(no error)"):
        assert error_group(error_group(text)) == error_group(text)


def test_failures_groups_by_error_with_counts_and_examples_however_ids_differ(
    api: Scheduler,
) -> None:
    two_groups(api)
    api.schedule("fine", fn="f")
    groups, examined, _ = all_groups(api, count=500)
    assert examined == 17
    assert [(g.error, g.count) for g in groups] == [(GROUP_TIMEOUT, 12), (GROUP_MISSING, 5)]
    timeouts = groups[0]
    assert len(timeouts.examples) == 5 and set(timeouts.examples) <= {f"t{i}" for i in range(12)}
    assert timeouts.sample.startswith("ConnectionError: timeout after ")
    assert set(groups[1].examples) == {f"m{i}" for i in range(5)}


def test_grouping_a_namespace_with_many_failures_takes_several_bounded_calls(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    two_groups(scheduler, timeouts=30, missing=5)
    scheduler.failures(count=1)  # the stripe count is read once, on the first call

    def commands() -> dict[str, int]:
        stats = redis_client.info("commandstats")
        return {name: int(v["calls"]) for name, v in stats.items()}

    before = commands()
    groups, examined, calls = all_groups(scheduler, count=10)
    after = commands()
    sent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert calls == 4 and examined == 35
    assert [(g.error, g.count) for g in groups] == [(GROUP_TIMEOUT, 30), (GROUP_MISSING, 5)]
    # Each call: one range of the failed index and one read of records and errors.
    assert sent.pop("cmdstat_zrangebylex") == calls
    assert sent.pop("cmdstat_hmget") == 2 * calls
    assert set(sent) <= {"cmdstat_info", "cmdstat_multi", "cmdstat_exec"}, sent


def test_each_call_of_a_full_batch_stays_far_under_50_ms_on_the_server(
    own_redis: RedisServer,
) -> None:
    # 3,000 failed tasks, each with an error of the largest size stored (4 KiB).
    with own_redis.client() as client:
        s = Scheduler(client, namespace="big")
        try:
            filler = "x" * 4000
            for start in range(0, 3000, 500):
                fail_all(
                    s,
                    {
                        f"b{i}": f"{filler}\nOSError: disk {i} full"
                        for i in range(start, start + 500)
                    },
                )
            # Half the 50 ms cap: a batch read whole would take several times that, while
            # a machine busy with other work stretches a bounded call's few ms.
            client.config_set("slowlog-log-slower-than", 25_000)  # 25 ms
            client.slowlog_reset()
            groups, examined, calls = all_groups(s, count=FAILURES_BATCH_MAX)
            assert examined == 3000 and calls == 6
            assert groups == (groups[0],) and groups[0].error == "OSError: disk # full"
            assert client.slowlog_get(10) == []
        finally:
            s.close()


# --------------------------------------------------------------------------- retry all


def test_retry_failures_retries_exactly_the_matching_group_and_nothing_else(
    api: Scheduler,
) -> None:
    two_groups(api)
    api.schedule("other", fn="f")
    api.cancel("other")
    versions = {t: api.status(t).version for t in [f"t{i}" for i in range(12)] + ["m0", "m4"]}
    # Given as any line of the group: grouped the same way.
    outcome = api.retry_failures(TIMEOUT.format(n=99), batch=4)
    assert (outcome.matched, outcome.done, outcome.skipped) == (12, 12, 0)
    assert outcome.examined == 17
    for i in range(12):
        info = api.status(f"t{i}")
        assert info.state is State.READY and info.version > versions[f"t{i}"]
    for i in range(5):
        info = api.status(f"m{i}")
        assert info.state is State.FAILED
    assert api.status("m0").version == versions["m0"]
    assert api.status("m4").version == versions["m4"]
    assert api.status("other").state is State.CANCELLED
    groups, _, _ = all_groups(api)
    assert [(g.error, g.count) for g in groups] == [(GROUP_MISSING, 5)]


def test_retry_failures_stops_at_its_limit_and_retries_what_a_failure_blocked(
    scheduler: Scheduler,
) -> None:
    fail_all(scheduler, {f"t{i}": TIMEOUT.format(n=i) for i in range(6)})
    scheduler.schedule("root", fn="f")
    scheduler.submit("child", fn="f", deps=["root"])
    (claim,) = scheduler.ready(1, "w")
    scheduler.fail(claim, TIMEOUT.format(n=1234))
    assert scheduler.status("child").state is State.BLOCKED
    outcome = scheduler.retry_failures(GROUP_TIMEOUT, limit=3, batch=2)
    assert (outcome.matched, outcome.done) == (3, 3)
    groups, _, _ = all_groups(scheduler)
    assert [(g.error, g.count) for g in groups] == [(GROUP_TIMEOUT, 4)]
    scheduler.retry_failures(GROUP_TIMEOUT)
    assert scheduler.status("root").state is State.READY
    assert scheduler.status("child").state is State.PENDING  # retried with its root


# --------------------------------------------------------------------------- purge all


def test_purge_failures_removes_exactly_the_matching_group_and_nothing_else(
    api: Scheduler,
) -> None:
    two_groups(api)
    api.schedule("later", fn="f", delay=3600)
    outcome = api.purge_failures(GROUP_MISSING, batch=3)
    assert (outcome.matched, outcome.done, outcome.skipped) == (5, 5, 0)
    for i in range(5):
        with pytest.raises(NotFoundError):
            api.status(f"m{i}")
    for i in range(12):
        assert api.status(f"t{i}").state is State.FAILED
    assert api.status("later").state is State.READY
    assert api.stats()["counts"]["failed"] == 12
    groups, _, _ = all_groups(api)
    assert [(g.error, g.count) for g in groups] == [(GROUP_TIMEOUT, 12)]
    assert api.purge_failures(GROUP_MISSING).matched == 0


def test_groups_retries_and_purges_span_the_stripes_of_a_striped_namespace(
    redis_server: RedisServer, namespace: str
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace, stripes=3)
    try:
        two_groups(s, timeouts=20, missing=10)
        groups, examined, _ = all_groups(s, count=4)
        assert examined == 30
        assert [(g.error, g.count) for g in groups] == [(GROUP_TIMEOUT, 20), (GROUP_MISSING, 10)]
        assert s.retry_failures(GROUP_TIMEOUT, batch=3).done == 20
        assert s.purge_failures(GROUP_MISSING, batch=3).done == 10
        assert all_groups(s)[0] == ()
    finally:
        s.close()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.retry_failures(""), "error"),
        (lambda s: s.retry_failures("   "), "error"),
        (lambda s: s.retry_failures(None), "error"),
        (lambda s: s.purge_failures(""), "error"),
        (lambda s: s.retry_failures("E", batch=0), "batch"),
        (lambda s: s.purge_failures("E", batch=FAILURES_BATCH_MAX + 1), "batch"),
        (lambda s: s.retry_failures("E", batch="10"), "batch"),
        (lambda s: s.purge_failures("E", limit=0), "limit"),
        (lambda s: s.failures(count=0), "count"),
        (lambda s: s.failures(count=FAILURES_BATCH_MAX + 1), "count"),
        (lambda s: s.failures(cursor="zzz"), "cursor"),
        (lambda s: s.failures(cursor=5), "cursor"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field_and_change_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str, call: Any, field: str
) -> None:
    two_groups(scheduler, timeouts=3, missing=2)
    before = namespace_keys(redis_client, namespace)
    with pytest.raises(InvalidArgument) as caught:
        call(scheduler)
    assert caught.value.field == field
    assert namespace_keys(redis_client, namespace) == before


# --------------------------------------------------------------------------- command line


def test_the_failures_command_prints_the_groups_and_retry_and_purge_take_one(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    two_groups(scheduler)
    out = invoke(redis_server, namespace, "failures", "--count", "5")
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["COUNT", "ERROR", "EXAMPLES"]
    assert lines[1].split()[0] == "12" and GROUP_TIMEOUT in lines[1]
    assert lines[2].split()[0] == "5" and GROUP_MISSING in lines[2]
    assert "grouped 17 failed tasks" in out.stderr
    assert f"distsched retry --error '{GROUP_TIMEOUT}'" in out.stderr

    some = invoke(redis_server, namespace, "failures", "--count", "5", "--max", "10", "--json")
    data = json.loads(some.stdout)
    assert data["examined"] == 10 and data["cursor"] is not None
    rest = invoke(redis_server, namespace, "failures", "--cursor", data["cursor"], "--json")
    assert json.loads(rest.stdout)["examined"] == 7

    retried = invoke(redis_server, namespace, "retry", "--error", GROUP_TIMEOUT, "--batch", "4")
    assert retried.exit_code == 0, retried.stderr
    assert retried.stdout.startswith("retried 12 failed tasks of the group")
    purged = invoke(redis_server, namespace, "purge", "--error", MISSING.format(n=1))
    assert purged.stdout.startswith("purged 5 failed tasks of the group")
    assert scheduler.stats()["counts"]["failed"] == 0
    assert scheduler.stats()["counts"]["ready"] == 12


def test_the_command_line_refuses_a_bad_group_or_size_naming_the_option(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    two_groups(scheduler, timeouts=2, missing=1)
    assert_one_line_error(invoke(redis_server, namespace, "retry", "--error", ""), "--error")
    assert_one_line_error(invoke(redis_server, namespace, "purge", "--error", " "), "--error")
    bad_batch = invoke(redis_server, namespace, "retry", "--error", "E", "--batch", "501")
    assert_one_line_error(bad_batch, "--batch", "500")
    assert_one_line_error(invoke(redis_server, namespace, "failures", "--count", "0"), "--count")
    both = invoke(redis_server, namespace, "retry", "t0", "--error", "E")
    assert both.exit_code == 2 and "give either ID or --state (or --error)" in both.stderr
    assert invoke(redis_server, namespace, "purge").exit_code == 2
    assert scheduler.stats()["counts"]["failed"] == 3


# --------------------------------------------------------------------------- dashboard

TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def dashboard(scheduler: Scheduler) -> Iterator[Any]:
    require_extra("starlette")
    require_extra("jinja2")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    with TestClient(create_app(scheduler, allow_actions=True, token=TOKEN)) as client:
        yield client


def _csrf(page: str) -> str:
    return page.split('name="csrf" value="')[1].split('"')[0]


def test_the_failures_page_lists_the_groups_read_only_until_logged_in(
    scheduler: Scheduler, dashboard: Any
) -> None:
    two_groups(scheduler)
    page = dashboard.get("/failures")
    assert page.status_code == 200
    assert "Grouped the 17 newest failed tasks" in page.text
    assert "ConnectionError: timeout after #s talking to #" in page.text
    assert "KeyError: &#39;user-#&#39;" in page.text  # escaped
    assert 'href="/task?id=m0"' in page.text or 'href="/task?id=m1"' in page.text
    assert "Retry all" not in page.text and 'href="/failures"' in page.text
    # No session: refused, nothing retried.
    refused = dashboard.post("/failures/retry", data={"error": GROUP_TIMEOUT})
    assert refused.status_code == 403
    assert scheduler.stats()["counts"]["failed"] == 17


def test_retry_all_and_remove_all_act_on_one_group_with_the_session_and_csrf_token(
    scheduler: Scheduler, dashboard: Any
) -> None:
    two_groups(scheduler)
    assert dashboard.post("/login", data={"token": TOKEN}).status_code == 200
    page = dashboard.get("/failures").text
    assert page.count('class="action-retry-group"') == 2
    token = _csrf(page)
    wrong = dashboard.post("/failures/retry", data={"error": GROUP_TIMEOUT, "csrf": "x" * 40})
    assert wrong.status_code == 403
    empty = dashboard.post("/failures/retry", data={"error": " ", "csrf": token})
    assert empty.status_code == 400
    assert scheduler.stats()["counts"]["failed"] == 17

    done = dashboard.post("/failures/retry", data={"error": GROUP_TIMEOUT, "csrf": token})
    assert done.status_code == 200
    assert "Retried 12 failed task(s) of that group" in done.text
    assert scheduler.stats()["counts"]["failed"] == 5
    assert scheduler.status("t3").state is State.READY

    gone = dashboard.post("/failures/purge", data={"error": GROUP_MISSING, "csrf": token})
    assert "Removed 5 failed task(s) of that group" in gone.text
    assert "No failed tasks" in gone.text
    with pytest.raises(NotFoundError):
        scheduler.status("m0")
    assert scheduler.stats()["counts"]["ready"] == 12


# --------------------------------------------------------------------------- demo


def test_the_demo_dashboard_tells_the_failure_story_and_a_group_can_be_retried(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    require_extra("uvicorn")
    import httpx2

    from distsched.tools.demo import DashboardOptions, run_demo

    lines: list[str] = []
    seen: dict[str, Any] = {}

    def look(url: str) -> None:
        token = lines[-1].rsplit(" ", 1)[1]
        with httpx2.Client(base_url=url, timeout=10, follow_redirects=True) as web:
            seen["before"] = web.get("/failures").text
            seen["branch"] = web.get("/task", params={"id": "month-close"}).text
            web.post("/login", data={"token": token})
            page = web.get("/failures").text
            group = "ConnectionError: payment gateway timed out after #s (order #)"
            reply = web.post("/failures/retry", data={"error": group, "csrf": _csrf(page)})
            seen["after"] = reply.text

    assert run_demo(redis_server.url, lines.append, DashboardOptions(port=0, until=look))
    assert "log in with the token" in lines[-1]
    counts = [
        (int(n), error)
        for n, error in re.findall(
            r'<td class="count">(\d+)</td>\s*<td class="error-cell"><code class="group-error">'
            r"([^<]*)</code>",
            seen["before"],
        )
    ]
    assert [n for n, _ in counts] == [37, 5, 2]  # one large group, two small ones
    assert "blocked" in seen["branch"] and "sync-orders" in seen["branch"]
    assert "Retried 37 failed task(s) of that group" in seen["after"]
    assert "payment gateway" not in seen["after"].split('id="groups"')[1]
    namespace = re.search(r"namespace '(demo-[0-9a-f]+)'", "\n".join(lines))
    assert namespace is not None
    assert not list(redis_client.scan_iter(match=f"ds:{{{namespace.group(1)}}}:*"))


def test_a_group_action_sent_from_another_site_is_refused_even_with_session_and_token(
    scheduler: Scheduler, dashboard: Any
) -> None:
    two_groups(scheduler, timeouts=3, missing=1)
    dashboard.post("/login", data={"token": TOKEN})
    token = _csrf(dashboard.get("/failures").text)
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        reply = dashboard.post(
            "/failures/purge", data={"error": GROUP_TIMEOUT, "csrf": token}, headers=headers
        )
        assert reply.status_code == 403
    assert dashboard.post("/failures/other", data={"error": "E", "csrf": token}).status_code == 404
    assert scheduler.stats()["counts"]["failed"] == 4
