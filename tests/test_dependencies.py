"""Dependencies (§7) against a real redis-server: release, blocking, cycles, retry, big graphs.

Tasks are driven by hand (claim with ``ready``, report with ``complete``/``fail``), so each
test sees every transition; the fan-in race uses real processes started together.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Wait
from distsched.errors import (
    BusyError,
    ConflictError,
    CycleError,
    InvalidArgument,
    NotFoundError,
    UnknownDependencyError,
)
from distsched.model import BlockedBy, WaitReason
from distsched.ops.base import once
from distsched.wire import calls
from tests.conftest import RedisServer, namespace_keys, python_command, subprocess_env


@pytest.fixture
def scheduler(api: Scheduler) -> Scheduler:
    """Every test here runs against both shells, the sync and the asyncio one."""
    return api


PROCS = Path(__file__).with_name("dag_procs.py")
WORKER = "w"


# --------------------------------------------------------------------------- helpers


def spec(task_id: str, deps: Sequence[str] = (), **kw: object) -> TaskSpec:
    return TaskSpec(task_id, "f", deps=deps, **kw)  # type: ignore[arg-type]


def state(s: Scheduler, task_id: str) -> State:
    return s.status(task_id).state


def states(s: Scheduler, ids: Iterable[str]) -> dict[str, State]:
    return {i: state(s, i) for i in ids}


def claim_all(s: Scheduler) -> list[Claim]:
    """Every task that can be claimed now."""
    out: list[Claim] = []
    while claims := s.ready(100, WORKER):
        out.extend(claims)
    return out


def claim_ids(s: Scheduler) -> set[str]:
    claims = claim_all(s)
    ids = [c.task_id for c in claims]
    assert len(ids) == len(set(ids)), f"a task was claimed twice: {ids}"
    return set(ids)


def run(s: Scheduler, task_id: str) -> Claim:
    """Claim exactly ``task_id`` (the only ready task) and report its success."""
    claims = s.ready(100, WORKER)
    assert [c.task_id for c in claims] == [task_id]
    assert s.complete(claims[0]) is Outcome.APPLIED
    return claims[0]


def fail(s: Scheduler, task_id: str) -> Claim:
    """Claim exactly ``task_id`` and report that it raised."""
    claims = s.ready(100, WORKER)
    assert [c.task_id for c in claims] == [task_id]
    assert s.fail(claims[0], "boom") is Outcome.APPLIED
    return claims[0]


def run_to_end(s: Scheduler) -> list[str]:
    """Claim and complete until nothing is ready; returns the ids in the order they ran."""
    order: list[str] = []
    while claims := s.ready(100, WORKER):
        order.extend(c.task_id for c in claims)
        assert set(s.complete_many([(c, None) for c in claims])) == {Outcome.APPLIED}
    return order


def assert_cycle(path: Sequence[str], members: Sequence[str]) -> None:
    """``path`` is the cycle ``members[0] -> members[1] -> ... -> members[0]``, any rotation.

    ``members`` lists each id before the id that depends on it.
    """
    assert path[0] == path[-1], path
    assert len(path) == len(members) + 1, path
    start = members.index(path[0])
    rotated = [*members[start:], *members[:start]]
    assert list(path[:-1]) == rotated, path


# --------------------------------------------------------------------------- shapes


def test_an_empty_graph_returns_no_versions_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    assert scheduler.submit_graph([]) == []
    assert namespace_keys(redis_client, namespace) == {}


def test_independent_branches_do_not_wait_for_each_other(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("b", ["a"]), spec("c"), spec("d", ["c"])])
    assert states(s, "abcd") == {
        "a": State.READY, "b": State.PENDING, "c": State.READY, "d": State.PENDING,
    }  # fmt: skip
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    assert set(claims) == {"a", "c"}
    s.fail(claims["c"], "boom")
    assert states(s, "bd") == {"b": State.PENDING, "d": State.BLOCKED}
    s.complete(claims["a"])
    assert states(s, "bd") == {"b": State.READY, "d": State.BLOCKED}
    assert run_to_end(s) == ["b"]


@pytest.mark.slow
def test_a_10000_task_chain_runs_each_task_only_after_its_predecessor_succeeded(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    n = 10_000
    ids = [f"t{i:05d}" for i in range(n)]
    versions = s.submit_graph([spec(ids[0])] + [spec(ids[i], [ids[i - 1]]) for i in range(1, n)])
    assert len(versions) == n
    counts = s.stats()["counts"]
    assert (counts["ready"], counts["pending"]) == (1, n - 1)
    assert s.status(ids[n // 2]).remaining == 1
    assert s.status(ids[n // 2]).dependents == (ids[n // 2 + 1],)
    done = 0
    while claims := s.ready(64, WORKER):
        # Only the successor of the last task that succeeded can ever be ready.
        assert [c.task_id for c in claims] == [ids[done]]
        assert s.complete_many([(c, None) for c in claims]) == [Outcome.APPLIED]
        done += 1
    assert done == n
    counts = s.stats()["counts"]
    assert counts["succeeded"] == n
    assert counts["pending"] == counts["ready"] == 0


def test_a_diamond_joins_only_after_both_branches_succeeded(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("d", ["b", "c"]), spec("b", ["a"]), spec("c", ["a"]), spec("a")])
    assert s.status("d").remaining == 2
    assert set(s.status("a").dependents) == {"b", "c"}
    run(s, "a")
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    assert set(claims) == {"b", "c"}
    s.complete(claims["b"])
    assert (state(s, "d"), s.status("d").remaining) == (State.PENDING, 1)
    s.complete(claims["c"])
    assert (state(s, "d"), s.status("d").remaining) == (State.READY, 0)
    assert run_to_end(s) == ["d"]


def _spawn_completer(url: str, namespace: str, claims: list[Claim]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        python_command(str(PROCS), "complete", url, namespace),
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps([list(c.token) for c in claims]) + "\n")
    proc.stdin.flush()
    return proc


def test_a_fan_in_whose_two_dependencies_complete_at_once_from_two_processes_runs_once(
    redis_server: RedisServer, scheduler: Scheduler, namespace: str
) -> None:
    s = scheduler
    n = 300
    specs = []
    for i in range(n):
        specs += [
            spec(f"a{i:03d}"),
            spec(f"b{i:03d}"),
            spec(f"j{i:03d}", [f"a{i:03d}", f"b{i:03d}"]),
        ]
    s.submit_graph(specs)
    claims = {c.task_id: c for c in claim_all(s)}
    assert len(claims) == 2 * n
    # Both processes report pair i at the same moment: a_i from one, b_i from the other.
    firsts = [claims[f"a{i:03d}"] for i in range(n)]
    seconds = [claims[f"b{i:03d}"] for i in range(n)]
    procs = [_spawn_completer(redis_server.url, namespace, part) for part in (firsts, seconds)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out) == ["applied"] * n
    stats = s.stats()
    assert stats["counts"]["ready"] == n
    assert stats["counts"]["pending"] == 0
    # One queue entry per fan-in: none was enqueued twice.
    assert stats["queue_entries"] == n
    for i in range(0, n, 37):
        info = s.status(f"j{i:03d}")
        assert (info.state, info.remaining) == (State.READY, 0)
    ran = [c.task_id for c in claim_all(s)]
    assert sorted(ran) == [f"j{i:03d}" for i in range(n)]


# --------------------------------------------------------------------------- failure


def test_a_failure_with_no_attempts_left_blocks_every_pending_descendant_with_its_cause(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([
        spec("a", max_attempts=2, backoff=0),
        spec("b", ["a"]),
        spec("c", ["b"]),
        spec("d", ["c"]),
        spec("x"),
        spec("e", ["b", "x"]),
    ])  # fmt: skip
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    assert set(claims) == {"a", "x"}
    # An attempt left: a failure is a new attempt, not a blocked graph.
    assert s.fail(claims["a"], "first") is Outcome.APPLIED
    assert states(s, "abcde") == {
        "a": State.READY, "b": State.PENDING, "c": State.PENDING, "d": State.PENDING,
        "e": State.PENDING,
    }  # fmt: skip
    fail(s, "a")
    assert states(s, "abcde") == {
        "a": State.FAILED, "b": State.BLOCKED, "c": State.BLOCKED, "d": State.BLOCKED,
        "e": State.BLOCKED,
    }  # fmt: skip
    assert s.status("b").blocked_by == BlockedBy("a", ("a", "b"))
    assert s.status("d").blocked_by == BlockedBy("a", ("a", "b", "c", "d"))
    assert s.status("e").blocked_by == BlockedBy("a", ("a", "b", "e"))
    assert s.status("a").blocked_by is None
    # x is not a descendant of a: it still runs; e keeps its first cause.
    assert s.fail(claims["x"], "later") is Outcome.APPLIED
    assert s.status("e").blocked_by == BlockedBy("a", ("a", "b", "e"))
    assert claim_all(s) == []


def test_cancelling_a_ready_dependency_blocks_its_descendants(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("b", ["a"]), spec("c", ["b"])])
    assert s.cancel("a") is State.CANCELLED
    assert states(s, "abc") == {"a": State.CANCELLED, "b": State.BLOCKED, "c": State.BLOCKED}
    assert s.status("c").blocked_by == BlockedBy("a", ("a", "b", "c"))
    assert claim_all(s) == []


def test_cancelling_a_pending_dependency_blocks_its_descendants_not_its_dependencies(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([spec("x"), spec("a", ["x"]), spec("b", ["a"]), spec("c", ["b"])])
    assert s.cancel("a") is State.CANCELLED
    assert states(s, "xabc") == {
        "x": State.READY, "a": State.CANCELLED, "b": State.BLOCKED, "c": State.BLOCKED,
    }  # fmt: skip
    assert s.status("c").blocked_by == BlockedBy("a", ("a", "b", "c"))
    # The cancelled task's own dependency still runs, and finishing it revives nothing.
    run(s, "x")
    assert states(s, "abc") == {"a": State.CANCELLED, "b": State.BLOCKED, "c": State.BLOCKED}
    assert claim_all(s) == []


def test_lease_exhaustion_with_no_attempts_left_blocks_descendants(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("a", max_attempts=1), spec("b", ["a"]), spec("c", ["b"])])
    [claim] = s.ready(10, WORKER)
    assert s.expire_lease("a") == 1
    info = s.status("a")
    assert (info.state, info.error) == (State.FAILED, "lease expired")
    assert s.status("c").blocked_by == BlockedBy("a", ("a", "b", "c"))
    # The holder's late report changes nothing.
    assert s.complete(claim) is Outcome.STALE
    assert states(s, "bc") == {"b": State.BLOCKED, "c": State.BLOCKED}


def test_cancelling_a_shared_dependency_blocks_only_the_branches_that_need_it(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([
        spec("shared"),
        spec("own"),
        spec("needs", ["shared", "own"]),
        spec("after_needs", ["needs"]),
        spec("mine", ["own"]),
        spec("may", ["own"], optional_deps=["shared"]),
    ])  # fmt: skip
    s.cancel("shared")
    assert states(s, ["needs", "after_needs", "mine", "may"]) == {
        "needs": State.BLOCKED,
        "after_needs": State.BLOCKED,
        "mine": State.PENDING,
        "may": State.PENDING,
    }
    run(s, "own")
    assert claim_ids(s) == {"mine", "may"}
    assert s.status("after_needs").blocked_by == BlockedBy(
        "shared", ("shared", "needs", "after_needs")
    )


# --------------------------------------------------------------------------- cycles


def test_a_cycle_within_one_batch_is_refused_with_its_path_and_nothing_is_written(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit("before", fn="f")
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        s.submit_graph([
            spec("tail", ["b"]),
            spec("a", ["c", "before"]),
            spec("b", ["a"]),
            spec("c", ["b"]),
            spec("free"),
        ])  # fmt: skip
    assert_cycle(info.value.path, ["a", "b", "c"])
    assert namespace_keys(redis_client, namespace) == snapshot
    with pytest.raises(CycleError) as info:
        s.submit_graph([spec("p", ["q"]), spec("q", ["p"])])
    assert_cycle(info.value.path, ["p", "q"])
    assert namespace_keys(redis_client, namespace) == snapshot


def test_a_cycle_closed_by_a_new_version_of_a_pending_task_is_refused(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("x"), spec("a", ["x"]), spec("b", ["a"]), spec("c", ["b"])])
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        s.submit("a", fn="f", deps=["c"])
    assert_cycle(info.value.path, ["a", "b", "c"])
    assert namespace_keys(redis_client, namespace) == snapshot
    # The refused version never replaced anything: the graph still runs in order.
    assert run_to_end(s) == ["x", "a", "b", "c"]


def test_a_cycle_closed_by_a_new_version_of_a_ready_task_is_refused(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("r"), spec("q", ["r"])])
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        s.submit("r", fn="f", optional_deps=["q"])
    assert_cycle(info.value.path, ["r", "q"])
    assert namespace_keys(redis_client, namespace) == snapshot


def test_a_cycle_closed_by_the_arrival_of_an_unknown_dependency_is_refused(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit("b", fn="f", deps=["a"], allow_unknown=True)
    s.submit("c", fn="f", deps=["b"])
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        s.submit("a", fn="f", deps=["c"])
    assert_cycle(info.value.path, ["a", "b", "c"])
    assert namespace_keys(redis_client, namespace) == snapshot
    with pytest.raises(NotFoundError):
        s.status("a")


def test_a_dependency_already_satisfied_does_not_count_towards_a_cycle(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit("a", fn="f")
    run(s, "a")
    s.submit("b", fn="f", deps=["a"])
    assert state(s, "b") is State.READY
    # b no longer waits on a, so a new a may wait on b.
    s.submit("a", fn="f", deps=["b"])
    assert state(s, "a") is State.PENDING
    assert run_to_end(s) == ["b", "a"]


def test_add_deps_closing_a_cycle_is_refused_with_its_path(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("x"), spec("a", ["x"]), spec("b", ["a"]), spec("c", ["b"])])
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(CycleError) as info:
        s.add_deps("a", ["c"])
    assert_cycle(info.value.path, ["a", "b", "c"])
    assert namespace_keys(redis_client, namespace) == snapshot


# --------------------------------------------------------------------------- unknown ids


def test_an_unknown_dependency_in_a_closed_graph_is_refused_and_nothing_is_written(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("known"), spec("waiting", ["known"])])
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(UnknownDependencyError) as info:
        s.submit_graph([spec("a"), spec("b", ["a", "known", "ghost"])])
    assert (info.value.task_id, info.value.dependency) == ("b", "ghost")
    with pytest.raises(UnknownDependencyError) as info:
        s.submit("c", fn="f", optional_deps=["ghost"])
    assert (info.value.task_id, info.value.dependency) == ("c", "ghost")
    with pytest.raises(UnknownDependencyError) as info:
        s.add_deps("waiting", ["ghost"])
    assert (info.value.task_id, info.value.dependency) == ("waiting", "ghost")
    assert namespace_keys(redis_client, namespace) == snapshot
    # An open graph takes the same dependency.
    s.add_deps("waiting", ["ghost"], allow_unknown=True)
    assert s.status("waiting").remaining == 2


def test_an_open_graph_task_waits_until_its_unknown_dependency_arrives_and_succeeds(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit("b", fn="f", deps=["later"], allow_unknown=True)
    info = s.status("b")
    assert (info.state, info.remaining, info.deps) == (State.PENDING, 1, ("later",))
    assert claim_all(s) == []
    s.submit("later", fn="f")
    assert s.status("later").dependents == ("b",)
    assert state(s, "b") is State.PENDING
    run(s, "later")
    assert state(s, "b") is State.READY
    assert run_to_end(s) == ["b"]


def test_an_open_graph_task_is_blocked_when_its_late_dependency_fails(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit("b", fn="f", deps=["later"], allow_unknown=True)
    s.submit("later", fn="f")
    fail(s, "later")
    assert s.status("b").blocked_by == BlockedBy("later", ("later", "b"))


# --------------------------------------------------------------------------- bad input


def test_the_same_id_twice_in_one_batch_is_an_invalid_task_id(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        scheduler.submit_graph([spec("a"), spec("b"), spec("a", ["b"])])
    assert info.value.field == "task_id"
    assert namespace_keys(redis_client, namespace) == {}


@pytest.mark.parametrize(
    ("deps", "optional", "field"),
    [
        (["a", "a"], [], "deps"),
        ([], ["a", "a"], "optional_deps"),
        (["me"], [], "deps"),
        ([], ["me"], "optional_deps"),
    ],
)
def test_duplicate_and_self_dependencies_are_invalid_arguments_naming_the_field(
    scheduler: Scheduler,
    redis_client: redis.Redis,
    namespace: str,
    deps: list[str],
    optional: list[str],
    field: str,
) -> None:
    scheduler.submit("a", fn="f")
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(InvalidArgument) as info:
        scheduler.submit("me", fn="f", deps=deps, optional_deps=optional)
    assert info.value.field == field
    assert namespace_keys(redis_client, namespace) == snapshot


def test_a_dependency_both_required_and_optional_is_an_invalid_argument(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    scheduler.submit("a", fn="f")
    snapshot = namespace_keys(redis_client, namespace)
    with pytest.raises(InvalidArgument) as info:
        scheduler.submit("b", fn="f", deps=["a"], optional_deps=["a"])
    assert info.value.field in ("deps", "optional_deps")
    assert namespace_keys(redis_client, namespace) == snapshot


def test_add_deps_naming_a_dependency_the_task_already_has_is_an_invalid_argument(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("o"), spec("b", ["a"], optional_deps=["o"])])
    snapshot = namespace_keys(redis_client, namespace)
    for dep in ("a", "o", "b"):
        with pytest.raises(InvalidArgument) as info:
            s.add_deps("b", [dep])
        assert info.value.field == "deps"
    with pytest.raises(InvalidArgument) as info:
        s.add_deps("b", [])
    assert info.value.field == "deps"
    assert namespace_keys(redis_client, namespace) == snapshot


def test_resubmitting_a_pending_task_keeps_one_edge_per_dependency(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit("a", fn="f")
    v1 = s.submit("b", fn="f", deps=["a"])
    v2 = s.submit("b", fn="f", deps=["a"])
    assert v2 > v1
    info = s.status("b")
    assert (info.state, info.version, info.remaining) == (State.PENDING, v2, 1)
    assert s.status("a").dependents == ("b",)
    run(s, "a")
    info = s.status("b")
    assert (info.state, info.remaining) == (State.READY, 0)
    assert s.stats()["live_entries"] == 1
    assert run_to_end(s) == ["b"]


# --------------------------------------------------------------------------- optional edges


def test_a_failed_optional_dependency_still_lets_its_dependent_run(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("req"), spec("opt"), spec("c", ["req"], optional_deps=["opt"])])
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    s.complete(claims["req"])
    # The optional dependency is still running: c waits for it to end, whatever the end.
    info = s.status("c")
    assert (info.state, info.remaining, info.optional_remaining) == (State.PENDING, 0, 1)
    assert info.optional_deps == ("opt",)
    s.fail(claims["opt"], "boom")
    info = s.status("c")
    assert (info.state, info.optional_remaining, info.blocked_by) == (State.READY, 0, None)
    assert run_to_end(s) == ["c"]


def test_a_cancelled_optional_dependency_still_lets_its_dependent_run(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph(
        [spec("x"), spec("opt", ["x"]), spec("req"), spec("c", ["req"], optional_deps=["opt"])]
    )
    s.cancel("opt")
    # opt ended (cancelled) before req: c still waits for its required dependency.
    assert (state(s, "c"), s.status("c").optional_remaining) == (State.PENDING, 0)
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    assert set(claims) == {"x", "req"}
    s.complete(claims["req"])
    assert state(s, "c") is State.READY


def test_a_blocked_optional_dependency_counts_as_ended(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("root"), spec("opt", ["root"]), spec("c", optional_deps=["opt"])])
    assert state(s, "c") is State.PENDING
    fail(s, "root")
    assert state(s, "opt") is State.BLOCKED
    info = s.status("c")
    assert (info.state, info.blocked_by) == (State.READY, None)


# --------------------------------------------------------------------------- retry


def _failed_chain(s: Scheduler) -> None:
    s.submit_graph([spec("a"), spec("b", ["a"]), spec("c", ["b"]), spec("other")])
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    s.fail(claims["a"], "boom")
    s.complete(claims["other"])
    assert states(s, "abc") == {"a": State.FAILED, "b": State.BLOCKED, "c": State.BLOCKED}


def test_retry_with_cascade_returns_the_blocked_descendants_to_pending(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    _failed_chain(s)
    before = {i: s.status(i).version for i in "abc"}
    version = s.retry("a")
    assert version > before["a"]
    after = {i: s.status(i) for i in "abc"}
    assert after["a"].version == version
    assert (after["a"].state, after["a"].attempt, after["a"].error) == (State.READY, 0, None)
    for i in "bc":
        assert after[i].version > before[i]
        assert (after[i].state, after[i].blocked_by) == (State.PENDING, None)
    assert run_to_end(s) == ["a", "b", "c"]


def test_retry_without_cascade_leaves_the_descendants_blocked(scheduler: Scheduler) -> None:
    s = scheduler
    _failed_chain(s)
    before = {i: s.status(i).version for i in "bc"}
    s.retry("a", cascade=False)
    assert state(s, "a") is State.READY
    assert {i: s.status(i).version for i in "bc"} == before
    assert run_to_end(s) == ["a"]
    assert states(s, "bc") == {"b": State.BLOCKED, "c": State.BLOCKED}
    assert s.status("c").blocked_by == BlockedBy("a", ("a", "b", "c"))


def test_retry_of_a_blocked_task_rechecks_its_dependencies(scheduler: Scheduler) -> None:
    s = scheduler
    _failed_chain(s)
    # Its dependency still failed: the new version is blocked again.
    s.retry("b", cascade=False)
    assert s.status("b").blocked_by == BlockedBy("a", ("a", "b"))
    s.schedule("a", fn="f")
    run(s, "a")
    s.retry("b", cascade=False)
    assert state(s, "b") is State.READY


def test_retry_of_a_blocked_task_brings_back_what_was_blocked_through_it_only(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit("x", fn="f")
    s.submit("a", fn="f", deps=["x"])
    s.submit("b", fn="f", deps=["a"])
    s.submit("c", fn="f", deps=["x"])
    fail(s, "x")
    assert states(s, "abc") == {"a": State.BLOCKED, "b": State.BLOCKED, "c": State.BLOCKED}
    # The root cause is fixed by a new version, not by a retry: nothing comes back by itself.
    s.schedule("x", fn="f")
    run(s, "x")
    assert states(s, "abc") == {"a": State.BLOCKED, "b": State.BLOCKED, "c": State.BLOCKED}
    # Retrying a brings back b, blocked through a; c was blocked by x directly and stays.
    s.retry("a")
    assert states(s, "abc") == {"a": State.READY, "b": State.PENDING, "c": State.BLOCKED}
    assert s.status("c").blocked_by == BlockedBy("x", ("x", "c"))
    assert run_to_end(s) == ["a", "b"]


def test_a_retry_cascade_revives_what_the_task_blocked_even_through_a_since_replaced_task(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit("d", fn="f")
    s.submit("b", fn="f", deps=["d"])
    s.submit("a", fn="f", deps=["b"])
    s.cancel("d")
    assert s.status("a").blocked_by == BlockedBy("d", ("d", "b", "a"))
    # b's new version has no dependencies: a's recorded root is still d, but its chain of
    # block causes now stops at b, which is no longer blocked.
    s.schedule("b", fn="f")
    assert state(s, "b") is State.READY
    assert s.status("a").blocked_by == BlockedBy("d", ("b", "a"))
    before = s.status("a").version
    s.retry("d")
    info = s.status("a")
    assert info.version > before
    assert (info.state, info.remaining, info.blocked_by) == (State.PENDING, 1, None)
    order = run_to_end(s)
    assert sorted(order[:2]) == ["b", "d"] and order[2:] == ["a"]


def test_a_retry_cascade_never_leaves_tasks_waiting_on_each_other(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit("root", fn="f")
    fail(s, "root")
    # Each edge was made while its dependency had ended, so no cycle was awaited then.
    s.submit("c", fn="f", deps=["a", "root"], allow_unknown=True)
    s.submit("a", fn="f", deps=["c"])
    s.submit("free", fn="f", deps=["root"])
    assert states(s, ["a", "c", "free"]) == {
        "a": State.BLOCKED, "c": State.BLOCKED, "free": State.BLOCKED,
    }  # fmt: skip
    s.retry("root")
    assert state(s, "free") is State.PENDING
    # Reviving both a and c would make them wait on each other for ever.
    assert State.PENDING not in states(s, "ac").values()
    assert run_to_end(s) == ["root", "free"]
    assert states(s, "ac") == {"a": State.BLOCKED, "c": State.BLOCKED}
    for task_id in "ac":
        assert s.status(task_id).blocked_by.root == "root"  # type: ignore[union-attr]


def test_retry_of_a_task_that_has_not_ended_or_succeeded_is_a_conflict(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([spec("done"), spec("running")])
    claims = {c.task_id: c for c in s.ready(10, WORKER)}
    s.complete(claims["done"])
    s.submit_graph([spec("ready"), spec("pending", ["ready"])])
    assert states(s, ["done", "running", "ready", "pending"]) == {
        "done": State.SUCCEEDED, "running": State.RUNNING, "ready": State.READY,
        "pending": State.PENDING,
    }  # fmt: skip
    for task_id in ("done", "ready", "pending", "running"):
        with pytest.raises(ConflictError):
            s.retry(task_id)
    with pytest.raises(NotFoundError):
        s.retry("nobody")


# --------------------------------------------------------------------------- changing deps


def test_replacing_a_pending_task_forgets_its_old_dependencies(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("old"), spec("new"), spec("c", ["old"])])
    s.submit("c", fn="f", deps=["new"])
    assert s.status("old").dependents == ()
    assert s.status("new").dependents == ("c",)
    claims = {cl.task_id: cl for cl in s.ready(10, WORKER)}
    s.complete(claims["old"])
    info = s.status("c")
    assert (info.state, info.remaining, info.deps) == (State.PENDING, 1, ("new",))
    s.complete(claims["new"])
    assert state(s, "c") is State.READY


def test_add_deps_on_a_pending_task_makes_it_wait_for_them(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("b"), spec("c", ["a"])])
    s.add_deps("c", ["b"])
    info = s.status("c")
    assert (info.state, info.remaining, info.deps) == (State.PENDING, 2, ("a", "b"))
    assert s.status("b").dependents == ("c",)
    claims = {cl.task_id: cl for cl in s.ready(10, WORKER)}
    s.complete(claims["a"])
    assert state(s, "c") is State.PENDING
    s.complete(claims["b"])
    assert state(s, "c") is State.READY


def test_add_deps_naming_a_failed_task_blocks_the_pending_task(scheduler: Scheduler) -> None:
    s = scheduler
    s.submit_graph([spec("bad"), spec("x", max_attempts=1)])
    claims = {cl.task_id: cl for cl in s.ready(10, WORKER)}
    s.fail(claims["bad"], "boom")
    s.submit_graph([spec("c", ["x"]), spec("d", ["c"])])
    s.add_deps("c", ["bad"])
    assert s.status("c").blocked_by == BlockedBy("bad", ("bad", "c"))
    assert s.status("d").blocked_by == BlockedBy("bad", ("bad", "c", "d"))


def test_add_deps_on_a_ready_or_running_task_is_a_conflict(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("dep")])
    [claim] = [c for c in s.ready(10, WORKER) if c.task_id == "a"]
    s.submit("r", fn="f")
    snapshot = namespace_keys(redis_client, namespace)
    for task_id in ("r", "a"):
        with pytest.raises(ConflictError):
            s.add_deps(task_id, ["dep"])
    assert namespace_keys(redis_client, namespace) == snapshot
    with pytest.raises(NotFoundError):
        s.add_deps("nobody", ["dep"])
    assert claim.task_id == "a"


# --------------------------------------------------------------------------- late reports


def test_a_stale_or_repeated_completion_never_releases_a_dependent_twice(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([spec("a", max_attempts=2, backoff=0), spec("b", ["a"])])
    [first] = s.ready(10, WORKER)
    assert s.expire_lease("a") == 1
    assert s.complete(first) is Outcome.STALE
    assert (state(s, "b"), s.status("b").remaining) == (State.PENDING, 1)
    [second] = s.ready(10, WORKER)
    assert second.attempt == 2
    assert s.complete(second) is Outcome.APPLIED
    for late in (second, first, second):
        assert s.complete(late) in (Outcome.DUPLICATE, Outcome.STALE)
        assert s.fail(late, "late") in (Outcome.DUPLICATE, Outcome.STALE)
    assert s.complete(second) is Outcome.DUPLICATE
    info = s.status("b")
    assert (info.state, info.remaining) == (State.READY, 0)
    assert s.stats()["live_entries"] == 1
    assert run_to_end(s) == ["b"]
    assert claim_all(s) == []


def test_a_completion_from_an_old_version_does_not_touch_the_new_graph(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.submit_graph([spec("a"), spec("b", ["a"])])
    [old] = s.ready(10, WORKER)
    s.expire_lease("a")
    assert state(s, "b") is State.BLOCKED
    s.retry("a")
    assert state(s, "b") is State.PENDING
    assert s.complete(old) is Outcome.STALE
    assert (state(s, "b"), s.status("b").remaining) == (State.PENDING, 1)
    run(s, "a")
    assert s.complete(old) is Outcome.STALE
    info = s.status("b")
    assert (info.state, info.remaining) == (State.READY, 0)
    assert run_to_end(s) == ["b"]


# --------------------------------------------------------------------------- capacity


def test_with_capacity_zero_nothing_of_the_graph_runs_until_capacity_is_raised(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    s.set_max_running(0)
    s.submit_graph([spec("a"), spec("b", ["a"]), spec("c", ["a"])])
    assert s.ready(10, WORKER) == []
    assert s.next(WORKER) == Wait(WaitReason.CAPACITY, None)
    assert states(s, "abc") == {"a": State.READY, "b": State.PENDING, "c": State.PENDING}
    s.set_max_running(1)
    run(s, "a")
    claims = s.ready(10, WORKER)
    assert len(claims) == 1
    assert s.ready(10, WORKER) == []
    s.complete(claims[0])
    assert len(run_to_end(s)) == 1
    assert s.stats()["counts"]["succeeded"] == 3


# --------------------------------------------------------------------------- big graphs

FAN = 20_000


def _fan_out(s: Scheduler) -> None:
    s.submit("root", fn="f")
    for start in range(0, FAN, 2000):
        s.submit_graph([spec(f"d{i:05d}", ["root"]) for i in range(start, start + 2000)])
    counts = s.stats()["counts"]
    assert (counts["ready"], counts["pending"]) == (1, FAN)


@pytest.mark.slow
def test_completing_a_task_with_20000_dependents_leaves_them_all_ready(
    scheduler: Scheduler,
) -> None:
    s = scheduler
    _fan_out(s)
    run(s, "root")
    assert s.settle() == 0
    stats = s.stats()
    assert stats["counts"]["ready"] == FAN
    assert stats["counts"]["pending"] == 0
    assert stats["counts"]["succeeded"] == 1
    assert stats["live_entries"] == stats["queue_entries"] == FAN
    assert s.status(f"d{FAN - 1:05d}").remaining == 0


@pytest.mark.slow
def test_failing_a_task_with_20000_dependents_blocks_them_in_bounded_chunks(
    sync_scheduler: Scheduler,
) -> None:
    s = sync_scheduler
    _fan_out(s)
    [claim] = s.ready(10, WORKER)
    # The script alone, as an interrupted caller would leave it: one budget settled.
    left, [outcome] = s._drive(once(calls.fail_call(s.keys, [(claim, "boom")])))
    assert outcome == b"applied"
    assert int(left) >= 1

    def blocked() -> int:
        counts = s.stats()["counts"]
        assert counts["blocked"] + counts["pending"] == FAN
        return int(counts["blocked"])

    done = blocked()
    assert 0 < done < FAN
    for _ in range(3):
        left, [used] = s._drive(once(calls.propagate_call(s.keys, 10)))
        assert 1 <= int(used) <= 10
        assert int(left) >= 1
        now = blocked()
        assert done < now <= done + 10
        done = now
    # Still telling its dependents: a new version is refused by the script itself ...
    with pytest.raises(BusyError):
        s._drive(once(calls.schedule_call(s.keys, [spec("root")], s.max_payload_bytes)))
    with pytest.raises(BusyError):
        s._drive(once(calls.retry_call(s.keys, "root", True)))
    assert s.status("root").state is State.FAILED
    assert blocked() == done
    # ... while the client settles first, then writes it.
    version = s.schedule("root", fn="f")
    assert s.status("root").version == version
    assert s.settle() == 0
    stats = s.stats()
    assert stats["counts"]["blocked"] == FAN
    assert stats["counts"]["pending"] == 0
    assert stats["counts"]["ready"] == 1
    last = s.status(f"d{FAN - 1:05d}")
    assert last.blocked_by == BlockedBy("root", ("root", last.task_id))
