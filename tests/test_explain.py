"""``Scheduler.explain`` and ``distsched why``: why a task is not running, from a
bounded number of reads, against a real redis-server, through both shells."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
import redis

from distsched import Scheduler, State, TaskSpec, model
from distsched.errors import InvalidArgument, NotFoundError
from distsched.model import BlockedBy, DepState, Reason
from distsched.ops import protocol
from distsched.ops.explain import EXPLAIN_LIMIT, SERVED_LIVE_S
from distsched.ops.namespace import Ops
from distsched.worker.link import WorkerLink
from distsched.worker.served import ServedFunctions
from tests.conftest import RedisServer
from tests.test_cli import assert_one_line_error, invoke


def announce(scheduler: Scheduler, *functions: str) -> None:
    """A live worker's announcement of ``functions``, as workers make it."""
    ServedFunctions(WorkerLink(scheduler), functions, 0.0).announce()


def claim_one(api: Scheduler, worker_id: str = "w-1") -> model.Claim:
    claims, _ = api.claim(1, worker_id)
    assert len(claims) == 1
    return claims[0]


# --------------------------------------------------------------------------- queued


def test_a_task_whose_run_at_is_ahead_is_not_due_and_says_when_by_the_server_clock(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    api.schedule("later", fn="f", delay=60, max_attempts=3)
    exp = api.explain("later")
    assert exp.reasons == (Reason.NOT_DUE,)
    assert exp.reason is Reason.NOT_DUE
    assert exp.state is State.READY
    assert exp.due_at == api.status("later").run_at
    assert exp.due_at is not None and 59.0 < exp.due_at - exp.server_time <= 60.0
    assert (exp.attempt, exp.max_attempts, exp.attempts_left) == (0, 3, 3)


def test_a_retry_waiting_out_its_backoff_is_not_due_and_counts_its_attempts_left(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    api.schedule("flaky", fn="f", max_attempts=3, backoff=30)
    api.fail(claim_one(api), "boom")
    exp = api.explain("flaky")
    assert exp.reasons == (Reason.NOT_DUE,)
    assert (exp.attempt, exp.attempts_left) == (1, 2)
    assert exp.due_at is not None and 29.0 < exp.due_at - exp.server_time <= 30.0


def test_a_due_task_alone_is_next_in_line(api: Scheduler, scheduler: Scheduler) -> None:
    announce(scheduler, "f")
    api.schedule("now", fn="f")
    exp = api.explain("now")
    assert exp.reasons == (Reason.NEXT,)
    assert exp.ahead == 0
    assert exp.due_at is not None and exp.due_at <= exp.server_time


def test_a_due_task_counts_the_queue_entries_ahead_of_it_stale_ones_included(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    past = api.server_time() - 10
    for task_id, priority in (("a", 3), ("b", 2), ("c", 1)):
        api.schedule(task_id, fn="f", run_at=past, priority=priority)
    exp = api.explain("c")
    assert exp.reasons == (Reason.BEHIND,)
    assert exp.ahead == 2
    # A replaced task leaves its old entry in the queue until it reaches the head.
    api.schedule("a", fn="f", run_at=past, priority=3)
    assert api.explain("c").ahead == 3
    assert api.explain("a").ahead == 1
    api.cancel("b")
    assert api.explain("c").ahead == 3
    assert api.stats()["queue_entries"] == 4


def test_a_due_task_waits_while_the_namespace_is_at_max_running(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    api.set_max_running(1)
    api.schedule("first", fn="f", priority=1)
    api.schedule("second", fn="f")
    claim_one(api)
    exp = api.explain("second")
    assert exp.reasons == (Reason.CAPACITY,)
    assert (exp.running, exp.max_running, exp.ahead) == (1, 1, 0)
    api.set_max_running(None)
    exp = api.explain("second")
    assert exp.reasons == (Reason.NEXT,)
    assert exp.max_running is None


def test_a_task_whose_function_no_live_worker_announced_is_unserved(
    api: Scheduler, scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    api.schedule("job", fn="f")
    announce(scheduler, "g")  # another function does not count
    exp = api.explain("job")
    assert exp.reasons == (Reason.UNSERVED, Reason.NEXT)
    assert exp.served_at is None
    # An announcement older than the live window is a worker gone.
    old_ms = int((api.server_time() - SERVED_LIVE_S - 5) * 1000)
    redis_client.hset(api.keys.served, "f", old_ms)
    exp = api.explain("job")
    assert exp.reasons == (Reason.UNSERVED, Reason.NEXT)
    assert exp.served_at == old_ms / 1000
    announce(scheduler, "f")
    exp = api.explain("job")
    assert exp.reasons == (Reason.NEXT,)
    assert exp.served_at is not None and abs(exp.served_at - exp.server_time) < 5


# --------------------------------------------------------------------------- dependencies


def test_a_pending_task_lists_its_dependencies_with_their_states(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    api.schedule("running", fn="f")
    claim_one(api)
    api.schedule("later", fn="f", delay=60)
    api.submit(
        "t", fn="f", deps=["later", "missing"], optional_deps=["running"], allow_unknown=True
    )
    exp = api.explain("t")
    assert exp.reasons == (Reason.WAITING_ON_DEPS,)
    assert (exp.remaining, exp.optional_remaining) == (2, 1)
    assert exp.deps == (
        DepState("later", State.READY),
        DepState("missing", None),
        DepState("running", State.RUNNING, optional=True),
    )
    assert exp.deps_not_shown == 0
    assert exp.due_at is None and exp.ahead is None


def test_a_pending_task_shows_the_states_of_at_most_fifty_dependencies_and_counts_the_rest(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    deps = [f"dep-{i:03d}" for i in range(EXPLAIN_LIMIT + 10)]
    api.schedule_many([TaskSpec(d, "f", delay=60) for d in deps])
    api.submit("sink", fn="f", deps=deps)
    exp = api.explain("sink")
    assert EXPLAIN_LIMIT == 50
    assert [d.task_id for d in exp.deps] == deps[:EXPLAIN_LIMIT]
    assert {d.state for d in exp.deps} == {State.READY}
    assert exp.deps_not_shown == 10
    assert exp.remaining == EXPLAIN_LIMIT + 10


def test_a_blocked_task_names_its_root_cause_the_root_state_and_the_path(
    api: Scheduler, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    api.schedule("root", fn="f")
    api.submit("mid", fn="f", deps=["root"])
    api.submit("leaf", fn="f", deps=["mid"])
    api.fail(claim_one(api), "boom")
    exp = api.explain("leaf")
    assert exp.reasons == (Reason.BLOCKED,)
    assert exp.blocked_by == BlockedBy(root="root", path=("root", "mid", "leaf"))
    assert exp.root_state is State.FAILED
    assert exp.deps == ()


# --------------------------------------------------------------------------- running


def test_a_running_task_names_its_lease_holder_and_deadline_and_a_cancel_request(
    api: Scheduler,
) -> None:
    api.schedule("job", fn="f", max_attempts=2)
    claim_one(api, "worker-7")
    exp = api.explain("job")
    assert exp.reasons == (Reason.RUNNING,)
    assert exp.worker == "worker-7"
    assert exp.lease_deadline is not None
    assert 4.0 < exp.lease_deadline - exp.server_time <= 5.0  # the api's 5 s lease
    assert (exp.attempt, exp.attempts_left) == (1, 1)
    assert api.cancel("job") is State.RUNNING
    exp = api.explain("job")
    assert exp.reasons == (Reason.RUNNING, Reason.CANCEL_REQUESTED)
    assert exp.cancel_requested


def test_a_running_task_whose_lease_passed_says_the_lease_expired(
    api: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    short = Scheduler(redis_client, namespace=namespace, lease_s=0.05)
    api.schedule("job", fn="f")
    short.claim(1, "gone")
    time.sleep(0.2)
    exp = api.explain("job")
    assert exp.reasons == (Reason.RUNNING, Reason.LEASE_EXPIRED)
    assert exp.lease_deadline is not None and exp.lease_deadline < exp.server_time
    api.reap()
    assert api.explain("job").reasons == (Reason.FAILED,)


# --------------------------------------------------------------------------- terminal


def test_a_failed_task_gives_the_first_line_of_its_error_and_the_attempts_spent(
    api: Scheduler,
) -> None:
    api.schedule("job", fn="f", max_attempts=2, backoff=0)
    api.fail(claim_one(api), "first")
    api.fail(claim_one(api), "ValueError: boom\nTraceback (most recent call last):\n  ...")
    exp = api.explain("job")
    assert exp.reasons == (Reason.FAILED,)
    assert exp.error == "ValueError: boom"
    assert (exp.attempt, exp.max_attempts, exp.attempts_left) == (2, 2, 0)


def test_succeeded_and_cancelled_tasks_say_so(api: Scheduler) -> None:
    api.schedule("done", fn="f")
    api.complete(claim_one(api), "result")
    api.schedule("dropped", fn="f", delay=60)
    api.cancel("dropped")
    assert api.explain("done").reasons == (Reason.SUCCEEDED,)
    assert api.explain("done").error is None
    assert api.explain("dropped").reasons == (Reason.CANCELLED,)


def test_an_unknown_id_is_not_found_and_a_bad_id_names_the_field(api: Scheduler) -> None:
    with pytest.raises(NotFoundError):
        api.explain("nothing")
    with pytest.raises(InvalidArgument) as bad:
        api.explain("")
    assert bad.value.field == "task_id"


# --------------------------------------------------------------------------- bounded reads


def recorded(scheduler: Scheduler, op: protocol.Op[Any]) -> tuple[Any, list[tuple[Any, ...]]]:
    """Drive ``op`` over the scheduler's connection; also return every command it sent."""
    commands: list[tuple[Any, ...]] = []
    step = protocol.advance(op, None)
    while not isinstance(step, protocol.Done):
        assert isinstance(step, protocol.Commands), step  # reads only, no script
        commands.extend(step.commands)
        step = protocol.advance(op, scheduler._send(step))
    return step.value, commands


BOUNDED = {"HGET", "HMGET", "ZSCORE", "ZRANK", "EVAL"}


def test_explain_sends_a_bounded_number_of_point_reads_whatever_the_namespace_holds(
    scheduler: Scheduler,
) -> None:
    announce(scheduler, "f")
    many = [TaskSpec(f"dep-{i}", "f", delay=60) for i in range(2000)]
    scheduler.schedule_many(many)
    scheduler.submit("sink", fn="f", deps=[s.task_id for s in many])
    scheduler.schedule("queued", fn="f")
    for task_id in ("sink", "queued", "dep-1999"):
        _, commands = recorded(scheduler, scheduler._ops.call(Ops.explain, task_id))
        assert {c[0] for c in commands} <= BOUNDED, commands
        # Twelve, the task's entries of the paused and progress hashes, and its two
        # workflow entries (parents, joins) in the same round; a windowed child reads its
        # parent's window too (tests/test_spawn.py).
        assert len(commands) <= 16
        # One HMGET of the shown dependencies at most: its key and EXPLAIN_LIMIT ids.
        assert max(len(c) for c in commands) <= 2 + EXPLAIN_LIMIT


def test_the_path_of_a_blocked_task_is_read_for_at_most_fifty_hops(
    scheduler: Scheduler,
) -> None:
    chain = [f"n{i}" for i in range(EXPLAIN_LIMIT + 20)]
    scheduler.schedule(chain[0], fn="f")
    scheduler.submit_graph([TaskSpec(c, "f", deps=[p]) for p, c in itertools.pairwise(chain)])
    scheduler.fail(claim_one(scheduler), "boom")
    exp, commands = recorded(scheduler, scheduler._ops.call(Ops.explain, chain[-1]))
    assert exp.reasons == (Reason.BLOCKED,)
    assert exp.blocked_by is not None and exp.blocked_by.root == chain[0]
    assert exp.blocked_by.path[-1] == chain[-1]
    assert list(exp.blocked_by.path) == chain[-len(exp.blocked_by.path) :]
    assert len(exp.blocked_by.path) <= EXPLAIN_LIMIT + 2
    assert len(commands) <= EXPLAIN_LIMIT + 16
    # A short chain is read whole.
    exp = scheduler.explain(chain[5])
    assert exp.blocked_by == BlockedBy(root=chain[0], path=tuple(chain[:6]))


# --------------------------------------------------------------------------- CLI


def test_why_prints_plain_sentences_for_each_kind_of_wait(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    announce(scheduler, "f")
    scheduler.schedule("later", fn="f", delay=3600)
    scheduler.submit("child", fn="f", deps=["later", "ghost"], allow_unknown=True)
    scheduler.schedule("busy", fn="f", delay=-1)
    claim_one(scheduler, "worker-7")

    later = invoke(redis_server, namespace, "why", "later")
    assert later.exit_code == 0, later.stderr
    lines = later.stdout.splitlines()
    assert lines[0] == "later (version 1, fn f) is ready, not running:"
    assert lines[1] == "- it is not due yet: due in 59 min (server clock)"
    assert lines[-1] == "0 of 1 attempts spent, 1 left."

    child = invoke(redis_server, namespace, "why", "child").stdout.splitlines()
    assert child[1] == "- it waits on 2 required dependencies:"
    assert child[2:4] == ["    later: ready", "    ghost: no record (not submitted yet)"]

    busy = invoke(redis_server, namespace, "why", "busy").stdout.splitlines()
    assert busy[0] == "busy (version 3, fn f) is running."
    assert busy[1].startswith("- it runs attempt 1 of 1, leased by worker-7 until ")

    scheduler.cancel("later")
    blocked = invoke(redis_server, namespace, "why", "child").stdout.splitlines()
    assert blocked[1] == "- it is blocked by later (cancelled), via later -> child"


def test_why_json_carries_every_field_and_the_reasons(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule("job", fn="f")
    result = invoke(redis_server, namespace, "why", "job", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["reasons"] == ["unserved", "next"]
    assert (data["task_id"], data["state"], data["ahead"], data["served_at"]) == (
        "job", "ready", 0, None,
    )  # fmt: skip


def test_why_of_an_unknown_id_is_a_one_line_error(
    redis_server: RedisServer, namespace: str
) -> None:
    result = invoke(redis_server, namespace, "why", "nothing")
    assert_one_line_error(result, "no task 'nothing'", namespace)
