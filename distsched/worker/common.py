"""What the worker's threads share: which Redis errors are transient, and the backoff."""

from __future__ import annotations

import random
from collections.abc import Iterator

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from distsched.subscription import RETRY_CAP_S, RETRY_FIRST_S, backoff

# Errors a worker rides out by backing off and trying again (§8).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
RETRY_MIN_S = RETRY_FIRST_S
RETRY_MAX_S = RETRY_CAP_S

# The longest pause of a worker between two tries while Redis is unreachable: each try
# also asks the cluster where the namespace's slot is now, so a worker claims, reports
# and extends its leases again within about this long of a failover's end, not after
# the longer pauses a refusal gets.
RESUME_PROBE_S = 0.25


def probe_backoff() -> Iterator[float]:
    """Pauses between tries while Redis is unreachable: doubling from RETRY_MIN_S to
    RESUME_PROBE_S, each drawn between half and all of that, so that a fleet's retries
    spread instead of arriving together."""
    pause = RETRY_MIN_S
    while True:
        yield random.uniform(pause / 2, pause)
        pause = min(pause * 2, RESUME_PROBE_S)


__all__ = [
    "RESUME_PROBE_S",
    "RETRY_MAX_S",
    "RETRY_MIN_S",
    "TRANSIENT",
    "backoff",
    "probe_backoff",
]
