"""The dashboard against a hostile network and hostile stored data: login limits, token
strength, a warning when actions are exposed, POSTs from other sites, and task pages that
stay bounded and render whatever a task holds."""

from __future__ import annotations

import html
import logging
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import markupsafe
import msgpack
import pytest

from distsched import Scheduler
from distsched.errors import InvalidArgument
from distsched.wire.records import id_prefix
from tests.conftest import (
    CLI_COMMAND,
    CliProcess,
    RedisServer,
    free_port,
    put_payload,
    require_extra,
    subprocess_env,
)

require_extra("starlette")
require_extra("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from distsched.dashboard import auth, create_app, reads, serve  # noqa: E402
from distsched.dashboard.auth import LoginLimiter, check_token  # noqa: E402

TOKEN = secrets.token_urlsafe(32)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(scheduler: Scheduler, clock: Clock) -> Any:
    scheduler.schedule("t1", fn="step")
    app = create_app(scheduler, allow_actions=True, token=TOKEN)
    app.state.dashboard.limiter = LoginLimiter(clock=clock)
    return app


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


def log_in(client: TestClient, token: str = TOKEN, **headers: str) -> Any:
    return client.post("/login", data={"token": token}, headers=headers, follow_redirects=False)


def csrf(client: TestClient) -> str:
    page = client.get("/task?id=t1").text
    return page.split('name="csrf" value="')[1].split('"')[0]


# --------------------------------------------------------------------------- login limit


def test_after_five_failed_logins_a_client_waits_and_is_answered_429_with_retry_after(
    client: TestClient, clock: Clock
) -> None:
    for _ in range(auth.FREE_FAILURES - 1):
        reply = log_in(client, "wrong")
        assert reply.status_code == 403 and "retry-after" not in reply.headers
    reply = log_in(client, "wrong")
    assert reply.status_code == 403 and reply.headers["retry-after"] == "1"
    # Locked: even the right token is not looked at, and no session is given.
    reply = log_in(client)
    assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
    assert "Too many failed logins" in reply.text and "set-cookie" not in reply.headers
    clock.now += 1.0
    assert log_in(client, "wrong").headers["retry-after"] == "2"  # doubled by each failure
    clock.now += 1.5
    assert log_in(client).status_code == 429
    clock.now += 0.5
    assert log_in(client, "wrong").headers["retry-after"] == "4"
    clock.now += 4.0
    assert log_in(client).status_code == 303  # the right token, after the wait


def test_a_successful_login_forgets_the_failures_and_other_clients_are_not_limited(
    app: Any, client: TestClient, clock: Clock
) -> None:
    for _ in range(auth.FREE_FAILURES):
        log_in(client, "wrong")
    assert log_in(client).status_code == 429
    with TestClient(app, client=("10.0.0.7", 40000)) as other:
        assert log_in(other).status_code == 303
    clock.now += 1.0
    assert log_in(client).status_code == 303
    # Counted from zero again: the first failures cost no wait.
    for _ in range(auth.FREE_FAILURES - 1):
        reply = log_in(client, "wrong")
        assert reply.status_code == 403 and "retry-after" not in reply.headers
    assert len(app.state.dashboard.limiter) == 1


def test_the_wait_grows_to_its_cap_and_a_quiet_client_is_forgotten(clock: Clock) -> None:
    limiter = LoginLimiter(clock=clock)
    waits = [limiter.failed("192.0.2.1") for _ in range(40)]
    assert waits[: auth.FREE_FAILURES - 1] == [0.0] * (auth.FREE_FAILURES - 1)
    assert waits[auth.FREE_FAILURES - 1 : auth.FREE_FAILURES + 2] == [1.0, 2.0, 4.0]
    assert max(waits) == waits[-1] == auth.LOCK_MAX_S
    clock.now += auth.FORGET_S + auth.LOCK_MAX_S + 1
    assert limiter.wait("192.0.2.1") == 0.0
    assert limiter.failed("192.0.2.1") == 0.0  # counted from zero again


def test_the_table_of_clients_is_bounded_and_an_ipv6_prefix_is_one_client(clock: Clock) -> None:
    limiter = LoginLimiter(max_clients=100, clock=clock)
    for i in range(5000):
        limiter.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
        assert len(limiter) <= 100
    # The most recent clients are the ones remembered.
    assert limiter.wait("10.0.19.135") == 0.0 and len(limiter) == 100
    fresh = LoginLimiter(clock=clock)
    for i in range(auth.FREE_FAILURES):
        fresh.failed(f"2001:db8:1:2::{i + 1:x}")
    assert fresh.wait("2001:db8:1:2:ffff::9") == 1.0 and len(fresh) == 1
    assert fresh.wait("2001:db8:1:3::1") == 0.0
    assert LoginLimiter.client_key("::ffff:192.0.2.1") == "192.0.2.1"


# --------------------------------------------------------------------------- token strength


@pytest.mark.parametrize(
    "token",
    [
        "short",
        secrets.token_urlsafe(32)[:31],
        "a" * 64,
        "ab" * 40,
        "abcdefghij" * 4,
        "0123456" * 10,
    ],
)
def test_a_weak_token_is_refused_with_how_to_make_one(token: str, scheduler: Scheduler) -> None:
    with pytest.raises(InvalidArgument, match=r"token.*secrets\.token_urlsafe\(32\)"):
        check_token(token)
    with pytest.raises(InvalidArgument, match="token"):
        create_app(scheduler, allow_actions=True, token=token)


@pytest.mark.parametrize(
    "token",
    [secrets.token_urlsafe(32), secrets.token_hex(16), secrets.token_hex(24), TOKEN],
)
def test_a_random_token_of_32_characters_or_more_is_accepted(token: str) -> None:
    assert check_token(token) == token


def test_the_dashboard_command_refuses_a_weak_token_saying_how_to_make_one(
    redis_server: RedisServer,
) -> None:
    done = subprocess.run(
        [*CLI_COMMAND, "--redis", redis_server.url, "dashboard", "--allow-actions"],
        env=subprocess_env(DISTSCHED_DASHBOARD_TOKEN="x" * 40), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "invalid --token: has fewer than 8 different characters" in done.stderr
    assert "secrets.token_urlsafe(32)" in done.stderr


# --------------------------------------------------------------------------- exposed actions


@pytest.mark.parametrize(
    ("bind", "actions", "warns"),
    [
        ("127.0.0.1", True, False),
        ("127.0.0.2", True, False),
        ("::1", True, False),
        ("localhost", True, False),
        ("0.0.0.0", True, True),
        ("::", True, True),
        ("192.0.2.10", True, True),
        ("dashboard.example.com", True, True),
        ("0.0.0.0", False, False),
    ],
)
def test_actions_on_an_address_other_machines_reach_give_a_warning(
    bind: str, actions: bool, warns: bool
) -> None:
    warning = serve.exposed_warning(bind, actions)
    assert (warning is not None) is warns
    if warning is not None:
        assert bind in warning and "actions are allowed" in warning


def test_serve_logs_the_warning(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    class NoServer:
        def __init__(self, config: Any) -> None:
            self.config = config

        def run(self) -> None:
            ran.append(self.config.host)

    monkeypatch.setattr("uvicorn.Server", NoServer)
    with caplog.at_level(logging.WARNING, logger="distsched.dashboard"):
        serve.serve(scheduler, "127.0.0.1", 0, allow_actions=True, token=TOKEN)
        assert not caplog.records
        serve.serve(scheduler, "0.0.0.0", 0, allow_actions=True, token=TOKEN)
    assert ran == ["127.0.0.1", "0.0.0.0"]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "listens on 0.0.0.0" in caplog.records[0].getMessage()


def test_the_dashboard_command_prints_the_warning_at_start(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    port = free_port()
    argv = [*CLI_COMMAND, "--redis", redis_server.url, "dashboard", "--allow-actions",
            "--bind", "0.0.0.0", "--port", str(port)]  # fmt: skip
    proc = CliProcess(tmp_path / "err", argv, subprocess_env(DISTSCHED_DASHBOARD_TOKEN=TOKEN))
    try:
        deadline = time.monotonic() + 30
        while "warning:" not in proc.stderr():
            assert proc.proc.poll() is None, proc.stderr()
            assert time.monotonic() < deadline, proc.stderr()
            time.sleep(0.1)
        assert "warning: actions are allowed and the dashboard listens on 0.0.0.0" in (
            proc.stderr()
        )
    finally:
        proc.close()


# --------------------------------------------------------------------------- other sites


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "https://evil.example"},
        {"origin": "http://testserver.evil.example"},
        {"origin": "http://testserver:8080"},
        {"origin": "https://testserver:80"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
        {"sec-fetch-site": "cross-site", "origin": "http://testserver"},
    ],
)
def test_a_post_from_another_site_is_refused_whatever_its_session(
    client: TestClient, scheduler: Scheduler, headers: dict[str, str]
) -> None:
    reply = log_in(client, **headers)
    assert reply.status_code == 403 and "another site" in reply.text
    assert "set-cookie" not in reply.headers
    assert log_in(client).status_code == 303
    token = csrf(client)
    reply = client.post("/actions/cancel", data={"id": "t1", "csrf": token}, headers=headers)
    assert reply.status_code == 403 and "another site" in reply.text
    assert scheduler.status("t1").state.value == "ready"
    reply = client.post("/logout", data={"csrf": token}, headers=headers)
    assert reply.status_code == 403
    assert client.get("/task?id=t1").text.count('name="csrf"') >= 1  # still logged in


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"origin": "http://testserver"},
        {"origin": "http://TestServer:80"},
        {"sec-fetch-site": "same-origin", "origin": "http://testserver"},
        {"sec-fetch-site": "none"},
    ],
)
def test_a_post_from_the_dashboard_itself_goes_through(
    client: TestClient, scheduler: Scheduler, headers: dict[str, str]
) -> None:
    assert log_in(client, **headers).status_code == 303
    reply = client.post(
        "/actions/cancel", data={"id": "t1", "csrf": csrf(client)}, headers=headers,
        follow_redirects=False,
    )  # fmt: skip
    assert reply.status_code == 303
    assert scheduler.status("t1").state.value == "cancelled"


def test_an_origin_behind_a_proxy_is_accepted_when_trusted(scheduler: Scheduler) -> None:
    proxy = {"origin": "https://ops.example.com"}
    with TestClient(create_app(scheduler, allow_actions=True, token=TOKEN)) as client:
        assert log_in(client, **proxy).status_code == 403
    app = create_app(
        scheduler, allow_actions=True, token=TOKEN, trusted_origins=["https://ops.example.com/"]
    )
    with TestClient(app) as client:
        assert log_in(client, **proxy).status_code == 303
        assert log_in(client, origin="https://other.example.com").status_code == 403
    # TLS ended by a proxy that keeps the Host header: the origin's scheme and port count.
    with TestClient(create_app(scheduler, allow_actions=True, token=TOKEN)) as client:
        reply = log_in(client, origin="https://testserver")
        assert reply.status_code == 303


# --------------------------------------------------------------------------- hostile data

# What a task page may weigh, whatever the task holds: its lists a page at a time, its
# long texts cut (each with a link to the whole).
PAGE_BOUND = 300_000
MIB = 1024 * 1024


def rewrite_record(s: Scheduler, task_id: str, worker: str) -> None:
    """Put ``worker`` in a task's stored record as a producer skipping the checks would."""
    raw = s.client.hget(s.keys.tasks, task_id)
    assert isinstance(raw, bytes) and raw[:1] == b"\xa1"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    fields = [unpacker.unpack() for _ in range(12)]
    rest = raw[unpacker.tell() :]
    fields[11] = worker
    s.client.hset(s.keys.tasks, task_id, b"".join(msgpack.packb(f) for f in fields) + rest)


def nested(depth: int) -> bytes:
    """A payload whose first argument is a list nested ``depth`` deep, packed by hand."""
    return b"\x83\xa2fn\xa4step\xa4args\x91" + b"\x91" * depth + b"\x01" + b"\xa6kwargs\x80"


def history_entry(n: int, worker: str, summary: str) -> bytes:
    w = worker.encode()
    return b"%d|%d|1000|2000|failed|%d|%s|%s\n" % (n, n, len(w), w, summary.encode())


@pytest.fixture
def hostile(scheduler: Scheduler) -> Scheduler:
    """Tasks holding what junk or another language could store."""
    s, k = scheduler, scheduler.keys
    s.schedule("many", fn="step")
    s.client.zadd(k.edges, {b"%s0r%s" % (id_prefix("many"), b"dep-%06d" % i): 0
                            for i in range(100_000)})  # fmt: skip
    s.schedule("huge-worker", fn="step")
    rewrite_record(s, "huge-worker", "w" * (8 * MIB))
    s.client.hset(k.history, "huge-worker", history_entry(1, "h" * (8 * MIB), "RuntimeError: x"))
    s.schedule("huge-error", fn="step")
    fail_with(s, "huge-error", "E" * (20 * MIB))
    s.client.hset(
        k.history, "huge-error", b"".join(history_entry(i, f"w{i}", f"E{i}") for i in range(500))
    )
    s.client.zadd(k.edges, {b"%s0r%s" % (id_prefix("huge-error"), b"x" * MIB): 0})
    for task_id, payload in [
        ("stamp", msgpack.packb({"fn": "step", "args": [msgpack.Timestamp(1, 5)], "kwargs": {}})),
        ("ext", msgpack.packb({"fn": "step", "args": [msgpack.ExtType(42, b"\x00\xff")],
                               "kwargs": {b"\xff": float("nan")}})),
        ("deep-900", nested(900)),
        ("deep-2500", nested(2500)),
    ]:  # fmt: skip
        s.schedule(task_id, fn="step")
        put_payload(s.client, k, task_id, payload)
    s.schedule("long-dep", fn="step")
    s.client.hset(k.deps, "long-dep", b"rfa0" + b"y" * 0xFA0 + b"r001z")
    s.schedule("junk", fn="step")
    s.client.hset(k.tasks, "junk", b"\xa1not a record at all")
    return s


def fail_with(s: Scheduler, task_id: str, error: str) -> None:
    s.client.hset(s.keys.results, task_id, b"E" + error.encode())
    raw = s.client.hget(s.keys.tasks, task_id)
    assert isinstance(raw, bytes)
    s.client.hset(s.keys.tasks, task_id, b"\xa1f" + raw[2:])


@pytest.mark.parametrize(
    "task_id",
    ["many", "huge-worker", "huge-error", "stamp", "ext", "deep-900", "deep-2500", "long-dep"],
)
def test_a_task_page_is_bounded_and_renders_whatever_the_task_holds(
    hostile: Scheduler, task_id: str
) -> None:
    with TestClient(create_app(hostile)) as client:
        reply = client.get("/task", params={"id": task_id})
        assert reply.status_code == 200, reply.text[-2000:]
        assert len(reply.content) < PAGE_BOUND, len(reply.content)
        assert 'id="payload-size"' in reply.text
        api = client.get("/api/task", params={"id": task_id})
        assert api.status_code == 200 and len(api.content) < PAGE_BOUND


def test_a_payload_with_an_extension_or_deep_nesting_shows_what_it_holds(
    hostile: Scheduler,
) -> None:
    with TestClient(create_app(hostile)) as client:
        for task_id in ("stamp", "ext", "deep-900", "deep-2500"):
            page = client.get("/task", params={"id": task_id}).text
            args = reads.value_preview(list(hostile.status(task_id).args))[0]
            assert f"<pre>{markupsafe.escape(args)}</pre>" in page


def test_any_value_shows_as_bounded_text_without_recursion() -> None:
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    shown = reads.show_value(deep, 1000)
    assert shown.text == "[" * reads.MAX_DEPTH + "[\u2026]" + "]" * reads.MAX_DEPTH
    value = {
        "t": msgpack.Timestamp(1, 5),
        "e": msgpack.ExtType(42, b"\x00\xff"),
        3: b"\xff\x00",
        b"k": [float("nan"), float("inf"), None, True, 10**80, "\u2603"],
        "d": {"x": ()},
    }
    assert reads.show_value(value, 1000).text == (
        '{"t": Timestamp(1970-01-01T00:00:01.000000005Z), "e": ExtType(42, 00ff), '
        '3: {"hex": "ff00"}, "k": [nan, inf, null, true, 1e+80, "\u2603"], "d": {"x": []}}'
    )
    huge = reads.show_value({"a": ["x" * (50 * MIB)] * 1000}, 100)
    assert len(huge.text) == 100 and huge.cut
    assert reads.show_value(object(), 20).text.startswith("<object object")


def test_a_record_that_does_not_decode_is_said_so_not_a_500(hostile: Scheduler) -> None:
    with TestClient(create_app(hostile)) as client:
        reply = client.get("/task", params={"id": "junk"})
        assert reply.status_code == 200 and "cannot read" in reply.text
        assert client.get("/api/task", params={"id": "junk"}).status_code == 200
        reply = client.get("/task", params={"id": "x" * 600})
        assert reply.status_code == 400 and len(reply.content) < 10_000


def commands_sent(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def test_dependents_are_paged_with_links(hostile: Scheduler) -> None:
    with TestClient(create_app(hostile)) as client:
        before = commands_sent(hostile.client)
        page = client.get("/task", params={"id": "many"}).text
        # Its dependents name no task: the graph's walk still stops after a few lookups.
        assert commands_sent(hostile.client) - before < 2000
        assert "Dependents 1 to 100 of 100,000." in page
        assert "dep-000099" in page and "dep-000100" not in page
        nxt = re.search(r'href="([^"]+)" id="dependents-next"', page)
        assert nxt is not None and 'id="dependents-prev"' not in page
        page = client.get(html.unescape(nxt.group(1))).text
        assert "Dependents 101 to 200 of 100,000." in page
        assert "dep-000100" in page and "dep-000099" not in page
        assert 'id="dependents-prev"' in page
        page = client.get("/task", params={"id": "many", "dependents": "99950"}).text
        assert "Dependents 99,951 to 100,000 of 100,000." in page
        assert 'id="dependents-next"' not in page
        # Not a number, or past the end: still a page.
        for junk in ("-5", "abc", "9" * 40, "100000000"):
            reply = client.get("/task", params={"id": "many", "dependents": junk})
            assert reply.status_code == 200


def test_attempts_are_paged_and_long_texts_cut_with_a_link_to_the_whole(
    hostile: Scheduler,
) -> None:
    with TestClient(create_app(hostile)) as client:
        page = client.get("/task", params={"id": "huge-error"}).text
        assert "Attempts 1 to 20 of 500." in page and 'id="attempts-next"' in page
        full = re.search(r'href="([^"]+)" id="error-full"', page)
        assert full is not None
        whole = client.get(html.unescape(full.group(1)))
        assert whole.status_code == 200 and whole.headers["content-type"].startswith("text/plain")
        assert whole.text == "E" * (20 * MIB)
        # An id too long to be a task's is shown cut, without a link.
        assert "x" * 200 + "\u2026" in page and "x" * 201 not in page
        page = client.get("/task", params={"id": "huge-worker"}).text
        links = re.findall(r'href="([^"]+)" class="full-text"', page)
        texts = [client.get(html.unescape(link)).text for link in links]
        assert texts == ["w" * (8 * MIB), "h" * (8 * MIB)]
        nope = client.get("/task/text", params={"id": "huge-worker", "field": "nope"})
        assert nope.status_code == 404
        # A dependency id too long for a task: drawn in the graph and listed, cut, unlinked.
        page = client.get("/task", params={"id": "long-dep"}).text
        assert 'data-state="not submitted"' in page and "graph: could not" not in page
        assert page.count("y" * 200 + "\u2026") >= 3 and "y" * 201 not in page


def test_the_lists_are_bounded_whatever_their_tasks_hold(scheduler: Scheduler) -> None:
    s = scheduler
    for i in range(5):
        s.schedule(f"run{i}", fn="step")
        assert getattr(s.next(f"w{i}"), "task_id", None) == f"run{i}"
        rewrite_record(s, f"run{i}", "w" * (8 * MIB))
    with TestClient(create_app(s)) as client:
        for path in ("/tasks?state=running", "/leases", "/api/task?id=run0"):
            reply = client.get(path)
            assert reply.status_code == 200 and len(reply.content) < PAGE_BOUND, path
            assert "w" * 200 + "\u2026" in reply.text and "w" * 201 not in reply.text
