"""Batching producers: concurrent schedule calls sent together, each caller getting its
own version or its own error (distsched/batching.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any

import pytest

from distsched import Scheduler, State
from distsched.aio import AsyncScheduler
from distsched.batching import Waiting, deliver, next_batch
from distsched.errors import ClosedError, ConflictError, InvalidArgument, NotFoundError
from distsched.model import Admitted, TaskSpec
from tests.conftest import RedisServer, script_calls

THREADS = 32
EACH = 40


def test_calls_from_many_threads_go_in_fewer_script_calls_each_returning_its_own_version(
    own_redis: RedisServer,
) -> None:
    client = own_redis.client()
    with Scheduler(client, namespace="b") as s:
        s.schedule("warm", fn="f")
        before = script_calls(client)
        got: dict[str, int] = {}
        lock = threading.Lock()
        start = threading.Barrier(THREADS)

        def produce(t: int, producer: Any) -> None:
            start.wait()
            for i in range(EACH):
                version = producer.schedule(f"t{t}-{i}", fn="f", args=[t, i])
                with lock:
                    got[f"t{t}-{i}"] = version

        with s.batching() as producer:
            threads = [threading.Thread(target=produce, args=(t, producer)) for t in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        calls = script_calls(client) - before
        assert len(got) == THREADS * EACH
        assert len(set(got.values())) == THREADS * EACH
        # Batches, not one call per task.
        assert calls < THREADS * EACH / 4
        for task_id, version in got.items():
            info = s.status(task_id)
            assert (info.state, info.version) == (State.READY, version)
        claimed: dict[str, tuple[Any, ...]] = {}
        while batch := s.ready(500, "w"):
            claimed.update((c.task_id, c.args) for c in batch)
        del claimed["warm"]
        assert claimed == {f"t{t}-{i}": (t, i) for t in range(THREADS) for i in range(EACH)}
    client.close()


def run_together(producer: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each call in its own thread, all started together: each one's version or error."""
    out: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def one(i: int) -> None:
        task_id, options = calls[i]
        start.wait()
        try:
            out[i] = producer.schedule(task_id, **options)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def test_a_bad_task_in_a_batch_fails_its_own_caller_only(scheduler: Scheduler) -> None:
    # A window long enough that the calls go in one batch.
    with scheduler.batching(window_s=0.3) as producer:
        out = run_together(
            producer,
            [("a", {"fn": "f"}), ("b", {"fn": "f", "priority": 2**40}), ("c", {"fn": "f"})],
        )
    assert isinstance(out[1], InvalidArgument) and "priority" in str(out[1])
    assert isinstance(out[0], int) and isinstance(out[2], int)
    assert scheduler.status("a").version == out[0]
    assert scheduler.status("c").version == out[2]
    with pytest.raises(NotFoundError):
        scheduler.status("b")


def test_a_running_id_in_a_batch_fails_its_own_caller_only(scheduler: Scheduler) -> None:
    scheduler.schedule("busy", fn="f")
    [claim] = scheduler.ready(1, "w")
    with scheduler.batching(window_s=0.3) as producer:
        out = run_together(
            producer, [("x", {"fn": "f"}), ("busy", {"fn": "f"}), ("y", {"fn": "f", "priority": 3})]
        )
    assert isinstance(out[1], ConflictError)
    assert scheduler.status("busy").version == claim.version
    assert scheduler.status("x").state is State.READY
    assert scheduler.status("y").state is State.READY


def test_calls_for_one_id_are_applied_in_the_order_they_arrived(scheduler: Scheduler) -> None:
    with scheduler.batching(window_s=0.2) as producer:
        first: list[int] = []
        thread = threading.Thread(
            target=lambda: first.append(producer.schedule("x", fn="f", args=[1]))
        )
        thread.start()
        # The first call is made (queued, or already sent) before the second.
        while not producer._queue and not first:
            time.sleep(0.001)
        second = producer.schedule("x", fn="f", args=[2])
        thread.join()
    assert second == first[0] + 1
    [claim] = scheduler.ready(5, "w")
    assert (claim.version, claim.args) == (second, (2,))


def test_close_sends_what_was_accepted_and_refuses_later_calls(scheduler: Scheduler) -> None:
    producer = scheduler.batching(window_s=0.5)
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(producer.schedule("a", fn="f")))
    thread.start()
    while not producer._queue and not out:
        time.sleep(0.001)
    producer.close()
    thread.join()
    assert scheduler.status("a").version == out[0]
    with pytest.raises(ClosedError):
        producer.schedule("b", fn="f")


def test_the_asyncio_producer_batches_calls_from_many_coroutines(own_redis: RedisServer) -> None:
    async def main() -> None:
        async with AsyncScheduler.from_url(own_redis.url, namespace="ab") as s:
            await s.schedule("warm", fn="f")
            sync = own_redis.client()
            before = script_calls(sync)
            async with s.batching() as producer:
                versions = await asyncio.gather(
                    *(producer.schedule(f"t{i}", fn="f", args=[i]) for i in range(300))
                )
                bad = await asyncio.gather(
                    producer.schedule("ok", fn="f"),
                    producer.schedule("bad", fn="f", max_attempts=0),
                    return_exceptions=True,
                )
            calls = script_calls(sync) - before
            sync.close()
            assert len(set(versions)) == 300
            assert calls < 300 / 4
            for i in (0, 150, 299):
                assert (await s.status(f"t{i}")).version == versions[i]
            assert isinstance(bad[0], int) and isinstance(bad[1], InvalidArgument)
            with pytest.raises(NotFoundError):
                await s.status("bad")
            with pytest.raises(ClosedError):
                await producer.schedule("late", fn="f")

    asyncio.run(main())


def test_a_batch_ends_before_an_id_it_already_holds_and_at_its_size() -> None:
    queue: deque[Waiting[None]] = deque(
        Waiting(TaskSpec(task_id, "f"), None) for task_id in ["a", "b", "a", "c"]
    )
    assert [w.spec.task_id for w in next_batch(queue, 10)] == ["a", "b"]
    assert [w.spec.task_id for w in next_batch(queue, 1)] == ["a"]
    assert [w.spec.task_id for w in next_batch(queue, 10)] == ["c"]


def test_an_error_of_the_whole_batch_goes_to_every_caller_and_one_tasks_fault_is_split() -> None:
    specs = [TaskSpec("a", "f"), TaskSpec("b", "f")]
    steps = deliver(specs)
    assert next(steps) == specs
    lost = ConnectionError("gone")
    with pytest.raises(StopIteration) as stop:
        steps.send(lost)
    assert stop.value.value == [lost, lost]
    steps = deliver(specs)
    next(steps)
    assert steps.send(ConflictError("running a")) == [specs[0]]
    assert steps.send(ConflictError("running a")) == [specs[1]]
    with pytest.raises(StopIteration) as stop:
        steps.send([Admitted("b", 3, True)])
    first, second = stop.value.value
    assert isinstance(first, ConflictError) and second == Admitted("b", 3, True)
