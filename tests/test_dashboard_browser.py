"""The dashboard in a real browser (headless Chromium driven by Selenium).

A real worker process runs a small pipeline in which one step fails. The browser
opens the overview and sees the counts, goes to the failed task, reads its
traceback and the dependents it blocked, logs in with the token, retries it, and
watches the pipeline finish without reloading the page. Each step saves a
screenshot under ``DISTSCHED_TEST_ARTIFACTS`` (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from distsched import Scheduler, TaskSpec
from distsched.model import State
from tests.conftest import (
    CLI_COMMAND,
    IN_CI,
    REPO_ROOT,
    RedisServer,
    free_port,
    require_extra,
    subprocess_env,
)

require_extra("selenium")
require_extra("uvicorn")
require_extra("starlette")

import uvicorn  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from distsched.dashboard import create_app  # noqa: E402

TOKEN = "a token long enough for the test, and then some"
PIPELINE = [
    ("extract", []),
    ("clean", ["extract"]),
    ("stats", ["extract"]),
    ("load", ["clean", "stats"]),
    ("report", ["load"]),
]
WAIT_S = 30.0

pytestmark = pytest.mark.slow


def browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing = "chromium" if chromium is None else "chromedriver"
        if IN_CI:
            pytest.fail(f"{missing} is not on PATH, and CI=true requires it")
        pytest.skip(f"{missing} is not on PATH (apt-get install chromium chromium-driver)")
    return chromium, driver


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    base = os.environ.get("DISTSCHED_TEST_ARTIFACTS")
    where = Path(base) / request.node.name if base else tmp_path / "screenshots"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    chromium, driver = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):  # fmt: skip
        options.add_argument(arg)
    # The driver is given, so Selenium Manager has nothing to look for (or download).
    service = Service(executable_path=driver, log_output=str(tmp_path / "chromedriver.log"))
    session = webdriver.Chrome(options=options, service=service)
    try:
        yield session
    finally:
        session.quit()


class Server:
    """uvicorn serving the dashboard on a thread of this process."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)


def wait_until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def text_of(browser: WebDriver, element_id: str) -> str:
    # The page redraws parts of itself as it polls: read again an element just replaced.
    for _ in range(50):
        try:
            return str(browser.find_element(By.ID, element_id).text)
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"#{element_id} kept changing under the test")


def gone_from_the_document(exc: WebDriverException) -> bool:
    """Whether ``exc`` is Chromium saying, while a page is replaced, that a node of the old
    page is no longer in the document (an inspector error rather than a stale element)."""
    return "does not belong to the document" in str(exc)


def page_left(page: WebElement) -> Callable[[WebDriver], bool]:
    """A wait condition: the page whose ``html`` element is ``page`` has been replaced."""

    def left(_: WebDriver) -> bool:
        try:
            page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if gone_from_the_document(exc):
                return True
            raise
        return False

    return left


def follow(browser: WebDriver, by: str, value: str) -> None:
    """Click what leads to another page and wait until the browser has left this one.

    Without the wait, what is read next may come from the page being left (under load
    the new page takes a while), e.g. the note of the previous action.
    """
    page: WebElement = browser.find_element(By.TAG_NAME, "html")
    try:
        browser.find_element(by, value).click()
    except WebDriverException as exc:
        # The page was replaced before the driver was done with the node: the click
        # happened, the next page is on its way.
        if not gone_from_the_document(exc):
            raise
    WebDriverWait(browser, WAIT_S).until(page_left(page))


def wait_for(browser: WebDriver, element_id: str) -> None:
    WebDriverWait(browser, WAIT_S).until(lambda b: b.find_elements(By.ID, element_id))


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a worker process for good: SIGTERM, then SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_an_operator_finds_the_failed_step_retries_it_and_watches_the_pipeline_finish(
    redis_server: RedisServer,
    namespace: str,
    browser: WebDriver,
    artifacts: Path,
    tmp_path: Path,
) -> None:
    failed_once = str(tmp_path / "clean-failed-once")
    release = tmp_path / "report-may-finish"
    args: dict[str, list[str | None]] = {"clean": [failed_once], "report": [None, str(release)]}
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    s.submit_graph(
        [
            TaskSpec(name, "step", args=[name, *args.get(name, [])], deps=deps)
            for name, deps in PIPELINE
        ]
    )
    with (tmp_path / "worker.err").open("w") as stderr:
        worker = subprocess.Popen(
            [*CLI_COMMAND, "--redis", redis_server.url, "--namespace", namespace, "worker",
             "tests.worker_app:PIPELINE", "--concurrency", "2", "--lease", "5s"],
            cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    shots = iter(range(1, 100))

    def shot(name: str) -> None:
        browser.save_screenshot(str(artifacts / f"{next(shots):02d}-{name}.png"))

    server: Server | None = None
    try:
        server = Server(create_app(s, allow_actions=True, token=TOKEN))
        wait_until("the pipeline to stop at the failure", lambda: (
            s.status("report").state is State.BLOCKED and s.status("stats").state.terminal
        ))  # fmt: skip

        # The overview shows the counts.
        browser.get(server.url + "/")
        assert text_of(browser, "count-failed") == "1"
        assert text_of(browser, "count-blocked") == "2"
        assert text_of(browser, "count-succeeded") == "2"
        assert text_of(browser, "hour-failed") == "1"
        shot("overview")

        # From the failed count to the failed task.
        follow(browser, By.CSS_SELECTOR, "a.card.state-failed")
        WebDriverWait(browser, WAIT_S).until(lambda b: b.find_elements(By.LINK_TEXT, "clean"))
        shot("failed-tasks")
        follow(browser, By.LINK_TEXT, "clean")
        wait_for(browser, "traceback")
        assert "RuntimeError: source unavailable for clean" in text_of(browser, "traceback")
        assert "Traceback (most recent call last)" in text_of(browser, "traceback")
        blocked = text_of(browser, "blocked-dependents").split()
        assert sorted(blocked) == ["load", "report"]
        assert browser.find_elements(By.CSS_SELECTOR, "svg.graph path.edge.blocking")
        assert not browser.find_elements(By.ID, "action-retry")  # not logged in yet
        shot("failed-task")

        # Log in with the token; back on the task, the retry button is there.
        follow(browser, By.LINK_TEXT, "Log in")
        wait_for(browser, "token")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        shot("login")
        follow(browser, By.ID, "login-submit")
        wait_for(browser, "action-retry")
        assert text_of(browser, "task-id") == "clean"
        shot("logged-in")

        # The page it leaves carries a note too (logged in): read the new page's.
        follow(browser, By.ID, "action-retry")
        wait_for(browser, "note")
        assert "Retried" in text_of(browser, "note")
        # Mark the page: a reload would lose the mark.
        browser.execute_script("window.__notReloaded = true;")
        shot("retried")

        def graph_states(b: WebDriver) -> dict[str, str]:
            # The page redraws the graph as it polls: read it again if it was replaced.
            for _ in range(50):
                try:
                    nodes = b.find_elements(By.CSS_SELECTOR, "svg.graph a.node")
                    return {
                        str(n.get_attribute("data-task")): str(n.get_attribute("data-state"))
                        for n in nodes
                    }
                except StaleElementReferenceException:
                    continue
            raise AssertionError("the graph kept changing under the test")

        # The last step waits for the test: the page must show the pipeline go on.
        assert graph_states(browser)["report"] != "succeeded"
        WebDriverWait(browser, WAIT_S).until(
            lambda b: (
                graph_states(b)["clean"] == "succeeded"
                and graph_states(b)["report"] in ("ready", "running")
            )
        )
        assert text_of(browser, "state") == "succeeded"
        shot("pipeline-going-on")
        release.touch()

        around_clean = {"extract", "clean", "load", "report"}
        WebDriverWait(browser, WAIT_S).until(
            lambda b: graph_states(b) == dict.fromkeys(around_clean, "succeeded")
        )
        assert browser.execute_script("return window.__notReloaded === true;")
        assert not browser.find_elements(By.CSS_SELECTOR, "svg.graph path.edge.blocking")
        shot("pipeline-finished")

        browser.get(server.url + "/")
        assert text_of(browser, "count-succeeded") == str(len(PIPELINE))
        assert text_of(browser, "count-failed") == "0"
        assert text_of(browser, "hour-succeeded") == str(len(PIPELINE))
        assert text_of(browser, "hour-failed") == "1"
        shot("overview-finished")
    finally:
        if server is not None:
            server.close()
        stop(worker)
        try:
            s.clear()
        finally:
            s.close()


def test_a_form_on_another_port_of_the_same_host_cannot_act_even_with_the_csrf_token(
    scheduler: Scheduler, browser: WebDriver
) -> None:
    """Another service on the same host is the same *site*: the browser sends it the
    SameSite=Strict session cookie. Even given the CSRF token, its form is refused: the
    browser says where the POST comes from (Origin, Sec-Fetch-Site)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    scheduler.schedule("victim", fn="step")
    dashboard = Server(create_app(scheduler, allow_actions=True, token=TOKEN))
    forms: dict[str, str] = {}

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(
            f'<form method="post" action="{dashboard.url}/actions/cancel">'
            '<input type="hidden" name="id" value="victim">'
            f'<input type="hidden" name="csrf" value="{forms["csrf"]}">'
            '<button type="submit" id="go">go</button></form>'
        )

    other = Server(Starlette(routes=[Route("/", page)]))
    try:
        browser.get(dashboard.url + "/login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        follow(browser, By.ID, "login-submit")
        wait_for(browser, "logout")
        browser.get(dashboard.url + "/task?id=victim")
        csrf = browser.find_element(By.CSS_SELECTOR, 'input[name="csrf"]')
        forms["csrf"] = str(csrf.get_attribute("value"))
        browser.get(other.url + "/")
        follow(browser, By.ID, "go")
        WebDriverWait(browser, WAIT_S).until(lambda b: "another site" in b.page_source)
        assert scheduler.status("victim").state is State.READY
        # The same form on the dashboard's own page goes through.
        browser.get(dashboard.url + "/task?id=victim")
        follow(browser, By.ID, "action-cancel")
        wait_for(browser, "note")
        assert scheduler.status("victim").state is State.CANCELLED
    finally:
        other.close()
        dashboard.close()


class _OldPage:
    """An element of a page being replaced, as the driver answers for it."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def is_enabled(self) -> bool:
        if self.error is not None:
            raise self.error
        return True


def test_a_node_chromium_calls_out_of_the_document_means_the_page_was_left() -> None:
    inspector = WebDriverException(
        'unknown error: unhandled inspector error: {"code":-32000,'
        '"message":"Node with given id does not belong to the document"}'
    )
    old: Any = _OldPage(inspector)
    no_browser: Any = None  # the condition reads only the element
    assert page_left(old)(no_browser)
    stale: Any = _OldPage(StaleElementReferenceException("stale"))
    assert page_left(stale)(no_browser)
    still: Any = _OldPage(None)
    assert not page_left(still)(no_browser)
    other: Any = _OldPage(WebDriverException("invalid session id"))
    with pytest.raises(WebDriverException):
        page_left(other)(no_browser)
