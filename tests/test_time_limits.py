"""Time limits: a run past its ``timeout`` is asked to stop, and after the worker's grace
its attempt ends failed with ``timed out after N s``, retried by its policy; a ``def``
function that ignores it keeps its slot (threads) or ends with its process (processes).
Real redis-server, real workers (threads, and ``distsched worker --processes``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from distsched import Scheduler, State, TaskSpec, Worker, current_task
from distsched.errors import InvalidArgument, NotFoundError, ScriptError
from distsched.ops.base import once
from distsched.wire import calls
from tests.conftest import RedisServer, put_payload, running, stored_payload
from tests.test_cli import assert_one_line_error, invoke
from tests.test_worker import wait_state, wait_until
from tests.test_worker_processes import Supervised, alive, worker_pids

LIMIT = 0.5
GRACE = 0.5
ERROR = "timed out after 0.5 s"


@pytest.fixture
def fast(scheduler: Scheduler) -> Iterator[Scheduler]:
    s = Scheduler(scheduler.client, namespace=scheduler.namespace, lease_s=1.0)
    yield s
    s.close()


def errors_of(s: Scheduler, task_id: str) -> list[tuple[str, str | None]]:
    return [(a.outcome, a.error) for a in s.status(task_id).attempts]


# --------------------------------------------------------------------------- cooperative


def test_a_function_that_stops_at_its_limit_fails_timed_out_and_is_retried_by_its_policy(
    fast: Scheduler,
) -> None:
    signalled: list[tuple[bool, bool]] = []

    def polite(how: str) -> str:
        ctx = current_task()
        ctx.wait_cancelled(30)
        signalled.append((ctx.cancel_requested, ctx.timed_out))
        if how == "raise":
            ctx.raise_if_cancelled()
        return "returned after the stop"

    fast.schedule("raises", fn="polite", args=["raise"], timeout=LIMIT, max_attempts=2, backoff=0)
    fast.schedule("returns", fn="polite", args=["return"], timeout=LIMIT)
    worker = Worker(fast, {"polite": polite}, concurrency=2, timeout_grace=GRACE)
    with running(worker):
        raised = wait_state(fast, "raises", State.FAILED)
        returned = wait_state(fast, "returns", State.FAILED)
    # Stopped within the grace, raising or returning: failed, not cancelled nor succeeded.
    assert raised.error == ERROR and returned.error == ERROR
    assert returned.result is None
    # Retried by its policy (2 attempts), each recorded as timed out in its history.
    assert errors_of(fast, "raises") == [("failed", ERROR), ("failed", ERROR)]
    assert errors_of(fast, "returns") == [("failed", ERROR)]
    assert signalled == [(True, True)] * 3
    assert worker.counts["failed"] == 3 and worker.counts["overran"] == 0


# --------------------------------------------------------------------------- threads


def test_a_def_that_ignores_its_limit_fails_at_the_grace_and_keeps_its_slot_until_it_returns(
    fast: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    ended: list[str] = []

    def stubborn() -> str:
        release.wait(30)
        ended.append("returned")
        return "too late"

    fast.schedule("hung", fn="stubborn", timeout=LIMIT)
    worker = Worker(fast, {"stubborn": stubborn, "noop": lambda: "ran"}, timeout_grace=GRACE,
                    concurrency=1)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="distsched.worker"), running(worker):
        started = time.monotonic()
        info = wait_state(fast, "hung", State.FAILED)
        assert time.monotonic() - started >= LIMIT + GRACE
        assert info.error == ERROR
        assert errors_of(fast, "hung") == [("failed", ERROR)]
        # The thread still runs the function: its slot stays taken, nothing else runs.
        assert worker.snapshot()["overrunning"] == 1 and worker.snapshot()["free"] == 0
        assert worker.counts["overran"] == 1
        assert any("hung" in r.getMessage() and r.levelno == logging.WARNING
                   for r in caplog.records), caplog.text  # fmt: skip
        fast.schedule("next", fn="noop")
        time.sleep(0.5)
        assert fast.status("next").state is State.READY
        # Its late return frees the slot; it changes nothing of the recorded attempt.
        release.set()
        wait_state(fast, "next", State.SUCCEEDED)
        assert worker.snapshot()["overrunning"] == 0
    assert ended == ["returned"]
    assert fast.status("hung").state is State.FAILED
    assert errors_of(fast, "hung") == [("failed", ERROR)]


def test_an_async_def_that_ignores_its_limit_is_cancelled_at_the_grace(fast: Scheduler) -> None:
    seen: list[str] = []

    async def sleepy() -> None:
        try:
            await asyncio.sleep(30)  # never looks at cancel_requested
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    fast.schedule("sleepy", fn="sleepy", timeout=LIMIT)
    worker = Worker(fast, {"sleepy": sleepy}, concurrency=1, timeout_grace=GRACE)
    with running(worker):
        info = wait_state(fast, "sleepy", State.FAILED)
        wait_until(lambda: seen == ["cancelled"], 5, "the cancellation")
        wait_until(lambda: worker.snapshot()["overrunning"] == 0, 5, "its slot free again")
    assert info.error == ERROR
    assert errors_of(fast, "sleepy") == [("failed", ERROR)]


# --------------------------------------------------------------------------- processes


@pytest.fixture
def supervised(
    redis_server: Any, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Supervised]]:
    made: list[Supervised] = []

    def make(*extra: str) -> Supervised:
        made.append(Supervised(redis_server, namespace, tmp_path, "tests.time_limits_app:FUNCS",
                               2, *extra))  # fmt: skip
        return made[-1]

    yield make
    for sup in made:
        sup.close()


def test_with_processes_a_stuck_function_ends_with_its_process_which_is_replaced(
    fast: Scheduler, supervised: Callable[..., Supervised]
) -> None:
    # The limit is the workers' default (--timeout), passed on to each process.
    sup = supervised("--concurrency", "1", "--grace", "1", "--timeout", str(LIMIT),
                     "--timeout-grace", str(GRACE))  # fmt: skip
    wait_until(lambda: len(worker_pids(fast)) == 2, 30, "two registered worker processes")
    fast.schedule("hung", fn="stuck", args=[60], max_attempts=2, backoff=0)

    # Both attempts time out, each ends with its process, and each process is replaced.
    info = wait_state(fast, "hung", State.FAILED, timeout=30)
    assert info.error == ERROR, sup.stderr()
    assert [(a.outcome, a.error) for a in info.attempts] == [("failed", ERROR)] * 2
    ran = {int(a.worker.split(":")[1]) for a in info.attempts}
    wait_until(lambda: not any(alive(pid) for pid in ran), 10, "the stuck processes ended")
    wait_until(
        lambda: len(worker_pids(fast) - ran) == 2, 30, f"two processes again: {sup.stderr()}"
    )
    assert sup.stderr().count("ended itself to stop a task function past its time limit") == 2
    # The replacements run the next tasks.
    fast.schedule_many([TaskSpec(f"after{i}", "pid") for i in range(4)])
    pids = {wait_state(fast, f"after{i}", State.SUCCEEDED).result for i in range(4)}
    assert pids and not pids & ran

    # An async def that blocks the event loop: its cancellation cannot reach it, and a
    # grace later its process ends too.
    fast.schedule("blocking", fn="blocking", args=[60])
    info = wait_state(fast, "blocking", State.FAILED, timeout=30)
    assert [(a.outcome, a.error) for a in info.attempts] == [("failed", ERROR)]
    blocked = int(info.attempts[0].worker.split(":")[1])
    wait_until(lambda: not alive(blocked), 10, "the blocked process ended")
    wait_until(lambda: len(worker_pids(fast) - ran - {blocked}) == 2, 30, "two processes again")

    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.stderr()


# --------------------------------------------------------------------------- precedence


def test_the_limit_is_the_tasks_else_its_functions_else_the_workers_and_none_is_no_limit(
    fast: Scheduler,
) -> None:
    def limit(seconds: float = 0.0) -> list[Any]:
        ctx = current_task()
        time.sleep(seconds)
        return [ctx.time_limit, ctx.cancel_requested]

    functions = {"limited": limit, "unlimited": limit, "plain": limit}
    fast.schedule_many([
        TaskSpec("task-wins", "limited", timeout=1.7),
        TaskSpec("fn-wins", "limited"),
        TaskSpec("worker-wins", "plain"),
        TaskSpec("fn-none", "unlimited", args=[2.0]),
        TaskSpec("task-over-none", "unlimited", timeout=1.2),
    ])  # fmt: skip
    worker = Worker(fast, functions, timeout=1.9, timeouts={"limited": 1.4, "unlimited": None})
    with running(worker):
        results = {
            task_id: wait_state(fast, task_id, State.SUCCEEDED).result
            for task_id in ("task-wins", "fn-wins", "worker-wins", "fn-none", "task-over-none")
        }
    assert results == {
        "task-wins": [1.7, False],
        "fn-wins": [1.4, False],
        "worker-wins": [1.9, False],
        # No limit for the function: it runs past the worker's default unsignalled.
        "fn-none": [None, False],
        "task-over-none": [1.2, False],
    }
    assert fast.status("task-wins").timeout == 1.7
    assert fast.status("fn-wins").timeout is None

    # No limit anywhere: a long run is never signalled.
    fast.schedule("free", fn="plain", args=[1.0])
    with running(Worker(fast, functions)):
        assert wait_state(fast, "free", State.SUCCEEDED).result == [None, False]


def test_quick_runs_under_a_long_limit_leave_nothing_behind_in_the_watchdog(
    fast: Scheduler,
) -> None:
    fast.schedule_many([TaskSpec(f"q{i}", "quick") for i in range(300)])
    worker = Worker(fast, {"quick": lambda: None}, timeout=3600)
    with running(worker):
        wait_until(lambda: worker.counts["succeeded"] == 300, 30, "every task done")
        # Ended runs are dropped once they are most of what it follows, not at their limit.
        assert len(worker._limits._heap) <= 130


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("bad", [0, -1, 0.0004, math.nan, math.inf, True, "5", 2_592_001])
def test_a_bad_timeout_is_refused_by_the_client_naming_it_and_nothing_is_written(
    fast: Scheduler, bad: Any
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        fast.schedule("t", fn="f", timeout=bad)
    assert caught.value.field == "timeout"
    with pytest.raises(InvalidArgument) as caught:
        fast.schedule_many([TaskSpec("t", "f", timeout=bad)])
    assert caught.value.field == "timeout"
    with pytest.raises(NotFoundError):
        fast.status("t")
    with pytest.raises(InvalidArgument) as caught:
        Worker(fast, {"f": print}, timeout=bad)
    assert caught.value.field == "timeout"
    with pytest.raises(InvalidArgument) as caught:
        Worker(fast, {"f": print}, timeouts={"f": bad})
    assert caught.value.field == "timeouts['f']"


def test_the_workers_time_limit_arguments_are_checked_naming_each(fast: Scheduler) -> None:
    for kwargs, field in (
        ({"timeouts": {"g": 1.0}}, "timeouts"),  # not one of its functions
        ({"timeouts": [("f", 1.0)]}, "timeouts"),
        ({"timeout_grace": -1}, "timeout_grace"),
        ({"timeout_grace": math.inf}, "timeout_grace"),
        ({"stop_on_overrun": 1}, "stop_on_overrun"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            Worker(fast, {"f": print}, **kwargs)
        assert caught.value.field == field


def test_a_stored_payload_with_a_bad_timeout_fails_its_task_as_a_decode_error(
    fast: Scheduler,
) -> None:
    ran: list[str] = []
    fast.schedule("bad", fn="f")
    fast.schedule("good", fn="f", timeout=5)
    put_payload(fast.client, fast.keys, "bad", msgpack.packb({"fn": "f", "timeout": 0.5}))
    with running(Worker(fast, {"f": lambda: ran.append("ran")})):
        info = wait_state(fast, "bad", State.FAILED)
        wait_state(fast, "good", State.SUCCEEDED)
    assert info.error is not None and "payload field 'timeout' must be an integer" in info.error
    assert ran == ["ran"]


def test_the_cli_schedules_a_timeout_shows_it_and_refuses_a_bad_one_naming_it(
    redis_server: RedisServer, namespace: str, fast: Scheduler
) -> None:
    done = invoke(redis_server, namespace, "schedule", "t", "--fn", "f", "--timeout", "1m30s")
    assert done.exit_code == 0, done.stderr
    assert fast.status("t").timeout == 90.0
    shown = invoke(redis_server, namespace, "status", "t")
    assert "timeout:" in shown.stdout and "90 s" in shown.stdout
    for bad in ("0", "-1", "31d", "nan"):
        refused = invoke(redis_server, namespace, "schedule", "u", "--fn", "f", "--timeout", bad)
        assert_one_line_error(refused, "--timeout")
        with pytest.raises(NotFoundError):
            fast.status("u")


def raw_schedule(s: Scheduler, task_id: str, payload: bytes) -> Any:
    """The schedule script called with ``payload`` as it is: no client-side check."""
    call = calls.schedule_call(s.keys, [TaskSpec(task_id, "f")], 1 << 20)
    args = list(call.args)
    args[4] = payload
    return s._drive(once(calls.Call(call.script, call.keys, args)))


@pytest.mark.parametrize(
    "value",
    [0, -5, 1.5, "1000", 2_592_000_001, True, [1000], 2**64 - 1, -(2**63)],
)
def test_the_script_refuses_a_bad_timeout_key_naming_it_and_writes_nothing(
    fast: Scheduler, value: Any
) -> None:
    before = fast.client.dbsize()
    payload = msgpack.packb({"fn": "f", "timeout": value})
    # The script's "BADARG payload of t ..." as the client raises it.
    with pytest.raises(InvalidArgument) as caught:
        raw_schedule(fast, "t", payload)
    assert caught.value.field == "payload"
    assert str(caught.value) == (
        "payload: of t field timeout must be an integer number of milliseconds in [1, 2592000000]"
    )
    assert fast.client.dbsize() == before


@pytest.mark.parametrize("encoded", [b"\x01", b"\xcd\x03\xe8", b"\xd2\x00\x00\x03\xe8", b"\xc0",
                                     b"\xcf\x00\x00\x00\x00\x9a\x7e\xc8\x00"])  # fmt: skip
def test_the_script_takes_a_timeout_in_any_msgpack_integer_encoding(
    fast: Scheduler, encoded: bytes
) -> None:
    # {"fn": "f", "timeout": <encoded>}
    payload = b"\x82\xa2fn\xa1f\xa7timeout" + encoded
    raw_schedule(fast, "t", payload)
    expected = {b"\x01": 0.001, b"\xc0": None}.get(encoded, 1.0)
    if encoded.startswith(b"\xcf"):
        expected = 2_592_000.0
    assert fast.status("t").timeout == expected


# --------------------------------------------------------------------------- schedules


def test_a_schedules_time_limit_goes_with_every_task_it_fires_and_ends_a_run_past_it(
    fast: Scheduler,
) -> None:
    past = time.time() - 1800
    sc = fast.add_schedule("s", "slow", interval=3600, start=past, timeout=LIMIT)
    assert sc.timeout == LIMIT
    run = fast.trigger("s")
    assert run is not None and fast.backfill("s", past - 60, past + 60, limit=1) == 1
    raw: Any = fast.client.hkeys(fast.keys.tasks)
    fired = sorted(k.decode() for k in raw)
    assert len(fired) == 2  # one triggered, one backfilled: both carry the limit
    for task_id in fired:
        payload = stored_payload(fast.client, fast.keys, task_id)
        assert payload is not None and msgpack.unpackb(payload)["timeout"] == 500
        if task_id != run:
            fast.cancel(task_id)

    worker = Worker(fast, {"slow": lambda: time.sleep(2.0)}, timeout_grace=GRACE)
    with running(worker):
        info = wait_state(fast, run, State.FAILED)
    assert info.error == ERROR and info.timeout == LIMIT


def test_a_schedule_without_a_time_limit_fires_tasks_without_the_key(fast: Scheduler) -> None:
    assert fast.add_schedule("plain", "f", interval=3600).timeout is None
    run = fast.trigger("plain")
    assert run is not None
    payload = stored_payload(fast.client, fast.keys, run)
    assert payload is not None and "timeout" not in msgpack.unpackb(payload)
    stored = fast.client.hget(fast.keys.schedules, "plain")
    assert isinstance(stored, bytes) and "timeout_ms" not in msgpack.unpackb(stored)


@pytest.mark.parametrize("junk", [0, -5, 1.5, "500", True, 2_592_000_001])
def test_a_stored_schedule_with_a_bad_time_limit_is_reported_unreadable_and_fires_nothing(
    fast: Scheduler, junk: Any
) -> None:
    fast.add_schedule("s", "f", interval=3600, timeout=LIMIT)
    stored = fast.client.hget(fast.keys.schedules, "s")
    assert isinstance(stored, bytes)
    fast.client.hset(fast.keys.schedules, "s", msgpack.packb({**msgpack.unpackb(stored),
                                                              "timeout_ms": junk}))  # fmt: skip
    with pytest.raises(ScriptError, match="timeout_ms"):
        fast.get_schedule("s")
    with pytest.raises(ScriptError, match="timeout_ms"):
        fast.trigger("s")
    assert fast.client.hlen(fast.keys.tasks) == 0


@pytest.mark.parametrize("bad", [0, -1, 0.0004, math.nan, math.inf, True, "5", 2_592_001])
def test_a_bad_schedule_timeout_is_refused_naming_it_and_nothing_is_written(
    api: Scheduler, bad: Any
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        api.add_schedule("s", "f", interval=60, timeout=bad)
    assert caught.value.field == "timeout"
    assert api.schedules() == []


def test_a_schedules_time_limit_reads_back_from_each_listing_and_survives_pause_and_resume(
    api: Scheduler,
) -> None:
    assert api.add_schedule("s", "f", interval=60, timeout=90).timeout == 90.0
    assert api.get_schedule("s").timeout == 90.0
    assert [sc.timeout for sc in api.schedules()] == [90.0]
    assert api.pause_schedule("s").timeout == 90.0
    assert api.resume_schedule("s").timeout == 90.0
    assert api.add_schedule("s", "f", interval=60).timeout is None  # replaced without one


def test_the_cli_adds_a_schedule_with_a_timeout_lists_it_and_refuses_a_bad_one_naming_it(
    redis_server: RedisServer, namespace: str, fast: Scheduler
) -> None:
    done = invoke(redis_server, namespace, "schedules", "add", "s", "--fn", "f",
                  "--interval", "1h", "--timeout", "1m30s")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert fast.get_schedule("s").timeout == 90.0
    listed = invoke(redis_server, namespace, "schedules", "list", "--json")
    assert [sc["timeout"] for sc in json.loads(listed.stdout)] == [90.0]
    table = invoke(redis_server, namespace, "schedules", "list").stdout.splitlines()
    assert "timeout" in table[0].split() and "90 s" in table[1]
    for bad in ("0", "-1", "31d", "nan"):
        refused = invoke(redis_server, namespace, "schedules", "add", "u", "--fn", "f",
                         "--interval", "1h", "--timeout", bad)  # fmt: skip
        assert_one_line_error(refused, "--timeout")
    assert [sc.name for sc in fast.schedules()] == ["s"]
