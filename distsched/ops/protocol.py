"""The machinery every operation is written against.

Every public operation of the schedulers is a generator (an :data:`Op`): it yields
the requests it needs (a script :class:`~distsched.wire.calls.Call`, plain
:class:`Commands` sent together, a :class:`Sleep`, a :class:`Listen`) and receives
each reply through ``send`` (a refused script call arrives as a thrown error). The
sync and asyncio shells only drive these generators over their connections, so the
logic of an operation is written once, whatever the I/O model.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redis import exceptions as redis_exceptions

from distsched.errors import Unavailable
from distsched.wire.calls import Call
from distsched.wire.replies import translate_error

# The longest single wait on a timer (threading's own limit is far above any real delay).
MAX_WAIT_S = 3600.0
# A client waiting for an outcome (``Scheduler.wait``) registers again and re-reads the
# task at least this often: a notice lost with its connection costs at most this long.
WAIT_REFRESH_S = 60.0
# How long a registration outlives the wait it was made for: room for the client to
# come round and register again before housekeeping (reap.lua) drops the entry.
WAIT_MARGIN_MS = 10_000


T = TypeVar("T")


@dataclass(frozen=True)
class Commands:
    """Plain Redis commands sent together; ``atomic`` wraps them in MULTI/EXEC."""

    commands: tuple[tuple[Any, ...], ...]
    atomic: bool = True


@dataclass(frozen=True)
class Sleep:
    """Pause before the next request (a retry after Redis was briefly unavailable)."""

    seconds: float


@dataclass(frozen=True)
class Listen:
    """Wait up to ``seconds`` for a notice that the task watched by ``handle`` ended.

    ``handle`` is what the shell made for this wait in its one shared subscription to
    the ``ended`` channel; the reply is True when a notice (or a reconnection, after
    which notices may have been lost) came, False when the time ran out.
    """

    handle: Any
    seconds: float


Request = Call | Commands | Sleep | Listen
Op = Generator[Request, Any, T]

# Pauses between tries of a read while Redis is briefly unavailable (a failover or a
# slot migration takes about this long); reads are idempotent, so they are retried.
READ_RETRY_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

# Errors that say "not now" rather than "not this": the call may succeed if sent again.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis_exceptions.ConnectionError,  # BusyLoadingError included
    redis_exceptions.TimeoutError,
    redis_exceptions.TryAgainError,
    redis_exceptions.ClusterDownError,  # MasterDownError included
    redis_exceptions.ReadOnlyError,
    redis_exceptions.AskError,  # MovedError included: redirects the client did not follow
    redis_exceptions.SlotNotCoveredError,
    # The cluster client gave up following redirections ("TTL exhausted"): a slot on
    # the move, or a failover, outlasted its tries.
    redis_exceptions.ClusterError,
    # The cluster client could reach no node ("no node reachable"), or lost its slot map.
    redis_exceptions.RedisClusterException,
)


# Of those, the refusals of a call that did not run: the keys' slot is on the move
# (TRYAGAIN, a redirection the client did not follow), the cluster or the master is down
# (CLUSTERDOWN, MASTERDOWN), the node is a replica now (READONLY), or loading its data.
# Sent again, such a call runs once at most.
NOT_RUN_ERRORS: tuple[type[Exception], ...] = (
    redis_exceptions.TryAgainError,
    redis_exceptions.AskError,
    redis_exceptions.ClusterDownError,
    redis_exceptions.SlotNotCoveredError,
    redis_exceptions.ReadOnlyError,
    redis_exceptions.BusyLoadingError,
)

# How long a script call refused without running waits for its slot, in all, sent again
# after pauses doubling from the first to the last: past it, Unavailable is raised.
NOT_RUN_WAIT_S = 10.0
NOT_RUN_PAUSES_S = (0.05, 0.5)


def not_run(exc: BaseException) -> bool:
    """Whether ``exc`` (an :class:`Unavailable` raised inside an operation) says the
    call was refused before it ran, so that sending it again is safe."""
    if not isinstance(exc, Unavailable):
        return False
    cause = exc.__cause__
    # The cluster client gives up after as many redirections and TRYAGAIN answers as it
    # follows ("TTL exhausted"): each of them was a refusal too (a lost connection is
    # raised as such, never counted there).
    exhausted = isinstance(cause, redis_exceptions.ClusterError) and "TTL exhausted" in str(cause)
    return exhausted or isinstance(cause, NOT_RUN_ERRORS)


def failure(exc: Exception) -> Failure:
    """The error a refused or failed request raises inside its operation.

    Transient errors become :class:`~distsched.errors.Unavailable`; a script's own
    error reply becomes the exception the API promises for it; anything else (an ACL
    refusal, a wrong password among them) is raised as redis-py raised it.
    """
    kept_as_is = (
        Unavailable,
        redis_exceptions.NoPermissionError,
        redis_exceptions.AuthenticationError,
        redis_exceptions.AuthorizationError,
    )
    if isinstance(exc, kept_as_is):
        # The operator's business, not a passing fault: keep redis-py's own exception.
        return Failure(exc)
    if isinstance(exc, TRANSIENT_ERRORS):
        error = Unavailable(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return Failure(error)
    if isinstance(exc, redis_exceptions.ResponseError):
        return Failure(translate_error(str(exc)))
    return Failure(exc)


@dataclass(frozen=True)
class Failure:
    """A script's error reply, translated, to be raised inside the operation."""

    error: Exception


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


def advance(op: Op[T], reply: Any) -> Request | Done[T]:
    """Give ``op`` the reply to its last request; return its next request or its result."""
    try:
        if isinstance(reply, Failure):
            return op.throw(reply.error)
        return op.send(reply)
    except StopIteration as stop:
        return Done(stop.value)


def _one(command: tuple[Any, ...]) -> Commands:
    return Commands((command,), atomic=False)
