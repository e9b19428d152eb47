"""The dashboard's Failures page: failed tasks grouped by error, and (with actions on)
a group retried or removed in bounded steps (``Scheduler.retry_failures`` and
``purge_failures``).

The page reads a window of the newest failed tasks (``WINDOW``, in calls of at most
``FAILURES_BATCH_MAX``), whatever the namespace holds, with a link to the next window.
Its routes are registered by :func:`register`; the app's guards (Redis trouble as a 503,
POSTs from other sites refused) wrap them as they wrap every route.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from distsched.client import Scheduler
from distsched.dashboard.pages import Pages
from distsched.errors import InvalidArgument
from distsched.model import FailureGroup
from distsched.ops.failures import FAILURES_BATCH_MAX, merge_groups

log = logging.getLogger("distsched.dashboard")


# Failed tasks one page load groups at most (two reads of FAILURES_BATCH_MAX).
WINDOW = 2 * FAILURES_BATCH_MAX
# Failed tasks read per step of a retry or removal of a group.
ACTION_BATCH = 200

# The group actions (the last part of their path) and what each one's redirect reports.
ACTIONS = {"retry": "retried", "purge": "purged"}


@dataclass(frozen=True)
class FailuresWindow:
    """The groups of one window of failed tasks, and the cursor of the next window."""

    groups: tuple[FailureGroup, ...]
    examined: int
    cursor: str | None


def read_window(scheduler: Scheduler, cursor: str | None) -> FailuresWindow:
    """Up to ``WINDOW`` failed tasks after ``cursor``, grouped by error."""
    groups: list[FailureGroup] = []
    examined = 0
    while examined < WINDOW:
        page = scheduler.failures(cursor=cursor, count=min(FAILURES_BATCH_MAX, WINDOW - examined))
        groups.extend(page.groups)
        examined += page.examined
        cursor = page.cursor
        if cursor is None:
            break
    return FailuresWindow(merge_groups(groups), examined, cursor)


# What a group action's redirect says: a fixed text and counts parsed as numbers, so a
# link cannot make the page say anything else.
DONE = {
    "retried": "Retried {done} failed task(s) of that group as new versions ({skipped} had "
    "moved on).",
    "purged": "Removed {done} failed task(s) of that group ({skipped} left: they moved on or "
    "still tell their dependents that they ended).",
}


def _count(request: Request, name: str) -> int:
    value = request.query_params.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 12 else 0


def register(d: Pages, get: list[tuple[str, Any, str]], post: list[tuple[str, Any, str]]) -> None:
    """Add the Failures page's routes to the app's lists of GET and POST routes."""

    async def page(request: Request) -> Response:
        cursor = request.query_params.get("cursor") or None
        try:
            window = await d.read(read_window, d.scheduler, cursor)
        except InvalidArgument as exc:
            return d.render(request, "error.html", 400, message=str(exc))
        done = DONE.get(request.query_params.get("done") or "")
        outcome = (
            done.format(done=_count(request, "n"), skipped=_count(request, "skipped"))
            if done
            else None
        )
        return d.render(request, "failures.html", window=window, cursor=cursor, outcome=outcome)

    async def act(request: Request) -> Response:
        refused = await d.refuse(request)
        if refused is not None:
            return refused
        name = ACTIONS.get(request.path_params["name"])
        if name is None:
            return d.render(request, "error.html", 404, message="No such action.")
        form = await request.form()
        error = form.get("error")
        if not isinstance(error, str) or not error.strip():
            return d.render(request, "error.html", 400, message="No error group given.")
        s = d.scheduler
        if name == "retried":
            outcome = await d.read(lambda: s.retry_failures(error, batch=ACTION_BATCH))
        else:
            outcome = await d.read(lambda: s.purge_failures(error, batch=ACTION_BATCH))
        log.info(
            "dashboard: %s %d failed tasks of group %r from %s",
            name,
            outcome.done,
            error[:200],
            request.client.host if request.client else "?",
        )
        target = d.url(request, "/failures", done=name, n=outcome.done, skipped=outcome.skipped)
        return RedirectResponse(target, 303)

    get.append(("/failures", page, "failures"))
    post.append(("/failures/{name}", act, "failures_action"))
