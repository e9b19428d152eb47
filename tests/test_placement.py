"""A task with more dependencies than one part, placed in parts (§7) against a real
redis-server: no script call names more than ``PLACE_PART`` of them, and no claim sees
the task before its last part, whatever happens between the parts.

The placement is driven call by call, so a test can act between two parts.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from distsched import Outcome, Scheduler, State, TaskSpec, model, views
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.model import Reason
from distsched.ops import protocol
from distsched.ops.namespace import Ops
from distsched.wire.calls import PLACE_PART, Call, add_deps_call, schedule_call

WORKER = "w"
# Two full parts and a short one after the first call.
WIDE = 3 * PLACE_PART + 7


def deps_of(call: Call) -> int:
    """The dependency ids one schedule or add_deps call names."""
    if call.script == "add_deps":
        return len(call.args) - 3
    assert call.script == "schedule"
    fields = str(call.args[3]).split(" ")
    return int(fields[6]) + int(fields[7])


def place(
    s: Scheduler,
    spec: TaskSpec,
    between: Callable[[int], None] = lambda part: None,
    stop_after: int | None = None,
) -> tuple[int | None, list[Call]]:
    """Schedule ``spec`` alone, calling ``between(n)`` after the n-th call that places
    it; ``stop_after`` drops the submission after that call, as a crashed client would."""
    versions, calls = place_batch(s, [spec], between, stop_after)
    return (versions[0] if versions else None), calls


def place_batch(
    s: Scheduler,
    specs: list[TaskSpec],
    between: Callable[[int], None] = lambda part: None,
    stop_after: int | None = None,
) -> tuple[list[int], list[Call]]:
    """``place`` for a batch: the versions (none when stopped) and the calls sent."""
    op = s._ops.admit_many(specs)
    calls: list[Call] = []
    step = protocol.advance(op, None)
    while not isinstance(step, protocol.Done):
        reply = s._send(step)
        if isinstance(step, Call) and step.script in ("schedule", "add_deps"):
            calls.append(step)
            between(len(calls))
            if stop_after == len(calls):
                op.close()
                return [], calls
        step = protocol.advance(op, reply)
    admitted: list[model.Admitted] = step.value
    return [a.version for a in admitted], calls


def ready_deps(s: Scheduler, n: int) -> list[str]:
    ids = [f"d{i}" for i in range(n)]
    for start in range(0, n, PLACE_PART):
        s.schedule_many([TaskSpec(i, "f") for i in ids[start : start + PLACE_PART]])
    return ids


def complete_ready(s: Scheduler) -> list[str]:
    """Claim and complete every ready task; the ids claimed."""
    done: list[str] = []
    while claims := s.ready(PLACE_PART, WORKER):
        done += [c.task_id for c in claims]
        assert set(s.complete_many([(c, None) for c in claims])) == {Outcome.APPLIED}
    return done


def test_no_call_placing_a_task_names_more_than_one_part_of_its_dependencies(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    version, calls = place(scheduler, TaskSpec("sink", "f", deps=ids))
    assert [c.script for c in calls] == ["schedule", "add_deps", "add_deps", "add_deps"]
    assert all(deps_of(c) <= PLACE_PART for c in calls)
    assert sum(deps_of(c) for c in calls) == WIDE
    info = scheduler.status("sink")
    assert (info.version, info.state, info.placing) == (version, State.PENDING, False)
    assert info.deps == tuple(ids)
    assert info.remaining == WIDE


def test_the_task_is_never_claimable_before_its_last_part_though_its_placed_deps_succeeded(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    claimed: list[list[str]] = []

    def between(part: int) -> None:
        # Every dependency (placed or not yet) succeeds before the next part.
        claimed.append(complete_ready(scheduler))

    place(scheduler, TaskSpec("sink", "f", deps=ids), between)
    assert sorted(claimed[0]) == sorted(ids)
    assert all("sink" not in got for got in claimed[:-1])
    # The last part lifted the hold with every dependency already succeeded.
    assert "sink" in claimed[-1]


def test_the_task_waits_for_dependencies_of_its_last_part_after_the_hold_is_lifted(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    place(scheduler, TaskSpec("sink", "f", deps=ids))
    order = complete_ready(scheduler)
    assert sorted(order[:-1]) == sorted(ids)
    assert order[-1] == "sink"


def test_a_dependency_failing_between_parts_blocks_the_task_which_never_runs(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)

    def between(part: int) -> None:
        if part == 1:
            claims = scheduler.ready(1, WORKER)
            assert claims[0].task_id == ids[0]
            assert scheduler.fail(claims[0], "boom") is Outcome.APPLIED

    _, calls = place(scheduler, TaskSpec("sink", "f", deps=ids), between)
    # The part after the failure finds the task blocked: nothing more is sent.
    assert len(calls) == 2
    info = scheduler.status("sink")
    assert info.state is State.BLOCKED
    assert info.blocked_by is not None and info.blocked_by.root == ids[0]
    # Retrying the failed dependency gives the task a new version, still held: only
    # part of its dependencies were placed, so it must not run.
    scheduler.retry(ids[0])
    assert scheduler.status("sink").placing
    assert "sink" not in complete_ready(scheduler)
    assert scheduler.status("sink").state is State.PENDING


def test_cancelling_the_task_between_parts_stops_the_placement_and_it_never_runs(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)

    def between(part: int) -> None:
        if part == 2:
            assert scheduler.cancel("sink") is State.CANCELLED

    _, calls = place(scheduler, TaskSpec("sink", "f", deps=ids), between)
    assert len(calls) == 3
    assert "sink" not in complete_ready(scheduler)
    assert scheduler.status("sink").state is State.CANCELLED


def test_a_submission_stopped_part_way_leaves_the_task_held_and_scheduling_it_again_completes_it(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    spec = TaskSpec("sink", "f", deps=ids)
    place(scheduler, spec, stop_after=2)
    info = scheduler.status("sink")
    assert (info.state, info.placing, len(info.deps)) == (State.PENDING, True, 2 * PLACE_PART)
    assert scheduler.explain("sink").reasons[0] is Reason.PLACING
    # Its placed dependencies all succeed: it stays held.
    assert "sink" not in complete_ready(scheduler)
    assert scheduler.status("sink").state is State.PENDING
    scheduler.submit_graph([spec])
    info = scheduler.status("sink")
    assert (info.placing, info.deps) == (False, tuple(ids))
    assert complete_ready(scheduler) == ["sink"]


def test_a_batch_writes_every_task_in_one_call_and_places_the_wide_one_after_it(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    batch = [TaskSpec("last", "f"), TaskSpec("sink", "f", deps=[*ids, "last"])]
    claimed: list[list[str]] = []
    versions, calls = place_batch(
        scheduler, batch, lambda part: claimed.append(complete_ready(scheduler))
    )
    assert [c.script for c in calls] == ["schedule", "add_deps", "add_deps", "add_deps"]
    assert all(deps_of(c) <= PLACE_PART for c in calls)
    assert versions[1] == scheduler.status("sink").version
    assert "last" in claimed[0]
    assert all("sink" not in got for got in claimed[:-1])
    assert claimed[-1] == ["sink"]


@pytest.mark.parametrize("hold", ["0", "2"])
def test_a_hold_option_other_than_1_is_refused_naming_it_and_nothing_is_written(
    scheduler: Scheduler, hold: str
) -> None:
    call = schedule_call(scheduler.keys, [TaskSpec("t", "f")], 1 << 20)
    call.args[3] = f"{call.args[3]} hold={hold}"
    with pytest.raises(InvalidArgument, match="hold"):
        scheduler._drive(scheduler._ops.call(Ops.run, call))
    with pytest.raises(NotFoundError):
        scheduler.status("t")


def test_a_part_naming_another_version_than_the_held_one_is_refused(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    place(scheduler, TaskSpec("sink", "f", deps=ids), stop_after=1)
    held = scheduler.status("sink").version
    stale = add_deps_call(scheduler.keys, "sink", ids[-1:], False, (held - 1, True))
    with pytest.raises(ConflictError, match="another version"):
        scheduler._drive(scheduler._ops.call(Ops.run, stale))
    assert scheduler.status("sink").placing


def test_status_and_the_graph_view_show_a_held_task_as_being_placed(
    scheduler: Scheduler,
) -> None:
    ids = ready_deps(scheduler, WIDE)
    place(scheduler, TaskSpec("sink", "f", deps=ids), stop_after=1)
    info = scheduler.status("sink")
    assert (info.placing, info.remaining, len(info.deps)) == (True, PLACE_PART, PLACE_PART)
    assert views.describe(info) == "pending (held while its dependencies are placed in parts)"


def test_a_task_of_a_striped_namespace_is_placed_in_parts_on_its_stripe(
    redis_client: redis.Redis, namespace: str
) -> None:
    with Scheduler(redis_client, namespace=namespace, stripes=3) as s:
        ids = [f"{{g}}d{i}" for i in range(WIDE)]
        for start in range(0, WIDE, PLACE_PART):
            s.submit_graph([TaskSpec(i, "f") for i in ids[start : start + PLACE_PART]])
        _, calls = place(s, TaskSpec("{g}sink", "f", deps=ids))
        assert len(calls) == 4
        assert all(deps_of(c) <= PLACE_PART for c in calls)
        assert s.status("{g}sink").deps == tuple(ids)
        order = complete_ready(s)
        assert sorted(order[:-1]) == sorted(ids)
        assert order[-1] == "{g}sink"
