"""The fairness keys page: every key of a fair namespace, idle ones included, with its
cap, weight and rate, which a logged-in user of a dashboard started with actions allowed
sets from the page (``Scheduler.set_key``)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from distsched.client import Scheduler
from distsched.dashboard.pages import Handler, Pages
from distsched.errors import InvalidArgument
from distsched.model import KeyInfo

log = logging.getLogger("distsched.dashboard")

# The most keys the page reads (those with work first, then those with settings).
KEYS_LIMIT = 1000

NOTES = {"key-set": "Key settings saved: they apply from the next claim."}


@dataclass(frozen=True)
class KeysPage:
    keys: list[KeyInfo]
    now: float  # server clock

    @property
    def fair(self) -> bool:
        return bool(self.keys)

    @property
    def full(self) -> bool:
        """Whether there may be more keys than the page read."""
        return len(self.keys) >= KEYS_LIMIT

    @property
    def default_cap(self) -> int | None:
        return self.keys[0].default_cap if self.keys else None

    def head_wait(self, info: KeyInfo) -> float | None:
        """Seconds until the key's first queued task is due (negative: due for that long)."""
        return None if info.head_due_at is None else info.head_due_at - self.now


def read(scheduler: Scheduler) -> KeysPage:
    infos = scheduler.fair_keys(KEYS_LIMIT)
    return KeysPage(sorted(infos, key=lambda i: i.key), scheduler.server_time())


def rate_text(info: KeyInfo) -> str:
    """``5 per 1 s``, or ``none``."""
    if info.rate is None:
        return "none"
    return f"{info.rate:,} per {info.per_s or 1.0:g} s"


def units_text(info: KeyInfo) -> str:
    """``37 of 40 left``, or ``-`` for a key without a rate."""
    if info.rate is None or info.units is None:
        return "-"
    return f"{info.units:,} of {info.rate:,} left"


def _whole(form: Any, name: str, *, empty: int | None) -> int | None:
    """A whole number from the form (``empty`` when left blank)."""
    raw = form.get(name)
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return empty
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(name, f"must be a whole number, got {text[:40]!r}") from None


def _seconds(form: Any, name: str) -> float:
    raw = form.get(name)
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidArgument(name, f"must be a number of seconds, got {text[:40]!r}")
    return value


def settings(form: Any) -> tuple[str, int | None, int, int | None, float]:
    """``(key, cap, weight, rate, per)`` from the key form; ``InvalidArgument`` naming the
    field for what is not a number (``Scheduler.set_key`` checks the ranges)."""
    key = form.get("key")
    if not isinstance(key, str):
        raise InvalidArgument("key", "is missing")
    cap = _whole(form, "cap", empty=None)
    weight = _whole(form, "weight", empty=1)
    rate = _whole(form, "rate", empty=None)
    per = _seconds(form, "per")
    return key, cap, 1 if weight is None else weight, rate, per


class KeyPages:
    """The routes of the keys page and of its form."""

    def __init__(self, dashboard: Pages) -> None:
        self.d = dashboard

    async def page(self, request: Request) -> Response:
        page = await self.d.read(read, self.d.scheduler)
        return self.d.render(
            request, "keys.html", page=page, rate_text=rate_text, units_text=units_text
        )

    async def set_key(self, request: Request) -> Response:
        refused = await self.d.refuse(request)
        if refused is not None:
            return refused
        form = await request.form()
        try:
            key, cap, weight, rate, per = settings(form)
            await self.d.read(self.d.scheduler.set_key, key, cap, weight, rate, per)
        except InvalidArgument as exc:
            return self.d.render(request, "error.html", 400, message=str(exc)[:300])
        peer = request.client.host if request.client else "?"
        log.info(
            "dashboard: key %r set to cap %s, weight %s, rate %s per %g s from %s",
            key,
            cap,
            weight,
            rate,
            per,
            peer,
        )
        return RedirectResponse(self.d.url(request, "/keys", done="key-set"), 303)

    def routes(self) -> tuple[list[tuple[str, Handler, str]], list[tuple[str, Handler, str]]]:
        """(GET routes, POST routes) as ``(path, handler, name)``."""
        return [("/keys", self.page, "keys")], [("/keys/set", self.set_key, "set_key")]
