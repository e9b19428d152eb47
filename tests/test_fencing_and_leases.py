"""§6 and §8: tokens fence every report, leases expire on the server clock, capacity holds."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Wait
from distsched.errors import LeaseLostError
from distsched.model import WaitReason
from tests.conftest import RedisServer, namespace_keys


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every test here runs against both shells, the sync and the asyncio one."""
    return api


W = "w"


def claim_one(s: Scheduler, worker: str = W) -> Claim:
    got = s.next(worker)
    assert isinstance(got, Claim), got
    return got


@pytest.fixture
def make_scheduler(redis_client: redis.Redis, namespace: str) -> Iterator[Callable[..., Scheduler]]:
    """Schedulers on the test's namespace, closed at the end."""
    made: list[Scheduler] = []

    def make(**kwargs: object) -> Scheduler:
        s = Scheduler(redis_client, namespace=namespace, **kwargs)  # type: ignore[arg-type]
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def wait_past_lease(s: Scheduler, task_id: str) -> None:
    """Sleep until the server clock has passed the task's lease deadline."""
    deadline = s.status(task_id).lease_deadline
    assert deadline is not None
    limit = time.monotonic() + 10
    while s.server_time() <= deadline + 0.002:
        assert time.monotonic() < limit, "the server clock did not pass the lease deadline"
        time.sleep(0.02)


# --------------------------------------------------------------------------- applied / duplicate


def test_a_report_with_the_current_token_is_applied_and_its_repeat_is_a_duplicate(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    assert scheduler.complete(c, 1) is Outcome.APPLIED
    before = namespace_keys(redis_client, scheduler.namespace)
    assert scheduler.complete(c, 2) is Outcome.DUPLICATE
    assert scheduler.fail(c, "late") is Outcome.DUPLICATE
    assert scheduler.confirm_cancel(c) is Outcome.DUPLICATE
    assert namespace_keys(redis_client, scheduler.namespace) == before
    assert scheduler.status("a").result == 1


def test_a_repeated_report_is_a_duplicate_even_after_the_task_moved_on(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f")
    old = claim_one(scheduler)
    assert scheduler.complete(old) is Outcome.APPLIED
    scheduler.schedule("a", fn="f")
    new = claim_one(scheduler)
    assert scheduler.complete(old) is Outcome.DUPLICATE
    assert scheduler.fail(old, "x") is Outcome.DUPLICATE
    assert scheduler.status("a").state is State.RUNNING
    assert scheduler.complete(new) is Outcome.APPLIED


def test_a_repeated_fail_is_a_duplicate_while_its_retry_waits_or_runs(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f", max_attempts=2, backoff=0)
    first = claim_one(scheduler)
    assert scheduler.fail(first, "x") is Outcome.APPLIED
    assert scheduler.fail(first, "x") is Outcome.DUPLICATE
    assert scheduler.complete(first) is Outcome.DUPLICATE
    assert scheduler.status("a").state is State.READY
    second = claim_one(scheduler)
    assert second.attempt == 2
    assert scheduler.fail(first, "x") is Outcome.DUPLICATE
    assert scheduler.complete(second) is Outcome.APPLIED


def test_a_repeated_confirm_cancel_is_a_duplicate(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    scheduler.cancel("a")
    assert scheduler.confirm_cancel(c) is Outcome.APPLIED
    assert scheduler.confirm_cancel(c) is Outcome.DUPLICATE
    assert scheduler.complete(c) is Outcome.DUPLICATE
    assert scheduler.status("a").state is State.CANCELLED


# --------------------------------------------------------------------------- stale


def test_a_released_token_of_a_replaced_version_is_stale(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f")
    old = claim_one(scheduler)
    assert scheduler.release([old]) == 1
    scheduler.schedule("a", fn="f")  # replaces the ready version
    assert scheduler.complete(old) is Outcome.STALE
    assert scheduler.fail(old, "x") is Outcome.STALE
    new = claim_one(scheduler)
    assert new.version > old.version
    assert scheduler.complete(old) is Outcome.STALE
    with pytest.raises(LeaseLostError):
        scheduler.heartbeat(old)
    assert scheduler.complete(new) is Outcome.APPLIED


def test_batch_reports_answer_each_token_on_its_own(scheduler: Scheduler) -> None:
    scheduler.schedule_many([TaskSpec("a", "f"), TaskSpec("b", "f")])
    a, b = scheduler.ready(2, W)
    assert scheduler.complete(a) is Outcome.APPLIED
    stale = Claim("b", b.version, b.attempt + 1, "f", (), {}, 0, 0.0)
    assert scheduler.complete_many([(a, None), (b, "ok"), (stale, None)]) == [
        Outcome.DUPLICATE,
        Outcome.APPLIED,
        Outcome.STALE,
    ]
    assert scheduler.heartbeat_many([a, b, stale]) == [None, None, None]


# --------------------------------------------------------------------------- leases


def test_a_heartbeat_moves_the_lease_deadline_forward_on_the_server_clock(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(lease_s=0.5)
    s.schedule("a", fn="f")
    c = claim_one(s)
    first = s.status("a").lease_deadline
    assert first is not None
    time.sleep(0.05)
    t0 = s.server_time()
    assert s.heartbeat(c) is False
    second = s.status("a").lease_deadline
    assert second is not None and second >= t0 + 0.5 - 0.001 and second > first
    assert s.leases() == [("a", second)]


def test_an_expired_lease_is_reaped_to_a_new_attempt_and_the_old_token_is_stale(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(lease_s=0.2)
    s.schedule("a", fn="f", max_attempts=2, backoff=0)
    old = claim_one(s)
    assert s.reap() == 0  # not expired yet
    wait_past_lease(s, "a")
    assert s.reap() == 1
    assert s.reap() == 0
    info = s.status("a")
    assert (info.state, info.error, info.lease_deadline) == (State.READY, "lease expired", None)
    with pytest.raises(LeaseLostError):
        s.heartbeat(old)
    assert s.complete(old) is Outcome.STALE
    new = claim_one(s)
    assert (new.version, new.attempt) == (old.version, 2)
    assert s.complete(old) is Outcome.STALE
    assert s.fail(old, "x") is Outcome.STALE
    assert s.complete(new, "done") is Outcome.APPLIED
    assert s.complete(old) is Outcome.STALE
    assert s.status("a").state is State.SUCCEEDED


def test_an_expired_lease_without_attempts_left_fails_with_lease_expired(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(lease_s=0.2)
    s.schedule("a", fn="f")
    c = claim_one(s)
    wait_past_lease(s, "a")
    assert s.reap() == 1
    info = s.status("a")
    assert (info.state, info.attempt, info.error) == (State.FAILED, 1, "lease expired")
    assert s.complete(c) is Outcome.STALE
    stats = s.stats()
    assert stats["counts"]["failed"] == 1 and stats["running"] == 0 and stats["leases"] == 0


def test_reap_leaves_live_leases_alone(scheduler: Scheduler, redis_client: redis.Redis) -> None:
    scheduler.schedule("a", fn="f")
    claim_one(scheduler)
    before = namespace_keys(redis_client, scheduler.namespace)
    assert scheduler.reap() == 0
    assert namespace_keys(redis_client, scheduler.namespace) == before


def test_expire_lease_expires_one_running_task_at_once(scheduler: Scheduler) -> None:
    scheduler.schedule_many([TaskSpec("a", "f", max_attempts=2, backoff=0), TaskSpec("b", "f")])
    a, b = scheduler.ready(2, W)
    assert {task_id for task_id, _ in scheduler.leases()} == {"a", "b"}
    assert scheduler.expire_lease("a") == 1
    assert scheduler.expire_lease("a") == 0  # no longer running
    assert scheduler.expire_lease("nope") == 0
    assert [task_id for task_id, _ in scheduler.leases()] == ["b"]
    assert scheduler.status("a").state is State.READY
    assert scheduler.status("b").state is State.RUNNING
    assert scheduler.complete(a) is Outcome.STALE
    assert claim_one(scheduler).attempt == 2
    assert scheduler.expire_lease("b") == 1
    assert scheduler.status("b").state is State.FAILED
    assert scheduler.status("b").error == "lease expired"
    assert scheduler.complete(b) is Outcome.STALE


def test_an_expired_lease_of_a_cancel_requested_task_is_not_retried(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("a", fn="f", max_attempts=3, backoff=0)
    claim_one(scheduler)
    scheduler.cancel("a")
    assert scheduler.expire_lease("a") == 1
    info = scheduler.status("a")
    assert info.state is State.FAILED and info.cancel_requested
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)


# --------------------------------------------------------------------------- capacity


def test_claims_stop_at_max_running_with_reason_capacity(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(max_running=2)
    s.schedule_many([TaskSpec(f"t{i}", "f", priority=-i) for i in range(4)])
    first = s.ready(10, W)
    assert [c.task_id for c in first] == ["t0", "t1"]
    assert s.next(W) == Wait(WaitReason.CAPACITY, None)
    assert s.claim(3, W) == ([], Wait(WaitReason.CAPACITY, None))
    assert s.complete(first[0]) is Outcome.APPLIED
    claims, wait = s.claim(3, W)
    assert [c.task_id for c in claims] == ["t2"]
    assert wait == Wait(WaitReason.CAPACITY, None)
    assert s.stats()["running"] == 2


def test_capacity_zero_claims_nothing(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler()
    s.schedule("a", fn="f")
    s.set_max_running(0)
    assert s.next(W) == Wait(WaitReason.CAPACITY, None)
    assert s.ready(5, W) == []
    assert s.status("a").state is State.READY
    s.set_max_running(None)  # removes the bound
    assert claim_one(s).task_id == "a"


def test_max_running_none_leaves_the_stored_value_and_a_number_overwrites_it(
    make_scheduler: Callable[..., Scheduler], redis_server: RedisServer, namespace: str
) -> None:
    make_scheduler(max_running=3)
    s = make_scheduler(max_running=None)
    assert s.stats()["max_running"] == 3
    other = Scheduler.from_url(redis_server.url, namespace=namespace, max_running=None)
    try:
        assert other.stats()["max_running"] == 3
    finally:
        other.close()
    last = Scheduler.from_url(redis_server.url, namespace=namespace, max_running=1)
    try:
        assert s.stats()["max_running"] == 1
    finally:
        last.close()


def test_ready_returns_at_most_the_free_capacity_in_queue_order(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(max_running=3)
    s.schedule("busy", fn="f", priority=100)
    claim_one(s)
    s.schedule_many([TaskSpec(f"p{p}", "f", priority=p) for p in (1, 5, 3, 4, 2)])
    assert [c.task_id for c in s.ready(10, W)] == ["p5", "p4"]
    assert s.ready(1, W) == []


def test_a_not_due_head_is_reported_before_capacity(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(max_running=0)
    s.schedule("later", fn="f", delay=60)
    wait = s.next(W)
    assert isinstance(wait, Wait) and wait.reason == "not_due"


# --------------------------------------------------------------------------- release


def test_release_gives_a_claim_back_without_spending_an_attempt(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f", priority=5)
    scheduler.schedule("b", fn="f", priority=1)
    c = claim_one(scheduler)
    assert c.task_id == "a"
    assert scheduler.release([c]) == 1
    info = scheduler.status("a")
    assert (info.state, info.attempt, info.worker, info.lease_deadline) == (
        State.READY,
        0,
        None,
        None,
    )
    assert scheduler.stats()["leases"] == 0
    # Back at its own place in the queue, still with its only attempt to spend.
    again = claim_one(scheduler)
    assert (again.task_id, again.version, again.attempt) == ("a", c.version, 1)
    assert scheduler.fail(again, "x") is Outcome.APPLIED
    assert scheduler.status("a").state is State.FAILED


def test_release_answers_each_token_and_counts_the_released(scheduler: Scheduler) -> None:
    scheduler.schedule_many([TaskSpec("a", "f"), TaskSpec("b", "f")])
    a, b = scheduler.ready(2, W)
    scheduler.complete(b)
    assert scheduler.release([a, b]) == 1
    assert scheduler.status("a").state is State.READY
    assert scheduler.status("b").state is State.SUCCEEDED


def test_release_of_a_cancel_requested_claim_ends_it_cancelled(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f")
    c = claim_one(scheduler)
    scheduler.cancel("a")
    assert scheduler.release([c]) == 1
    info = scheduler.status("a")
    assert info.state is State.CANCELLED and info.attempt == 0
    assert scheduler.next(W) == Wait(WaitReason.EMPTY, None)


# --------------------------------------------------------------------------- races


def run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]


def test_racing_workers_claim_each_version_and_attempt_at_most_once(
    redis_server: RedisServer, namespace: str
) -> None:
    tasks, attempts, workers = 40, 3, 8
    setup = Scheduler.from_url(redis_server.url, namespace=namespace)
    setup.schedule_many(
        [TaskSpec(f"t{i}", "f", max_attempts=attempts, backoff=0) for i in range(tasks)]
    )
    barrier = threading.Barrier(workers)
    tokens: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        s = Scheduler.from_url(redis_server.url, namespace=namespace)
        try:
            barrier.wait()
            idle = 0
            while idle < 3:
                got = s.next(f"w{i}") if i % 2 else s.ready(3, f"w{i}")
                claims = [got] if isinstance(got, Claim) else [] if isinstance(got, Wait) else got
                if not claims:
                    idle += 1
                    continue
                idle = 0
                for c in claims:
                    with lock:
                        tokens.append(c.token)
                    # Every attempt but the last fails, so each task is claimed `attempts` times.
                    if c.attempt < attempts:
                        assert s.fail(c, "again") is Outcome.APPLIED
                    else:
                        assert s.complete(c) is Outcome.APPLIED
        finally:
            s.close()

    try:
        run_threads(workers, worker)
        assert len(tokens) == len(set(tokens)) == tasks * attempts
        per_task = Counter(task_id for task_id, _, _ in tokens)
        assert per_task == dict.fromkeys((f"t{i}" for i in range(tasks)), attempts)
        assert setup.stats()["counts"]["succeeded"] == tasks
    finally:
        setup.close()


def test_cancel_racing_claims_exactly_one_of_them_wins_each_task(
    redis_server: RedisServer, namespace: str
) -> None:
    tasks = 60
    setup = Scheduler.from_url(redis_server.url, namespace=namespace)
    setup.schedule_many([TaskSpec(f"t{i}", "f") for i in range(tasks)])
    barrier = threading.Barrier(3)
    claimed: list[str] = []
    cancelled: dict[str, State] = {}

    def run(i: int) -> None:
        s = Scheduler.from_url(redis_server.url, namespace=namespace)
        try:
            barrier.wait()
            if i == 0:
                for k in range(tasks):
                    cancelled[f"t{k}"] = s.cancel(f"t{k}")
            else:
                while True:
                    got = s.next(f"w{i}")
                    if isinstance(got, Wait):
                        return
                    claimed.append(got.task_id)
        finally:
            s.close()

    try:
        run_threads(3, run)
        assert len(claimed) == len(set(claimed))
        for k in range(tasks):
            task_id = f"t{k}"
            state = setup.status(task_id).state
            if task_id in claimed:
                # The claim won: cancel could only ask the running function to stop.
                assert cancelled[task_id] is State.RUNNING
                assert state is State.RUNNING and setup.status(task_id).cancel_requested
            else:
                assert cancelled[task_id] is State.CANCELLED
                assert state is State.CANCELLED
        counts = setup.stats()["counts"]
        assert counts["running"] + counts["cancelled"] == tasks
    finally:
        setup.close()
