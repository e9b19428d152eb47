"""Fan-out decided at run time: a task that completes by spawning children and a join
(``Spawn``, lua/spawn.lua), atomically with its own completion and fenced by its token."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from distsched import Claim, JoinRule, Outcome, Scheduler, Spawn, State, TaskSpec
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.keys import Keys
from distsched.model import Reason
from tests.conftest import (
    CLI_COMMAND,
    CliProcess,
    RedisServer,
    namespace_keys,
    subprocess_env,
)
from tests.test_cli import invoke
from tests.test_script_bounds import evalsha


def claim_of(s: Scheduler, task_id: str) -> Claim:
    claims = s.ready(10, "w")
    found = [c for c in claims if c.task_id == task_id]
    assert found, claims
    return found[0]


def children(parent: str, n: int, fn: str = "f") -> list[TaskSpec]:
    return [TaskSpec(f"{parent}:{i}", fn, args=[i]) for i in range(n)]


def wait_until(check: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out waiting for {what if isinstance(what, str) else what()}"
            )
        time.sleep(0.02)


# --------------------------------------------------------------------------- the spawn


def test_a_spawn_ends_the_parent_succeeded_and_adds_its_children_and_join_in_one_step(
    api: Scheduler,
) -> None:
    api.schedule("p", fn="fan")
    claim = claim_of(api, "p")
    spawn = Spawn(children("p", 3), join=TaskSpec("p:join", "gather"), result={"n": 3})
    assert api.spawn(claim, spawn) is Outcome.APPLIED

    parent = api.status("p")
    assert parent.state is State.SUCCEEDED and parent.result == {"n": 3}
    for i in range(3):
        info = api.status(f"p:{i}")
        assert (info.state, info.args) == (State.READY, (i,))
        assert info.workflow is not None
        assert (info.workflow.parent, info.workflow.root, info.workflow.join) == (
            "p",
            "p",
            "p:join",
        )
    join = api.status("p:join")
    assert join.state is State.PENDING and join.remaining == 3
    assert join.deps == ("p:0", "p:1", "p:2")
    assert join.workflow is not None and join.workflow.is_join and join.workflow.parent == "p"
    # The join runs once every child succeeded.
    for c in api.ready(3, "w"):
        assert api.complete(c, c.args[0]) is Outcome.APPLIED
    assert api.status("p:join").state is State.READY


def test_a_grandchild_belongs_to_the_workflow_of_the_first_parent(scheduler: Scheduler) -> None:
    scheduler.schedule("p", fn="fan")
    scheduler.spawn(claim_of(scheduler, "p"), Spawn(children("p", 1)))
    scheduler.spawn(claim_of(scheduler, "p:0"), Spawn(children("p:0", 2)))
    info = scheduler.status("p:0:1")
    assert info.workflow is not None
    assert (info.workflow.parent, info.workflow.root, info.workflow.join) == ("p:0", "p", None)


def test_a_stale_attempts_spawn_is_refused_and_adds_nothing(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("p", fn="fan", max_attempts=2, backoff=0)
    first = claim_of(scheduler, "p")
    assert scheduler.expire_lease("p") == 1  # the lease lost: attempt 2 is due
    second = claim_of(scheduler, "p")
    before = namespace_keys(redis_client, scheduler.namespace)

    assert scheduler.spawn(first, Spawn(children("p", 3))) is Outcome.STALE
    assert namespace_keys(redis_client, scheduler.namespace) == before
    with pytest.raises(NotFoundError):
        scheduler.status("p:0")

    assert scheduler.spawn(second, Spawn(children("p", 3))) is Outcome.APPLIED
    # Sent again (a lost reply): a duplicate, and nothing more is added.
    after = namespace_keys(redis_client, scheduler.namespace)
    assert scheduler.spawn(second, Spawn(children("p", 4))) is Outcome.DUPLICATE
    assert namespace_keys(redis_client, scheduler.namespace) == after


def test_a_spawned_id_that_exists_refuses_the_whole_spawn(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule_many([TaskSpec("p", "fan"), TaskSpec("p:1", "other", delay=3600)])
    claim = claim_of(scheduler, "p")
    before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(ConflictError, match="'p:1' exists already"):
        scheduler.spawn(claim, Spawn(children("p", 3)))
    assert namespace_keys(redis_client, scheduler.namespace) == before
    assert scheduler.status("p").state is State.RUNNING


@pytest.mark.parametrize(
    ("spawn", "field"),
    [
        (Spawn([]), "children"),
        (Spawn(children("p", 1001)), "children"),
        (Spawn([TaskSpec("p:0", "f", deps=["x"])]), "children.deps"),
        (Spawn([TaskSpec("p:0", "f", dedupe=True)]), "children.dedupe"),
        (Spawn([TaskSpec("p:0", "f"), TaskSpec("p:0", "f")]), "children.task_id"),
        (Spawn([TaskSpec("p", "f")]), "children.task_id"),
        (Spawn(children("p", 1), join=TaskSpec("p:j", "f", debounce=1.0)), "join.dedupe"),
        (Spawn([TaskSpec("p:0", "f", priority=2**40)]), "priority"),
        (Spawn(children("p", 2), window=3), "window"),
        (Spawn(children("p", 2), window=0), "window"),
        (Spawn(children("p", 2), rule=JoinRule.any()), "rule"),
        (Spawn(children("p", 2), join=TaskSpec("j", "f"), rule=JoinRule.first(3)), "rule"),
        (Spawn(children("p", 2), join=TaskSpec("j", "f"), rule="any"), "rule"),  # type: ignore[arg-type]
        ("not a spawn", "spawn"),
    ],
)
def test_a_bad_spawn_is_refused_in_python_naming_the_field(
    scheduler: Scheduler, spawn: Any, field: str
) -> None:
    scheduler.schedule("p", fn="fan")
    claim = claim_of(scheduler, "p")
    with pytest.raises(InvalidArgument) as info:
        scheduler.spawn(claim, spawn)
    assert info.value.field == field
    assert scheduler.status("p").state is State.RUNNING


def raw_spawn(claim: Claim, *tail: Any) -> list[Any]:
    """spawn.lua's ARGV for claim: budget, token, no result, then ``tail`` (join rule,
    window, n, the tasks, the largest payload)."""
    return [250, claim.task_id, claim.version, claim.attempt, b"", *tail]


PAYLOAD = msgpack.packb({"fn": "f"})
SPEC = "in 0 0 1 0 0 0 0"
CHILD = ["c", SPEC, PAYLOAD]
JOIN = ["j", SPEC, PAYLOAD]


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (["", "0", "0"], "BADARG n must be in [1, 1000] children per spawn (MAX_SPAWN_CHILDREN)"),
        (["", "0", "1001"], "BADARG n must be in [1, 1000]"),
        (["most", "0", "1", *CHILD, *JOIN, 1000], "BADARG join must be all, any, at_least"),
        (["at_least 2", "0", "1", *CHILD, *JOIN, 1000], "BADARG join at_least needs a count"),
        (["any 1", "0", "1", *CHILD, *JOIN, 1000], "BADARG join any takes no count"),
        (["", "2", "1", *CHILD, 1000], "BADARG window must be 0 (none) or in [1, n]"),
        (["", "x", "1", *CHILD, 1000], "BADARG window must be an integer"),
        (["", "0", "1", "c", "in 0 0 1 0 0 1 0", PAYLOAD, 1000], "BADARG spec of c must be"),
        (["", "0", "1", "c", SPEC + " dedupe=0", PAYLOAD, 1000], "BADARG spec of c a spawned"),
        (["", "0", "1", "c", SPEC, b"\x91\x01", 1000], "BADARG payload of c"),
        (["", "0", "1", "", SPEC, PAYLOAD, 1000], "BADARG task_id"),
        (["", "0", "2", *CHILD, 1000], "BADARG ARGV length"),
        (["all", "0", "1", *CHILD, 1000], "BADARG ARGV length"),
    ],
)
def test_a_bad_spawn_is_refused_by_the_script_naming_the_field_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, tail: list[Any], message: str
) -> None:
    scheduler.schedule("p", fn="fan")
    claim = claim_of(scheduler, "p")
    before = namespace_keys(redis_client, scheduler.namespace)
    with pytest.raises(redis.ResponseError) as info:
        evalsha(redis_client, scheduler.keys, "spawn", *raw_spawn(claim, *tail))
    assert str(info.value).startswith(message)
    assert namespace_keys(redis_client, scheduler.namespace) == before


# --------------------------------------------------------------------------- real processes


class Fleet:
    """Worker processes of ``tests.spawn_app`` on one namespace."""

    def __init__(self, server: RedisServer, namespace: str, tmp_path: Path) -> None:
        self.server, self.namespace, self.tmp_path = server, namespace, tmp_path
        self.procs: list[CliProcess] = []

    def start(self, concurrency: int = 4) -> CliProcess:
        argv = [
            *CLI_COMMAND,
            "--redis",
            self.server.url,
            "--namespace",
            self.namespace,
            "worker",
            "tests.spawn_app:FUNCS",
            "--concurrency",
            str(concurrency),
            "--lease",
            "30s",
        ]
        env = subprocess_env(DISTSCHED_REDIS_URL=None, DISTSCHED_NAMESPACE=None)
        proc = CliProcess(self.tmp_path / f"worker{len(self.procs)}.err", argv, env)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


@pytest.fixture
def fleet(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(redis_server, namespace, tmp_path)
    yield f
    f.close()


def test_a_worker_killed_inside_a_fan_out_spawns_nothing_and_the_retry_spawns_once(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer, fleet: Fleet
) -> None:
    ns = scheduler.namespace
    scheduler.schedule(
        "p", fn="fan", args=[redis_server.url, ns, 5, None, True], max_attempts=2, backoff=0
    )
    victim = fleet.start()
    wait_until(lambda: redis_client.get(f"test:{ns}:inside"), 120, "the first run inside fan")
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    # Killed before its report: the task still runs (its lease held), nothing spawned.
    assert scheduler.status("p").state is State.RUNNING
    assert scheduler.stats()["counts"]["ready"] == 0
    with pytest.raises(NotFoundError):
        scheduler.status("p:0")
    assert redis_client.hlen(Keys(ns).parents) == 0

    assert scheduler.expire_lease("p") == 1  # the lost lease, as the reap finds it
    retry = fleet.start()
    wait_until(lambda: redis_client.hexists(Keys(ns).tasks, "p:join"), 120, retry.stderr)
    info = scheduler.wait("p:join", timeout=120)
    assert info.state is State.SUCCEEDED
    assert scheduler.status("p").attempt == 2 and scheduler.result("p") == 5
    # Spawned once: each child ran once, the join once.
    assert sorted(int(i) for i in redis_client.lrange(f"test:{ns}:started", 0, -1)) == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert redis_client.get(f"test:{ns}:joined") == b"1"
    assert redis_client.get(f"test:{ns}:fan-runs") == b"2"


# --------------------------------------------------------------------------- windows


def holding(s: Scheduler, parent: str, n: int) -> list[str]:
    """The children of ``parent`` that hold a slot of its window: ready or running."""
    ids = [f"{parent}:{i}" for i in range(n)]
    return [i for i in ids if s.status(i).state in (State.READY, State.RUNNING)]


def test_a_window_holds_the_children_past_it_and_each_ending_releases_the_next_in_order(
    api: Scheduler,
) -> None:
    api.schedule("p", fn="fan")
    assert api.spawn(claim_of(api, "p"), Spawn(children("p", 6), window=2)) is Outcome.APPLIED
    assert holding(api, "p", 6) == ["p:0", "p:1"]
    held = api.status("p:4")
    assert held.state is State.PENDING and held.workflow is not None
    assert held.workflow.window_waiting and held.workflow.window == 2
    assert held.workflow.window_running == 2
    # Any ending passes the slot on: a success, a cancel of a ready child, a failure.
    [first, second] = api.ready(2, "w")
    assert (first.task_id, second.task_id) == ("p:0", "p:1")
    assert api.complete(first) is Outcome.APPLIED
    assert holding(api, "p", 6) == ["p:1", "p:2"]
    assert api.fail(second, "no") is Outcome.APPLIED
    assert holding(api, "p", 6) == ["p:2", "p:3"]
    # A waiting child cancelled leaves the line: it held no slot.
    assert api.cancel("p:4") is State.CANCELLED
    assert api.cancel("p:2") is State.CANCELLED
    assert holding(api, "p", 6) == ["p:3", "p:5"]
    info = api.status("p:5").workflow
    assert info is not None and not info.window_waiting


def test_with_a_window_of_3_no_more_than_3_children_run_at_once_under_a_fleet_and_in_order(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer, fleet: Fleet
) -> None:
    ns = scheduler.namespace
    scheduler.schedule("p", fn="fan", args=[redis_server.url, ns, 12, 3])
    for _ in range(3):
        fleet.start(concurrency=4)
    wait_until(lambda: redis_client.hexists(Keys(ns).tasks, "p:join"), 120, "the spawn")
    assert scheduler.wait("p:join", timeout=120).state is State.SUCCEEDED
    started = [int(i) for i in redis_client.lrange(f"test:{ns}:started", 0, -1)]
    assert sorted(started) == list(range(12))
    # Released in order: a child starts only after those before it were made ready; a
    # worker may start one a little after the next, never more than the window apart.
    assert all(i - 3 < started.index(i) < i + 3 for i in range(12)), started
    assert int(redis_client.get(f"test:{ns}:peak") or 0) <= 3
    assert redis_client.hlen(Keys(ns).windows) == 0 and redis_client.zcard(Keys(ns).window) == 0


# --------------------------------------------------------------------------- join rules


def fan_out(s: Scheduler, n: int, rule: JoinRule, window: int | None = None) -> dict[str, Claim]:
    """p spawned n children and a join by ``rule``; every child claimed (by id)."""
    s.schedule("p", fn="fan")
    spawn = Spawn(children("p", n), join=TaskSpec("p:join", "gather"), rule=rule, window=window)
    assert s.spawn(claim_of(s, "p"), spawn) is Outcome.APPLIED
    return {c.task_id: c for c in s.ready(n, "w")}


def progress(s: Scheduler) -> tuple[State, int, int, int]:
    info = s.status("p:join")
    assert info.workflow is not None and info.workflow.is_join
    w = info.workflow
    return info.state, w.children, w.succeeded, w.failed


def test_a_join_with_rule_all_waits_for_every_child_and_a_failed_one_blocks_it(
    api: Scheduler,
) -> None:
    claims = fan_out(api, 3, JoinRule.ALL)
    api.complete(claims["p:0"])
    assert progress(api) == (State.PENDING, 3, 1, 0)
    api.fail(claims["p:1"], "no")
    assert progress(api) == (State.BLOCKED, 3, 1, 1)


def test_a_join_with_rule_any_is_ready_at_the_first_success_and_blocked_when_all_failed(
    scheduler: Scheduler,
) -> None:
    claims = fan_out(scheduler, 3, JoinRule.any())
    scheduler.fail(claims["p:0"], "no")
    assert progress(scheduler) == (State.PENDING, 3, 0, 1)
    scheduler.complete(claims["p:2"])
    assert progress(scheduler) == (State.READY, 3, 1, 1)


def test_a_join_with_rule_any_is_blocked_when_every_child_failed(scheduler: Scheduler) -> None:
    claims = fan_out(scheduler, 2, JoinRule.any())
    scheduler.fail(claims["p:0"], "no")
    assert progress(scheduler) == (State.PENDING, 2, 0, 1)
    scheduler.fail(claims["p:1"], "no")
    assert progress(scheduler) == (State.BLOCKED, 2, 0, 2)


def test_a_join_with_rule_at_least_k_is_blocked_once_fewer_than_k_can_still_succeed(
    api: Scheduler,
) -> None:
    claims = fan_out(api, 4, JoinRule.at_least(2))
    api.fail(claims["p:0"], "no")
    api.fail(claims["p:1"], "no")
    assert progress(api) == (State.PENDING, 4, 0, 2)  # two can still succeed
    api.complete(claims["p:2"])
    assert progress(api) == (State.PENDING, 4, 1, 2)
    api.fail(claims["p:3"], "no")
    assert progress(api) == (State.BLOCKED, 4, 1, 3)


def test_a_join_with_rule_at_least_k_is_ready_when_k_children_succeeded(api: Scheduler) -> None:
    claims = fan_out(api, 4, JoinRule.at_least(2))
    api.complete(claims["p:1"])
    api.fail(claims["p:0"], "no")
    api.complete(claims["p:3"])
    assert progress(api) == (State.READY, 4, 2, 1)


def test_a_join_with_rule_first_n_is_ready_at_n_successes_and_cancels_the_rest(
    api: Scheduler,
) -> None:
    # Six children, a window of four: two of them wait for a slot, unstarted.
    claims = fan_out(api, 6, JoinRule.first(2), window=4)
    assert sorted(claims) == ["p:0", "p:1", "p:2", "p:3"]
    api.complete(claims["p:2"])
    api.complete(claims["p:0"])
    assert api.status("p:join").state is State.READY
    # The running children are asked to stop; the waiting ones end cancelled.
    assert api.status("p:1").cancel_requested and api.status("p:3").cancel_requested
    assert api.status("p:4").state is State.CANCELLED
    assert api.status("p:5").state is State.CANCELLED
    assert api.confirm_cancel(claims["p:1"]) is Outcome.APPLIED
    assert api.status("p:1").state is State.CANCELLED


# --------------------------------------------------------------------------- cancel a workflow


def test_cancelling_a_workflow_from_any_task_cancels_its_root_and_every_spawned_task(
    api: Scheduler,
) -> None:
    claims = fan_out(api, 5, JoinRule.ALL, window=2)
    assert sorted(claims) == ["p:0", "p:1"]  # p:2 .. p:4 wait for a slot, unstarted
    # p:0 spawns grandchildren; p:1 still runs.
    assert api.spawn(claims["p:0"], Spawn(children("p:0", 2))) is Outcome.APPLIED
    # p:0:0, p:0:1, p:1 .. p:4; the join ends blocked by its first cancelled child.
    assert api.cancel_workflow("p:0:1") == 6
    for task_id in ("p:0:0", "p:0:1", "p:2", "p:3", "p:4"):
        assert api.status(task_id).state is State.CANCELLED, task_id
    assert api.status("p:join").state is State.BLOCKED
    assert api.status("p").state is State.SUCCEEDED  # ended before: left as it is
    running = api.status("p:1")
    assert running.state is State.RUNNING and running.cancel_requested
    # A run asked to stop that still returns a spawn succeeds and adds nothing.
    assert api.spawn(claims["p:1"], Spawn(children("p:1", 3))) is Outcome.APPLIED
    with pytest.raises(NotFoundError):
        api.status("p:1:0")


# --------------------------------------------------------------------------- visible


def test_explain_and_the_cli_show_a_childs_parent_a_joins_progress_and_a_window_wait(
    scheduler: Scheduler, redis_server: RedisServer
) -> None:
    claims = fan_out(scheduler, 5, JoinRule.at_least(3), window=2)
    scheduler.complete(claims["p:0"])
    exp = scheduler.explain("p:4")
    assert exp.reasons[0] is Reason.WINDOW
    assert exp.workflow is not None and exp.workflow.window_running == 2
    ns = scheduler.namespace
    why = invoke(redis_server, ns, "why", "p:4").stdout
    assert "spawned by p; join p:join; waiting for a window slot (2 running, window 2)" in why
    assert "it waits for a window slot" in why
    status = invoke(redis_server, ns, "status", "p:join").stdout
    assert "join (at_least 3): 1 of 5 children succeeded, 0 did not" in status
    assert (
        "cancelled or asked to stop" in invoke(redis_server, ns, "cancel", "--workflow", "p").stdout
    )
    assert scheduler.status("p:4").state is State.CANCELLED


def test_the_dashboards_task_page_shows_the_parent_the_join_and_its_progress(
    scheduler: Scheduler,
) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    claims = fan_out(scheduler, 5, JoinRule.first(2), window=3)
    scheduler.complete(claims["p:0"])  # p:3 takes its slot; p:4 waits
    with TestClient(create_app(scheduler)) as client:
        child = client.get("/task", params={"id": "p:4"}).text
        join = client.get("/task", params={"id": "p:join"}).text
    assert 'id="workflow-parent"' in child and 'href="/task?id=p"' in child
    assert "waiting for a window slot (3 running, window 3)" in child
    assert "first 2: 1 of 5 children succeeded, 0 did not" in join
