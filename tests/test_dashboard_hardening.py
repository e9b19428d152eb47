"""The dashboard against a hostile network and hostile stored data: login limits, token
strength, a warning when actions are exposed, POSTs from other sites, and task pages that
stay bounded and render whatever a task holds."""

from __future__ import annotations

import logging
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distsched import Scheduler
from distsched.errors import InvalidArgument
from tests.conftest import (
    CLI_COMMAND,
    CliProcess,
    RedisServer,
    free_port,
    require_extra,
    subprocess_env,
)

require_extra("starlette")
require_extra("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from distsched.dashboard import auth, create_app, serve  # noqa: E402
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
