"""finish.lua: a worker's reports of succeeded tasks and its next claim, in one script call."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from distsched import Scheduler, State, TaskSpec
from distsched.errors import InvalidArgument
from distsched.model import Claim, Outcome, WaitReason
from distsched.ops.base import once
from distsched.wire.calls import Call, claim_call, finish_call
from distsched.wire.replies import decode_finish_reply
from tests.conftest import script_calls


def finish(
    s: Scheduler, reports: list[tuple[Claim, object]], n: int, request_id: str | None = None
) -> tuple[int, list[Outcome], list[Claim], Any]:
    call = finish_call(
        s.keys, reports, claim_call(s.keys, "w", n, 30_000, listening=True, request_id=request_id)
    )
    left, values = s._drive(once(call))
    outcomes, claims, wait = decode_finish_reply(len(reports), values)
    return left, outcomes, claims, wait


def test_one_call_reports_a_success_and_claims_the_next_tasks(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule_many([TaskSpec(f"t{i}", "f") for i in range(5)])
    [first] = scheduler.ready(1, "w")
    before = script_calls(redis_client)
    left, outcomes, claims, wait = finish(scheduler, [(first, {"ok": 1})], 2)
    assert script_calls(redis_client) - before == 1
    assert (left, outcomes) == (0, [Outcome.APPLIED])
    assert [c.task_id for c in claims] == ["t1", "t2"] and wait is None
    assert scheduler.result(first.task_id) == {"ok": 1}
    counts = scheduler.stats()["counts"]
    assert (counts["succeeded"], counts["running"], counts["ready"]) == (1, 2, 2)


def test_the_dependent_a_report_releases_is_claimed_by_the_same_call(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many([TaskSpec("parent", "f"), TaskSpec("child", "f", deps=["parent"])])
    [parent] = scheduler.ready(5, "w")
    _, outcomes, claims, _ = finish(scheduler, [(parent, None)], 5)
    assert outcomes == [Outcome.APPLIED]
    assert [c.task_id for c in claims] == ["child"]
    assert scheduler.status("child").state is State.RUNNING


def test_the_same_call_sent_again_is_a_duplicate_report_and_gets_the_same_tasks(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many([TaskSpec(f"t{i}", "f") for i in range(4)])
    [first] = scheduler.ready(1, "w")
    _, outcomes, claims, _ = finish(scheduler, [(first, None)], 2, request_id="r1")
    _, again, claims_again, _ = finish(scheduler, [(first, None)], 2, request_id="r1")
    assert (outcomes, again) == ([Outcome.APPLIED], [Outcome.DUPLICATE])
    assert [(c.task_id, c.version, c.attempt) for c in claims_again] == [
        (c.task_id, c.version, c.attempt) for c in claims
    ]
    assert scheduler.stats()["counts"]["running"] == 2


def test_a_stale_report_changes_nothing_and_the_claim_still_runs(scheduler: Scheduler) -> None:
    scheduler.schedule_many([TaskSpec("a", "f"), TaskSpec("b", "f")])
    [a] = scheduler.ready(1, "w")
    stale = Claim(a.task_id, a.version, a.attempt + 1, a.fn, a.args, a.kwargs, a.priority, a.run_at)
    _, outcomes, claims, _ = finish(scheduler, [(stale, None)], 1)
    assert outcomes == [Outcome.STALE]
    assert [c.task_id for c in claims] == ["b"]
    assert scheduler.status("a").state is State.RUNNING


def test_a_bad_claim_argument_refuses_the_whole_call_before_the_report_is_written(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many([TaskSpec("a", "f"), TaskSpec("b", "f")])
    [a] = scheduler.ready(1, "w")
    call = finish_call(scheduler.keys, [(a, None)], claim_call(scheduler.keys, "w", 1, 30_000))
    args = list(call.args)
    args[-4] = ""  # an empty worker id
    with pytest.raises(InvalidArgument):
        scheduler._drive(once(Call("finish", call.keys, args)))
    assert scheduler.status("a").state is State.RUNNING
    assert scheduler.status("b").state is State.READY


def test_a_claim_with_nothing_left_says_so_after_the_report(scheduler: Scheduler) -> None:
    scheduler.schedule("only", fn="f")
    [only] = scheduler.ready(1, "w")
    _, outcomes, claims, wait = finish(scheduler, [(only, None)], 4)
    assert outcomes == [Outcome.APPLIED] and claims == []
    assert wait is not None and wait.reason is WaitReason.EMPTY


def test_a_fair_namespace_claims_by_key_after_the_report(scheduler: Scheduler) -> None:
    scheduler.schedule_many(
        [TaskSpec(f"{key}{i}", "f", key=key) for key in ("x", "y") for i in range(3)]
    )
    [first] = scheduler.ready(1, "w")
    _, outcomes, claims, _ = finish(scheduler, [(first, None)], 2)
    assert outcomes == [Outcome.APPLIED]
    assert sorted(c.key for c in claims if c.key) == ["x", "y"]
