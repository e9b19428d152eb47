"""What the worker's threads share: which Redis errors are transient, and the backoff."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from distsched.subscription import RETRY_CAP_S, RETRY_FIRST_S, backoff

# Errors a worker rides out by backing off and trying again (§8).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
RETRY_MIN_S = RETRY_FIRST_S
RETRY_MAX_S = RETRY_CAP_S

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "TRANSIENT", "backoff"]
