"""The dashboard's pages for schedules and fairness keys, the state tabs' counts, the
failure on top of a failed task's page, the badge of tasks no live worker serves, and one
app serving several namespaces with a switcher. Over HTTP, against a real redis-server."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from markupsafe import escape

from distsched import Scheduler, TaskSpec
from distsched.errors import InvalidArgument
from distsched.model import State
from distsched.ops.explain import SERVED_LIVE_S
from distsched.text import iso
from tests.conftest import RedisServer, require_extra
from tests.test_dashboard import TOKEN, csrf_of, fail, links, login

require_extra("starlette")
require_extra("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from distsched.dashboard import create_app, create_multi_app  # noqa: E402
from distsched.worker.link import WorkerLink  # noqa: E402
from distsched.worker.served import ServedFunctions  # noqa: E402

HOSTILE_NAME = "<img src=x onerror=alert(5)>"
HOSTILE_KEY = "<b>tenant</b>&"


@pytest.fixture
def read_only(scheduler: Scheduler) -> Iterator[TestClient]:
    with TestClient(create_app(scheduler)) as client:
        yield client


@pytest.fixture
def with_actions(scheduler: Scheduler) -> Iterator[TestClient]:
    with TestClient(create_app(scheduler, allow_actions=True, token=TOKEN)) as client:
        yield client


def row_of(page: str, attribute: str, value: str) -> str:
    """The table row whose ``attribute`` is ``value`` (as the page escapes it)."""
    found = re.search(
        rf'<tr [^>]*{attribute}="{re.escape(str(escape(value)))}">(.*?)</tr>', page, re.S
    )
    assert found is not None, f"no row {attribute}={value!r}"
    return found.group(1)


def cell(row: str, name: str) -> str:
    found = re.search(rf'<(td|span) class="{name}">(.*?)</\1>', row, re.S)
    assert found is not None, f"no {name} cell in {row}"
    return re.sub(r"<[^>]+>", " ", found.group(2)).split()[0] if found.group(2).strip() else ""


# --------------------------------------------------------------------------- schedules


@pytest.fixture
def with_schedules(scheduler: Scheduler) -> Scheduler:
    scheduler.add_schedule("hourly", "report", interval=3600)
    scheduler.add_schedule(HOSTILE_NAME, "step", interval=60, paused=True, key="acme")
    scheduler.trigger("hourly")
    return scheduler


def test_the_schedules_page_lists_every_schedule_with_its_next_fire_counters_and_state(
    read_only: TestClient, with_schedules: Scheduler
) -> None:
    page = read_only.get("/schedules").text
    hourly = with_schedules.get_schedule("hourly")
    row = row_of(page, "data-schedule", "hourly")
    assert "every 1 h 0 min" in row and "<code>report</code>" in row
    assert hourly.next_fire is not None
    assert iso(hourly.next_fire) in row
    assert re.search(r"in (59|60) min", row)
    assert (cell(row, "fired"), cell(row, "skipped"), cell(row, "missed")) == ("1", "0", "0")
    assert hourly.last_task is not None
    assert f'href="/task?id={hourly.last_task.replace("@", "%40")}"' in row
    assert 'class="badge schedule-active">active<' in row
    paused = row_of(page, "data-schedule", HOSTILE_NAME)
    assert 'class="badge schedule-paused">paused<' in paused
    assert cell(paused, "next-fire") == "-" and "<code>acme</code>" in paused
    assert HOSTILE_NAME not in page and str(escape(HOSTILE_NAME)) in page
    assert links(page).post == []  # read-only: no buttons


def test_a_cron_schedule_shows_its_expression_and_time_zone(
    read_only: TestClient, scheduler: Scheduler
) -> None:
    require_extra("cronsim")
    scheduler.add_schedule("weekdays", "f", cron="0 9 * * 1-5", tz="Europe/Paris")
    row = row_of(read_only.get("/schedules").text, "data-schedule", "weekdays")
    assert "<code>0 9 * * 1-5</code>" in row and "Europe/Paris" in row
    assert 'title="overlap policy: skip; catch-up: latest' in row


def test_an_empty_namespace_says_it_has_no_schedules(read_only: TestClient) -> None:
    assert "No schedules in this namespace." in read_only.get("/schedules").text


def test_schedule_buttons_show_only_to_a_logged_in_user(
    with_actions: TestClient, with_schedules: Scheduler
) -> None:
    page = with_actions.get("/schedules").text
    assert links(page).post == [] and "Log in" in page
    login(with_actions)
    page = with_actions.get("/schedules").text
    assert "Resume" in row_of(page, "data-schedule", HOSTILE_NAME)
    hourly = row_of(page, "data-schedule", "hourly")
    assert "Pause" in hourly and "Trigger now" in hourly and "Resume" not in hourly
    assert set(links(page).post) >= {"/schedules/pause", "/schedules/resume", "/schedules/trigger"}


def test_pause_resume_and_trigger_act_on_the_schedule_named(
    with_actions: TestClient, with_schedules: Scheduler
) -> None:
    s = with_schedules
    csrf = login(with_actions)

    def act(op: str, name: str) -> str:
        reply = with_actions.post(
            f"/schedules/{op}", data={"name": name, "csrf": csrf}, follow_redirects=False
        )
        assert reply.status_code == 303, reply.text
        return str(reply.headers["location"])

    assert act("pause", "hourly") == "/schedules?done=schedule-paused"
    assert s.get_schedule("hourly").paused and s.get_schedule("hourly").next_fire is None
    assert "Schedule paused" in with_actions.get("/schedules?done=schedule-paused").text
    assert act("resume", HOSTILE_NAME) == "/schedules?done=schedule-resumed"
    resumed = s.get_schedule(HOSTILE_NAME)
    assert not resumed.paused and resumed.next_fire is not None
    assert act("trigger", HOSTILE_NAME) == "/schedules?done=schedule-triggered"
    triggered = s.get_schedule(HOSTILE_NAME)
    assert triggered.fired == 1 and triggered.last_task is not None
    assert s.status(triggered.last_task).state is State.READY
    assert s.get_schedule("hourly").fired == 1  # the others are left alone
    # Its last run still queued, the overlap policy (skip) skips a run triggered now.
    assert act("trigger", HOSTILE_NAME) == "/schedules?done=schedule-skipped"
    assert s.get_schedule(HOSTILE_NAME).skipped == 1
    assert "overlap policy skipped" in with_actions.get("/schedules?done=schedule-skipped").text


def test_a_schedule_action_on_an_unknown_schedule_or_op_changes_nothing(
    with_actions: TestClient, with_schedules: Scheduler
) -> None:
    csrf = login(with_actions)
    before = with_schedules.schedules()
    assert (
        with_actions.post("/schedules/pause", data={"name": "nope", "csrf": csrf}).status_code
        == 404
    )
    assert (
        with_actions.post("/schedules/remove", data={"name": "hourly", "csrf": csrf}).status_code
        == 404
    )
    assert with_actions.post("/schedules/pause", data={"csrf": csrf}).status_code == 400
    assert with_schedules.schedules() == before


# ------------------------------------------------------------------ guards of the new actions

NEW_POSTS = [
    ("/schedules/pause", {"name": "hourly"}),
    ("/schedules/trigger", {"name": "hourly"}),
    ("/keys/set", {"key": "acme", "cap": "9", "weight": "9"}),
]


def unchanged(s: Scheduler) -> tuple[object, ...]:
    hourly = s.get_schedule("hourly")
    acme = s.key_info("acme")
    return hourly.paused, hourly.fired, hourly.skipped, acme.cap, acme.weight


@pytest.mark.parametrize(("path", "data"), NEW_POSTS)
def test_the_new_actions_are_refused_read_only_without_a_session_or_csrf_or_from_another_site(
    read_only: TestClient,
    with_actions: TestClient,
    with_schedules: Scheduler,
    path: str,
    data: dict[str, str],
) -> None:
    s = with_schedules
    s.set_key("acme", cap=2)
    before = unchanged(s)
    assert read_only.post(path, data={**data, "csrf": "x"}).status_code == 403
    assert with_actions.post(path, data={**data, "csrf": "x"}).status_code == 403  # no session
    csrf = login(with_actions)
    assert with_actions.post(path, data=data).status_code == 403
    assert with_actions.post(path, data={**data, "csrf": csrf + "x"}).status_code == 403
    other = TestClient(with_actions.app)
    assert with_actions.post(path, data={**data, "csrf": login(other)}).status_code == 403
    reply = with_actions.post(
        path, data={**data, "csrf": csrf}, headers={"sec-fetch-site": "cross-site"}
    )
    assert reply.status_code == 403 and "another site" in reply.text
    assert unchanged(s) == before
    # The same form, from the dashboard's own page, goes through.
    reply = with_actions.post(path, data={**data, "csrf": csrf}, follow_redirects=False)
    assert reply.status_code == 303
    assert unchanged(s) != before


# --------------------------------------------------------------------------- fairness keys


def test_the_keys_page_lists_every_key_idle_ones_included_with_cap_weight_and_rate(
    read_only: TestClient, scheduler: Scheduler
) -> None:
    scheduler.set_key("idle", cap=2, weight=3, rate=5, per=2)
    scheduler.set_key(HOSTILE_KEY, weight=4)
    scheduler.schedule_many([TaskSpec(f"b{i}", "step", key="busy") for i in range(3)])
    claims, _ = scheduler.claim(1, "w")
    assert [c.task_id for c in claims] == ["b0"]
    page = read_only.get("/keys").text
    idle = row_of(page, "data-key", "idle")
    assert 'class="badge turn idle">idle<' in idle
    assert (cell(idle, "running"), cell(idle, "queued"), cell(idle, "cap")) == ("0", "0", "2")
    assert cell(idle, "weight") == "3" and "5 per 2 s" in idle
    busy = row_of(page, "data-key", "busy")
    assert (cell(busy, "running"), cell(busy, "queued")) == ("1", "2")
    assert (cell(busy, "cap"), cell(busy, "rate")) == ("none", "none")
    # Units in the bucket of a key with a rate; a task's cost takes them.
    assert (cell(idle, "units"), cell(busy, "units")) == ("5", "-") and "5 of 5 left" in idle
    scheduler.schedule("heavy", fn="step", key="idle", cost=4)
    assert [c.task_id for c in scheduler.claim(1, "w")[0]] == ["heavy"]
    idle = row_of(read_only.get("/keys").text, "data-key", "idle")
    # 1 left, and 2.5 a second refill (5 per 2 s) while the page is read.
    assert cell(idle, "units") in ("1", "2", "3") and "of 5 left" in idle
    task_page = read_only.get("/task", params={"id": "heavy"}).text
    assert '<td data-field="cost">4 units of its key\'s rate</td>' in task_page
    hostile = row_of(page, "data-key", HOSTILE_KEY)
    assert cell(hostile, "weight") == "4" and HOSTILE_KEY not in page
    assert links(page).post == []
    # The overview shows the ten keys with the most work; the keys page every key.
    scheduler.schedule_many([TaskSpec(f"k{i}", "step", key=f"k{i:02d}") for i in range(12)])
    overview = read_only.get("/").text.split('id="keys"')[1]
    assert "idle" not in overview and "k00" in overview
    page = read_only.get("/keys").text
    assert 'data-key="idle"' in page and 'data-key="k11"' in page


def test_a_namespace_without_keys_says_it_is_not_fair(read_only: TestClient) -> None:
    page = read_only.get("/keys").text
    assert 'id="not-fair"' in page and 'id="keys"' not in page


def test_a_key_is_set_live_from_the_page(with_actions: TestClient, scheduler: Scheduler) -> None:
    scheduler.set_key("acme", cap=2)
    csrf = login(with_actions)
    page = with_actions.get("/keys").text
    assert 'name="cap"' in row_of(page, "data-key", "acme") and 'id="new-key"' in page
    reply = with_actions.post(
        "/keys/set",
        data={"csrf": csrf, "key": "acme", "cap": "7", "weight": "3", "rate": "10", "per": "2"},
        follow_redirects=False,
    )
    assert reply.headers["location"] == "/keys?done=key-set"
    info = scheduler.key_info("acme")
    assert (info.cap, info.weight, info.rate, info.per_s) == (7, 3, 10, 2.0)
    # Blank fields: no cap of its own, weight 1, no rate.
    with_actions.post("/keys/set", data={"csrf": csrf, "key": "acme", "cap": "", "rate": ""})
    info = scheduler.key_info("acme")
    assert (info.cap, info.weight, info.rate) == (None, 1, None)
    # A tenant with no work yet, from the form below the table.
    with_actions.post("/keys/set", data={"csrf": csrf, "key": "new tenant", "cap": "0"})
    assert scheduler.key_info("new tenant").cap == 0
    assert 'data-key="new tenant"' in with_actions.get("/keys").text
    # The default key (of tasks given none): a blank name.
    with_actions.post("/keys/set", data={"csrf": csrf, "key": "", "cap": "5"})
    assert scheduler.key_info("").cap == 5
    default = row_of(with_actions.get("/keys").text, "data-key", "")
    assert "tasks without a key" in default and cell(default, "cap") == "5"


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"cap": "x"}, "cap"),
        ({"cap": "-1"}, "cap"),
        ({"weight": "0"}, "weight"),
        ({"weight": "1.5"}, "weight"),
        ({"rate": "many"}, "rate"),
        ({"rate": "5", "per": "nan"}, "per"),
        ({"key": "k" * 5000}, "key"),
    ],
)
def test_bad_key_settings_are_refused_naming_the_field_and_nothing_is_written(
    with_actions: TestClient, scheduler: Scheduler, form: dict[str, str], field: str
) -> None:
    scheduler.set_key("acme", cap=2, weight=5)
    csrf = login(with_actions)
    reply = with_actions.post("/keys/set", data={"csrf": csrf, "key": "acme", **form})
    assert reply.status_code == 400
    message = re.search(r'id="error-message">([^<]*)<', reply.text)
    assert message is not None and message.group(1).startswith(field + ":"), reply.text
    info = scheduler.key_info("acme")
    assert (info.cap, info.weight, info.rate) == (2, 5, None)
    assert [k.key for k in scheduler.fair_keys()] == ["acme"]


# --------------------------------------------------------------------------- tabs, failures


def test_the_state_tabs_show_a_count_per_state(read_only: TestClient, scheduler: Scheduler) -> None:
    scheduler.submit_graph([TaskSpec("a", "f"), TaskSpec("b", "f", deps=["a"])])
    scheduler.schedule_many([TaskSpec(f"r{i}", "g") for i in range(3)])
    fail(scheduler, "a", "RuntimeError: boom")
    page = read_only.get("/tasks", params={"state": "failed"}).text
    counts = dict(re.findall(r'id="tab-count-(\w+)">([\d,]+)<', page))
    assert counts == {
        "pending": "0", "ready": "3", "running": "0", "succeeded": "0",
        "failed": "1", "cancelled": "0", "blocked": "1",
    }  # fmt: skip
    # The counts are of the namespace, whatever the function filter.
    page = read_only.get("/tasks", params={"state": "ready", "fn": "nope"}).text
    assert 'id="tab-count-ready">3<' in page and "every function" in page


def test_a_failed_task_shows_its_exception_at_the_top_and_the_traceback_further_down(
    read_only: TestClient, scheduler: Scheduler
) -> None:
    scheduler.schedule("t", fn="f", max_attempts=1)
    error = (
        "Traceback (most recent call last):\n"
        '  File "job.py", line 3, in run\n'
        "    raise ValueError(text)\n"
        "ValueError: bad <input> & more"
    )
    fail(scheduler, "t", error)
    page = read_only.get("/task", params={"id": "t"}).text
    top = re.search(r'id="exception">([^<]*)<', page)
    said = "ValueError: bad <input> & more (at job.py:3 in run)"
    assert top is not None and top.group(1) == str(escape(said))
    exception_at, traceback_at = page.index('id="exception"'), page.index('id="traceback"')
    assert exception_at < page.index("<h2>Record</h2>") < traceback_at
    assert page.index('id="to-traceback"') < traceback_at and 'id="error"' in page
    assert str(escape(error)) in page  # the whole traceback is still shown


def test_a_task_that_did_not_fail_has_no_failure_on_top(
    read_only: TestClient, scheduler: Scheduler
) -> None:
    scheduler.schedule("t", fn="f")
    assert 'id="exception"' not in read_only.get("/task", params={"id": "t"}).text


# --------------------------------------------------------------------------- unserved functions


def announce(s: Scheduler, functions: list[str]) -> None:
    """Announce ``functions`` as a live worker does."""
    ServedFunctions(WorkerLink(s), functions, 0.0).announce()


def test_queued_tasks_whose_function_no_live_worker_serves_carry_a_badge(
    read_only: TestClient, scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("served", fn="f")
    scheduler.schedule("orphan", fn="nobody")
    scheduler.schedule("stale", fn="gone")
    scheduler.submit_graph([TaskSpec("waits", "nobody", deps=["served"])])
    announce(scheduler, ["f"])
    # A worker that announced "gone" long ago, then stopped.
    long_ago = int((scheduler.server_time() - SERVED_LIVE_S - 5) * 1000)
    redis_client.hset(scheduler.keys.served, "gone", long_ago)

    def badged(state: str) -> set[str]:
        page = read_only.get("/tasks", params={"state": state}).text
        rows = re.findall(r"<tr><td>(.*?)</tr>", page, re.S)
        return {re.sub(r"<[^>]+>", " ", r).split()[0] for r in rows if "no worker serves it" in r}

    assert badged("ready") == {"orphan", "stale"}
    assert badged("pending") == {"waits"}
    for task_id, shown in [("orphan", True), ("stale", True), ("waits", True), ("served", False)]:
        page = read_only.get("/task", params={"id": task_id}).text
        assert ('id="unserved"' in page) is shown, task_id
    # Once a worker serves it, the badge goes.
    announce(scheduler, ["nobody"])
    assert badged("ready") == {"stale"}
    # A task that is no longer queued carries none.
    fail(scheduler, "served", "RuntimeError: x")
    assert badged("failed") == set()
    assert 'id="unserved"' not in read_only.get("/task", params={"id": "served"}).text


# --------------------------------------------------------------------------- several namespaces


@pytest.fixture
def two(redis_client: redis.Redis, namespace: str) -> Iterator[tuple[Scheduler, Scheduler]]:
    one = Scheduler(redis_client, namespace=namespace + "-one")
    other = Scheduler(redis_client, namespace=namespace + "-tr\u00e9s;2")
    yield one, other
    for s in (one, other):
        s.clear()
        s.close()


def test_one_app_serves_several_namespaces_each_under_its_path_with_a_switcher(
    two: tuple[Scheduler, Scheduler],
) -> None:
    one, other = two
    one.schedule("in-one", fn="f")
    other.schedule("in-other", fn="f")
    names = [one.namespace, other.namespace]
    with TestClient(create_multi_app(one, names)) as client:
        home = client.get("/", follow_redirects=False)
        assert home.status_code == 307 and home.headers["location"] == f"/ns/{one.namespace}/"
        assert home.headers["x-frame-options"] == "DENY"
        first = client.get(f"/ns/{one.namespace}/tasks?state=ready").text
        assert "in-one" in first and "in-other" not in first
        switch = dict(
            re.findall(r'<a href="([^"]+)" class="ns-link" data-namespace="([^"]+)"', first)
        )
        target = f"/ns/{quote_ns(other.namespace)}/tasks?state=ready"
        assert switch == {target: str(escape(other.namespace))}
        reply = client.get(target.replace("&amp;", "&"))
        assert reply.headers.get_list("x-frame-options") == ["DENY"]
        second = reply.text
        assert "in-other" in second and "in-one" not in second
        assert f'<li class="current">{escape(other.namespace)}</li>' in second
        for href in links(second).get:
            if not href.startswith(f"/ns/{quote_ns(one.namespace)}/"):
                assert href.startswith(f"/ns/{quote_ns(other.namespace)}/"), href
                assert client.get(href.replace("&amp;", "&")).status_code == 200, href
        # A task page leads to the other namespace's overview.
        page = client.get(f"/ns/{one.namespace}/task?id=in-one").text
        assert f'href="/ns/{quote_ns(other.namespace)}/"' in page


def quote_ns(namespace: str) -> str:
    from urllib.parse import quote

    return quote(namespace, safe="")


def test_a_session_of_one_namespace_cannot_act_in_another(
    two: tuple[Scheduler, Scheduler],
) -> None:
    one, other = two
    other.schedule("victim", fn="f")
    one.schedule("mine", fn="f")
    names = [one.namespace, other.namespace]
    app = create_multi_app(one, names, allow_actions=True, token=TOKEN)
    with TestClient(app) as client:
        mine = f"/ns/{one.namespace}"
        theirs = f"/ns/{quote_ns(other.namespace)}"
        csrf = login(client, mine)
        assert (
            client.post(f"{theirs}/actions/cancel", data={"id": "victim", "csrf": csrf}).status_code
            == 403
        )
        assert other.status("victim").state is State.READY
        assert 'id="action-cancel"' not in client.get(f"{theirs}/task?id=victim").text
        reply = client.post(
            f"{mine}/actions/cancel", data={"id": "mine", "csrf": csrf}, follow_redirects=False
        )
        assert reply.status_code == 303 and one.status("mine").state is State.CANCELLED
        # Logging in there too: the cookie of each is sent to its own path only.
        theirs_csrf = csrf_of_login(client, theirs)
        reply = client.post(
            f"{theirs}/actions/cancel", data={"id": "victim", "csrf": theirs_csrf},
            follow_redirects=False,
        )  # fmt: skip
        assert reply.status_code == 303 and other.status("victim").state is State.CANCELLED


def csrf_of_login(client: TestClient, prefix: str) -> str:
    reply = client.post(f"{prefix}/login", data={"token": TOKEN}, follow_redirects=False)
    assert reply.status_code == 303
    assert f"Path={prefix}/" in reply.headers["set-cookie"]
    return csrf_of(client.get(f"{prefix}/").text)


def test_a_url_multi_app_opens_and_closes_its_own_connection(
    redis_server: RedisServer, two: tuple[Scheduler, Scheduler]
) -> None:
    one, other = two
    one.schedule("x", fn="f")
    with TestClient(create_multi_app(redis_server.url, [other.namespace, one.namespace])) as client:
        assert client.get("/", follow_redirects=True).status_code == 200
        assert "/task?id=x" in client.get(f"/ns/{one.namespace}/tasks?state=ready").text


def test_create_multi_app_checks_its_namespaces(scheduler: Scheduler) -> None:
    for bad, field in [([], "namespaces"), (["a/b"], "namespaces"), (["a%b"], "namespaces"),
                       (["a{b}"], "namespace"), ([""], "namespace")]:  # fmt: skip
        with pytest.raises(InvalidArgument, match=f"^{field}:"):
            create_multi_app(scheduler, bad)
    with pytest.raises(InvalidArgument, match="AsyncScheduler"):
        create_multi_app(object(), ["a"])  # type: ignore[arg-type]
