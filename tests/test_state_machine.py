"""A stateful test: random operation sequences against a pure-Python model of the contract.

The model knows §2's transitions, §3's order, §6's fencing and attempts and §8's capacity.
Each example runs on the real ``redis-server`` in a namespace of its own; after every step
the whole observable state (``status`` of every id, ``stats``) must equal the model's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Wait
from distsched.errors import ConflictError, LeaseLostError, NotFoundError
from distsched.model import WaitReason
from tests.conftest import RedisServer
from tests.test_listing import listing_matches

IDS = ["a", "b|c", "ü"]  # '|' is the record separator; ü is multi-byte
WORKERS = ["w1", "w|2"]
PRIORITIES = [-(2**31), -1, 0, 0, 5, 2**31 - 1]
BASE_MS = 1_700_000_000_000  # well in the past: every scheduled task is due
# A repeated report is a duplicate while its attempt is among the last 10 attempts in the
# id's history and was ended by a report (README).
HISTORY_KEEP = 10

Token = tuple[str, int, int]


@dataclass
class Task:
    state: State
    version: int
    priority: int
    run_at_ms: int
    max_attempts: int
    attempt: int = 0
    cancel_requested: bool = False
    worker: str | None = None
    error: str | None = None
    result: object = None

    def token(self, task_id: str) -> Token:
        return (task_id, self.version, self.attempt)


@dataclass
class Model:
    tasks: dict[str, Task] = field(default_factory=dict)
    # Queue entries as Redis holds them: (priority, version, id) -> run_at ms.
    queue: dict[tuple[int, int, str], int] = field(default_factory=dict)
    seq: int = 0
    # Each id's ended attempts, oldest first: (version, attempt, ended by a report).
    history: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)
    max_running: int | None = None

    def running(self) -> int:
        return sum(t.state is State.RUNNING for t in self.tasks.values())

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in State}
        for t in self.tasks.values():
            counts[t.state.value] += 1
        return counts

    def is_current(self, token: Token) -> bool:
        task_id, version, attempt = token
        t = self.tasks.get(task_id)
        return (
            t is not None
            and t.state is State.RUNNING
            and (t.version, t.attempt) == (version, attempt)
        )

    def outcome(self, token: Token) -> Outcome:
        if self.is_current(token):
            return Outcome.APPLIED
        task_id, version, attempt = token
        if (version, attempt, True) in self.history.get(task_id, [])[-HISTORY_KEEP:]:
            return Outcome.DUPLICATE
        return Outcome.STALE

    def remember(self, token: Token, reported: bool = True) -> None:
        self.history.setdefault(token[0], []).append((token[1], token[2], reported))

    def live(self, entry: tuple[int, int, str]) -> bool:
        _, version, task_id = entry
        t = self.tasks.get(task_id)
        return t is not None and t.state is State.READY and t.version == version

    def claim(self, n: int, worker: str) -> tuple[list[Token], str]:
        """The claim script's walk: stale heads dropped, capacity checked, in queue order."""
        out: list[Token] = []
        while len(out) < n:
            if not self.queue:
                return out, "empty"
            head = min(self.queue, key=lambda e: (self.queue[e], -e[0], e[1]))
            if not self.live(head):
                del self.queue[head]
                continue
            if self.max_running is not None and self.running() >= self.max_running:
                return out, "capacity"
            del self.queue[head]
            t = self.tasks[head[2]]
            t.state, t.attempt, t.worker = State.RUNNING, t.attempt + 1, worker
            out.append(t.token(head[2]))
        return out, ""

    def enqueue(self, task_id: str) -> None:
        t = self.tasks[task_id]
        self.queue[(t.priority, t.version, task_id)] = t.run_at_ms


class SchedulerMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.s = Scheduler(client, namespace="sm" + uuid.uuid4().hex[:12], lease_s=60.0)
        self.m = Model()
        # Tokens handed out by a claim and not given back by release (which returns the
        # attempt, so the same token may legitimately be handed out again).
        self.issued: set[Token] = set()
        self.seen: dict[str, tuple[int, State]] = {}

    def teardown(self) -> None:
        self.s.close()

    # ------------------------------------------------------------------ helpers

    def server_ms(self) -> int:
        return int(self.s.server_time() * 1000)

    def check_claims(self, claims: list[Claim], expected: list[Token]) -> None:
        assert [c.token for c in claims] == expected
        for c in claims:
            t = self.m.tasks[c.task_id]
            assert (c.priority, round(c.run_at * 1000)) == (t.priority, t.run_at_ms)
            assert (c.fn, c.args) == ("f", (c.task_id, t.version))
            assert c.token not in self.issued, "a (version, attempt) was claimed twice"
            self.issued.add(c.token)

    def new_version(self, task_id: str, priority: int, offset: int, max_attempts: int) -> None:
        self.m.seq += 1
        self.m.tasks[task_id] = Task(
            state=State.READY,
            version=self.m.seq,
            priority=priority,
            run_at_ms=BASE_MS + offset,
            max_attempts=max_attempts,
        )
        self.m.enqueue(task_id)

    def retried_at(self, task_id: str, before_ms: int) -> None:
        """A retry is due at the server's now (backoff 0): learn it from the server."""
        run_at_ms = round(self.s.status(task_id).run_at * 1000)
        assert before_ms <= run_at_ms <= self.server_ms()
        self.m.tasks[task_id].run_at_ms = run_at_ms
        self.m.enqueue(task_id)

    def end_attempt_failed(self, task_id: str, reason: str, before_ms: int) -> None:
        t = self.m.tasks[task_id]
        t.worker, t.error = None, reason
        if t.attempt < t.max_attempts and not t.cancel_requested:
            t.state = State.READY
            self.retried_at(task_id, before_ms)
        else:
            t.state = State.FAILED

    # ------------------------------------------------------------------ producers

    @rule(
        task_id=st.sampled_from(IDS),
        priority=st.sampled_from(PRIORITIES),
        offset=st.integers(0, 3),
        max_attempts=st.integers(1, 3),
    )
    def schedule(self, task_id: str, priority: int, offset: int, max_attempts: int) -> None:
        old = self.m.tasks.get(task_id)
        call = dict(
            fn="f",
            run_at=(BASE_MS + offset) / 1000,
            priority=priority,
            max_attempts=max_attempts,
            backoff=0,
            args=(task_id, self.m.seq + 1),
        )
        if old is not None and old.state is State.RUNNING:
            with pytest.raises(ConflictError):
                self.s.schedule(task_id, **call)  # type: ignore[arg-type]
            return
        version = self.s.schedule(task_id, **call)  # type: ignore[arg-type]
        self.new_version(task_id, priority, offset, max_attempts)
        assert version == self.m.seq

    @rule(
        ids=st.lists(st.sampled_from(IDS), min_size=2, max_size=3, unique=True),
        priority=st.sampled_from(PRIORITIES),
        offset=st.integers(0, 3),
    )
    def schedule_batch(self, ids: list[str], priority: int, offset: int) -> None:
        specs = [
            TaskSpec(
                task_id,
                "f",
                run_at=(BASE_MS + offset) / 1000,
                priority=priority,
                max_attempts=2,
                backoff=0,
                args=(task_id, self.m.seq + 1 + i),
            )
            for i, task_id in enumerate(ids)
        ]
        if any(
            self.m.tasks.get(i) is not None and self.m.tasks[i].state is State.RUNNING for i in ids
        ):
            with pytest.raises(ConflictError):
                self.s.schedule_many(specs)
            return
        versions = self.s.schedule_many(specs)
        for task_id in ids:
            self.new_version(task_id, priority, offset, 2)
        assert versions == list(range(self.m.seq - len(ids) + 1, self.m.seq + 1))

    @rule(task_id=st.sampled_from(IDS))
    def cancel(self, task_id: str) -> None:
        self.cancel_id(task_id)

    @rule(c=claims)
    def cancel_a_claimed_task(self, c: Claim) -> None:
        # Cancelling what was claimed makes running tasks with a request common.
        self.cancel_id(c.task_id)

    def cancel_id(self, task_id: str) -> None:
        t = self.m.tasks.get(task_id)
        if t is None:
            with pytest.raises(NotFoundError):
                self.s.cancel(task_id)
            return
        got = self.s.cancel(task_id)
        if t.state in (State.PENDING, State.READY):
            t.state = State.CANCELLED
        elif t.state is State.RUNNING:
            t.cancel_requested = True
        assert got is t.state

    @rule(limit=st.sampled_from([None, 0, 1, 2]))
    def set_max_running(self, limit: int | None) -> None:
        self.s.set_max_running(limit)
        self.m.max_running = limit

    # ------------------------------------------------------------------ workers

    @rule(target=claims, worker=st.sampled_from(WORKERS))
    def next(self, worker: str) -> object:
        expected, reason = self.m.claim(1, worker)
        got = self.s.next(worker)
        if not expected:
            assert got == Wait(WaitReason(reason), None)
            return multiple()
        assert isinstance(got, Claim)
        self.check_claims([got], expected)
        return multiple(got)

    def has_ready(self) -> bool:
        return any(t.state is State.READY for t in self.m.tasks.values())

    @precondition(has_ready)
    @rule(target=claims, n=st.integers(1, 4), worker=st.sampled_from(WORKERS))
    def ready(self, n: int, worker: str) -> object:
        expected, _ = self.m.claim(n, worker)
        got = self.s.ready(n, worker)
        self.check_claims(got, expected)
        return multiple(*got)

    @precondition(has_ready)
    @rule(target=claims, n=st.integers(1, 4), worker=st.sampled_from(WORKERS))
    def claim(self, n: int, worker: str) -> object:
        expected, reason = self.m.claim(n, worker)
        event(f"claim: {len(expected)} of {n}, {reason or 'full'}")
        got, wait = self.s.claim(n, worker)
        self.check_claims(got, expected)
        assert wait == (Wait(WaitReason(reason), None) if reason else None)
        return multiple(*got)

    @rule(c=claims)
    def heartbeat(self, c: Claim) -> None:
        if self.m.is_current(c.token):
            assert self.s.heartbeat(c) is self.m.tasks[c.task_id].cancel_requested
        else:
            with pytest.raises(LeaseLostError):
                self.s.heartbeat(c)

    @rule(c=claims, result=st.one_of(st.none(), st.integers(-5, 5)))
    def complete(self, c: Claim, result: int | None) -> None:
        expected = self.m.outcome(c.token)
        event(f"complete: {expected}")
        assert self.s.complete(c, result) is expected
        if expected is Outcome.APPLIED:
            t = self.m.tasks[c.task_id]
            t.state, t.worker, t.result, t.error = State.SUCCEEDED, None, result, None
            self.m.remember(c.token)

    @rule(c=claims)
    def fail(self, c: Claim) -> None:
        expected = self.m.outcome(c.token)
        event(f"fail: {expected}")
        before = self.server_ms()
        assert self.s.fail(c, f"boom {c.attempt}") is expected
        if expected is Outcome.APPLIED:
            self.m.remember(c.token)
            self.end_attempt_failed(c.task_id, f"boom {c.attempt}", before)

    @rule(c=claims)
    def confirm_cancel(self, c: Claim) -> None:
        expected = self.m.outcome(c.token)
        event(f"confirm_cancel: {expected}, requested: {self.m.tasks[c.task_id].cancel_requested}")
        t = self.m.tasks[c.task_id]
        if expected is Outcome.APPLIED and not t.cancel_requested:
            with pytest.raises(ConflictError):
                self.s.confirm_cancel(c)
            return
        assert self.s.confirm_cancel(c) is expected
        if expected is Outcome.APPLIED:
            t.state, t.worker = State.CANCELLED, None
            self.m.remember(c.token)

    @rule(c=claims)
    def release(self, c: Claim) -> None:
        current = self.m.is_current(c.token)
        assert self.s.release([c]) == int(current)
        if current:
            self.m.remember(c.token, reported=False)  # handed back
            t = self.m.tasks[c.task_id]
            t.attempt, t.worker = t.attempt - 1, None
            self.issued.discard(c.token)
            if t.cancel_requested:
                # Never started, and asked to stop: it ends cancelled rather than run later.
                t.state = State.CANCELLED
            else:
                t.state = State.READY
                self.m.enqueue(c.task_id)

    @rule(task_id=st.sampled_from(IDS))
    def expire_lease(self, task_id: str) -> None:
        t = self.m.tasks.get(task_id)
        running = t is not None and t.state is State.RUNNING
        before = self.server_ms()
        assert self.s.expire_lease(task_id) == int(running)
        if running:
            assert t is not None
            self.m.remember(t.token(task_id), reported=False)  # lost
            self.end_attempt_failed(task_id, "lease expired", before)

    @rule()
    def reap(self) -> None:
        # Leases last a minute: nothing is due for reaping within an example.
        assert self.s.reap() == 0

    # ------------------------------------------------------------------ invariants

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = self.s.stats()
        assert stats["counts"] == self.m.counts()
        assert stats["queue_entries"] == len(self.m.queue)
        assert stats["stale_entries"] == sum(not self.m.live(e) for e in self.m.queue)
        assert stats["leases"] == stats["running"] == self.m.running()
        assert stats["max_running"] == self.m.max_running
        assert stats["sequence"] == self.m.seq

    @invariant()
    def every_task_matches_the_model(self) -> None:
        for task_id in IDS:
            t = self.m.tasks.get(task_id)
            if t is None:
                with pytest.raises(NotFoundError):
                    self.s.status(task_id)
                continue
            info = self.s.status(task_id)
            assert (info.state, info.version, info.attempt, info.max_attempts) == (
                t.state,
                t.version,
                t.attempt,
                t.max_attempts,
            )
            assert (info.priority, round(info.run_at * 1000)) == (t.priority, t.run_at_ms)
            assert info.cancel_requested is t.cancel_requested
            assert info.worker == t.worker
            assert (info.lease_deadline is not None) == (t.state is State.RUNNING)
            assert info.error == t.error
            assert info.result == (t.result if t.state is State.SUCCEEDED else None)
            # What Redis showed at the previous step: versions only grow, and a terminal
            # state stays as it is until a new version.
            previous = self.seen.get(task_id)
            if previous is not None:
                assert info.version >= previous[0]
                if previous[1].terminal and info.version == previous[0]:
                    assert info.state is previous[1]
            self.seen[task_id] = (info.version, info.state)

    @invariant()
    def each_state_lists_exactly_its_tasks(self) -> None:
        by_state: dict[State, set[str]] = {}
        for task_id, t in self.m.tasks.items():
            by_state.setdefault(t.state, set()).add(task_id)
        listing_matches(self.s, by_state)
        # Ready tasks come in the order workers claim them.
        live = sorted(
            (run_at, -priority, version, task_id)
            for (priority, version, task_id), run_at in self.m.queue.items()
            if self.m.live((priority, version, task_id))
        )
        ready = [info.task_id for info in self.s.tasks(State.READY, limit=1000).items]
        assert ready == [entry[3] for entry in live]


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis_server.client()
    yield c
    c.close()


def test_random_operation_sequences_follow_the_contract_model(client: redis.Redis) -> None:
    # Hypothesis types the factory as a machine class, though it documents and accepts any
    # callable that returns a machine.
    run_state_machine_as_test(
        lambda: SchedulerMachine(client),  # type: ignore[arg-type]
        settings=settings(
            max_examples=60,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
