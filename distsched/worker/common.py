"""What the worker's threads share: which Redis errors are transient, and the backoff."""

from __future__ import annotations

from collections.abc import Iterator

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Errors a worker rides out by backing off and trying again (§8).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
RETRY_MIN_S = 0.05
RETRY_MAX_S = 2.0


def backoff() -> Iterator[float]:
    """Pauses between attempts: doubling from ``RETRY_MIN_S`` up to ``RETRY_MAX_S``."""
    delay = RETRY_MIN_S
    while True:
        yield delay
        delay = min(RETRY_MAX_S, delay * 2)
