"""``distsched tasks``, bulk ``retry --state`` and ``purge --state``, and
``Scheduler.purge_tasks``, against a real redis-server."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
import redis

from distsched import Scheduler, State
from distsched.errors import InvalidArgument
from tests.conftest import RedisServer
from tests.test_cli import invoke


def fail_tasks(s: Scheduler, prefix: str, n: int, fn: str = "f") -> None:
    for i in range(n):
        s.schedule(f"{prefix}{i}", fn=fn)
        (claim,) = s.ready(1, "w")
        s.fail(claim, f"ValueError: {prefix}{i} went wrong")
        time.sleep(0.002)  # one millisecond apart: newest first is then one order


def test_tasks_prints_a_table_newest_first_with_the_error_summary(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    fail_tasks(scheduler, "t", 3)
    out = invoke(redis_server, namespace, "tasks", "--state", "failed")
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["ID", "FN", "STATE", "ATTEMPT", "UPDATED", "ERROR"]
    assert [line.split()[0] for line in lines[1:]] == ["t2", "t1", "t0"]
    assert "failed" in lines[1] and "1/1" in lines[1]
    assert lines[1].endswith("ValueError: t2 went wrong")
    assert out.stderr == ""


def test_tasks_pages_with_the_cursor_it_prints(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    fail_tasks(scheduler, "t", 3)
    first = invoke(redis_server, namespace, "tasks", "--state", "failed", "--limit", "2", "--json")
    data = json.loads(first.stdout)
    assert [item["task_id"] for item in data["items"]] == ["t2", "t1"]
    assert data["items"][0]["attempts"][0]["outcome"] == "failed"
    rest = invoke(
        redis_server, namespace, "tasks", "--state", "failed", "--cursor", data["cursor"], "--json"
    )
    assert json.loads(rest.stdout) == {
        "items": [json.loads(rest.stdout)["items"][0]],
        "cursor": None,
    }
    assert json.loads(rest.stdout)["items"][0]["task_id"] == "t0"
    text = invoke(redis_server, namespace, "tasks", "--state", "failed", "--limit", "2")
    assert "more: distsched tasks --state failed --cursor" in text.stderr


def test_tasks_refuses_a_limit_beyond_a_page(redis_server: RedisServer, namespace: str) -> None:
    out = invoke(redis_server, namespace, "tasks", "--state", "failed", "--limit", "5000")
    assert out.exit_code != 0 and "limit" in out.stderr


def test_bulk_retry_is_safe_to_interrupt_and_finish_by_running_again(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    fail_tasks(scheduler, "a", 5)
    fail_tasks(scheduler, "b", 2, fn="other")
    # An interrupted run: three tasks of f, two per page.
    args = ["retry", "--state", "failed", "--fn", "f", "--batch", "2"]
    first = invoke(redis_server, namespace, *args, "--limit", "3")
    assert first.exit_code == 0, first.stderr
    assert "retried 3 failed tasks" in first.stdout
    assert "retried 2, skipped 0" in first.stderr  # progress after each page
    assert len(scheduler.tasks("failed", fn="f").items) == 2
    again = invoke(redis_server, namespace, *args)
    assert "retried 2 failed tasks" in again.stdout
    assert {scheduler.status(f"a{i}").state for i in range(5)} == {State.READY}
    assert {scheduler.status(f"b{i}").state for i in range(2)} == {State.FAILED}
    assert "retried 0 failed tasks" in invoke(redis_server, namespace, *args).stdout


def test_bulk_retry_since_takes_only_recent_failures(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer, namespace: str
) -> None:
    fail_tasks(scheduler, "old", 2)
    # Make the old failures two hours old, as if they ended then (index and record).
    for task_id in ("old0", "old1"):
        raw = redis_client.hget(scheduler.keys.tasks, task_id)
        assert isinstance(raw, bytes)
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(raw)
        fields = list(unpacker)
        fields[8] -= 7_200_000  # updated_delta_ms
        redis_client.hset(scheduler.keys.tasks, task_id, b"".join(msgpack.packb(f) for f in fields))
        (member,) = [
            m
            for m in redis_client.zrange(scheduler.keys.states, 0, -1)
            if isinstance(m, bytes) and m.endswith(task_id.encode())
        ]
        redis_client.zrem(scheduler.keys.states, member)
        shifted = int(member[1:15], 16) + 7_200_000
        redis_client.zadd(scheduler.keys.states, {b"f%014x" % shifted + task_id.encode(): 0})
    fail_tasks(scheduler, "new", 2)
    out = invoke(redis_server, namespace, "retry", "--state", "failed", "--since", "1h")
    assert "retried 2 failed tasks" in out.stdout
    assert sorted(i.task_id for i in scheduler.tasks("failed").items) == ["old0", "old1"]


def test_retry_takes_one_id_or_a_state(redis_server: RedisServer, namespace: str) -> None:
    neither = invoke(redis_server, namespace, "retry")
    assert neither.exit_code == 2 and "either ID or --state" in neither.stderr
    both = invoke(redis_server, namespace, "retry", "x", "--state", "failed")
    assert both.exit_code == 2
    stray = invoke(redis_server, namespace, "retry", "x", "--fn", "f")
    assert stray.exit_code == 2 and "--state" in stray.stderr


def test_bulk_purge_removes_only_the_chosen_tasks(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    fail_tasks(scheduler, "a", 3)
    fail_tasks(scheduler, "b", 2, fn="other")
    scheduler.schedule("keep", fn="f", delay=3600)
    out = invoke(redis_server, namespace, "purge", "--state", "failed", "--fn", "f", "--batch", "2")
    assert out.exit_code == 0, out.stderr
    assert "purged 3 failed tasks" in out.stdout
    assert "purged 2, skipped 0" in out.stderr
    assert [i.task_id for i in scheduler.tasks("failed").items] == ["b1", "b0"]
    assert scheduler.status("keep").state is State.READY
    assert scheduler.stats()["counts"]["failed"] == 2
    assert "purged 0 failed tasks" in invoke(redis_server, namespace, "purge", "--state", "failed",
                                             "--fn", "f").stdout  # fmt: skip


def test_purge_needs_a_terminal_state(redis_server: RedisServer, namespace: str) -> None:
    out = invoke(redis_server, namespace, "purge", "--state", "ready")
    assert out.exit_code == 2


# --------------------------------------------------------------------------- purge_tasks


def test_purge_tasks_removes_terminal_tasks_and_refuses_the_others(api: Scheduler) -> None:
    api.schedule("done", fn="f")
    (claim,) = api.ready(1, "w")
    api.complete(claim)
    api.schedule("waiting", fn="f", delay=3600)
    assert api.purge_tasks(["done", "waiting", "unknown"]) == 1
    assert api.status("waiting").state is State.READY
    assert api.tasks("succeeded").items == ()
    assert api.purge_tasks(["done"]) == 0
    assert api.purge_tasks([]) == 0


def test_purge_tasks_keeps_dependents_data_and_a_root_still_telling_them(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("root", fn="f")
    scheduler.schedule("child", fn="f", deps=["root"])
    (claim,) = scheduler.ready(1, "w")
    scheduler.fail(claim, "no")
    assert scheduler.status("child").state is State.BLOCKED
    assert scheduler.purge_tasks(["root"]) == 1
    child = scheduler.status("child")
    assert child.state is State.BLOCKED and child.deps == ("root",)
    # The child's edge from the removed root is gone with it; its own data stays.
    assert redis_client.zcard(scheduler.keys.edges) == 0
    assert redis_client.hexists(scheduler.keys.deps, "child")


@pytest.mark.parametrize("ids", ["abc", [1], [""], ["x"] * 1001])
def test_purge_tasks_refuses_bad_ids(api: Scheduler, ids: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        api.purge_tasks(ids)  # type: ignore[arg-type]
    assert caught.value.field == "task_ids"


def test_tasks_lists_ready_tasks_in_due_order_and_running_ones(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    scheduler.schedule("later", fn="f", delay=60)
    scheduler.schedule("now", fn="g")
    scheduler.schedule("soon", fn="f", delay=30)
    ready = invoke(redis_server, namespace, "tasks", "--state", "ready")
    assert [line.split()[0] for line in ready.stdout.splitlines()[1:]] == ["now", "soon", "later"]
    scheduler.ready(1, "w")
    running = invoke(redis_server, namespace, "tasks", "--state", "running", "--fn", "g")
    rows = running.stdout.splitlines()[1:]
    assert [row.split()[:4] for row in rows] == [["now", "g", "running", "1/1"]]
    empty = invoke(redis_server, namespace, "tasks", "--state", "blocked")
    assert empty.stdout.splitlines() == ["ID  FN  STATE  ATTEMPT  UPDATED  ERROR"]
    assert "no blocked tasks" in empty.stderr
