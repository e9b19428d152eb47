"""Attempt history and per-minute counters against a real redis-server.

Every script that ends an attempt appends it to the task's history (its last 10
attempts, across versions), which ``status`` shows; complete, fail and reap count
succeeded and failed attempts per minute, which ``throughput`` reads and the workers'
housekeeping trims to a day.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest
import redis

from distsched import Scheduler, State, model
from distsched.errors import InvalidArgument
from distsched.model import AttemptInfo
from distsched.wire import calls, records
from tests.conftest import RedisServer
from tests.test_cli import invoke


def only(api: Scheduler, worker: str = "w1") -> model.Claim:
    (claim,) = api.ready(1, worker)
    return claim


def raise_here(text: str) -> BaseException:
    try:
        raise ValueError(text)
    except ValueError as exc:
        return exc


def test_a_success_is_recorded_with_its_worker_and_times(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    claim = only(api, "worker|one")
    claimed_at = api.status("t").updated_at
    api.complete(claim, 1)
    info = api.status("t")
    (attempt,) = info.attempts
    assert attempt == AttemptInfo(
        version=claim.version,
        attempt=1,
        worker="worker|one",
        started_at=claimed_at,
        ended_at=info.updated_at,
        outcome="succeeded",
        error=None,
    )


def test_a_failure_then_a_retry_then_a_success_keeps_both_attempts(api: Scheduler) -> None:
    api.schedule("t", fn="f", max_attempts=2, backoff=0)
    api.fail(only(api), raise_here("first try\nwith two lines"))
    assert api.status("t").state is State.READY
    api.complete(only(api, "w2"))
    first, second = api.status("t").attempts
    assert (first.attempt, first.outcome, first.worker) == (1, "failed", "w1")
    assert first.error == "with two lines"
    assert (second.attempt, second.outcome, second.worker) == (2, "succeeded", "w2")
    assert first.ended_at <= second.started_at


def test_the_error_summary_is_the_last_line_cut_to_200_bytes(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    api.fail(only(api), "Traceback ...\n  File x\nValueError: " + "é" * 300 + "\n\n")
    (attempt,) = api.status("t").attempts
    assert attempt.error is not None
    assert attempt.error.startswith("ValueError: éé")
    assert len(attempt.error.encode()) <= 200
    assert "\n" not in attempt.error


def test_a_lost_lease_is_recorded_as_lost(api: Scheduler) -> None:
    api.schedule("t", fn="f", max_attempts=2, backoff=0)
    claim = only(api)
    assert api.expire_lease("t") == 1
    (attempt,) = api.status("t").attempts
    assert (attempt.outcome, attempt.error, attempt.attempt) == ("lost", "lease expired", 1)
    assert attempt.version == claim.version


def test_a_confirmed_cancel_and_a_hand_back_are_recorded(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    api.release([only(api)])
    api.schedule("u", fn="f")
    claim = only(api)
    assert claim.task_id == "t"
    api.cancel("t")
    api.confirm_cancel(claim)
    handed, cancelled = api.status("t").attempts
    assert (handed.outcome, handed.attempt) == ("handed_back", 1)
    assert (cancelled.outcome, cancelled.attempt) == ("cancelled", 1)


def test_history_keeps_the_last_ten_attempts_across_versions(api: Scheduler) -> None:
    for version in range(12):
        api.schedule("t", fn="f")
        api.fail(only(api), f"Boom: {version}")
    attempts = api.status("t").attempts
    assert len(attempts) == records.HISTORY_KEEP == 10
    assert [a.error for a in attempts] == [f"Boom: {i}" for i in range(2, 12)]
    versions = [a.version for a in attempts]
    assert versions == sorted(versions) and len(set(versions)) == 10


def test_purge_removes_the_history(scheduler: Scheduler, redis_client: redis.Redis) -> None:
    scheduler.schedule("t", fn="f")
    scheduler.complete(only(scheduler))
    assert redis_client.hexists(scheduler.keys.history, "t")
    scheduler.set_retention(0)
    scheduler.purge()
    assert not redis_client.hexists(scheduler.keys.history, "t")
    assert redis_client.zcard(scheduler.keys.states) == 0


def test_history_that_does_not_parse_is_replaced_without_failing_the_report(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("t", fn="f")
    redis_client.hset(scheduler.keys.history, "t", b"junk|no\n")
    scheduler.complete(only(scheduler))
    (attempt,) = scheduler.status("t").attempts
    assert attempt.outcome == "succeeded"


def test_status_json_and_text_show_the_attempts(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    scheduler.schedule("t", fn="f")
    scheduler.fail(only(scheduler), "KeyError: 'x'")
    out = invoke(redis_server, namespace, "status", "t", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["attempts"][0]["outcome"] == "failed"
    assert data["attempts"][0]["error"] == "KeyError: 'x'"
    scheduler.retry("t")
    scheduler.complete(only(scheduler, "w2"))
    lines = invoke(redis_server, namespace, "status", "t").stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("attempts:"))
    assert "failed: version" in lines[at] and "attempt 1" in lines[at]
    assert lines[at].endswith("KeyError: 'x'") and "w1" in lines[at]
    assert lines[at + 1].split()[0] == "succeeded:" and "w2" in lines[at + 1]


# --------------------------------------------------------------------------- minutes


def test_throughput_counts_succeeded_and_failed_attempts_per_minute(api: Scheduler) -> None:
    for i in range(3):
        api.schedule(f"ok{i}", fn="f")
    api.complete_many([(c, None) for c in api.ready(3, "w")])
    api.schedule("retried", fn="f", max_attempts=2, backoff=0)
    api.fail(only(api), "once")
    api.fail(only(api), "twice")
    api.schedule("lost", fn="f")
    only(api)
    api.expire_lease("lost")
    minutes = api.throughput(5)
    assert len(minutes) == 5
    now = api.server_time()
    assert minutes[-1].minute == (now // 60) * 60
    assert [m.minute for m in minutes] == [minutes[0].minute + 60 * i for i in range(5)]
    assert sum(m.succeeded for m in minutes) == 3
    assert sum(m.failed for m in minutes) == 3


@pytest.mark.parametrize("minutes", [0, 1441, "60", 1.5])
def test_throughput_refuses_a_window_outside_a_day(api: Scheduler, minutes: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        api.throughput(minutes)  # type: ignore[arg-type]
    assert caught.value.field == "minutes"


def test_housekeeping_trims_counters_older_than_a_day_in_bounded_steps(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    now_minute = int(scheduler.server_time() * 1000) // 60_000
    keep_from = now_minute - calls.MINUTES_KEEP - calls.MINUTES_MARGIN
    old = {f"{m}:s": 1 for m in range(keep_from - 500, keep_from)}
    recent = {f"{m}:f": 2 for m in range(now_minute - 1439, now_minute + 1)}
    redis_client.hset(scheduler.keys.minutes, mapping=cast(Any, {**old, **recent}))
    first = scheduler.housekeeping()["trimmed"]
    assert 0 < first <= calls.MINUTES_TRIM_STEP
    for _ in range(10):
        scheduler.housekeeping()
    left = {k.decode() for k in cast(list[bytes], redis_client.hkeys(scheduler.keys.minutes))}
    assert left == set(recent)
    assert sum(m.failed for m in scheduler.throughput(1440)) == 2 * 1440
    assert scheduler.housekeeping()["trimmed"] == 0


def test_counters_made_now_survive_housekeeping(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    api.complete(only(api))
    api.housekeeping()
    time.sleep(0.001)
    assert sum(m.succeeded for m in api.throughput(2)) == 1
