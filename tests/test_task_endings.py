"""Every script that can end a task does all that an ending owes (CONTRACT §6, §7, §9).

A task that ends wakes the clients that wait for it (``<state> <id>`` on ``ended``, its
``waits`` entry gone), gives the slot of its fairness key back when it was running, and
moves its member of the per-state index. The scripts that can end a task are found from
their code (those that can reach ``end_task``, lib/ended.lua): a new one without an
ending here fails ``test_every_script_that_can_end_a_task_has_an_ending_here``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from distsched import Scheduler, TaskSpec, model, scripts
from distsched.keys import Keys
from distsched.ops import protocol
from distsched.ops.namespace import Ops
from distsched.wire import calls, records
from distsched.worker.link import WorkerLink
from tests.test_scripts_registry import reachable_code

KEY = "tenant"


class Recorder(Scheduler):
    """A scheduler that notes the name of every script it calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.called: list[str] = []

    def _request(self, request: protocol.Request) -> Any:
        if isinstance(request, calls.Call):
            self.called.append(request.script)
        return super()._request(request)


@dataclass(frozen=True)
class Ending:
    """How one script ends a task: ``prepare`` sets the stage, ``end`` makes the script end
    task ``task_id`` in ``state``; ``running`` when the task held a fairness slot."""

    script: str
    task_id: str
    state: str
    prepare: Callable[[Scheduler], object]
    end: Callable[[Scheduler], object]
    running: bool = False


def claim(s: Scheduler, task_id: str) -> model.Claim:
    [c] = s.ready(1, "w")
    assert c.task_id == task_id
    return c


def keyed(task_id: str, **options: Any) -> TaskSpec:
    return TaskSpec(task_id, "f", key=KEY, **options)


def failed_x(s: Scheduler) -> None:
    s.schedule("x", fn="f", key=KEY, max_attempts=1)
    s.fail(claim(s, "x"), "no")


def failed_x_and_y_on_z(s: Scheduler) -> None:
    failed_x(s)
    s.schedule("y", fn="f", deps=["z"], allow_unknown=True)


def failed_x_and_y_on_x(s: Scheduler) -> None:
    failed_x(s)
    s.schedule("y", fn="f", key=KEY, deps=["x"])


def past_ttl(s: Scheduler, delay: float) -> None:
    s.schedule("x", fn="f", key=KEY, delay=delay, ttl=0.01)
    time.sleep(0.05)


def triggered_once(s: Scheduler) -> None:
    s.add_schedule("sched", "f", interval=3600.0, overlap="cancel_previous", key=KEY)
    s.trigger("sched")
    # The second trigger's slot is another millisecond.
    time.sleep(0.002)


def first_trigger(client: Any, keys: Keys) -> str:
    """The task of the schedule's first trigger: the only one when the second comes."""
    [task_id] = [t for t in client.hkeys(keys.tasks) if t.startswith(b"sched@")]
    return str(task_id.decode())


def endings() -> list[Ending]:
    n = calls.PROPAGATE_BUDGET + 10
    last = f"d{n - 1}"
    claims: dict[str, model.Claim] = {}

    def claimed(s: Scheduler, **options: Any) -> None:
        s.schedule_many([keyed("x", **options), keyed("other")])
        claims["x"] = claim(s, "x")

    def claimed_cancelled(s: Scheduler) -> None:
        claimed(s)
        s.cancel("x")

    return [
        Ending("complete", "x", "succeeded", claimed, lambda s: s.complete(claims["x"]), True),
        Ending(
            "finish",
            "x",
            "succeeded",
            claimed,
            lambda s: WorkerLink(s).complete_and_claim([(claims["x"], b"")], 1, "w"),
            True,
        ),
        Ending(
            "spawn",
            "x",
            "succeeded",
            claimed,
            lambda s: s.spawn(claims["x"], model.Spawn([TaskSpec("x:0", "f")])),
            True,
        ),
        Ending(
            "fail",
            "x",
            "failed",
            lambda s: claimed(s, max_attempts=1),
            lambda s: s.fail(claims["x"], "no"),
            True,
        ),
        Ending(
            "reap",
            "x",
            "failed",
            lambda s: claimed(s, max_attempts=1),
            lambda s: s.expire_lease("x"),
            True,
        ),
        Ending(
            "confirm_cancel",
            "x",
            "cancelled",
            claimed_cancelled,
            lambda s: s.confirm_cancel(claims["x"]),
            True,
        ),
        Ending(
            "release",
            "x",
            "cancelled",
            claimed_cancelled,
            lambda s: s.release([claims["x"]]),
            True,
        ),
        Ending(
            "cancel",
            "x",
            "cancelled",
            lambda s: s.schedule("x", fn="f", key=KEY, delay=60),
            lambda s: s.cancel("x"),
        ),
        Ending(
            "propagate",
            last,
            "blocked",
            lambda s: s.submit_graph(
                [keyed("root", delay=60)] + [keyed(f"d{i}", deps=["root"]) for i in range(n)]
            ),
            lambda s: s.cancel("root"),
        ),
        Ending(
            "schedule",
            "y",
            "blocked",
            failed_x,
            lambda s: s.schedule("y", fn="f", key=KEY, deps=["x"]),
        ),
        Ending(
            "add_deps",
            "y",
            "blocked",
            failed_x_and_y_on_z,
            lambda s: s.add_deps("y", ["x"]),
        ),
        Ending(
            "retry",
            "y",
            "blocked",
            failed_x_and_y_on_x,
            lambda s: s.retry("y", cascade=False),
        ),
        Ending(
            "expire",
            "x",
            "cancelled",
            lambda s: past_ttl(s, delay=60),
            lambda s: s.housekeeping(),
        ),
        Ending(
            "claim",
            "x",
            "cancelled",
            lambda s: past_ttl(s, delay=0),
            lambda s: s.ready(1, "w"),
        ),
        Ending(
            "fire",
            "sched@first",
            "cancelled",
            triggered_once,
            lambda s: s.trigger("sched"),
        ),
        Ending(
            "waitpoint",
            "x",
            "succeeded",
            lambda s: s.create_waitpoint("x", timeout=60),
            lambda s: s.complete_waitpoint("x", {"ok": True}),
        ),
        Ending(
            "waitpoint",
            "x",
            "failed",
            lambda s: s.create_waitpoint("x", timeout=60),
            lambda s: s.fail_waitpoint("x", "rejected"),
        ),
        Ending(
            "expire",
            "x",
            "failed",
            timed_out_waitpoint,
            lambda s: s.housekeeping(),
        ),
    ]


def timed_out_waitpoint(s: Scheduler) -> None:
    """A waitpoint whose timeout has passed: the next housekeeping times it out."""
    s.create_waitpoint("x", timeout=60)
    s._drive(s._ops.call(Ops.advance_clock, 61_000))


ENDINGS = endings()


def scripts_that_can_end_a_task() -> set[str]:
    return {
        name
        for name in scripts.SCRIPT_NAMES
        if "end_task" in reachable_code(scripts.source(name))[0]
    }


def test_every_script_that_can_end_a_task_has_an_ending_here() -> None:
    found = scripts_that_can_end_a_task()
    assert {"complete", "fail", "reap", "cancel", "propagate", "expire"} <= found
    assert found == {e.script for e in ENDINGS}


@pytest.fixture
def recorder(redis_client: redis.Redis, namespace: str) -> Iterator[Recorder]:
    s = Recorder(redis_client, namespace=namespace, lease_s=5.0)
    # Fair, with a cap the running task fills: its key waits in fairfull until it ends.
    s.set_key(KEY, cap=1)
    yield s
    s.close()


def ended_notices(client: Any, keys: Keys, act: Callable[[], object]) -> list[bytes]:
    """The messages published on ``ended`` while ``act`` runs (and shortly after)."""
    pubsub: Any = client.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.ended)
    try:
        deadline = time.monotonic() + 5
        while client.execute_command("PUBSUB", "SHARDNUMSUB", keys.ended)[1] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        act()
        told = []
        # None also for the subscription's own confirmation: read until quiet for a while.
        quiet = time.monotonic() + 1
        while time.monotonic() < quiet:
            message = pubsub.get_sharded_message(timeout=0.2)
            if message is not None:
                told.append(message["data"])
        return told
    finally:
        pubsub.close()


def fairness_problems(client: Any, keys: Keys) -> list[str]:
    """Where the fairness counters disagree with the running tasks: each key's run:<key>
    counts its fairrun entries, every fairrun entry is a running task, and a key waits in
    fairfull only while it is at its cap."""
    fair = {k.decode(): v.decode() for k, v in client.hgetall(keys.fair).items()}
    fairrun = {k.decode(): v.decode() for k, v in client.hgetall(keys.fairrun).items()}
    problems = []
    for key in {*fairrun.values(), *(f[4:] for f in fair if f.startswith("run:"))}:
        held = sorted(t for t, k in fairrun.items() if k == key)
        if int(fair.get(f"run:{key}", 0)) != len(held):
            problems.append(f"run:{key} = {fair.get(f'run:{key}')} but fairrun holds {held}")
    for task_id in fairrun:
        if client.zscore(keys.leases, task_id) is None:
            problems.append(f"fairrun holds {task_id}, which is not running")
    for raw in client.zrange(keys.fairfull, 0, -1):
        key = raw.decode()
        cap = fair.get(f"cap:{key}", fair.get("cap"))
        if cap is None or int(fair.get(f"run:{key}", 0)) < int(cap):
            problems.append(f"{key} waits in fairfull below its cap")
    return problems


def index_members(client: Any, keys: Keys, task_id: str) -> list[bytes]:
    tail = task_id.encode()
    return [m for m in client.zrange(keys.states, 0, -1) if m[15:] == tail]


@pytest.mark.parametrize("ending", ENDINGS, ids=lambda e: e.script)
def test_an_ending_wakes_its_waiters_gives_the_fairness_slot_back_and_moves_the_index(
    recorder: Recorder, redis_client: redis.Redis, ending: Ending
) -> None:
    keys = recorder.keys
    ending.prepare(recorder)
    task_id = first_trigger(redis_client, keys) if ending.script == "fire" else ending.task_id
    if ending.running:
        assert redis_client.hget(keys.fairrun, task_id) == KEY.encode()
        assert redis_client.zscore(keys.fairfull, KEY) is not None
    redis_client.zadd(keys.waits, {task_id: 2**52})
    recorder.called.clear()

    told = ended_notices(redis_client, keys, lambda: ending.end(recorder))

    assert ending.script in recorder.called
    assert recorder.status(task_id).state.value == ending.state
    # Its waiters: told, and its entry gone.
    assert f"{ending.state} {task_id}".encode() in told
    assert redis_client.zscore(keys.waits, task_id) is None
    # Fairness: no slot held by a task that is not running, and a key below its cap
    # takes its turns again.
    assert fairness_problems(redis_client, keys) == []
    assert redis_client.hget(keys.fairrun, task_id) is None
    # The per-state index: one member, the record's.
    raw = redis_client.hget(keys.tasks, task_id)
    assert raw is not None
    record = records.decode_record(raw, task_id)
    member = records.state_index_member(record.state, record.updated_ms, task_id)
    assert index_members(redis_client, keys, task_id) == [member]
