"""The priority order (README, "Ordering"): due tasks by ``due - priority * aging``.

A stateful test drives the real scripts against a small reference model of the rule,
including tasks that become due while others wait and changes of aging and order while
tasks are queued; an adversarial test floods a namespace with high-priority tasks and
checks that a low-priority one is never passed over beyond the stated bound.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from distsched import Claim, Outcome, Scheduler, State, TaskSpec
from distsched.errors import ConflictError, InvalidArgument
from distsched.model import Order, OrderSetting, priority_bucket
from distsched.ops.namespace import Ops
from distsched.wire import calls
from tests.conftest import RedisServer

IDS = ["a", "b", "c", "d"]
PRIORITIES = [0, 1, 3]
AGINGS_MS = [0, 100, 1000]
# Tasks due later than the start become due at one of these steps (ms after the start),
# far enough apart that a claim's own run time spans at most one of them.
STEP_MS = 250

Token = tuple[str, int, int]


@dataclass
class Task:
    state: State
    version: int
    priority: int
    due_ms: int
    attempt: int = 0
    max_attempts: int = 2
    cancel_requested: bool = False


@dataclass
class Model:
    """The rule: among live entries due at ``now``, the lowest (rank, -priority, version)."""

    tasks: dict[str, Task] = field(default_factory=dict)
    seq: int = 0
    order: Order = Order.DEFAULT
    aging_ms: int = 0

    def key(self, task_id: str) -> tuple[int, int, int]:
        t = self.tasks[task_id]
        aging = self.aging_ms if self.order is Order.PRIORITY else 0
        return (t.due_ms - t.priority * aging, -t.priority, t.version)

    def claim(self, n: int, now_ms: int) -> list[Token]:
        due = [
            task_id
            for task_id, t in self.tasks.items()
            if t.state is State.READY and t.due_ms <= now_ms
        ]
        out: list[Token] = []
        for task_id in sorted(due, key=self.key)[:n]:
            t = self.tasks[task_id]
            t.state, t.attempt = State.RUNNING, t.attempt + 1
            out.append((task_id, t.version, t.attempt))
        return out


class PriorityMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.s = Scheduler(client, namespace="po" + uuid.uuid4().hex[:12], lease_s=60.0)
        self.m = Model()
        self.start_ms = self.server_ms()

    def teardown(self) -> None:
        self.s.close()

    def server_ms(self) -> int:
        return int(self.s.server_time() * 1000)

    @rule(
        task_id=st.sampled_from(IDS),
        priority=st.sampled_from(PRIORITIES),
        # Negative: due that many ms before the start; positive: due at that step.
        when=st.sampled_from([-1500, -200, -50, 0, 1, 2, 3]),
    )
    def schedule(self, task_id: str, priority: int, when: int) -> None:
        old = self.m.tasks.get(task_id)
        due_ms = self.start_ms + (when * STEP_MS if when > 0 else when)
        call = dict(fn="f", run_at=due_ms / 1000, priority=priority, max_attempts=2, backoff=0)
        if old is not None and old.state is State.RUNNING:
            with pytest.raises(ConflictError):
                self.s.schedule(task_id, **call)  # type: ignore[arg-type]
            return
        version = self.s.schedule(task_id, **call)  # type: ignore[arg-type]
        self.m.seq += 1
        assert version == self.m.seq
        self.m.tasks[task_id] = Task(State.READY, version, priority, due_ms)

    @rule(task_id=st.sampled_from(IDS))
    def cancel(self, task_id: str) -> None:
        t = self.m.tasks.get(task_id)
        if t is None:
            return
        state = self.s.cancel(task_id)
        if t.state in (State.READY, State.PENDING):
            t.state = State.CANCELLED
        elif t.state is State.RUNNING:
            t.cancel_requested = True
        assert state is t.state or (t.state is State.RUNNING and state is State.RUNNING)

    @rule(target=claims, n=st.integers(1, 3))
    def claim(self, n: int) -> object:
        before = self.server_ms()
        got, _ = self.s.claim(n, "w")
        after = self.server_ms()
        # The claim ran at some instant in [before, after]: a task that became due in
        # between may or may not have been due for it, and both answers are right.
        early, late = copy.deepcopy(self.m), copy.deepcopy(self.m)
        expected_early, expected_late = early.claim(n, before), late.claim(n, after)
        tokens = [c.token for c in got]
        assert tokens in (expected_early, expected_late)
        self.m = early if tokens == expected_early else late
        return multiple(*got)

    @rule(c=claims)
    def complete(self, c: Claim) -> None:
        t = self.m.tasks[c.task_id]
        current = t.state is State.RUNNING and (t.version, t.attempt) == (c.version, c.attempt)
        outcome = self.s.complete(c)
        if current:
            assert outcome is Outcome.APPLIED
            t.state = State.SUCCEEDED

    @rule(c=claims)
    def fail(self, c: Claim) -> None:
        """A failed attempt with attempts left is due again at once (backoff 0): it goes
        into the ready set with the rank of that due time."""
        t = self.m.tasks[c.task_id]
        current = t.state is State.RUNNING and (t.version, t.attempt) == (c.version, c.attempt)
        self.s.fail(c, "boom")
        if current:
            if t.attempt < t.max_attempts and not t.cancel_requested:
                t.state = State.READY
                t.due_ms = round(self.s.status(c.task_id).run_at * 1000)
            else:
                t.state = State.FAILED

    @rule(aging_ms=st.sampled_from(AGINGS_MS))
    def prioritise(self, aging_ms: int) -> None:
        setting = self.s.set_order("priority", aging=aging_ms / 1000)
        assert setting == OrderSetting(Order.PRIORITY, aging_ms / 1000)
        self.m.order, self.m.aging_ms = Order.PRIORITY, aging_ms

    @rule()
    def back_to_default(self) -> None:
        self.s.set_order("default")
        self.m.order, self.m.aging_ms = Order.DEFAULT, 0

    @rule()
    def wait_for_the_next_step(self) -> None:
        """Delayed tasks become due: sleep to just past the next step."""
        now = self.server_ms()
        later = [t.due_ms for t in self.m.tasks.values() if t.due_ms > now]
        if later:
            time.sleep((min(later) - now) / 1000 + 0.02)

    @invariant()
    def counts_and_order_match(self) -> None:
        stats = self.s.stats()
        ready = sum(t.state is State.READY for t in self.m.tasks.values())
        assert stats["counts"]["ready"] == ready
        assert stats["live_entries"] == ready <= stats["queue_entries"]
        assert stats["order"] == self.m.order.value
        listed = {info.task_id for info in self.s.tasks("ready", limit=10).items}
        assert listed == {i for i, t in self.m.tasks.items() if t.state is State.READY}


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis_server.client()
    yield c
    c.close()


def test_claims_follow_the_rank_rule_as_tasks_become_due_and_the_aging_changes(
    client: redis.Redis,
) -> None:
    run_state_machine_as_test(
        lambda: PriorityMachine(client),  # type: ignore[arg-type]
        settings=settings(
            max_examples=80,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# --------------------------------------------------------------------------- starvation


def flood(s: Scheduler, aging_ms: int, rounds: int) -> tuple[int, list[int], bool]:
    """A priority-0 task behind a backlog of priority-5 ones, then rounds of two more
    priority-5 tasks submitted for each one claimed. Returns the low task's due time (ms),
    the due times of the tasks claimed before it, and whether it was claimed."""
    s.set_order("priority", aging=aging_ms / 1000)
    s.schedule_many([TaskSpec(f"h-before-{i}", "f", priority=5) for i in range(20)])
    s.schedule("low", fn="f", priority=0)
    low_due = round(s.status("low").run_at * 1000)
    passed_over: list[int] = []
    for round_no in range(rounds):
        s.schedule_many([TaskSpec(f"h{round_no}-{j}", "f", priority=5) for j in range(2)])
        [c] = s.ready(1, "w")
        if c.task_id == "low":
            return low_due, passed_over, True
        passed_over.append(round(c.run_at * 1000))
    return low_due, passed_over, False


def test_a_stream_of_higher_priority_tasks_delays_a_low_one_at_most_by_the_stated_bound(
    sync_scheduler: Scheduler,
) -> None:
    """Producers submit two priority-5 tasks for every one a worker claims, for ever. With
    an aging of 20 ms per point the priority-0 task may only be passed over by tasks due
    at most (5 - 0) * 20 ms after it (or before it): then it is claimed, however long
    the stream goes on and however fast or slow the machine is."""
    aging_ms = 20
    low_due, passed_over, claimed = flood(sync_scheduler, aging_ms, 5000)
    assert claimed, "the low-priority task starved"
    bound_ms = low_due + (5 - 0) * aging_ms
    assert passed_over and max(passed_over) <= bound_ms
    # Tasks due after the bound are still queued: the stream went on past it.
    later = [i for i in sync_scheduler.tasks("ready", limit=1000).items]
    assert any(info.run_at * 1000 > bound_ms for info in later)


def test_without_credit_for_waiting_the_same_stream_starves_the_low_task(
    sync_scheduler: Scheduler,
) -> None:
    """The flood above is a real threat: with a credit so large that priority alone
    decides, every claim takes a priority-5 task."""
    _, passed_over, claimed = flood(sync_scheduler, 1_000_000_000, 200)
    assert not claimed and len(passed_over) == 200


# --------------------------------------------------------------------------- API


def test_the_order_is_default_until_set_and_is_kept_in_the_namespace(api: Scheduler) -> None:
    assert api.order() == OrderSetting(Order.DEFAULT, 0.0)
    assert api.set_order("priority", aging=2.5) == OrderSetting(Order.PRIORITY, 2.5)
    assert api.order() == OrderSetting(Order.PRIORITY, 2.5)
    stats = api.stats()
    assert (stats["order"], stats["aging_s"]) == ("priority", 2.5)
    assert api.set_order("default") == OrderSetting(Order.DEFAULT, 0.0)
    assert api.stats()["order"] == "default"


@pytest.mark.parametrize(
    ("order", "aging"),
    [("fifo", 1.0), ("priority", -1.0), ("priority", float("nan")), ("priority", 1e7)],
)
def test_a_bad_order_or_aging_is_refused(api: Scheduler, order: str, aging: float) -> None:
    with pytest.raises(InvalidArgument):
        api.set_order(order, aging=aging)


def test_due_tasks_go_highest_priority_first_and_waiting_earns_priority(api: Scheduler) -> None:
    api.set_order("priority", aging=10.0)
    now = api.server_time()
    api.schedule("old-low", fn="f", priority=0, run_at=now - 25.0)  # rank now - 25
    api.schedule("new-mid", fn="f", priority=2)  # rank now - 20
    api.schedule("new-high", fn="f", priority=3)  # rank now - 30
    api.schedule("later-top", fn="f", priority=9, delay=3600)  # not due
    got, wait = api.claim(10, "w")
    assert [c.task_id for c in got] == ["new-high", "old-low", "new-mid"]
    assert wait is not None and wait.reason == "not_due" and wait.delay is not None
    assert 3500 < wait.delay <= 3600


def test_the_default_order_is_unchanged(api: Scheduler) -> None:
    now = api.server_time()
    api.schedule("old-low", fn="f", priority=0, run_at=now - 25.0)
    api.schedule("new-high", fn="f", priority=3)
    assert [c.task_id for c in api.claim(10, "w")[0]] == ["old-low", "new-high"]
    assert api.stats()["ranked_entries"] == 0


def test_tasks_queued_before_the_switch_are_ranked_and_go_back_at_their_due_time(
    api: Scheduler,
) -> None:
    now = api.server_time()
    api.schedule("old-low", fn="f", priority=0, run_at=now - 25.0)
    api.schedule("new-high", fn="f", priority=3)
    api.set_order("priority", aging=100.0)
    assert api.explain("new-high").ahead == 0  # it ranks first, once moved
    # Back to the default before any claim moved them, then to priority, and a claim.
    api.set_order("default")
    api.set_order("priority", aging=100.0)
    [first], _ = api.claim(1, "w")
    assert first.task_id == "new-high"
    stats = api.stats()
    assert (stats["ranked_entries"], stats["live_entries"]) == (1, 1)
    # The ready set goes back into the queue at its due time: the default order holds.
    api.schedule("newest", fn="f", priority=9)
    api.set_order("default")
    assert api.stats()["ranked_entries"] == 0
    assert [c.task_id for c in api.claim(10, "w")[0]] == ["old-low", "newest"]


def test_a_change_that_would_rewrite_a_large_ready_set_is_refused(
    sync_scheduler: Scheduler,
) -> None:
    s = sync_scheduler
    s.set_order("priority", aging=1.0)
    s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(5)])
    call = calls.order_call(s.keys, Order.DEFAULT, 0, most=4)
    with pytest.raises(ConflictError, match="5 entries"):
        s._drive(s._ops.call(Ops.run, call))
    assert s.order().order is Order.PRIORITY
    assert s.set_order("priority", aging=2.0).aging_s == 2.0  # within the default bound


def test_explain_and_the_listing_follow_the_ready_set(api: Scheduler) -> None:
    api.set_order("priority", aging=1.0)
    for i, priority in enumerate([0, 5, 2]):
        api.schedule(f"t{i}", fn="f", priority=priority)
    api.schedule("later", fn="f", priority=1, delay=3600)
    api.cancel("t2")  # a stale entry in the ready set
    assert api.explain("t1").ahead == 0
    assert api.explain("t0").ahead == 2  # t1, and t2's stale entry
    first = api.tasks("ready", limit=1)
    assert [i.task_id for i in first.items] == ["t1"] and first.cursor is not None
    rest = api.tasks("ready", limit=10, cursor=first.cursor)
    assert [i.task_id for i in rest.items] == ["t0", "later"]
    assert api.stats()["stale_entries"] == 1


def test_compaction_drops_stale_entries_of_the_ready_set(sync_scheduler: Scheduler) -> None:
    s = sync_scheduler
    s.set_order("priority", aging=1.0)
    s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(300)])
    s.schedule_many([TaskSpec(f"t{i}", "f", delay=3600) for i in range(300)])
    for i in range(100):
        s.cancel(f"t{i}")
    stats = s.stats()
    assert (stats["queue_entries"], stats["stale_entries"]) == (600, 400)
    removed = 0
    for _ in range(10):
        removed += s._drive(s._ops.call(Ops.run, calls.compact_call(s.keys, 100, 0)))[0]
    assert removed == 400
    stats = s.stats()
    assert (stats["queue_entries"], stats["stale_entries"]) == (200, 0)


def test_the_overview_shows_the_oldest_due_wait_per_priority(api: Scheduler) -> None:
    api.set_order("priority", aging=1.0)
    now = api.server_time()
    api.schedule("a", fn="f", priority=0, run_at=now - 30)
    api.schedule("b", fn="f", priority=0, run_at=now - 10)
    api.schedule("c", fn="f", priority=250, run_at=now - 5)
    api.schedule("d", fn="f", priority=-3, delay=3600)
    waits = api.overview()["oldest_ready_age_by_priority"]
    assert set(waits) == {"0", "100-999"}
    assert 30 <= waits["0"] < 40 and 5 <= waits["100-999"] < 15


def test_priorities_are_reported_in_a_few_buckets() -> None:
    labels = {priority_bucket(p) for p in range(-(2**31), 2**31, 2**20)}
    labels |= {priority_bucket(p) for p in range(-20, 2000)}
    assert labels == {"<0", *map(str, range(10)), "10-99", "100-999", ">=1000"}


def test_a_claim_moves_at_most_1000_due_entries_and_the_next_claims_move_the_rest(
    sync_scheduler: Scheduler,
) -> None:
    s = sync_scheduler
    now = s.server_time()
    specs = [TaskSpec(f"t{i}", "f", run_at=now - 10 + i / 1000) for i in range(1499)]
    specs.append(TaskSpec("top", "f", run_at=now - 10 + 1.499, priority=9))
    s.schedule_many(specs)  # in the default order: all in the queue
    s.set_order("priority", aging=1.0)
    [first] = s.ready(1, "w")
    assert first.task_id == "t0"  # the best of the 1,000 earliest due
    assert s.stats()["ranked_entries"] == 999
    [second] = s.ready(1, "w")
    assert second.task_id == "top"  # moved by this call, and ranked first
    assert s.stats()["ranked_entries"] == 1498


def test_a_junk_aging_counts_as_no_credit(sync_scheduler: Scheduler) -> None:
    s = sync_scheduler
    s.set_order("priority", aging=1.0)
    s.client.hset(s.keys.meta, "aging_ms", "soon")  # written by hand
    assert s.order() == OrderSetting(Order.PRIORITY, 0.0)
    now = s.server_time()
    s.schedule("old", fn="f", run_at=now - 1)
    s.schedule("high", fn="f", priority=1000)
    assert [c.task_id for c in s.claim(2, "w")[0]] == ["old", "high"]
