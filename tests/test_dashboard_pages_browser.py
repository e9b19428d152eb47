"""The schedules and keys pages, the state tabs, the failure on top of a task page, the
unserved badge and the namespace switcher in a real browser (headless Chromium driven by
Selenium, as ``test_dashboard_browser``). Each step saves a screenshot under
``DISTSCHED_TEST_ARTIFACTS`` (default: the test's tmp dir)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from distsched import Claim, Scheduler, TaskSpec
from distsched.model import State
from tests.conftest import require_extra

require_extra("selenium")
require_extra("uvicorn")
require_extra("starlette")

from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from distsched.dashboard import create_app, create_multi_app  # noqa: E402
from distsched.worker.link import WorkerLink  # noqa: E402
from distsched.worker.served import ServedFunctions  # noqa: E402
from tests.test_dashboard_browser import (  # noqa: E402
    TOKEN,
    WAIT_S,
    Server,
    artifacts,  # noqa: F401 (a fixture)
    browser,  # noqa: F401 (a fixture)
    follow,
    gone_from_the_document,
    page_left,
    text_of,
    wait_for,
)

pytestmark = pytest.mark.slow

Shot = Callable[[str], None]


@pytest.fixture
def shot(browser: WebDriver, artifacts: Path) -> Shot:  # noqa: F811
    shots = iter(range(1, 100))

    def save(name: str) -> None:
        browser.save_screenshot(str(artifacts / f"{next(shots):02d}-{name}.png"))

    return save


@pytest.fixture
def served_with_actions(scheduler: Scheduler) -> Iterator[Server]:
    server = Server(create_app(scheduler, allow_actions=True, token=TOKEN))
    yield server
    server.close()


def log_in(browser: WebDriver, server: Server, page: str) -> None:  # noqa: F811
    browser.get(server.url + page)
    follow(browser, By.ID, "login-link")
    wait_for(browser, "token")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    follow(browser, By.ID, "login-submit")
    wait_for(browser, "logout")


def row(browser: WebDriver, attribute: str, value: str) -> str:  # noqa: F811
    for element in browser.find_elements(By.CSS_SELECTOR, f"tr[{attribute}]"):
        if element.get_attribute(attribute) == value:
            return str(element.text)
    raise AssertionError(f"no row {attribute}={value!r}")


def click_in_row(browser: WebDriver, attribute: str, value: str, css: str) -> None:  # noqa: F811
    for element in browser.find_elements(By.CSS_SELECTOR, f"tr[{attribute}]"):
        if element.get_attribute(attribute) == value:
            page = browser.find_element(By.TAG_NAME, "html")
            try:
                element.find_element(By.CSS_SELECTOR, css).click()
            except WebDriverException as exc:
                # The click's form post replaced the page before the driver was done with
                # the button's node: the click happened, the next page is on its way.
                if not gone_from_the_document(exc):
                    raise
            WebDriverWait(browser, WAIT_S).until(page_left(page))
            return
    raise AssertionError(f"no row {attribute}={value!r}")


def test_an_operator_pauses_resumes_and_triggers_a_schedule_from_its_page(
    scheduler: Scheduler,
    served_with_actions: Server,
    browser: WebDriver,  # noqa: F811
    shot: Shot,
) -> None:
    scheduler.add_schedule("nightly-report", "report", interval=86400)
    scheduler.add_schedule("sync <crm>", "sync", interval=300, paused=True, key="acme")
    server = served_with_actions
    browser.get(server.url + "/")
    follow(browser, By.ID, "nav-schedules")
    assert "every 1 d 0 h" in row(browser, "data-schedule", "nightly-report")
    assert "paused" in row(browser, "data-schedule", "sync <crm>")
    assert not browser.find_elements(By.CSS_SELECTOR, "button.action-pause")
    shot("schedules-read")

    log_in(browser, server, "/schedules")
    click_in_row(browser, "data-schedule", "nightly-report", "button.action-pause")
    wait_for(browser, "note")
    assert "paused" in text_of(browser, "note")
    assert "paused" in row(browser, "data-schedule", "nightly-report").split()
    assert scheduler.get_schedule("nightly-report").paused
    shot("schedule-paused")

    click_in_row(browser, "data-schedule", "sync <crm>", "button.action-resume")
    wait_for(browser, "note")
    assert "active" in row(browser, "data-schedule", "sync <crm>").split()
    click_in_row(browser, "data-schedule", "sync <crm>", "button.action-trigger")
    wait_for(browser, "note")
    assert "triggered" in text_of(browser, "note")
    synced = scheduler.get_schedule("sync <crm>")
    assert synced.fired == 1 and synced.last_task is not None
    shot("schedule-triggered")

    # The last run links to its task.
    follow(browser, By.LINK_TEXT, synced.last_task)
    wait_for(browser, "task-id")
    assert text_of(browser, "task-id") == synced.last_task
    assert text_of(browser, "state") == "ready"


def test_an_operator_changes_a_key_cap_live_and_sees_idle_tenants(
    scheduler: Scheduler,
    served_with_actions: Server,
    browser: WebDriver,  # noqa: F811
    shot: Shot,
) -> None:
    scheduler.set_key("idle-tenant", cap=2, weight=3, rate=5, per=2)
    scheduler.schedule_many([TaskSpec(f"b{i}", "step", key="busy") for i in range(3)])
    server = served_with_actions
    browser.get(server.url + "/keys")
    assert "idle" in row(browser, "data-key", "idle-tenant").split()
    assert "5 per 2 s" in row(browser, "data-key", "idle-tenant")
    shot("keys-read")

    log_in(browser, server, "/keys")
    for element in browser.find_elements(By.CSS_SELECTOR, "tr[data-key]"):
        if element.get_attribute("data-key") == "busy":
            cap = element.find_element(By.NAME, "cap")
            cap.clear()
            cap.send_keys("1")
            weight = element.find_element(By.NAME, "weight")
            weight.clear()
            weight.send_keys("4")
    shot("key-edited")
    click_in_row(browser, "data-key", "busy", "button.action-set-key")
    wait_for(browser, "note")
    assert "saved" in text_of(browser, "note")
    info = scheduler.key_info("busy")
    assert (info.cap, info.weight) == (1, 4)
    busy = row(browser, "data-key", "busy")
    assert busy.split()[:5] == ["busy", "ready", "0", "3", "1"]
    shot("key-saved")
    # The cap applies at the next claim: one of the key's tasks runs, not two.
    claims, _ = scheduler.claim(2, "w")
    assert len(claims) == 1


def test_an_operator_reads_the_counts_the_unserved_badge_and_the_failure_above_the_fold(
    scheduler: Scheduler,
    served_with_actions: Server,
    browser: WebDriver,  # noqa: F811
    shot: Shot,
) -> None:
    scheduler.schedule("crashed", fn="crash")
    claim = scheduler.next("w")
    assert isinstance(claim, Claim) and claim.task_id == "crashed"
    scheduler.fail(claim, deep_traceback())
    scheduler.schedule_many([TaskSpec(f"r{i}", "report") for i in range(3)])
    scheduler.schedule("orphan", fn="nobody")
    ServedFunctions(WorkerLink(scheduler), ["report", "crash"], 0.0).announce()
    url = served_with_actions.url

    browser.get(url + "/tasks?state=ready")
    assert text_of(browser, "tab-count-ready") == "4"
    assert text_of(browser, "tab-count-failed") == "1"
    badges = browser.find_elements(By.CSS_SELECTOR, "#tasks .badge.unserved")
    assert len(badges) == 1 and badges[0].is_displayed()
    assert "orphan" in str(
        browser.find_element(By.XPATH, "//tr[.//span[contains(@class,'unserved')]]").text
    )
    shot("ready-with-unserved-badge")

    follow(browser, By.ID, "tab-failed")
    follow(browser, By.LINK_TEXT, "crashed")
    wait_for(browser, "exception")
    assert text_of(browser, "exception").startswith("ZeroDivisionError: division by zero")
    top, below, height = browser.execute_script(
        "return [document.getElementById('exception').getBoundingClientRect().top,"
        " document.getElementById('traceback').getBoundingClientRect().top,"
        " window.innerHeight];"
    )
    assert 0 <= top < height / 3  # read without scrolling
    assert below > height  # the traceback further down
    shot("failed-task-top")
    # Its link scrolls down to the whole traceback.
    browser.find_element(By.ID, "to-traceback").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda b: (
            0
            <= b.execute_script(
                "return document.getElementById('error').getBoundingClientRect().top;"
            )
            < height / 2
        )
    )
    assert "Traceback (most recent call last)" in text_of(browser, "traceback")
    shot("failed-task-traceback")

    browser.get(url + "/task?id=orphan")
    wait_for(browser, "unserved")
    assert "no worker serves nobody" in text_of(browser, "unserved")
    assert scheduler.status("orphan").state is State.READY
    shot("unserved-task")


def deep_traceback() -> str:
    """A real traceback, long enough to fill a screen."""
    import traceback

    def deep(n: int) -> None:
        if n == 0:
            print(1 / 0)
        deep(n - 1)

    try:
        deep(30)
    except ZeroDivisionError:
        return traceback.format_exc()
    raise AssertionError("no error")


def test_an_operator_switches_namespace_and_stays_on_the_same_page(
    redis_client: redis.Redis,
    namespace: str,
    browser: WebDriver,  # noqa: F811
    shot: Shot,
) -> None:
    one = Scheduler(redis_client, namespace=namespace + "-eu")
    other = Scheduler(redis_client, namespace=namespace + "-us")
    server: Server | None = None
    try:
        one.add_schedule("eu-only", "f", interval=60)
        other.add_schedule("us-only", "f", interval=60)
        server = Server(create_multi_app(one, [one.namespace, other.namespace]))
        browser.get(server.url + "/")
        wait_for(browser, "ns-switch")
        assert f"/ns/{one.namespace}/" in browser.current_url
        follow(browser, By.ID, "nav-schedules")
        assert "eu-only" in text_of(browser, "schedules")
        browser.find_element(By.CSS_SELECTOR, "#ns-switch summary").click()
        shot("switcher-open")
        follow(browser, By.CSS_SELECTOR, f'a.ns-link[data-namespace="{other.namespace}"]')
        wait_for(browser, "schedules")
        assert browser.current_url == f"{server.url}/ns/{other.namespace}/schedules"
        assert "us-only" in text_of(browser, "schedules")
        assert "eu-only" not in text_of(browser, "schedules")
        shot("switched")
    finally:
        if server is not None:
            server.close()
        for s in (one, other):
            s.clear()
            s.close()


# Below the page's timed refresh while its stream is open (10 s): only a push is this quick.
PUSHED_S = 6.0


def test_a_task_page_shows_each_progress_report_as_it_is_pushed_and_then_the_end(
    browser: WebDriver,  # noqa: F811
    scheduler: Scheduler,
    shot: Shot,
) -> None:
    scheduler.schedule("encode", fn="f")
    claims, _ = scheduler.claim(1, "w1")
    app = create_app(scheduler)
    notices = app.state.dashboard.notices
    server = Server(app)
    try:
        browser.get(server.url + "/task?id=encode")
        # The page of a running task listens to its stream of notices.
        WebDriverWait(browser, WAIT_S).until(lambda _b: notices.open_streams == 1)
        scheduler.report_progress(claims[0], 0.5, "half way")
        WebDriverWait(browser, PUSHED_S).until(lambda b: "half way" in text_of(b, "progress"))
        shot("progress-pushed")
        scheduler.report_progress(claims[0], 0.75, "three quarters")
        WebDriverWait(browser, PUSHED_S).until(lambda b: "three quarters" in text_of(b, "progress"))
        scheduler.complete(claims[0], None)
        WebDriverWait(browser, PUSHED_S).until(lambda b: text_of(b, "state") == "succeeded")
        # Nothing more will come: the page closed its stream.
        WebDriverWait(browser, WAIT_S).until(lambda _b: notices.open_streams == 0)
        shot("ended")
    finally:
        server.close()
