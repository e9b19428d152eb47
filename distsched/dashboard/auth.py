"""The dashboard's sessions: a token login, a signed cookie, a CSRF token per session.

A session is ``<issued ms>.<random id>.<signature>``, signed with HMAC-SHA256 under a key
derived from the dashboard's token and namespace: nothing is stored server-side, several
server processes started with the same token accept each other's sessions, and changing
the token ends every session. The CSRF token of a session is the HMAC of its id, so a
form posted from another site (which cannot read the page) cannot carry it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from distsched.errors import InvalidArgument

COOKIE = "distsched_dashboard"
SESSION_S = 12 * 3600
MIN_TOKEN_CHARS = 12


def check_token(token: str | None) -> str:
    """The token, or ``InvalidArgument`` when it is missing or too short to allow actions."""
    if token is None or len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgument(
            "token", f"must be at least {MIN_TOKEN_CHARS} characters to allow actions"
        )
    return token


@dataclass(frozen=True)
class Session:
    session_id: str
    csrf: str


class Signer:
    """Issues and checks session cookies and CSRF tokens for one token."""

    def __init__(self, token: str, namespace: str) -> None:
        self._token = token.encode("utf-8")
        self._key = hmac.new(
            self._token, b"distsched-dashboard-session\x00" + namespace.encode("utf-8"),
            hashlib.sha256,
        ).digest()  # fmt: skip

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
