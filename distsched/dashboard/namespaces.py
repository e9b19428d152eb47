"""One dashboard for several namespaces of one Redis (:func:`create_multi_app`): each
namespace's dashboard under ``/ns/<namespace>/``, and a switcher in every page's header."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route

from distsched.client import Scheduler
from distsched.dashboard.app import SECURITY_HEADERS, Dashboard, create_app
from distsched.errors import InvalidArgument
from distsched.keys import validate_namespace

# Where each namespace's dashboard is mounted, below the app's own prefix.
MOUNT = "/ns/"
# Characters a namespace served beside others may not hold: its mount path must come back
# from the browser as the same path, and name no other namespace's page.
REFUSED = "/?#%\\"
# The pages that every namespace has: the switcher keeps the page the user is on.
SHARED_PAGES = frozenset({"/", "/tasks", "/leases", "/workers", "/schedules", "/keys"})


def namespace_list(namespaces: Iterable[str]) -> list[str]:
    """The namespaces to serve, checked, in the order given (repeats dropped)."""
    if isinstance(namespaces, str):
        namespaces = (namespaces,)
    names = list(dict.fromkeys(validate_namespace(ns) for ns in namespaces))
    if not names:
        raise InvalidArgument("namespaces", "give at least one namespace")
    for ns in names:
        if any(c in ns for c in REFUSED):
            raise InvalidArgument(
                "namespaces", f"{ns!r}: a namespace served beside others cannot hold / ? # % \\"
            )
    return names


def create_multi_app(
    scheduler: Scheduler | str,
    namespaces: Iterable[str],
    *,
    allow_actions: bool = False,
    token: str | None = None,
    trusted_origins: Iterable[str] = (),
) -> Starlette:
    """The dashboards of several namespaces of one Redis as one ASGI application.

    Each namespace's dashboard (as :func:`~distsched.dashboard.create_app` makes it, with
    the same ``allow_actions``, ``token`` and ``trusted_origins``) is served under
    ``/ns/<namespace>/``; ``/`` leads to the first namespace, and every page's header has a
    switcher to the others (it keeps the list page the user is on). ``scheduler`` is a
    :class:`~distsched.client.Scheduler` whose Redis connection every namespace shares
    (the app does not close it), or a Redis URL (the app closes that connection at
    shutdown). A session is one namespace's: log in again in another. A namespace that
    holds ``/``, ``?``, ``#``, ``%`` or ``\\`` cannot be served beside others.
    """
    names = namespace_list(namespaces)
    if isinstance(scheduler, str):
        base = Scheduler.from_url(scheduler, namespace=names[0])
    elif isinstance(scheduler, Scheduler):
        base = scheduler
    else:
        raise InvalidArgument(
            "scheduler", "must be a distsched.Scheduler (not an AsyncScheduler) or a Redis URL"
        )
    owned = [Scheduler(base.client, namespace=ns) for ns in names if ns != base.namespace]
    by_name = {s.namespace: s for s in (base, *owned)}
    routes: list[Route | Mount] = []
    try:
        for ns in sorted(names, key=len, reverse=True):  # a longer name is matched first
            app = create_app(
                by_name[ns],
                allow_actions=allow_actions,
                token=token,
                trusted_origins=trusted_origins,
            )
            dashboard: Dashboard = app.state.dashboard
            dashboard.switcher = _Switch(dashboard.namespace, names)
            routes.append(Mount(MOUNT + ns, app=app))
    except BaseException:
        _close(owned, base if isinstance(scheduler, str) else None)
        raise
    first = names[0]

    async def home(request: Request) -> Response:
        prefix = quote(Dashboard.base(request), safe="/")
        response = RedirectResponse(f"{prefix}{MOUNT}{quote(first, safe='')}/", 307)
        # The mounted dashboards add these to their own answers; this one is the app's.
        for name, value in SECURITY_HEADERS:
            response.headers[name.decode()] = value.decode()
        return response

    routes.insert(0, Route("/", home, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            _close(owned, base if isinstance(scheduler, str) else None)

    return Starlette(routes=routes, lifespan=lifespan)


class _Switch:
    """The header's switcher of one namespace's dashboard: ``(name, link, current)``."""

    def __init__(self, namespace: str, names: list[str]) -> None:
        self.namespace = namespace
        self.names = names
        self.own = MOUNT + namespace

    def __call__(self, request: Request) -> list[tuple[str, str, bool]]:
        base = Dashboard.base(request)
        outer = base[: -len(self.own)] if base.endswith(self.own) else base
        page = request.url.path[len(base) :] if request.url.path.startswith(base) else "/"
        page = page if page in SHARED_PAGES else "/"
        if page == "/tasks" and request.query_params.get("state"):
            page += "?state=" + quote(request.query_params["state"], safe="")
        return [
            (ns, quote(f"{outer}{MOUNT}{ns}", safe="/") + page, ns == self.namespace)
            for ns in self.names
        ]


def _close(owned: list[Scheduler], base: Scheduler | None) -> None:
    """Close the schedulers the app made; ``base`` last (it holds the connection)."""
    for s in owned:
        s.close()
    if base is not None:
        base.close()
