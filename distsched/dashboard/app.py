"""The dashboard's ASGI application (:func:`create_app`)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode, urlsplit

import jinja2
import redis
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from distsched import times
from distsched.client import Scheduler
from distsched.dashboard import chart, failures, graph, keys, reads, schedules
from distsched.dashboard.auth import (
    COOKIE,
    SESSION_S,
    LoginLimiter,
    Session,
    Signer,
    check_token,
    retry_after,
)
from distsched.dashboard.events import TaskNotices
from distsched.dashboard.pages import Handler
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.model import STATS_TOP_KEYS, Change, State, Stats, stage_counts
from distsched.text import finite_or_none, iso, jsonable, progress_text, size

log = logging.getLogger("distsched.dashboard")

HERE = Path(__file__).resolve().parent

T = TypeVar("T")

# What an action's redirect says, by code: fixed texts, so a link cannot make the page
# say anything else.
NOTES = {
    "cancelled": "Cancelled.",
    "cancel-requested": "Cancellation requested: the function is asked to stop.",
    "retried": "Retried as a new version.",
    "expired": "Lease expired: the task runs again as a new attempt, or fails.",
    "not-running": "The task holds no lease (it is not running).",
    "conflict": "Not possible in the task's current state.",
    "paused": "Paused: no worker claims it until it is resumed.",
    "resumed": "Resumed: back in its place in the queue.",
    "logged-in": "Logged in: actions are enabled.",
    "logged-out": "Logged out.",
    "bulk-retried": "Retried the failed tasks of that page; they left this list.",
    "purged": "Removed the tasks of that page (those that were still in this state).",
    **schedules.NOTES,
    **keys.NOTES,
}


def seconds(value: float | None) -> str:
    """A span of seconds for people: ``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``."""
    return times.span(value, parts=2)


def when(epoch: float | None) -> Markup:
    """An instant relative to now (``in 11 h``), the exact UTC time on hover."""
    if epoch is None:
        return Markup("-")
    exact = times.absolute(epoch)
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(
        exact, times.relative(epoch, time.time())
    )


class Dashboard:
    """The routes' shared state: the scheduler, the templates and the session signer."""

    def __init__(
        self,
        scheduler: Scheduler,
        allow_actions: bool,
        token: str | None,
        owns: bool,
        trusted_origins: Iterable[str] = (),
    ) -> None:
        self.scheduler = scheduler
        self.namespace = scheduler.namespace
        self.allow_actions = allow_actions
        self.owns = owns
        self.signer = Signer(token, scheduler.namespace) if token is not None else None
        self.limiter = LoginLimiter()
        self.notices = TaskNotices(scheduler)
        self.plans = reads.PlanCache()
        self.trusted_origins = frozenset(trusted_origins)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["seconds"] = seconds
        self.env.filters["iso"] = when
        self.env.filters["short"] = reads.short
        self.env.globals["reads"] = reads
        # The other namespaces served beside this one: (name, link, current) for the
        # header's switcher (set by create_multi_app; None: this namespace alone).
        self.switcher: Callable[[Request], list[tuple[str, str, bool]]] | None = None

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def base(request: Request) -> str:
        """The path the app is mounted at ('' at the root)."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    @classmethod
    def link_base(cls, request: Request) -> str:
        """:meth:`base` percent-encoded, as it goes in a link and in the session cookie's
        path: the browser sends it back so, and a namespace in the mount path of a
        multi-namespace app may hold ``;`` or non-ASCII letters."""
        return quote(cls.base(request), safe="/")

    def url(self, request: Request, path: str, **query: Any) -> str:
        """A link inside the dashboard; every query value percent-encoded."""
        kept = {k: v for k, v in query.items() if v is not None and v != ""}
        join = "&" if "?" in path else "?"
        tail = join + urlencode(kept, quote_via=quote, safe="") if kept else ""
        return f"{self.link_base(request)}{path}{tail}"

    def here(self, request: Request) -> str:
        """This page's path and query inside the dashboard (where to come back to)."""
        path = request.url.path[len(self.base(request)) :] or "/"
        # The note of the last action is not part of where the user was.
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "done"]
        return path + ("?" + urlencode(kept, quote_via=quote, safe="") if kept else "")

    def session(self, request: Request) -> Session | None:
        if self.signer is None or not self.allow_actions:
            return None
        return self.signer.session(request.cookies.get(COOKIE))

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        session = self.session(request)
        note = request.query_params.get("done")
        page = self.env.get_template(template).render(
            request=request,
            namespace=self.namespace,
            url=lambda path, **q: self.url(request, path, **q),
            actions=self.allow_actions,
            session=session,
            note=NOTES.get(note or ""),
            here=self.here(request),
            switcher=[] if self.switcher is None else self.switcher(request),
            **context,
        )
        response = HTMLResponse(page, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        return response

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking read of the sync scheduler on Starlette's thread pool."""
        return await run_in_threadpool(fn, *args)

    def task_link(self, request: Request) -> Callable[[str], str]:
        return lambda task_id: self.url(request, "/task", id=task_id)

    # ------------------------------------------------------------------ pages

    async def overview(self, request: Request) -> Response:
        page = await self.read(reads.overview, self.scheduler, self.plans)
        data = reads.overview_json(page)
        return self.render(
            request,
            "overview.html",
            page=page,
            data=data,
            fields=overview_fields(data),
            states=list(State),
            svgs=charts(page),
        )

    async def overview_api(self, request: Request) -> Response:
        page = await self.read(reads.overview, self.scheduler, self.plans)
        data = reads.overview_json(page)
        fields = overview_fields(data)
        return json_response({"data": data, "fields": fields, "svgs": charts(page)})

    async def task(self, request: Request) -> Response:
        task_id = request.query_params.get("id", "")
        if not task_id:
            return self.render(request, "error.html", 400, message="No task id given.")
        offsets = {name: _offset(request, name) for name in reads.PAGED}
        try:
            page = await self.read(reads.task, self.scheduler, task_id, offsets)
        except NotFoundError:
            return self.render(
                request,
                "error.html",
                404,
                message=f"No task {reads.short(task_id)!r} in this namespace.",
            )
        except InvalidArgument as exc:
            return self.render(request, "error.html", 400, message=reads.short(str(exc), 300))
        except reads.Unreadable as exc:
            return self.render(
                request,
                "error.html",
                200,
                message=f"Task {reads.short(task_id)!r} is stored in a form this dashboard "
                f"cannot read ({exc}); it was probably written by other means.",
            )
        svg = graph.render(page.hood, self.task_link(request))

        def paged(name: str, offset: int) -> str:
            """This page with list ``name`` from ``offset`` (the other lists kept)."""
            offsets = {**page.offsets, name: offset}
            return self.url(
                request, "/task", id=task_id, **{k: v or None for k, v in offsets.items()}
            )

        return self.render(
            request,
            "task.html",
            page=page,
            info=page.info,
            svg=svg,
            reads=reads,
            paged=paged,
            progress=progress_text(page.info.progress, time.time()),
        )

    async def task_text(self, request: Request) -> Response:
        """The whole of a text the task page cut: its error, worker, function name, or an
        attempt's worker or error (``n``: which attempt, counted from 0), as plain text."""
        q = request.query_params
        task_id, which = q.get("id", ""), q.get("field", "")
        try:
            info = await self.read(self.scheduler.status, task_id)
        except NotFoundError:
            return _text("no such task", 404)
        except InvalidArgument as exc:
            return _text(str(exc)[:300], 400)
        text: str | None = None
        if which in ("error", "worker", "fn"):
            text = getattr(info, which)
        elif which in ("attempt-worker", "attempt-error"):
            n = _offset(request, "n")
            if n < len(info.attempts):
                attempt = info.attempts[n]
                text = attempt.worker if which == "attempt-worker" else attempt.error
        if text is None:
            return _text("no such text", 404)
        return _text(text)

    async def task_api(self, request: Request) -> Response:
        task_id = request.query_params.get("id", "")
        try:
            page = await self.read(reads.task, self.scheduler, task_id)
        except NotFoundError:
            return json_response({"error": "not found"}, 404)
        except InvalidArgument:
            return json_response({"error": "no task can have that id"}, 400)
        except reads.Unreadable as exc:
            return json_response({"error": f"stored in a form that cannot be read: {exc}"}, 200)
        info = page.info
        ex = page.explanation
        fields = {
            "state": info.state.value,
            "version": str(info.version),
            "attempt": f"{info.attempt} of {info.max_attempts}",
            "worker": reads.short(info.worker) if info.worker else "-",
            "lease_left": seconds(page.lease_left),
            "reasons": "?" if ex is None else ", ".join(r.value for r in ex.reasons),
            "updated_at": times.relative(info.updated_at, time.time()),
            "progress": progress_text(info.progress, time.time()),
        }
        return json_response(
            {
                "task_id": reads.short(info.task_id),
                "state": info.state.value,
                "fields": fields,
                "svgs": {"graph": graph.render(page.hood, self.task_link(request))},
            }
        )

    async def task_events(self, request: Request) -> Response:
        """Server-sent events: ``progress`` at each report of the task, ``ended`` at its end."""
        task_id = request.query_params.get("id", "")
        try:
            await self.read(self.scheduler.progress, task_id)
        except NotFoundError:
            return json_response({"error": "not found"}, 404)
        except InvalidArgument:
            return json_response({"error": "no task can have that id"}, 400)
        return self.notices.response(task_id)

    async def tasks(self, request: Request) -> Response:
        q = request.query_params
        try:
            state = State(q.get("state") or "failed")
        except ValueError:
            return self.render(request, "error.html", 400, message="No such state.")
        fn = q.get("fn") or None
        cursor = q.get("cursor") or None
        try:
            page = await self.read(reads.task_list, self.scheduler, state, fn, cursor)
        except InvalidArgument as exc:
            return self.render(request, "error.html", 400, message=str(exc))
        counts = await self.read(reads.state_counts, self.scheduler)
        unserved: frozenset[str] = frozenset()
        if state in reads.QUEUED:
            unserved = await self.read(reads.unserved, self.scheduler, [t.fn for t in page.items])
        return self.render(
            request,
            "tasks.html",
            state=state,
            states=list(State),
            counts=counts,
            unserved=unserved,
            fn=fn or "",
            cursor=cursor,
            page=page,
            reads=reads,
        )

    async def leases(self, request: Request) -> Response:
        cursor = request.query_params.get("cursor") or None
        try:
            page = await self.read(reads.leases, self.scheduler, cursor)
        except InvalidArgument as exc:
            return self.render(request, "error.html", 400, message=str(exc))
        return self.render(request, "leases.html", leases=page, cursor=cursor)

    async def workers(self, request: Request) -> Response:
        rows = await self.read(self.scheduler.workers)
        return self.render(request, "workers.html", rows=rows)

    # ------------------------------------------------------------------ login

    async def login_form(self, request: Request) -> Response:
        if not self.allow_actions:
            return self.render(request, "error.html", 404, message="Actions are disabled.")
        return self.render(request, "login.html", failed=False, next=_local(request, "next"))

    async def login(self, request: Request) -> Response:
        if not self.allow_actions or self.signer is None:
            return self.render(request, "error.html", 403, message="Actions are disabled.")
        peer = _peer(request)
        wait = self.limiter.wait(peer)
        if wait > 0:
            return self.locked_out(request, wait)
        form = await request.form()
        given = form.get("token")
        target = _local_path(str(form.get("next") or "/"))
        if not isinstance(given, str) or not self.signer.token_matches(given):
            wait = self.limiter.failed(peer)
            log.warning("dashboard: a login with a wrong token from %s", peer)
            refused = self.render(request, "login.html", 403, failed=True, next=target)
            if wait > 0:
                refused.headers["Retry-After"] = retry_after(wait)
            return refused
        self.limiter.succeeded(peer)
        response = RedirectResponse(self.url(request, target, done="logged-in"), 303)
        response.set_cookie(
            COOKIE,
            self.signer.issue(),
            max_age=SESSION_S,
            path=self.link_base(request) + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    def locked_out(self, request: Request, wait: float) -> Response:
        """The 429 answer to a client that failed to log in too often."""
        log.warning(
            "dashboard: login attempts from %s refused for %.0f s (too many failures)",
            _peer(request),
            wait,
        )
        response = self.render(
            request,
            "error.html",
            429,
            message=f"Too many failed logins: try again in {seconds(math.ceil(wait))}.",
        )
        response.headers["Retry-After"] = retry_after(wait)
        return response

    async def logout(self, request: Request) -> Response:
        refused = await self.refuse(request)
        if refused is not None:
            return refused
        response = RedirectResponse(self.url(request, "/", done="logged-out"), 303)
        response.delete_cookie(COOKIE, path=self.link_base(request) + "/")
        return response

    # ------------------------------------------------------------------ actions

    async def refuse(self, request: Request) -> Response | None:
        """The 403 answer to a POST without actions enabled, a session or its CSRF token."""
        if not self.allow_actions:
            return self.render(request, "error.html", 403, message="Actions are disabled.")
        session = self.session(request)
        if session is None:
            return self.render(request, "error.html", 403, message="Log in with the token first.")
        form = await request.form()
        given = form.get("csrf")
        if not isinstance(given, str) or not Signer.csrf_matches(session, given):
            return self.render(request, "error.html", 403, message="Missing or wrong CSRF token.")
        return None

    async def action(self, request: Request) -> Response:
        refused = await self.refuse(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        form = await request.form()
        if name == "retry-failed":
            return await self.retry_failed(request, form.get("fn"), form.get("cursor"))
        if name == "purge-page":
            return await self.purge_page(request, form)
        task_id = form.get("id")
        if not isinstance(task_id, str) or not task_id:
            return self.render(request, "error.html", 400, message="No task id given.")
        version = form.get("version")
        try:
            done = await self.act_on_task(name, task_id, version)
        except NotFoundError:
            return self.render(
                request, "error.html", 404, message=f"No task {task_id!r} in this namespace."
            )
        except (ConflictError, InvalidArgument):
            done = "conflict"
        if done is None:
            return self.render(request, "error.html", 404, message="No such action.")
        log.info("dashboard: %s %r from %s: %s", name, task_id, _peer(request), done)
        return RedirectResponse(self.url(request, "/task", id=task_id, done=done), 303)

    async def act_on_task(self, name: str, task_id: str, version: Any = None) -> str | None:
        """Run the action ``name`` on one task; what came of it (the ``done`` the task
        page shows), or None when there is no such action. ``version``: the one the page
        showed, for pause and resume (another one meanwhile is a conflict)."""
        s = self.scheduler
        if name in ("pause", "resume"):
            fenced = int(version) if isinstance(version, str) and version.isdigit() else None
            method = s.pause_task if name == "pause" else s.resume_task
            changed = await self.read(method, task_id, fenced)
            if changed.change is Change.NOT_FOUND:
                raise NotFoundError(task_id)
            if changed.change in (Change.APPLIED, Change.UNCHANGED):
                return "paused" if name == "pause" else "resumed"
            return "conflict"
        if name == "cancel":
            state = await self.read(s.cancel, task_id)
            if state.terminal and state is not State.CANCELLED:
                return "conflict"
            return "cancel-requested" if state is State.RUNNING else "cancelled"
        if name == "retry":
            await self.read(s.retry, task_id)
            return "retried"
        if name == "expire":
            expired = await self.read(s.expire_lease, task_id)
            return "expired" if expired else "not-running"
        return None

    async def retry_failed(self, request: Request, fn: Any, cursor: Any) -> Response:
        """Retry the failed tasks of one page of the failed list (with its filter)."""
        fn = fn if isinstance(fn, str) and fn else None
        cursor = cursor if isinstance(cursor, str) and cursor else None
        try:
            page = await self.read(reads.task_list, self.scheduler, State.FAILED, fn, cursor)
        except InvalidArgument as exc:
            return self.render(request, "error.html", 400, message=str(exc))
        retried = await self.read(_retry_each, self.scheduler, [t.task_id for t in page.items])
        log.info("dashboard: retried %d failed tasks from %s", retried, _peer(request))
        # What was retried left the list: its first page now shows what is still failed.
        return RedirectResponse(
            self.url(request, "/tasks", state="failed", fn=fn, done="bulk-retried"), 303
        )

    async def purge_page(self, request: Request, form: Any) -> Response:
        """Remove now the ended tasks of one page of a terminal state's list."""
        try:
            state = State(str(form.get("state") or ""))
        except ValueError:
            state = State.PENDING
        if not state.terminal:
            return self.render(request, "error.html", 400, message="Only ended tasks go.")
        fn, cursor = form.get("fn") or None, form.get("cursor") or None
        try:
            page = await self.read(reads.task_list, self.scheduler, state, fn, cursor)
        except InvalidArgument as exc:
            return self.render(request, "error.html", 400, message=str(exc))
        ids = [t.task_id for t in page.items]
        removed = await self.read(self.scheduler.purge_tasks, ids) if ids else 0
        log.info("dashboard: purged %d %s tasks from %s", removed, state.value, _peer(request))
        return RedirectResponse(
            self.url(request, "/tasks", state=state.value, fn=fn, done="purged"), 303
        )


def _retry_each(scheduler: Scheduler, task_ids: list[str]) -> int:
    """Retry each task that is still failed; those that moved on are left alone."""
    done = 0
    for task_id in task_ids:
        try:
            scheduler.retry(task_id)
        except (ConflictError, NotFoundError):
            continue
        done += 1
    return done


def charts(page: reads.OverviewPage) -> dict[str, str]:
    """The overview's throughput charts as SVG markup (every text escaped)."""
    return {
        "hour": chart.render(chart.buckets(page.hour, 1), "last hour", "per minute"),
        "day": chart.render(
            chart.buckets(page.minutes, reads.DAY_BUCKET),
            "last day",
            f"per {reads.DAY_BUCKET} minutes",
        ),
    }


def overview_fields(data: Mapping[str, Any]) -> dict[str, str]:
    """The overview's numbers as shown, by the name of their place on the page."""
    # Ready splits into scheduled (not due yet) and ready (due now).
    counts = stage_counts(cast(Stats, data))
    fields = {f"count-{state}": f"{n:,}" for state, n in counts.items()}
    limit = data["max_running"]
    fields.update(
        {
            "running": f"{data['running']:,}" + (f" of {limit:,}" if limit is not None else ""),
            "queue": f"{data['queue_entries']:,}",
            "live": f"{data['live_entries']:,}",
            "stale": f"{data['stale_entries']:,} ({data['stale_ratio']:.0%})",
            "oldest": seconds(data["oldest_ready_age"]) if data["oldest_ready_age"] else "-",
            "leases": f"{data['leases']:,}",
            "expiring": f"{data['leases_expiring']:,}",
            "expired": f"{data['leases_expired']:,}",
            "workers": f"{data['workers_alive']} alive of {data['workers']}",
            "slots": f"{data['slots']:,}",
            "server_time": iso(data["server_time"]),
            **_memory_fields(data["memory"]),
            "hour-succeeded": f"{data['hour']['succeeded']:,}",
            "hour-failed": f"{data['hour']['failed']:,}",
            "day-succeeded": f"{data['day']['succeeded']:,}",
            "day-failed": f"{data['day']['failed']:,}",
        }
    )
    # The keys table keeps the rows it was drawn with: a row whose place is now empty is
    # blanked rather than left showing an old key; a key new to the top list shows on reload.
    loads = data["keys"]
    for i in range(STATS_TOP_KEYS):
        load = loads[i] if i < len(loads) else None
        fields.update(
            {
                f"key-{i}-key": "" if load is None else load["key"] or DEFAULT_KEY,
                f"key-{i}-running": "" if load is None else f"{load['running']:,}",
                f"key-{i}-queued": "" if load is None else f"{load['queued']:,}",
                f"key-{i}-cap": "" if load is None else _cap(load["cap"]),
                f"key-{i}-wait": "" if load is None else seconds(load["ready_wait_s"]),
            }
        )
    return fields


def _memory_fields(plan: Mapping[str, Any] | None) -> dict[str, str]:
    """The retention plan's figures (docs: "Planning for retention")."""
    if plan is None:
        return {"memory-ended": "-", "memory-projected": "not readable by this user"}
    per_task = plan["bytes_per_ended_task"]
    ended = f"{plan['ended_kept']:,} kept, {size(plan['kept_bytes'])}"
    if per_task is not None:
        ended += f" ({per_task:,.0f} B each)"
    projected = f"{size(plan['projected_bytes'])} at {plan['ended_per_s']:,.1f} endings/s"
    if plan["fraction_of_maxmemory"] is not None:
        projected += f", {plan['fraction_of_maxmemory']:.0%} of maxmemory"
    return {"memory-ended": ended, "memory-projected": projected}


# How the default key (tasks given no key) is shown in the keys table.
DEFAULT_KEY = '"" (tasks without a key)'


def _cap(cap: int | None) -> str:
    return "none" if cap is None else f"{cap:,}"


def json_response(data: Any, status_code: int = 200) -> JSONResponse:
    response = JSONResponse(finite_or_none(jsonable(data)), status_code=status_code)
    response.headers["Cache-Control"] = "no-store"
    return response


def _offset(request: Request, name: str) -> int:
    """A non-negative offset from the query (0 when absent or not a number)."""
    value = request.query_params.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else 0


def _text(text: str, status_code: int = 200) -> PlainTextResponse:
    response = PlainTextResponse(text, status_code=status_code)
    response.headers["Cache-Control"] = "no-store"
    return response


def _local_path(path: str) -> str:
    """A path inside the dashboard to go to after logging in (never another site)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def _local(request: Request, name: str) -> str:
    return _local_path(request.query_params.get(name) or "/")


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"


# A browser marks a request sent by another site's page so (Fetch Metadata); a sibling
# subdomain ("same-site") is another origin too.
REFUSED_FETCH_SITES = frozenset({"cross-site", "same-site"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def foreign_post(request: Request, trusted: frozenset[str] = frozenset()) -> str | None:
    """Why a POST comes from another site's page (None: it does not, as far as the
    browser says): its ``Sec-Fetch-Site`` is cross-site or same-site, or its ``Origin`` is
    present and neither the dashboard's own (the host and port of its ``Host`` header; a
    ``Host`` without a port stands for the default port of the origin's scheme) nor one of
    ``trusted``."""
    site = request.headers.get("sec-fetch-site", "").lower()
    if site in REFUSED_FETCH_SITES:
        return f"Sec-Fetch-Site is {site}"
    origin = request.headers.get("origin")
    if origin is None or origin in trusted or _same_origin(origin, request):
        return None
    return f"Origin {origin[:200]!r} is not this dashboard's"


def _same_origin(origin: str, request: Request) -> bool:
    try:
        theirs = urlsplit(origin)
        ours = urlsplit("//" + request.headers.get("host", ""))
        if theirs.scheme not in DEFAULT_PORTS or not theirs.hostname:
            return False
        their_port = theirs.port or DEFAULT_PORTS[theirs.scheme]
        our_port = ours.port
    except ValueError:  # a port that is not a number
        return False
    if theirs.hostname != ours.hostname or theirs.path or theirs.query:
        return False
    if our_port is None:  # the default port of the scheme the browser used
        return their_port == DEFAULT_PORTS[theirs.scheme]
    # Behind a proxy that ends TLS the request arrives as http: the scheme is the origin's.
    return their_port == our_port


def _same_site_only(
    handler: Callable[[Request], Awaitable[Response]], dashboard: Dashboard
) -> Callable[[Request], Awaitable[Response]]:
    """A POST sent by another site's page is refused with 403, whatever its session."""

    async def checked(request: Request) -> Response:
        why = foreign_post(request, dashboard.trusted_origins)
        if why is not None:
            log.warning(
                "dashboard: refused a POST to %s from %s: %s", request.url.path, _peer(request), why
            )
            return dashboard.render(
                request, "error.html", 403, message="Refused: this form was sent by another site."
            )
        return await handler(request)

    return checked


def _guard(
    handler: Callable[[Request], Awaitable[Response]], dashboard: Dashboard
) -> Callable[[Request], Awaitable[Response]]:
    """Redis trouble is a 503 page, not a crash."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except redis.RedisError as exc:
            log.warning("dashboard: Redis error on %s: %s", request.url.path, exc)
            if request.url.path.startswith(f"{dashboard.base(request)}/api/"):
                return json_response({"error": "Redis is unavailable"}, 503)
            return dashboard.render(
                request, "error.html", 503, message="Redis is unavailable; retry in a moment."
            )

    return guarded


# Scripts and styles come from the dashboard's own static files only (no inline script
# runs, so injected markup could not run any); no other site may frame its pages.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(
    scheduler: Scheduler | str,
    namespace: str | None = None,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    trusted_origins: Iterable[str] = (),
) -> Starlette:
    """The dashboard as an ASGI application, to serve or to mount in another app.

    ``scheduler`` is a :class:`~distsched.client.Scheduler` (``namespace``, when given,
    must be its namespace) or a Redis URL (then ``namespace`` defaults to
    ``"default"``, and the app closes the connection at shutdown). Read-only unless
    ``allow_actions``, which needs a ``token`` of at least 32 characters (make one with
    ``secrets.token_urlsafe(32)``): a user logs in with it once, then may cancel, retry and
    expire leases. A POST sent from another site's page is refused (its ``Origin`` or
    ``Sec-Fetch-Site`` says so); ``trusted_origins`` (``"https://ops.example.com"``) are
    accepted too, for a proxy that changes the ``Host`` header.

    Mount it with ``Mount("/tasks", app=create_app(...))`` in Starlette or
    ``app.mount("/tasks", create_app(...))`` in FastAPI: every link follows the prefix.
    """
    owns = isinstance(scheduler, str)
    if isinstance(scheduler, str):
        scheduler = Scheduler.from_url(scheduler, namespace=namespace or "default")
    elif not isinstance(scheduler, Scheduler):
        raise InvalidArgument(
            "scheduler", "must be a distsched.Scheduler (not an AsyncScheduler) or a Redis URL"
        )
    elif namespace is not None and namespace != scheduler.namespace:
        raise InvalidArgument(
            "namespace", f"is {namespace!r} but the scheduler's is {scheduler.namespace!r}"
        )
    if allow_actions:
        check_token(token)
    elif token is not None and not token:
        raise InvalidArgument("token", "must not be empty")
    if isinstance(trusted_origins, str):
        trusted_origins = (trusted_origins,)
    d = Dashboard(scheduler, allow_actions, token, owns, [o.rstrip("/") for o in trusted_origins])
    get: list[tuple[str, Handler, str]] = [
        ("/", d.overview, "overview"),
        ("/api/overview", d.overview_api, "overview_api"),
        ("/tasks", d.tasks, "tasks"),
        ("/task", d.task, "task"),
        ("/task/text", d.task_text, "task_text"),
        ("/api/task", d.task_api, "task_api"),
        ("/api/task/events", d.task_events, "task_events"),
        ("/leases", d.leases, "leases"),
        ("/workers", d.workers, "workers"),
        ("/login", d.login_form, "login_form"),
    ]
    post: list[tuple[str, Handler, str]] = [
        ("/login", d.login, "login"),
        ("/logout", d.logout, "logout"),
        ("/actions/{name}", d.action, "action"),
    ]
    for pages in (schedules.SchedulePages(d), keys.KeyPages(d)):
        more_get, more_post = pages.routes()
        get += more_get
        post += more_post
    failures.register(d, get, post)
    routes: list[Route | Mount] = [
        Route(path, _guard(fn, d), methods=["GET"], name=name) for path, fn, name in get
    ]
    routes += [
        Route(path, _guard(_same_site_only(fn, d), d), methods=["POST"], name=name)
        for path, fn, name in post
    ]
    routes.append(Mount("/static", StaticFiles(directory=HERE / "static"), name="static"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if d.owns:
                d.scheduler.close()

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(SecurityHeaders)])
    app.state.dashboard = d
    return app
