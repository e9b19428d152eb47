"""What a page's routes need of the dashboard, so that page modules do not import the app.

``Dashboard`` (in ``app.py``) satisfies :class:`Pages`; the Failures, Keys and Schedules
pages take it as a ``Pages`` and hand back their routes as ``(path, Handler, name)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from distsched.client import Scheduler

T = TypeVar("T")

Handler = Callable[[Request], Awaitable[Response]]


class Pages(Protocol):
    """What a page needs of the dashboard (its ``Dashboard``)."""

    scheduler: Scheduler

    def url(self, request: Request, path: str, **query: Any) -> str: ...

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> Response: ...

    async def read(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def refuse(self, request: Request) -> Response | None: ...
