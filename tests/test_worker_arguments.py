"""The worker checks every argument when it is built (§8, §12): a bad one raises
``InvalidArgument`` naming it, before any thread starts or anything is written."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import redis

from distsched import Scheduler, Worker
from distsched.errors import InvalidArgument
from tests.conftest import namespace_keys, running


def ok() -> None:
    pass


GOOD: dict[str, Any] = {"functions": {"ok": ok}}

BAD_SECONDS = [-1, math.nan, math.inf, -math.inf, "1", True, [1]]


@pytest.mark.parametrize(
    ("field", "value"),
    [("concurrency", v) for v in (0, -3, 1.5, "4", True, None)]
    + [("functions", v) for v in ({}, {"ok": 42}, {5: ok}, {"": ok}, [ok], "ok", None)]
    + [("worker_id", v) for v in ("", 7, b"bytes", "\ud800")]
    + [("heartbeat_s", v) for v in (0, 0.0, *BAD_SECONDS)]
    + [("grace", v) for v in (*BAD_SECONDS, None)]
    + [("cancel_wait", v) for v in (*BAD_SECONDS, None)]
    + [("unserved_timeout", v) for v in (*BAD_SECONDS, None)]
    + [("metrics", v) for v in (object(), "prometheus", {})],
)
def test_a_bad_worker_argument_is_refused_naming_it_before_anything_starts(
    scheduler: Scheduler, redis_client: redis.Redis, field: str, value: Any
) -> None:
    threads_before = set(threading.enumerate())
    keys_before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(InvalidArgument) as info:
        Worker(scheduler, **{**GOOD, field: value})
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
    assert set(threading.enumerate()) == threads_before
    assert namespace_keys(redis_client, scheduler.namespace) == keys_before


@pytest.mark.parametrize("grace", [-1, math.nan, math.inf, "5"])
def test_stop_refuses_a_bad_grace_naming_it(scheduler: Scheduler, grace: Any) -> None:
    worker = Worker(scheduler, {"ok": ok})
    with pytest.raises(InvalidArgument) as info:
        worker.stop(grace)
    assert info.value.field == "grace"


def test_the_boundary_values_are_accepted(scheduler: Scheduler) -> None:
    worker = Worker(
        scheduler, {"ok": ok}, concurrency=1, worker_id="w", heartbeat_s=0.001, grace=0,
        cancel_wait=0, unserved_timeout=0,
    )  # fmt: skip
    assert (worker.concurrency, worker.worker_id, worker.heartbeat_s) == (1, "w", 0.001)
    assert (worker.grace, worker.cancel_wait, worker.unserved_timeout) == (0.0, 0.0, 0.0)
    # Without heartbeat_s, leases are extended three times per lease.
    assert Worker(scheduler, {"ok": ok}).heartbeat_s == pytest.approx(scheduler.lease_s / 3)


def test_a_worker_runs_once(scheduler: Scheduler) -> None:
    worker = Worker(scheduler, {"ok": ok}, concurrency=1)
    with running(worker):
        pass
    with pytest.raises(RuntimeError, match="runs once"):
        worker.run()
