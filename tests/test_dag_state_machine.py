"""A stateful test of dependencies (§7): random DAG operations against a pure-Python model.

The model keeps, for each task's current version, its dependency list, the edges it still
awaits, its remaining counts and its block cause. Each example runs on the real
``redis-server`` in a namespace of its own. After every step: the state, version,
remaining counts, dependencies and block cause of every id equal the model's, the
per-state counts equal the model's, no propagation is left over, and the tasks that
wait on each other form no cycle. Every claim is checked as it happens: the task was
ready, its version had never been claimed, and each of its required dependencies had
succeeded since the version was written.

Propagation order is modelled as the scripts document it: terminal tasks are settled
oldest first, the dependents of one task in edge order (optional before required, then
by id), so the *first* cause of a block is predictable. A retry's cascade re-versions
the tasks blocked with the retried task as their root, in id order, after the task; a
task whose new version would wait, through others, on itself stays blocked instead.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distsched import Claim, Outcome, Scheduler, State
from distsched.errors import (
    ConflictError,
    CycleError,
    InvalidArgument,
    NotFoundError,
    UnknownDependencyError,
)
from distsched.model import BlockedBy
from tests.conftest import RedisServer
from tests.test_listing import listing_matches

IDS = ["a", "b", "c", "d", "e"]
WORKER = "w"
# A repeated report is a duplicate while its attempt is among the last 10 attempts in the
# id's history and was ended by a report (README).
HISTORY_KEEP = 10
TERMINAL = {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.BLOCKED}

dep_lists = st.lists(st.sampled_from(IDS), max_size=3, unique=True)


@dataclass
class Task:
    state: State
    version: int
    deps: list[tuple[str, str]]  # (kind 'r' or 'o', id), in the order given
    waiting: dict[str, str] = field(default_factory=dict)  # awaited edges: dep id -> kind
    remaining: int = 0
    optional: int = 0
    cause: tuple[str, str] | None = None  # (root, parent) when blocked
    # Required dependencies seen succeeded since this version was written.
    satisfied: set[str] = field(default_factory=set)
    cancel_requested: bool = False

    def required(self) -> list[str]:
        return [d for kind, d in self.deps if kind == "r"]

    def optional_ids(self) -> list[str]:
        return [d for kind, d in self.deps if kind == "o"]


@dataclass
class Model:
    tasks: dict[str, Task] = field(default_factory=dict)
    seq: int = 0
    jobs: list[str] = field(default_factory=list)  # terminal ids whose dependents are untold
    # Each id's ended attempts, oldest first: (version, attempt, ended by a report).
    history: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries

    def state(self, task_id: str) -> State | None:
        t = self.tasks.get(task_id)
        return t.state if t else None

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in State}
        for t in self.tasks.values():
            counts[t.state.value] += 1
        return counts

    def awaited_edges(self, skip: str | None = None) -> dict[str, list[str]]:
        """dep -> the pending tasks awaiting it (``skip``'s old edges left out)."""
        out: dict[str, list[str]] = {}
        for task_id, t in self.tasks.items():
            if task_id != skip and t.state is State.PENDING:
                for dep in t.waiting:
                    out.setdefault(dep, []).append(task_id)
        return out

    @staticmethod
    def reaches(graph: dict[str, list[str]], start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), []):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    def root_through(self, dep: str, dep_state: State) -> str:
        t = self.tasks.get(dep)
        if dep_state is State.BLOCKED and t is not None and t.cause is not None:
            return t.cause[0]
        return dep

    def add_deps_refusals(
        self, task_id: str, deps: list[str], allow_unknown: bool
    ) -> tuple[set[type[Exception]], dict[str, list[str]]]:
        """The errors ``add_deps`` may raise, and the awaited edges with the new ones."""
        t = self.tasks[task_id]
        errors: set[type[Exception]] = set()
        if t.state is not State.PENDING:
            errors.add(ConflictError)
        if any(d in {i for _, i in t.deps} for d in deps):
            errors.add(InvalidArgument)
        if not allow_unknown and any(d not in self.tasks for d in deps):
            errors.add(UnknownDependencyError)
        graph = self.awaited_edges()
        for dep in deps:
            graph.setdefault(dep, []).append(task_id)
        if t.state is State.PENDING and self.reaches(graph, task_id, task_id):
            errors.add(CycleError)
        return errors, graph

    # ------------------------------------------------------------------ transitions

    def push_job(self, task_id: str) -> None:
        if task_id not in self.jobs:
            self.jobs.append(task_id)

    def block(self, task_id: str, root: str, parent: str) -> None:
        t = self.tasks[task_id]
        t.state, t.cause = State.BLOCKED, (root, parent)
        if any(task_id in o.waiting for o in self.tasks.values()):
            self.push_job(task_id)

    def add_deps(self, task_id: str, deps: list[str]) -> None:
        """Required dependencies added to a pending task; an ended one that did not
        succeed blocks it."""
        t = self.tasks[task_id]
        cause: tuple[str, str] | None = None
        for dep in deps:
            st_ = self.state(dep)
            t.deps.append(("r", dep))
            if st_ is State.SUCCEEDED:
                t.satisfied.add(dep)
            elif st_ in TERMINAL:
                assert st_ is not None
                if cause is None:
                    cause = (self.root_through(dep, st_), dep)
            else:
                t.remaining += 1
                t.waiting[dep] = "r"
        if cause is not None:
            self.block(task_id, *cause)
            self.propagate()

    def write(
        self,
        task_id: str,
        deps: Sequence[tuple[str, str]],
        state_of: Callable[[str], State | None] | None = None,
    ) -> int:
        """A new version of ``task_id`` with ``deps`` (schedule.lua's write_version)."""
        state_of = state_of or self.state
        self.seq += 1
        t = Task(state=State.PENDING, version=self.seq, deps=list(deps))
        cause: tuple[str, str] | None = None
        for kind, dep in deps:
            st_ = state_of(dep)
            if kind == "o":
                if st_ not in TERMINAL:
                    t.optional += 1
                    t.waiting[dep] = "o"
            elif st_ is State.SUCCEEDED:
                t.satisfied.add(dep)
            elif st_ in TERMINAL:
                assert st_ is not None
                if cause is None:
                    cause = (self.root_through(dep, st_), dep)
            else:
                t.remaining += 1
                t.waiting[dep] = "r"
        self.tasks[task_id] = t
        if cause is not None:
            t.waiting.clear()
            self.block(task_id, *cause)
        elif t.remaining + t.optional == 0:
            t.state = State.READY
        return t.version

    def ended(self, task_id: str) -> None:
        """``task_id`` just became terminal: tell its dependents."""
        if self.tasks[task_id].state is State.SUCCEEDED:
            for t in self.tasks.values():
                if task_id in t.required():
                    t.satisfied.add(task_id)
        self.push_job(task_id)
        self.propagate()

    def propagate(self) -> None:
        while self.jobs:
            parent = self.jobs.pop(0)
            p_state = self.tasks[parent].state
            edges = sorted(
                (t.waiting[parent], child) for child, t in self.tasks.items() if parent in t.waiting
            )
            for kind, child in edges:
                ct = self.tasks[child]
                del ct.waiting[parent]
                if ct.state is not State.PENDING:
                    continue
                if kind == "o":
                    ct.optional -= 1
                elif p_state is State.SUCCEEDED:
                    ct.remaining -= 1
                else:
                    self.block(child, self.root_through(parent, p_state), parent)
                    continue
                if ct.remaining <= 0 and ct.optional <= 0:
                    ct.state = State.READY

    def retry(self, task_id: str, cascade: bool) -> int:
        # What it blocked shares its root cause: itself, or its own root when blocked.
        own = self.tasks[task_id]
        root = own.cause[0] if own.state is State.BLOCKED and own.cause else task_id
        version = self.write(task_id, self.tasks[task_id].deps)
        if cascade:

            def through(x: str) -> bool:
                """x's chain of block parents leads to task_id before the root."""
                seen: set[str] = set()
                cur = x
                while cur not in seen:
                    seen.add(cur)
                    t = self.tasks.get(cur)
                    if t is None or t.cause is None or t.cause[0] != root:
                        return False
                    parent = t.cause[1]
                    if parent == task_id:
                        return True
                    if parent == root:
                        return False
                    cur = parent
                return False

            def in_cascade(x: str) -> bool:
                t = self.tasks.get(x)
                return (
                    t is not None
                    and t.state is State.BLOCKED
                    and t.version < version
                    and t.cause is not None
                    and t.cause[0] == root
                    and (root == task_id or through(x))
                )

            def state_of(x: str) -> State | None:
                return State.PENDING if in_cascade(x) else self.state(x)

            for member in sorted(x for x in self.tasks if in_cascade(x)):
                deps = self.tasks[member].deps
                if self.closes_cycle(member, deps, state_of):
                    # It stays blocked; what already waits on it is blocked again.
                    self.push_job(member)
                else:
                    self.write(member, deps, state_of)
        self.propagate()
        return version

    def closes_cycle(
        self, task_id: str, deps: Sequence[tuple[str, str]], state_of: Callable[[str], State | None]
    ) -> bool:
        """Would a new version of ``task_id`` await a task that (transitively) awaits it?"""
        graph = self.awaited_edges(skip=task_id)
        for kind, dep in deps:
            st_ = state_of(dep)
            if kind == "r" and st_ in TERMINAL and st_ is not State.SUCCEEDED:
                return False  # blocked at once: it awaits nothing
            if st_ not in TERMINAL:
                graph.setdefault(dep, []).append(task_id)
        return self.reaches(graph, task_id, task_id)

    def blocked_path(self, task_id: str) -> tuple[str, ...]:
        """From the root to ``task_id``, following each blocked task's parent while intact."""
        cause = self.tasks[task_id].cause
        assert cause is not None
        root = cause[0]
        path = [task_id]
        parent = cause[1]
        while parent not in path:
            path.append(parent)
            if parent == root:
                break
            pt = self.tasks.get(parent)
            if pt is None or pt.state is not State.BLOCKED or pt.cause is None:
                break
            if pt.cause[0] != root:
                break
            parent = pt.cause[1]
        return tuple(reversed(path))

    def outcome(self, claim: Claim) -> Outcome:
        t = self.tasks.get(claim.task_id)
        if t is not None and t.state is State.RUNNING and t.version == claim.version:
            return Outcome.APPLIED
        ended = self.history.get(claim.task_id, [])[-HISTORY_KEEP:]
        if (claim.version, claim.attempt, True) in ended:
            return Outcome.DUPLICATE
        return Outcome.STALE


def assert_cycle_path(path: Sequence[str], edges: dict[str, list[str]]) -> None:
    """Each id of ``path`` is a dependency of the next, first == last, no id twice."""
    assert len(path) >= 3 and path[0] == path[-1], path
    assert len(set(path[:-1])) == len(path) - 1, path
    for dep, dependent in itertools.pairwise(path):
        assert dependent in edges.get(dep, []), (path, dep, dependent)


class DagMachine(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.s = Scheduler(client, namespace="dag" + uuid.uuid4().hex[:12], lease_s=60.0)
        self.m = Model()
        self.running: dict[str, Claim] = {}
        self.claims: list[Claim] = []  # every claim handed out, for late reports
        self.claimed_versions: set[tuple[str, int]] = set()

    def teardown(self) -> None:
        self.s.close()

    # ------------------------------------------------------------------ helpers

    def expect_refusal(self, errors: set[type[Exception]], call: Callable[[], object]) -> Exception:
        """``call`` must raise one of ``errors`` and write nothing."""
        with pytest.raises(tuple(errors)) as info:
            call()
        assert type(info.value) in errors, info.value
        assert self.s.stats()["sequence"] == self.m.seq
        return info.value

    def ids_of(self, state: State) -> list[str]:
        return sorted(i for i, t in self.m.tasks.items() if t.state is state)

    # ------------------------------------------------------------------ producers

    @rule(
        task_id=st.sampled_from(IDS),
        required=dep_lists,
        optional=dep_lists,
        mode=st.sampled_from(["closed", "closed", "open", "closed-any"]),
    )
    def submit(self, task_id: str, required: list[str], optional: list[str], mode: str) -> None:
        if mode == "closed":
            # Dependencies among the ids that exist, so closed submissions mostly succeed.
            required = [d for d in required if d in self.m.tasks]
            optional = [d for d in optional if d in self.m.tasks]
        required = [d for d in required if d != task_id]
        optional = [d for d in optional if d != task_id and d not in required]
        allow_unknown = mode == "open"
        deps = [("r", d) for d in required] + [("o", d) for d in optional]
        errors: set[type[Exception]] = set()
        if self.m.state(task_id) is State.RUNNING:
            errors.add(ConflictError)
        if not allow_unknown and any(d not in self.m.tasks for _, d in deps):
            errors.add(UnknownDependencyError)
        graph = self.m.awaited_edges(skip=task_id)
        for _, dep in deps:
            graph.setdefault(dep, []).append(task_id)
        if self.m.reaches(graph, task_id, task_id):
            errors.add(CycleError)

        def call() -> int:
            return self.s.submit(
                task_id, fn="f", deps=required, optional_deps=optional, allow_unknown=allow_unknown
            )

        if errors:
            event(f"submit refused: {sorted(e.__name__ for e in errors)}")
            err = self.expect_refusal(errors, call)
            if isinstance(err, CycleError):
                assert_cycle_path(err.path, graph)
            return
        version = call()
        assert version == self.m.write(task_id, deps)
        self.m.propagate()
        event(f"submit: {self.m.tasks[task_id].state}")

    @rule(task_id=st.sampled_from(IDS))
    def cancel(self, task_id: str) -> None:
        t = self.m.tasks.get(task_id)
        if t is None:
            self.expect_refusal({NotFoundError}, lambda: self.s.cancel(task_id))
            return
        before = t.state
        got = self.s.cancel(task_id)
        if before in (State.PENDING, State.READY):
            t.state = State.CANCELLED
            self.m.ended(task_id)
        elif before is State.RUNNING:
            t.cancel_requested = True
        assert got is t.state

    @rule(task_id=st.sampled_from(IDS), cascade=st.booleans())
    def retry(self, task_id: str, cascade: bool) -> None:
        t = self.m.tasks.get(task_id)
        if t is None:
            self.expect_refusal({NotFoundError}, lambda: self.s.retry(task_id, cascade=cascade))
            return
        if t.state not in (State.FAILED, State.CANCELLED, State.BLOCKED):
            self.expect_refusal({ConflictError}, lambda: self.s.retry(task_id, cascade=cascade))
            return
        before = self.m.seq
        version = self.s.retry(task_id, cascade=cascade)
        assert version == self.m.retry(task_id, cascade)
        event(f"retry: {self.m.seq - before} versions, cascade={cascade}")

    @rule(
        data=st.data(),
        task_id=st.sampled_from(IDS),
        deps=dep_lists,
        allow_unknown=st.booleans(),
        aim=st.booleans(),
    )
    def add_deps(
        self, data: st.DataObject, task_id: str, deps: list[str], allow_unknown: bool, aim: bool
    ) -> None:
        if aim:
            task_id, deps = self.aim_add_deps(data, task_id, deps)
        deps = [d for d in deps if d != task_id]
        if not deps:
            return
        t = self.m.tasks.get(task_id)
        if t is None:
            self.expect_refusal({NotFoundError}, lambda: self.s.add_deps(task_id, deps))
            return
        errors, graph = self.m.add_deps_refusals(task_id, deps, allow_unknown)

        def call() -> None:
            self.s.add_deps(task_id, deps, allow_unknown=allow_unknown)

        if errors:
            event(f"add_deps refused: {sorted(e.__name__ for e in errors)}")
            err = self.expect_refusal(errors, call)
            if isinstance(err, CycleError):
                assert_cycle_path(err.path, graph)
            return
        call()
        self.m.add_deps(task_id, deps)
        event(f"add_deps: {t.state}")

    def aim_add_deps(
        self, data: st.DataObject, task_id: str, deps: list[str]
    ) -> tuple[str, list[str]]:
        """Mostly legal calls: a pending task and dependencies it does not have yet."""
        pending = self.ids_of(State.PENDING)
        if not pending:
            return task_id, deps
        task_id = data.draw(st.sampled_from(pending))
        have = {d for _, d in self.m.tasks[task_id].deps}
        return task_id, [d for d in deps if d not in have]

    # ------------------------------------------------------------------ workers

    @rule(n=st.integers(1, 3))
    def claim(self, n: int) -> None:
        ready = self.ids_of(State.READY)
        claims = self.s.ready(n, WORKER)
        assert len(claims) == min(n, len(ready))
        for c in claims:
            t = self.m.tasks[c.task_id]
            assert t.state is State.READY, c
            assert c.version == t.version and c.attempt == 1
            key = (c.task_id, c.version)
            assert key not in self.claimed_versions, f"version claimed twice: {key}"
            self.claimed_versions.add(key)
            missing = set(t.required()) - t.satisfied
            assert not missing, f"{c.task_id} ran before {missing} succeeded"
            t.state = State.RUNNING
            self.running[c.task_id] = c
            self.claims.append(c)

    def has_running(self) -> bool:
        return bool(self.running)

    def report(self, task_id: str, how: str) -> None:
        claim = self.running.pop(task_id)
        t = self.m.tasks[task_id]
        if how == "complete":
            assert self.s.complete(claim) is Outcome.APPLIED
            t.state = State.SUCCEEDED
        elif how == "fail":
            assert self.s.fail(claim, "boom") is Outcome.APPLIED
            t.state = State.FAILED
        else:
            assert self.s.expire_lease(task_id) == 1
            t.state = State.FAILED
        reported = how != "expire"
        self.m.history.setdefault(task_id, []).append((claim.version, claim.attempt, reported))
        self.m.ended(task_id)

    @precondition(has_running)
    @rule(data=st.data(), how=st.sampled_from(["complete", "complete", "fail", "expire"]))
    def finish(self, data: st.DataObject, how: str) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.running)))
        event(f"finish: {how}")
        self.report(task_id, how)

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail"]))
    def late_report(self, data: st.DataObject, how: str) -> None:
        claim = data.draw(st.sampled_from(self.claims))
        if self.running.get(claim.task_id) == claim:
            return
        expected = self.m.outcome(claim)
        assert expected is not Outcome.APPLIED
        if how == "complete":
            assert self.s.complete(claim) is expected
        else:
            assert self.s.fail(claim, "late") is expected
        event(f"late {how}: {expected}")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_task_matches_the_model(self) -> None:
        for task_id in IDS:
            t = self.m.tasks.get(task_id)
            if t is None:
                with pytest.raises(NotFoundError):
                    self.s.status(task_id)
                continue
            info = self.s.status(task_id)
            assert (info.state, info.version) == (t.state, t.version), task_id
            assert info.deps == tuple(t.required()), task_id
            assert info.optional_deps == tuple(t.optional_ids()), task_id
            assert info.remaining >= 0 and info.optional_remaining >= 0, info
            assert (info.remaining, info.optional_remaining) == (t.remaining, t.optional), info
            assert info.cancel_requested is t.cancel_requested
            if t.state is State.BLOCKED:
                assert t.cause is not None
                expected = BlockedBy(t.cause[0], self.m.blocked_path(task_id))
                assert info.blocked_by == expected, task_id
            else:
                assert info.blocked_by is None, info

    @invariant()
    def each_state_lists_exactly_its_tasks(self) -> None:
        by_state: dict[State, set[str]] = {}
        for task_id, t in self.m.tasks.items():
            by_state.setdefault(t.state, set()).add(task_id)
        listing_matches(self.s, by_state)

    @invariant()
    def counts_match_and_nothing_is_left_to_settle(self) -> None:
        stats = self.s.stats()
        assert stats["counts"] == self.m.counts()
        assert stats["sequence"] == self.m.seq
        assert self.client.zcard(self.s.keys.propagating) == 0

    @invariant()
    def no_pending_tasks_wait_on_each_other_in_a_cycle(self) -> None:
        graph = self.m.awaited_edges()
        for task_id, t in self.m.tasks.items():
            if t.state is State.PENDING:
                assert not self.m.reaches(graph, task_id, task_id), task_id


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis_server.client()
    yield c
    c.close()


def test_random_dag_operations_follow_the_dependency_model(client: redis.Redis) -> None:
    # Hypothesis types the factory as a machine class, though it documents and accepts any
    # callable that returns a machine.
    run_state_machine_as_test(
        lambda: DagMachine(client),  # type: ignore[arg-type]
        settings=settings(
            max_examples=60,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
