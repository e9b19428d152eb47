"""The schedules page: every recurring schedule of the namespace, with pause, resume
and trigger-now for a logged-in user of a dashboard started with actions allowed."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from distsched.client import Scheduler
from distsched.dashboard.pages import Handler, Pages
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.schedules import Schedule

log = logging.getLogger("distsched.dashboard")

# What a schedule action's redirect says (added to the dashboard's notes).
NOTES = {
    "schedule-paused": "Schedule paused: it fires no more until resumed.",
    "schedule-resumed": "Schedule resumed: it fires from its next slot after now.",
    "schedule-triggered": "Schedule triggered: its task was created now.",
    "schedule-skipped": "Not triggered: the schedule's overlap policy skipped the run.",
    "schedule-conflict": "The schedule changed meanwhile: nothing was done, try again.",
}


@dataclass(frozen=True)
class SchedulesPage:
    schedules: list[Schedule]
    now: float  # server clock

    def until(self, schedule: Schedule) -> float | None:
        """Seconds from now to the schedule's next fire (None: paused or ended)."""
        return None if schedule.next_fire is None else schedule.next_fire - self.now


def read(scheduler: Scheduler) -> SchedulesPage:
    return SchedulesPage(scheduler.schedules(), scheduler.server_time())


def status(schedule: Schedule) -> str:
    """``paused``, ``active`` or ``ended`` (no slot left before its end)."""
    if schedule.paused:
        return "paused"
    return "ended" if schedule.next_fire is None else "active"


class SchedulePages:
    """The routes of the schedules page and its actions."""

    def __init__(self, dashboard: Pages) -> None:
        self.d = dashboard

    async def page(self, request: Request) -> Response:
        page = await self.d.read(read, self.d.scheduler)
        return self.d.render(request, "schedules.html", page=page, status=status)

    async def act(self, request: Request) -> Response:
        """Pause, resume or trigger one schedule (``op`` in the path, ``name`` in the form)."""
        refused = await self.d.refuse(request)
        if refused is not None:
            return refused
        op = request.path_params["op"]
        name = (await request.form()).get("name")
        if not isinstance(name, str) or not name:
            return self.d.render(request, "error.html", 400, message="No schedule name given.")
        s = self.d.scheduler
        try:
            if op == "pause":
                await self.d.read(s.pause_schedule, name)
                done = "schedule-paused"
            elif op == "resume":
                await self.d.read(s.resume_schedule, name)
                done = "schedule-resumed"
            elif op == "trigger":
                created = await self.d.read(s.trigger, name)
                done = "schedule-skipped" if created is None else "schedule-triggered"
            else:
                return self.d.render(request, "error.html", 404, message="No such action.")
        except NotFoundError:
            return self.d.render(
                request, "error.html", 404, message=f"No schedule {name[:200]!r} in this namespace."
            )
        except InvalidArgument as exc:
            return self.d.render(request, "error.html", 400, message=str(exc)[:300])
        except ConflictError:
            done = "schedule-conflict"
        log.info("dashboard: schedule %s %r from %s: %s", op, name, _peer(request), done)
        return RedirectResponse(self.d.url(request, "/schedules", done=done), 303)

    def routes(self) -> tuple[list[tuple[str, Handler, str]], list[tuple[str, Handler, str]]]:
        """(GET routes, POST routes) as ``(path, handler, name)``."""
        return (
            [("/schedules", self.page, "schedules")],
            [("/schedules/{op}", self.act, "schedule_action")],
        )


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"
