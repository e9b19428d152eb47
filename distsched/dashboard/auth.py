"""The dashboard's sessions: a token login, a signed cookie, a CSRF token per session.

A session is ``<issued ms>.<random id>.<signature>``, signed with HMAC-SHA256 under a key
derived from the dashboard's token and namespace: nothing is stored server-side, several
server processes started with the same token accept each other's sessions, and changing
the token ends every session. The CSRF token of a session is the HMAC of its id, so a
form posted from another site (which cannot read the page) cannot carry it.

Failed logins are limited per client address (:class:`LoginLimiter`), so the token cannot be
guessed one request at a time, however many requests are sent at once.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from distsched.errors import InvalidArgument

COOKIE = "distsched_dashboard"
SESSION_S = 12 * 3600
# A token allowing actions: at least this many characters, at least MIN_TOKEN_DISTINCT
# different ones, and not a shorter text repeated (``secrets.token_urlsafe(32)`` gives 43
# characters of 64 kinds; ``openssl rand -hex 16`` gives 32 of 16 kinds).
MIN_TOKEN_CHARS = 32
MIN_TOKEN_DISTINCT = 8
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def check_token(token: str | None) -> str:
    """The token, or ``InvalidArgument`` when it is missing or too weak to allow actions:
    shorter than ``MIN_TOKEN_CHARS``, fewer than ``MIN_TOKEN_DISTINCT`` different
    characters, or a shorter text repeated."""
    if token is None or len(token) < MIN_TOKEN_CHARS:
        why = f"must be at least {MIN_TOKEN_CHARS} characters to allow actions"
    elif len(set(token)) < MIN_TOKEN_DISTINCT:
        why = f"has fewer than {MIN_TOKEN_DISTINCT} different characters: too easy to guess"
    elif _repeats(token):
        why = "is a shorter text repeated: too easy to guess"
    else:
        return token
    raise InvalidArgument("token", f"{why}; make one with {MAKE_TOKEN}")


def _repeats(text: str) -> bool:
    """Whether ``text`` is some shorter text repeated (``abcabcabc``)."""
    return (text + text).find(text, 1) < len(text)


# Failed logins a client may make before it must wait; then it waits LOCK_BASE_S, doubled
# by each further failure, up to LOCK_MAX_S. A client with no failure for FORGET_S is
# forgotten; at most MAX_CLIENTS are remembered (the longest quiet one is forgotten first).
FREE_FAILURES = 5
LOCK_BASE_S = 1.0
LOCK_MAX_S = 900.0
FORGET_S = 3600.0
MAX_CLIENTS = 4096


@dataclass
class _Failures:
    count: int
    last: float
    locked_until: float


class LoginLimiter:
    """Failed logins per client: after ``FREE_FAILURES`` a client waits, twice as long
    after each further failure (``LOCK_BASE_S`` up to ``LOCK_MAX_S``); a success forgets it.

    Clients are told apart by address, an IPv6 address by its /64 (one host usually holds
    the whole prefix). Memory is bounded: at most ``max_clients`` are remembered.
    """

    def __init__(
        self, max_clients: int = MAX_CLIENTS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_clients = max_clients
        self.clock = clock
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    @staticmethod
    def client_key(address: str) -> str:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address[:100]
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.IPv6Network((ip, 64), strict=False))
        return str(ip)

    def wait(self, address: str) -> float:
        """Seconds ``address`` must wait before its next login attempt (0: none)."""
        now = self.clock()
        entry = self._clients.get(self.client_key(address))
        if entry is None:
            return 0.0
        return max(0.0, entry.locked_until - now)

    def failed(self, address: str) -> float:
        """Count a failed login of ``address``; the seconds it must now wait."""
        now = self.clock()
        key = self.client_key(address)
        entry = self._clients.pop(key, None)
        if entry is None or now - entry.last > FORGET_S:
            entry = _Failures(0, now, now)
        entry.count += 1
        entry.last = now
        over = entry.count - FREE_FAILURES
        if over >= 0:
            entry.locked_until = now + min(LOCK_MAX_S, LOCK_BASE_S * 2 ** min(over, 30))
        self._clients[key] = entry  # the most recent last
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return max(0.0, entry.locked_until - now)

    def succeeded(self, address: str) -> None:
        self._clients.pop(self.client_key(address), None)

    def __len__(self) -> int:
        return len(self._clients)


def retry_after(wait_s: float) -> str:
    """A ``Retry-After`` header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


@dataclass(frozen=True)
class Session:
    session_id: str
    csrf: str


class Signer:
    """Issues and checks session cookies and CSRF tokens for one token."""

    def __init__(self, token: str, namespace: str) -> None:
        self._token = token.encode("utf-8")
        self._key = hmac.new(
            self._token,
            b"distsched-dashboard-session\x00" + namespace.encode("utf-8"),
            hashlib.sha256,
        ).digest()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8"), self._token)

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode("ascii"), hashlib.sha256).hexdigest()

    def issue(self, now: float | None = None) -> str:
        """A new session cookie value."""
        issued = int((time.time() if now is None else now) * 1000)
        body = f"{issued}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign(body)}"

    def session(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session of a cookie value, or None when it is missing, forged or expired."""
        if not cookie or not cookie.isascii():
            return None
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        issued, _, session_id = body.partition(".")
        try:
            age = (time.time() if now is None else now) - int(issued) / 1000
        except ValueError:
            return None
        if not -60 <= age < SESSION_S or not session_id:
            return None
        return Session(session_id, self._sign("csrf." + session_id))

    @staticmethod
    def csrf_matches(session: Session, given: str) -> bool:
        return hmac.compare_digest(session.csrf.encode("ascii"), given.encode("utf-8"))
