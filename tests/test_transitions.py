"""Every legal transition of §2 (without dependencies) and the refusal of the others.

Each test drives a real ``redis-server`` through the public ``Scheduler`` API and
reads the outcome back with ``status()`` / ``stats()``.
"""

from __future__ import annotations

from typing import cast

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Wait
from distsched.errors import ConflictError, LeaseLostError, NotFoundError
from distsched.model import WaitReason
from tests.conftest import namespace_keys


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every test here runs against both shells, the sync and the asyncio one."""
    return api


W = "worker-1"


def claim_one(s: Scheduler, worker: str = W) -> Claim:
    got = s.next(worker)
    assert isinstance(got, Claim), got
    return got


def make_due(client: redis.Redis, s: Scheduler) -> None:
    """Move every queue entry to score 0, so a backed-off retry is due without waiting."""
    for member in cast(list[bytes], client.zrange(s.keys.queue, 0, -1)):
        client.zadd(s.keys.queue, {member: 0}, xx=True)


def forged(claim: Claim, version: int | None = None, attempt: int | None = None) -> Claim:
    return Claim(
        task_id=claim.task_id,
        version=claim.version if version is None else version,
        attempt=claim.attempt if attempt is None else attempt,
        fn=claim.fn,
        args=claim.args,
        kwargs=claim.kwargs,
        priority=claim.priority,
        run_at=claim.run_at,
    )


def to_terminal(s: Scheduler, task_id: str, state: State) -> None:
    """Bring a freshly scheduled ready task to the terminal ``state``."""
    if state is State.CANCELLED:
        assert s.cancel(task_id) is State.CANCELLED
        return
    c = claim_one(s)
    assert c.task_id == task_id
    if state is State.SUCCEEDED:
        assert s.complete(c, "ok") is Outcome.APPLIED
    else:
        assert s.fail(c, "boom") is Outcome.APPLIED
    assert s.status(task_id).state is state


TERMINALS = [State.SUCCEEDED, State.FAILED, State.CANCELLED]


# --------------------------------------------------------------------------- (none) -> ready


def test_a_new_id_becomes_ready_with_a_first_version(scheduler: Scheduler) -> None:
    v = scheduler.schedule("a", fn="f", args=(1, 2), kwargs={"k": "v"}, priority=7)
    info = scheduler.status("a")
    assert info.state is State.READY
    assert info.version == v >= 1
    assert info.attempt == 0
    assert (info.fn, info.args, info.kwargs, info.priority) == ("f", (1, 2), {"k": "v"}, 7)
    assert scheduler.stats()["counts"]["ready"] == 1


@pytest.mark.parametrize("terminal", TERMINALS, ids=str)
def test_a_terminal_task_scheduled_again_becomes_ready_as_a_newer_version(
    scheduler: Scheduler, terminal: State
) -> None:
    v1 = scheduler.schedule("a", fn="f", args=(1,))
    to_terminal(scheduler, "a", terminal)
    v2 = scheduler.schedule("a", fn="g", args=(2,))
    assert v2 > v1
    info = scheduler.status("a")
    assert (info.state, info.version, info.attempt) == (State.READY, v2, 0)
    # The new version starts clean: no error or result of the old one, no cancel request.
    assert info.error is None and info.result is None and not info.cancel_requested
    counts = scheduler.stats()["counts"]
    assert counts["ready"] == 1 and counts[terminal.value] == 0
    c = claim_one(scheduler)
    assert (c.version, c.attempt, c.fn, c.args) == (v2, 1, "g", (2,))


def test_replacing_a_ready_task_makes_only_the_new_version_claimable(
    scheduler: Scheduler,
) -> None:
    v1 = scheduler.schedule("a", fn="f", args=("old",), priority=5)
    v2 = scheduler.schedule("a", fn="f", args=("new",), priority=1)
    assert v2 > v1
    assert scheduler.status("a").version == v2
    c = claim_one(scheduler)
    assert (c.version, c.args, c.priority) == (v2, ("new",), 1)
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)


def test_replacing_a_delayed_ready_task_moves_it_to_its_new_time(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f", delay=3600)
    assert isinstance(scheduler.next(W), Wait)
    v2 = scheduler.schedule("a", fn="f", delay=-1)
    assert claim_one(scheduler).version == v2


def test_replacing_a_running_task_raises_conflict_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(ConflictError):
        scheduler.schedule("a", fn="f")
    assert namespace_keys(redis_client, scheduler.namespace) == before
    # The holder is unaffected.
    assert scheduler.heartbeat(c) is False
    assert scheduler.complete(c) is Outcome.APPLIED


# --------------------------------------------------------------------------- cancel


def test_cancel_of_a_ready_task_returns_cancelled_and_it_is_never_claimed(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f")
    scheduler.schedule("b", fn="f", delay=-1)
    assert scheduler.cancel("a") is State.CANCELLED
    assert scheduler.status("a").state is State.CANCELLED
    assert claim_one(scheduler).task_id == "b"
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)
    assert scheduler.status("a").state is State.CANCELLED


def test_cancel_of_a_running_task_returns_running_and_records_the_request(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.heartbeat(c) is False
    assert scheduler.cancel("a") is State.RUNNING
    info = scheduler.status("a")
    assert info.state is State.RUNNING and info.cancel_requested
    assert scheduler.heartbeat(c) is True
    # A repeated cancel changes nothing and still says running.
    assert scheduler.cancel("a") is State.RUNNING


def test_confirm_cancel_after_a_request_ends_the_task_cancelled(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    scheduler.cancel("a")
    assert scheduler.confirm_cancel(c) is Outcome.APPLIED
    info = scheduler.status("a")
    assert info.state is State.CANCELLED and info.cancel_requested
    assert info.lease_deadline is None
    stats = scheduler.stats()
    assert stats["counts"]["cancelled"] == 1 and stats["running"] == 0 and stats["leases"] == 0
    with pytest.raises(LeaseLostError):
        scheduler.heartbeat(c)


def test_a_task_that_ignores_the_cancel_request_ends_succeeded_with_the_request_kept(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.cancel("a") is State.RUNNING
    assert scheduler.complete(c, 42) is Outcome.APPLIED
    info = scheduler.status("a")
    assert info.state is State.SUCCEEDED and info.result == 42
    assert info.cancel_requested


def test_a_task_that_raises_after_a_cancel_request_ends_failed_and_is_not_retried(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f", max_attempts=3, backoff=0)
    c = claim_one(scheduler)
    assert scheduler.cancel("a") is State.RUNNING
    assert scheduler.fail(c, "stopped half way") is Outcome.APPLIED
    info = scheduler.status("a")
    assert info.state is State.FAILED and info.cancel_requested
    assert info.error == "stopped half way"
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)


@pytest.mark.parametrize("terminal", TERMINALS, ids=str)
def test_cancel_of_a_terminal_task_changes_nothing_and_returns_its_state(
    scheduler: Scheduler, redis_client: redis.Redis, terminal: State
) -> None:
    scheduler.schedule("a", fn="f")
    to_terminal(scheduler, "a", terminal)
    before = namespace_keys(redis_client, scheduler.namespace)
    assert scheduler.cancel("a") is terminal
    assert namespace_keys(redis_client, scheduler.namespace) == before


def test_cancel_of_an_unknown_id_raises_not_found(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(NotFoundError):
        scheduler.cancel("nope")
    assert namespace_keys(redis_client, scheduler.namespace) == before


# --------------------------------------------------------------------------- running -> ...


def test_a_completed_claim_ends_succeeded_with_its_result(scheduler: Scheduler) -> None:
    v = scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.status("a").state is State.RUNNING
    assert scheduler.complete(c, {"rows": [1, 2]}) is Outcome.APPLIED
    info = scheduler.status("a")
    assert (info.state, info.version, info.attempt) == (State.SUCCEEDED, v, 1)
    assert info.result == {"rows": [1, 2]} and info.error is None
    assert info.worker is None and info.lease_deadline is None
    stats = scheduler.stats()
    assert stats["counts"]["succeeded"] == 1 and stats["running"] == 0 and stats["leases"] == 0


def test_a_failed_claim_without_attempts_left_ends_failed_with_the_error(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.fail(c, ValueError("bad row 7")) is Outcome.APPLIED
    info = scheduler.status("a")
    assert info.state is State.FAILED and info.attempt == 1
    assert info.error == "ValueError: bad row 7"
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)
    assert scheduler.stats()["counts"]["failed"] == 1


def test_a_failed_claim_with_attempts_left_is_retried_after_exponential_backoff(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f", max_attempts=3, backoff=2.0)
    for k, expected_delay in ((1, 2.0), (2, 4.0)):
        c = claim_one(scheduler)
        assert c.attempt == k
        assert scheduler.fail(c, f"try {k}") is Outcome.APPLIED
        info = scheduler.status("a")
        assert (info.state, info.attempt, info.error) == (State.READY, k, f"try {k}")
        # The backoff is counted from the server time at which the attempt ended.
        assert info.run_at - info.updated_at == pytest.approx(expected_delay, abs=1e-9)
        wait = scheduler.next(W)
        assert isinstance(wait, Wait) and wait.reason == "not_due"
        assert wait.delay is not None and expected_delay - 0.5 < wait.delay <= expected_delay
        make_due(redis_client, scheduler)
    last = claim_one(scheduler)
    assert last.attempt == 3
    assert scheduler.fail(last, "try 3") is Outcome.APPLIED
    info = scheduler.status("a")
    assert (info.state, info.attempt, info.error) == (State.FAILED, 3, "try 3")


@pytest.mark.parametrize("result", [None, "ok"])
def test_a_task_that_succeeds_on_a_retry_reports_no_error(
    scheduler: Scheduler, result: str | None
) -> None:
    scheduler.schedule("a", fn="f", max_attempts=2, backoff=0)
    scheduler.fail(claim_one(scheduler), "first try")
    assert scheduler.status("a").error == "first try"
    assert scheduler.complete(claim_one(scheduler), result) is Outcome.APPLIED
    info = scheduler.status("a")
    assert (info.state, info.error, info.result) == (State.SUCCEEDED, None, result)


def test_zero_backoff_retries_at_once(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f", max_attempts=2, backoff=0)
    c1 = claim_one(scheduler)
    scheduler.fail(c1, "x")
    c2 = claim_one(scheduler)
    assert (c2.version, c2.attempt) == (c1.version, 2)


def test_backoff_is_capped_at_one_hour(scheduler: Scheduler, redis_client: redis.Redis) -> None:
    scheduler.schedule("a", fn="f", max_attempts=3, backoff=3600)
    c1 = claim_one(scheduler)
    scheduler.fail(c1, "x")
    info = scheduler.status("a")
    assert info.run_at - info.updated_at == pytest.approx(3600.0, abs=1e-9)
    make_due(redis_client, scheduler)
    c2 = claim_one(scheduler)
    scheduler.fail(c2, "x")
    info = scheduler.status("a")
    # 3600 * 2**1 would be two hours: the cap holds it at one.
    assert info.run_at - info.updated_at == pytest.approx(3600.0, abs=1e-9)


# --------------------------------------------------------------------------- illegal


def test_reports_with_a_non_current_token_change_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    scheduler.cancel("a")  # so that confirm_cancel with the right token would apply
    before = namespace_keys(redis_client, scheduler.namespace)
    for bad in (forged(c, attempt=c.attempt + 1), forged(c, version=c.version - 1)):
        assert scheduler.complete(bad) is Outcome.STALE
        assert scheduler.fail(bad, "x") is Outcome.STALE
        assert scheduler.confirm_cancel(bad) is Outcome.STALE
        assert scheduler.release([bad]) == 0
        with pytest.raises(LeaseLostError):
            scheduler.heartbeat(bad)
    assert namespace_keys(redis_client, scheduler.namespace) == before


def test_confirm_cancel_without_a_request_raises_conflict_and_changes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(ConflictError):
        scheduler.confirm_cancel(c)
    assert namespace_keys(redis_client, scheduler.namespace) == before
    assert scheduler.status("a").state is State.RUNNING


def test_release_of_a_stale_token_returns_zero_and_changes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    scheduler.complete(c)
    scheduler.schedule("a", fn="f")
    before = namespace_keys(redis_client, scheduler.namespace)
    assert scheduler.release([c]) == 0
    assert namespace_keys(redis_client, scheduler.namespace) == before


def test_reports_on_a_ready_task_are_stale(scheduler: Scheduler) -> None:
    """A task that is not running has no current token: nothing can complete it."""
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.release([c]) == 1
    assert scheduler.complete(c) is Outcome.STALE
    assert scheduler.fail(c, "x") is Outcome.STALE
    assert scheduler.status("a").state is State.READY


# --------------------------------------------------------------------------- stats, status


def test_stats_count_states_and_stale_queue_entries(scheduler: Scheduler) -> None:
    for task_id in "abcd":
        scheduler.schedule(task_id, fn="f", delay=-10)
    scheduler.schedule("a", fn="f", delay=-20)  # replaced: its old entry is stale
    assert scheduler.cancel("b") is State.CANCELLED  # cancelled: its entry is stale
    stats = scheduler.stats()
    assert stats["counts"] == {
        "pending": 0,
        "ready": 3,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 1,
        "blocked": 0,
    }
    assert (stats["queue_entries"], stats["live_entries"], stats["stale_entries"]) == (5, 3, 2)

    # Queue order: new "a" (earliest run_at), then old "a", "b", "c", "d".
    first = claim_one(scheduler)
    assert first.task_id == "a"
    stats = scheduler.stats()
    assert stats["counts"]["running"] == 1 and stats["leases"] == 1
    assert (stats["queue_entries"], stats["stale_entries"]) == (4, 2)
    # Claiming "c" walks over the old "a" and "b" entries and drops each exactly once.
    assert claim_one(scheduler).task_id == "c"
    stats = scheduler.stats()
    assert (stats["queue_entries"], stats["live_entries"], stats["stale_entries"]) == (1, 1, 0)
    assert claim_one(scheduler).task_id == "d"
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)
    stats = scheduler.stats()
    assert (stats["queue_entries"], stats["stale_entries"]) == (0, 0)
    assert stats["counts"]["running"] == 3 and stats["counts"]["ready"] == 0


def test_stale_entries_left_behind_a_due_head_are_not_dropped_early(
    scheduler: Scheduler,
) -> None:
    """Lazy deletion: only entries that reach the head are dropped."""
    scheduler.schedule("x", fn="f", delay=-10)
    scheduler.schedule("y", fn="f", delay=3600)
    scheduler.schedule("y", fn="f", delay=60)  # the old entry now sits behind the new one
    assert scheduler.stats()["stale_entries"] == 1
    assert claim_one(scheduler).task_id == "x"
    wait = scheduler.next(W)
    assert isinstance(wait, Wait) and wait.reason == "not_due"
    assert scheduler.stats()["stale_entries"] == 1


def test_status_reports_every_field_of_a_running_task(scheduler: Scheduler) -> None:
    t0 = scheduler.server_time()
    v = scheduler.schedule(
        "a",
        fn="f",
        args=(1, "x"),
        kwargs={"k": [1]},
        priority=-3,
        run_at=t0 - 1,
        max_attempts=4,
        backoff=0.25,
    )
    c = claim_one(scheduler, "w|1")
    t1 = scheduler.server_time()
    info = scheduler.status("a")
    assert info.task_id == "a"
    assert (info.state, info.version, info.attempt, info.max_attempts) == (
        State.RUNNING,
        v,
        1,
        4,
    )
    assert info.priority == -3 and info.backoff == 0.25
    assert info.run_at == pytest.approx(t0 - 1, abs=0.001)
    assert (info.fn, info.args, info.kwargs) == ("f", (1, "x"), {"k": [1]})
    assert info.worker == "w|1"
    assert info.cancel_requested is False
    assert info.lease_deadline is not None
    assert t0 + 5 - 0.002 <= info.lease_deadline <= t1 + 5 + 0.002
    assert t0 - 0.002 <= info.updated_at <= t1 + 0.002
    assert info.error is None and info.result is None
    assert c.token == ("a", v, 1)


def test_status_of_an_unknown_id_raises_not_found(scheduler: Scheduler) -> None:
    with pytest.raises(NotFoundError):
        scheduler.status("nope")


def test_versions_only_grow_for_an_id(scheduler: Scheduler) -> None:
    seen = []
    for round_ in range(4):
        seen.append(scheduler.schedule("a", fn="f"))
        seen.append(scheduler.schedule("a", fn="f"))  # replaces the ready one
        if round_ % 2:
            scheduler.cancel("a")
        else:
            scheduler.complete(claim_one(scheduler))
        assert scheduler.status("a").version == seen[-1]
    versions = [*seen, *scheduler.schedule_many([TaskSpec("a", "f"), TaskSpec("b", "f")])]
    assert versions[:-1] == sorted(set(versions[:-1]))
    assert versions[-2] > seen[-1]
