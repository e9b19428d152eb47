"""The web dashboard over HTTP: pages, actions, escaping, sessions, mounting, bounded reads."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from markupsafe import escape

from distsched import Scheduler, TaskSpec
from distsched.errors import InvalidArgument
from distsched.model import State, WorkerInfo
from tests.conftest import CLI_COMMAND, RedisServer, free_port, require_extra, subprocess_env

require_extra("starlette")
require_extra("jinja2")

from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from distsched.dashboard import create_app  # noqa: E402
from distsched.worker.link import WorkerLink  # noqa: E402

TOKEN = "correct horse battery staple, and a staple more"
HOSTILE_ID = "<script>alert(1)</script>"
HOSTILE_FN = '<img src=x onerror="alert(2)">'
HOSTILE_ERROR = "RuntimeError: <script>alert(3)</script> & 'quotes'"
ODD_ID = "a/b?c=d&e#f g\u00e9\u2603"


class Links(HTMLParser):
    """Every link, script, stylesheet and form target of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.get: list[str] = []
        self.post: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for name in ("href", "src"):
            if a.get(name):
                self.get.append(str(a[name]))
        if tag == "form" and a.get("action"):
            (self.post if a.get("method") == "post" else self.get).append(str(a["action"]))


def links(page: str) -> Links:
    parser = Links()
    parser.feed(page)
    return parser


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def fail(s: Scheduler, task_id: str, error: str) -> None:
    claim = s.next("w-" + task_id)
    assert not isinstance(claim, type(None))
    assert getattr(claim, "task_id", None) == task_id, claim
    s.fail(claim, error)  # type: ignore[arg-type]


def register(s: Scheduler, worker_id: str) -> None:
    counts = {"claimed": 3, "succeeded": 2}
    info = WorkerInfo(
        worker_id, "host-1", 4242, "0.1.0", 4, ("step", HOSTILE_FN), 0.0, 0.0, 1, counts, 1.0, 5.0
    )
    WorkerLink(s).register_worker(info)


@pytest.fixture
def story(scheduler: Scheduler) -> Scheduler:
    """A failed task that blocked two dependents (one with a hostile id), a running
    task, queued work and a registered worker."""
    scheduler.submit_graph(
        [
            TaskSpec("extract", "step", args=["x" * 5000]),
            TaskSpec(HOSTILE_ID, HOSTILE_FN, deps=["extract"], kwargs={"k": "<b>v</b>"}),
            TaskSpec(ODD_ID, "step", deps=[HOSTILE_ID]),
        ]
    )
    fail(
        scheduler, "extract", f'Traceback (most recent call last):\n  File "a.py"\n{HOSTILE_ERROR}'
    )
    scheduler.schedule("busy", fn="step")
    claim = scheduler.next("worker-<i>1</i>")
    assert getattr(claim, "task_id", None) == "busy"
    scheduler.schedule("later", fn="step", delay=3600)
    register(scheduler, "worker-<i>1</i>")
    return scheduler


@pytest.fixture
def read_only(story: Scheduler) -> Iterator[TestClient]:
    with TestClient(create_app(story)) as client:
        yield client


@pytest.fixture
def with_actions(story: Scheduler) -> Iterator[TestClient]:
    with TestClient(create_app(story, allow_actions=True, token=TOKEN)) as client:
        yield client


def login(client: TestClient, prefix: str = "") -> str:
    """Log in with the token; return the session's CSRF token."""
    reply = client.post(f"{prefix}/login", data={"token": TOKEN}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return csrf_of(client.get(f"{prefix}/").text)


PAGES = [
    "/", "/tasks?state=failed", "/tasks?state=blocked", "/tasks?state=ready",
    "/tasks?state=running", "/task?id=extract", "/leases", "/workers", "/api/overview",
    "/api/task?id=extract", "/schedules", "/keys",
]  # fmt: skip


# --------------------------------------------------------------------------- pages


@pytest.mark.parametrize("path", PAGES)
def test_every_page_answers_200(read_only: TestClient, path: str) -> None:
    reply = read_only.get(path)
    assert reply.status_code == 200, reply.text
    assert reply.headers["cache-control"] == "no-store"


def test_overview_shows_the_counts_per_state_and_the_fleet(read_only: TestClient) -> None:
    page = read_only.get("/").text
    assert re.search(r'id="count-failed">1<', page)
    assert re.search(r'id="count-blocked">2<', page)
    assert re.search(r'id="count-running">1<', page)
    # The one queued task ("later") is not due yet: scheduled, not ready.
    assert re.search(r'id="count-scheduled">1<', page)
    assert re.search(r'id="count-ready">0<', page)
    assert re.search(r'id="hour-failed">1<', page) and re.search(r'id="day-failed">1<', page)
    assert 'aria-label="last hour: 0 succeeded, 1 failed"' in page
    assert 'aria-label="last day: 0 succeeded, 1 failed"' in page
    data = read_only.get("/api/overview").json()
    assert data["data"]["hour"] == {"succeeded": 0, "failed": 1}
    assert 'aria-label="last hour: 0 succeeded, 1 failed"' in data["svgs"]["hour"]
    assert data["data"]["counts"]["blocked"] == 2
    assert data["data"]["workers_alive"] == 1
    assert data["fields"]["count-failed"] == "1"


HOSTILE_KEY = "<img src=x onerror=alert(4)>&"


def test_the_overview_of_a_keyed_namespace_shows_its_keys_as_text(scheduler: Scheduler) -> None:
    with TestClient(create_app(scheduler)) as client:
        scheduler.schedule("plain", fn="step")
        assert 'id="keys"' not in client.get("/").text  # not fair: no table
        scheduler.set_key(HOSTILE_KEY, cap=3)
        scheduler.schedule_many([TaskSpec(f"h{i}", "step", key=HOSTILE_KEY) for i in range(4)])
        scheduler.schedule("t0", fn="step", key="tenant:1")
        claims, _ = scheduler.claim(3, "w")
        assert sorted(c.task_id for c in claims) == ["h0", "plain", "t0"]
        page = client.get("/").text
        assert 'id="keys"' in page
        assert "<img src=x" not in page
        escaped = "&lt;img src=x onerror=alert(4)&gt;&amp;"
        row = re.search(
            r'data-field="key-0-key">([^<]*)</code></td>\s*'
            r'<td data-field="key-0-running">(\d+)</td>\s*'
            r'<td data-field="key-0-queued">(\d+)</td>\s*'
            r'<td data-field="key-0-cap">(\w+)</td>',
            page,
        )
        assert row is not None, page
        assert row.groups() in {(escaped, "1", "3", "3"), ("tenant:1", "1", "0", "none")}
        assert escaped in page and "tenant:1" in page
        data = client.get("/api/overview").json()
        loads = {load["key"]: load for load in data["data"]["keys"]}
        assert (loads[HOSTILE_KEY]["running"], loads[HOSTILE_KEY]["queued"]) == (1, 3)
        assert loads[HOSTILE_KEY]["cap"] == 3
        shown = {data["fields"][f"key-{i}-key"] for i in range(3)}
        assert {HOSTILE_KEY, "tenant:1"} <= shown  # raw in JSON: the page sets it as text


def test_the_task_page_shows_the_traceback_and_the_dependents_it_blocked(
    read_only: TestClient,
) -> None:
    page = read_only.get("/task?id=extract").text
    assert 'id="traceback"' in page
    assert escape(HOSTILE_ERROR) in page
    blocked = page.split('id="blocked-dependents"')[1].split("</ul>")[0]
    assert escape(HOSTILE_ID) in blocked and escape(ODD_ID) in blocked
    # The graph marks the blocking path and colours the states.
    assert page.count('class="edge blocking"') == 2
    assert 'data-state="failed"' in page and 'data-state="blocked"' in page
    # The attempt history: one attempt, failed, by the worker that claimed it.
    attempts = page.split('id="attempts"')[1].split("</table>")[0]
    assert attempts.count("<tr>") == 2 and "w-extract" in attempts and ">failed<" in attempts
    # The payload's size and a preview of it.
    assert re.search(r'id="payload-size">50\d\d bytes', page)


def test_a_running_task_shows_its_lease_holder_and_time_left(read_only: TestClient) -> None:
    page = read_only.get("/task?id=busy").text
    assert escape("worker-<i>1</i>") in page
    assert re.search(r'data-field="lease_left">[0-9.]+ s<', page)
    fields = read_only.get("/api/task", params={"id": "busy"}).json()["fields"]
    assert fields["state"] == "running" and fields["worker"] == "worker-<i>1</i>"


def test_the_leases_and_workers_pages_list_them(read_only: TestClient) -> None:
    leases = read_only.get("/leases").text
    assert "/task?id=busy" in leases and "1 lease," in leases
    assert escape("worker-<i>1</i>") in leases
    workers = read_only.get("/workers").text
    assert escape("worker-<i>1</i>") in workers and "host-1 / 4242" in workers


def test_an_unknown_task_is_404_and_a_missing_id_400(read_only: TestClient) -> None:
    assert read_only.get("/task", params={"id": "nope"}).status_code == 404
    assert read_only.get("/api/task", params={"id": "nope"}).status_code == 404
    assert read_only.get("/task").status_code == 400


def test_the_task_lists_page_by_state_with_a_function_filter(
    read_only: TestClient, story: Scheduler
) -> None:
    story.schedule_many([TaskSpec(f"many{i:03d}", "bulk", delay=60) for i in range(120)])

    def ids_on(page: str) -> list[str]:
        hrefs = [h for h in links(page).get if h.startswith("/task?")]
        return [parse_qs(urlsplit(h).query)["id"][0] for h in hrefs]

    page = read_only.get("/tasks", params={"state": "ready", "fn": "bulk"}).text
    assert ids_on(page) == [f"many{i:03d}" for i in range(50)]  # due order
    seen = ids_on(page)
    while (nxt := re.search(r'href="([^"]+)" id="next-page"', page)) is not None:
        page = read_only.get(nxt.group(1).replace("&amp;", "&")).text
        seen += ids_on(page)
    assert seen == [f"many{i:03d}" for i in range(120)]
    blocked = read_only.get("/tasks", params={"state": "blocked"}).text
    assert escape(HOSTILE_ID) in blocked and "many000" not in blocked
    failed = read_only.get("/tasks", params={"state": "failed"}).text
    assert escape(HOSTILE_ERROR) in failed
    assert read_only.get("/tasks", params={"state": "nope"}).status_code == 400
    assert read_only.get("/tasks", params={"state": "ready", "cursor": "junk"}).status_code == 400


# --------------------------------------------------------------------------- escaping


@pytest.mark.parametrize("path", [*PAGES, f"/task?id={HOSTILE_ID}", "/task?id=%3Cb%3Ex"])
def test_hostile_ids_functions_and_errors_render_as_text(
    with_actions: TestClient, path: str
) -> None:
    login(with_actions)
    reply = with_actions.get(path)
    for raw in ("<script>alert", "<img src=x", "<i>1</i>", "<b>v</b>", "<b>x"):
        assert raw not in reply.text


@pytest.mark.parametrize("path", ["/", "/task?id=extract", "/api/overview", "/login"])
def test_pages_run_no_inline_script_and_cannot_be_framed(
    with_actions: TestClient, path: str
) -> None:
    reply = with_actions.get(path)
    policy = reply.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert reply.headers["x-frame-options"] == "DENY"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in reply.text


def test_links_to_tasks_percent_encode_any_id(read_only: TestClient) -> None:
    page = read_only.get("/task", params={"id": HOSTILE_ID}).text
    hrefs = [h for h in links(page).get if h.startswith("/task?")]
    ids = {parse_qs(urlsplit(h).query)["id"][0] for h in hrefs}
    assert ODD_ID in ids and "extract" in ids
    odd = next(h for h in hrefs if parse_qs(urlsplit(h).query)["id"][0] == ODD_ID)
    assert "/" not in odd.split("?", 1)[1] and "#" not in odd and " " not in odd
    target = read_only.get(odd)
    assert target.status_code == 200
    assert f'<code id="task-id">{escape(ODD_ID)}</code>' in target.text


# --------------------------------------------------------------------------- actions


def test_read_only_renders_no_action_and_refuses_every_post(
    read_only: TestClient, story: Scheduler
) -> None:
    for path in PAGES:
        if not path.startswith("/api/"):
            assert links(read_only.get(path).text).post == []
    assert read_only.get("/login").status_code == 404
    for action in ("retry", "cancel", "expire"):
        reply = read_only.post(f"/actions/{action}", data={"id": "extract", "csrf": "x"})
        assert reply.status_code == 403
    assert read_only.post("/login", data={"token": TOKEN}).status_code == 403
    assert story.status("extract").state is State.FAILED


def test_actions_are_refused_without_a_session(with_actions: TestClient, story: Scheduler) -> None:
    page = with_actions.get("/task?id=extract").text
    assert 'id="action-retry"' not in page and "Log in" in page
    reply = with_actions.post("/actions/retry", data={"id": "extract", "csrf": "x"})
    assert reply.status_code == 403
    assert story.status("extract").version == 1


def test_a_wrong_token_does_not_log_in(with_actions: TestClient) -> None:
    reply = with_actions.post("/login", data={"token": TOKEN + "x"}, follow_redirects=False)
    assert reply.status_code == 403 and "Wrong token" in reply.text
    assert "set-cookie" not in reply.headers


def test_the_session_cookie_is_signed_http_only_and_same_site_strict(
    with_actions: TestClient,
) -> None:
    reply = with_actions.post("/login", data={"token": TOKEN}, follow_redirects=False)
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    forged = value[:-1] + ("0" if value[-1] != "0" else "1")
    with_actions.cookies.clear()
    with_actions.cookies.set("distsched_dashboard", forged)
    assert 'id="logout"' not in with_actions.get("/").text
    assert with_actions.post("/actions/retry", data={"id": "extract"}).status_code == 403


def test_actions_need_the_csrf_token_of_their_own_session(
    with_actions: TestClient, story: Scheduler
) -> None:
    csrf = login(with_actions)
    other = TestClient(with_actions.app)
    other_csrf = login(other)
    assert other_csrf != csrf
    for data in (
        {"id": "extract"},
        {"id": "extract", "csrf": ""},
        {"id": "extract", "csrf": other_csrf},
    ):
        assert with_actions.post("/actions/retry", data=data).status_code == 403
    assert story.status("extract").version == 1


def test_retry_gives_a_new_version_and_the_blocked_dependents_wait_again(
    with_actions: TestClient, story: Scheduler
) -> None:
    csrf = login(with_actions)
    page = with_actions.get("/task?id=extract").text
    assert 'id="action-retry"' in page
    reply = with_actions.post(
        "/actions/retry", data={"id": "extract", "csrf": csrf}, follow_redirects=False
    )
    assert reply.status_code == 303
    assert reply.headers["location"] == "/task?id=extract&done=retried"
    assert story.status("extract").state is State.READY
    assert story.status(HOSTILE_ID).state is State.PENDING
    assert "Retried as a new version." in with_actions.get(reply.headers["location"]).text


def test_cancel_and_expire_act_on_the_task_named(
    with_actions: TestClient, story: Scheduler
) -> None:
    csrf = login(with_actions)
    reply = with_actions.post("/actions/cancel", data={"id": "later", "csrf": csrf})
    assert reply.status_code == 200 and story.status("later").state is State.CANCELLED
    with_actions.post("/actions/expire", data={"id": "busy", "csrf": csrf})
    # One attempt only: the expired lease fails the task.
    assert story.status("busy").state is State.FAILED
    story.schedule("queued", fn="step")
    reply = with_actions.post("/actions/retry", data={"id": "queued", "csrf": csrf})
    assert "Not possible in the task" in reply.text
    reply = with_actions.post("/actions/retry", data={"id": "nope", "csrf": csrf})
    assert reply.status_code == 404


def test_bulk_retry_retries_the_failed_tasks_of_one_page(
    with_actions: TestClient, story: Scheduler
) -> None:
    for i in range(60):
        story.schedule(f"bad{i:02d}", fn="flaky")
        fail(story, f"bad{i:02d}", "RuntimeError: no")
    csrf = login(with_actions)
    page = with_actions.get("/tasks", params={"state": "failed", "fn": "flaky"}).text
    assert 'id="action-retry-page"' in page
    reply = with_actions.post(
        "/actions/retry-failed", data={"csrf": csrf, "fn": "flaky"}, follow_redirects=False
    )
    assert reply.status_code == 303
    assert reply.headers["location"] == "/tasks?state=failed&fn=flaky&done=bulk-retried"
    states = [story.status(f"bad{i:02d}").state for i in range(60)]
    # One page of 50, and only the function filtered on.
    assert states.count(State.READY) == 50 and states.count(State.FAILED) == 10
    assert story.status("extract").state is State.FAILED
    assert with_actions.post("/actions/retry-failed", data={"fn": "flaky"}).status_code == 403


def test_purge_removes_the_ended_tasks_of_one_page(
    with_actions: TestClient, story: Scheduler
) -> None:
    csrf = login(with_actions)
    page = with_actions.get("/tasks", params={"state": "blocked"}).text
    assert 'id="action-purge-page"' in page and "data-confirm=" in page
    assert 'id="action-purge-page"' not in with_actions.get("/tasks?state=ready").text
    reply = with_actions.post(
        "/actions/purge-page", data={"csrf": csrf, "state": "blocked"}, follow_redirects=False
    )
    assert reply.headers["location"] == "/tasks?state=blocked&done=purged"
    assert story.stats()["counts"]["blocked"] == 0
    assert story.status("extract").state is State.FAILED
    refused = with_actions.post("/actions/purge-page", data={"csrf": csrf, "state": "ready"})
    assert refused.status_code == 400
    assert story.stats()["counts"]["ready"] == 1


def test_logging_out_ends_the_session(with_actions: TestClient) -> None:
    csrf = login(with_actions)
    assert with_actions.post("/logout", data={"csrf": csrf}).status_code == 200
    assert 'id="logout"' not in with_actions.get("/").text
    assert (
        with_actions.post("/actions/retry", data={"id": "extract", "csrf": csrf}).status_code == 403
    )


def test_create_app_checks_its_arguments(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidArgument, match="token"):
        create_app(scheduler, allow_actions=True)
    with pytest.raises(InvalidArgument, match="token"):
        create_app(scheduler, allow_actions=True, token="short")
    with pytest.raises(InvalidArgument, match="namespace"):
        create_app(scheduler, "another")
    with pytest.raises(InvalidArgument, match="AsyncScheduler"):
        create_app(object())  # type: ignore[arg-type]


def test_a_url_app_reads_its_namespace_and_answers_503_when_redis_is_down(
    redis_server: RedisServer, story: Scheduler
) -> None:
    with TestClient(create_app(redis_server.url, story.namespace)) as client:
        assert re.search(r'id="count-failed">1<', client.get("/").text)
    with TestClient(create_app(f"redis://127.0.0.1:{free_port()}/0", "x")) as client:
        assert client.get("/").status_code == 503
        assert client.get("/api/overview").status_code == 503


# --------------------------------------------------------------------------- mounting


def test_mounted_under_a_prefix_every_link_works(story: Scheduler) -> None:
    prefix = "/ops/queue"
    outer = Starlette(
        routes=[Mount(prefix, app=create_app(story, allow_actions=True, token=TOKEN))]
    )
    with TestClient(outer) as client:
        csrf = login(client, prefix)
        seen: set[str] = set()
        todo = [f"{prefix}/", f"{prefix}/task?id=extract", f"{prefix}/task?id=busy"]
        posts: set[str] = set()
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            reply = client.get(path)
            assert reply.status_code == 200, path
            if "text/html" not in reply.headers["content-type"]:
                continue
            found = links(reply.text)
            for href in found.get:
                assert href.startswith(prefix + "/"), (path, href)
                if len(seen) + len(todo) < 60:
                    todo.append(href)
            posts.update(found.post)
        assert all(p.startswith(prefix + "/") for p in posts)
        assert {f"{prefix}/actions/retry", f"{prefix}/logout"} <= posts
        assert f"{prefix}/static/dashboard.js" in seen
        reply = client.post(
            f"{prefix}/actions/retry", data={"id": "extract", "csrf": csrf}, follow_redirects=False
        )
        assert reply.headers["location"] == f"{prefix}/task?id=extract&done=retried"
        assert story.status("extract").state is State.READY


# --------------------------------------------------------------------------- bounded reads


def commands_sent(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def page_costs(server: RedisServer, filler: int) -> dict[str, int]:
    """Redis commands each page sends, with ``filler`` more ready tasks in the namespace."""
    client = server.client()
    s = Scheduler(client, namespace=f"bounded{filler}", lease_s=30.0)
    s.submit_graph([TaskSpec("extract", "f"), TaskSpec("child", "f", deps=["extract"])])
    fail(s, "extract", "RuntimeError: boom")
    for i in range(3):
        s.schedule(f"run{i}", fn="f")
        assert getattr(s.next(f"w{i}"), "task_id", None) == f"run{i}"
    register(s, "w0")
    for start in range(0, filler, 1000):
        s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(start, min(filler, start + 1000))])
    costs: dict[str, int] = {}
    with TestClient(create_app(s)) as web:
        for path in [*PAGES, "/task?id=child", "/task?id=run0", "/api/task?id=t1"]:
            assert web.get(path).status_code == 200  # scripts loaded, pools warm
            before = commands_sent(client)
            assert web.get(path).status_code == 200
            costs[path] = commands_sent(client) - before
    s.close()
    client.close()
    return costs


def test_no_page_sends_more_redis_commands_with_5000_tasks_than_with_20(
    own_redis: RedisServer,
) -> None:
    small = page_costs(own_redis, 20)
    large = page_costs(own_redis, 5000)
    # Never more with more tasks. A short listing may read one part more than a full one
    # (the ready list goes on to the fairness keys' entries once the queue ends early).
    assert large.keys() == small.keys()
    grown = {page: (small[page], large[page]) for page in small if large[page] > small[page]}
    assert grown == {}
    assert all(small[page] - large[page] <= 1 for page in small), (small, large)
    assert max(small.values()) < 100


# --------------------------------------------------------------------------- command line


def test_the_dashboard_command_serves_the_namespace(
    redis_server: RedisServer, story: Scheduler
) -> None:
    import httpx2

    port = free_port()
    proc = subprocess.Popen(
        [*CLI_COMMAND, "--redis", redis_server.url, "--namespace", story.namespace,
         "dashboard", "--port", str(port)],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = httpx2.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx2.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.1)
        assert reply.status_code == 200
        assert re.search(r'id="count-failed">1<', reply.text)
        assert "read-only" in reply.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/ (read-only)" in out


def test_the_dashboard_command_serves_other_namespaces_beside_it_with_a_switcher(
    redis_server: RedisServer, story: Scheduler
) -> None:
    import httpx2

    port = free_port()
    proc = subprocess.Popen(
        [*CLI_COMMAND, "--redis", redis_server.url, "--namespace", story.namespace,
         "dashboard", "--port", str(port), "--also", "other-ns"],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                first = httpx2.get(f"http://127.0.0.1:{port}/", timeout=5, follow_redirects=True)
                break
            except httpx2.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.1)
        other = httpx2.get(f"http://127.0.0.1:{port}/ns/other-ns/", timeout=5)
        assert first.status_code == other.status_code == 200
        assert re.search(r'id="count-failed">1<', first.text)
        assert re.search(r'id="count-failed">0<', other.text)
        assert "/ns/other-ns/" in first.text  # the switcher leads there
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"'{story.namespace}', 'other-ns' on http://127.0.0.1:{port}/" in out


def test_the_dashboard_command_refuses_actions_without_a_long_enough_token(
    redis_server: RedisServer,
) -> None:
    done = subprocess.run(
        [*CLI_COMMAND, "--redis", redis_server.url, "dashboard", "--allow-actions"],
        env=subprocess_env(DISTSCHED_DASHBOARD_TOKEN=None), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--allow-actions needs --token" in done.stderr
    short = subprocess.run(
        [*CLI_COMMAND, "--redis", redis_server.url, "dashboard", "--allow-actions"],
        env=subprocess_env(DISTSCHED_DASHBOARD_TOKEN="short"), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert short.returncode == 1
    assert "invalid --token: must be at least 32 characters" in short.stderr


# --------------------------------------------------------------------------- demo


def test_the_demo_serves_the_dashboard_on_what_it_ran_then_cleans_up(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    import httpx2

    from distsched.tools.demo import DashboardOptions, run_demo

    seen: dict[str, str] = {}

    def look(url: str) -> None:
        seen["url"] = url
        seen["overview"] = httpx2.get(url + "/", timeout=10).text
        seen["task"] = httpx2.get(url + "/task", params={"id": "transform-b"}, timeout=10).text

    lines: list[str] = []
    assert run_demo(redis_server.url, lines.append, DashboardOptions(port=0, until=look))
    assert re.search(r'id="count-succeeded">\d+<', seen["overview"])
    assert '<code id="task-id">transform-b</code>' in seen["task"]
    assert f"Dashboard of what the demo ran: {seen['url']}/" in lines
    namespace = re.search(r"namespace '(demo-[0-9a-f]+)'", "\n".join(lines))
    assert namespace is not None
    assert not list(redis_client.scan_iter(match=f"ds:{{{namespace.group(1)}}}:*"))


def test_the_demo_says_how_to_open_the_dashboard(redis_server: RedisServer) -> None:
    from distsched.tools.demo import run_demo

    lines: list[str] = []
    assert run_demo(redis_server.url, lines.append)
    assert any("distsched demo --dashboard" in line for line in lines[-3:])
