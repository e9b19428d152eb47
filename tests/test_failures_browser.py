"""The Failures page in a real browser (headless Chromium driven by Selenium, set up as
in ``tests/test_dashboard_browser.py``): an operator sees the failed tasks grouped by
error, logs in, retries the large group with one click and finds only the other left.
Each step saves a screenshot under ``DISTSCHED_TEST_ARTIFACTS`` (default: tmp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsched import Scheduler, State
from tests.conftest import RedisServer, require_extra
from tests.test_failures import GROUP_MISSING, GROUP_TIMEOUT, two_groups

require_extra("selenium")
require_extra("uvicorn")
require_extra("starlette")

from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from distsched.dashboard import create_app  # noqa: E402
from tests.test_dashboard_browser import (  # noqa: E402
    TOKEN,
    WAIT_S,
    Server,
    artifacts,
    browser,
    follow,
    gone_from_the_document,
    page_left,
    text_of,
    wait_for,
)

__all__ = ["artifacts", "browser"]  # fixtures, used by name

pytestmark = pytest.mark.slow


def group_rows(browser: WebDriver) -> list[tuple[str, str]]:
    """(count, error group) of each row of the groups table, in order."""
    rows = browser.find_elements(By.CSS_SELECTOR, "#groups tr.group")
    return [
        (
            row.find_element(By.CSS_SELECTOR, "td.count").text,
            row.find_element(By.CSS_SELECTOR, "code.group-error").text,
        )
        for row in rows
    ]


def test_an_operator_sees_failures_grouped_and_retries_the_large_group_in_one_click(
    redis_server: RedisServer, namespace: str, browser: WebDriver, artifacts: Path
) -> None:
    s = Scheduler.from_url(redis_server.url, namespace=namespace)
    two_groups(s, timeouts=40, missing=3)
    shots = iter(range(1, 100))

    def shot(name: str) -> None:
        browser.save_screenshot(str(artifacts / f"{next(shots):02d}-{name}.png"))

    server: Server | None = None
    try:
        server = Server(create_app(s, allow_actions=True, token=TOKEN))
        browser.get(server.url + "/")
        follow(browser, By.LINK_TEXT, "Failures")
        wait_for(browser, "groups")
        assert group_rows(browser) == [("40", GROUP_TIMEOUT), ("3", GROUP_MISSING)]
        assert "Grouped the 43 newest failed tasks" in text_of(browser, "window")
        assert not browser.find_elements(By.CSS_SELECTOR, "button.action-retry-group")
        shot("groups-read-only")

        # An example leads to its task.
        example = browser.find_elements(By.CSS_SELECTOR, "#groups tr.group a.example")[0]
        task_id = example.text
        follow(browser, By.LINK_TEXT, task_id)
        wait_for(browser, "task-id")
        assert text_of(browser, "task-id") == task_id
        browser.back()
        wait_for(browser, "groups")

        follow(browser, By.ID, "login-link")
        wait_for(browser, "token")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        follow(browser, By.ID, "login-submit")
        wait_for(browser, "groups")
        assert len(browser.find_elements(By.CSS_SELECTOR, "button.action-retry-group")) == 2
        shot("groups-logged-in")

        first_retry = browser.find_elements(By.CSS_SELECTOR, "button.action-retry-group")[0]
        page = browser.find_element(By.TAG_NAME, "html")
        try:
            first_retry.click()
        except WebDriverException as exc:
            # The form post replaced the page before the driver was done with the button.
            if not gone_from_the_document(exc):
                raise
        WebDriverWait(browser, WAIT_S).until(page_left(page))
        wait_for(browser, "outcome")
        assert "Retried 40 failed task(s) of that group" in text_of(browser, "outcome")
        assert group_rows(browser) == [("3", GROUP_MISSING)]
        shot("after-retry-all")
        assert s.stats()["counts"]["failed"] == 3
        assert s.status("t0").state is State.READY
    finally:
        if server is not None:
            server.close()
        s.close()
