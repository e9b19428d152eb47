"""Typed tasks: a function made a handle schedules by its name with its own arguments,
and a worker given the handles (a Tasks, a module, a list) serves them. Real Redis."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
import redis
import redis.asyncio

from distsched import Scheduler, State, TaskSpec, Worker
from distsched.aio import AsyncScheduler
from distsched.errors import InvalidArgument
from distsched.tasks import AsyncTask, NotBoundError, Task, Tasks, served_functions
from tests.conftest import RedisServer, running
from tests.test_worker import wait_state


def make_tasks() -> tuple[Tasks, Task[..., str], AsyncTask[[int, int], int]]:
    tasks = Tasks()

    @tasks.task(max_attempts=3)
    def send_welcome(user_id: int, *, greeting: str = "welcome") -> str:
        return f"{greeting} {user_id}"

    @tasks.task(name="math.add")
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    return tasks, send_welcome, add


def test_a_handle_schedules_its_function_by_name_with_its_own_arguments(
    scheduler: Scheduler,
) -> None:
    tasks, send_welcome, add = make_tasks()
    tasks.bind(scheduler)
    send_welcome.schedule("w:1", 1, greeting="hello")
    add.schedule("sum", 2, 3)
    claims, _ = scheduler.claim(10, "w")
    found = {c.task_id: (c.fn, c.args, c.kwargs) for c in claims}
    assert found == {
        "w:1": ("send_welcome", (1,), {"greeting": "hello"}),
        "sum": ("math.add", (2, 3), {}),
    }
    # The decorator's options are the defaults of every call.
    assert scheduler.status("w:1").max_attempts == 3


def test_options_apply_to_calls_through_the_returned_handle_only(scheduler: Scheduler) -> None:
    tasks, send_welcome, _ = make_tasks()
    tasks.bind(scheduler)
    later = send_welcome.options(delay=3600, priority=7)
    later.schedule("later", 1)
    send_welcome.schedule("now", 2)
    soon, now = scheduler.status("later"), scheduler.status("now")
    assert soon.priority == 7 and soon.max_attempts == 3
    assert soon.run_at - scheduler.server_time() > 3000
    assert now.priority == 0 and now.run_at <= scheduler.server_time()
    # Calling the handle calls the function, here.
    assert later(5) == "welcome 5"


def test_a_worker_serves_the_handles_of_a_tasks_and_results_come_back(
    scheduler: Scheduler,
) -> None:
    tasks, send_welcome, add = make_tasks()
    tasks.bind(scheduler)
    send_welcome.schedule("w:42", 42)
    add.schedule("sum", 40, 2)
    with running(Worker(scheduler, tasks, concurrency=2)):
        assert send_welcome.result("w:42", timeout=20) == "welcome 42"
        assert add.result("sum", timeout=20) == 42


def test_a_worker_serves_the_handles_defined_in_a_module(scheduler: Scheduler) -> None:
    tasks, send_welcome, add = make_tasks()
    module = types.ModuleType("app")
    module.send_welcome = send_welcome  # type: ignore[attr-defined]
    module.add = add  # type: ignore[attr-defined]
    module.helper = len  # type: ignore[attr-defined]
    assert set(served_functions(module)) == {"send_welcome", "math.add"}
    assert served_functions([add]) == {"math.add": add.fn}
    # Handles inside a mapping are served as their functions (an async one on the loop).
    assert served_functions({"x": add}) == {"x": add.fn}
    tasks.bind(scheduler)
    add.schedule("sum", 1, 1)
    with running(Worker(scheduler, module)):
        assert add.result("sum", timeout=20) == 2


def test_handles_build_specs_for_batches(scheduler: Scheduler) -> None:
    _, send_welcome, add = make_tasks()
    specs = [send_welcome.spec("a", 1), add.options(deps=["a"]).spec("b", 1, 2)]
    assert specs[0] == TaskSpec("a", "send_welcome", args=[1], kwargs={}, max_attempts=3)
    scheduler.submit_graph(specs)
    assert scheduler.status("b").state is State.PENDING


def test_an_unbound_handle_says_how_to_bind_it() -> None:
    _, send_welcome, add = make_tasks()
    with pytest.raises(NotBoundError, match="bind"):
        send_welcome.schedule("x", 1)
    with pytest.raises(NotBoundError, match="AsyncScheduler"):
        asyncio.run(add.schedule_async("x", 1, 2))


def test_names_and_options_are_checked_when_the_task_is_made(scheduler: Scheduler) -> None:
    tasks = Tasks()

    def f() -> None: ...

    tasks.task(f)
    with pytest.raises(InvalidArgument, match="name"):
        tasks.task(f)  # the same name twice
    with pytest.raises(InvalidArgument, match="name"):
        tasks.task(lambda: None)
    with pytest.raises(InvalidArgument, match="max_attempts"):
        tasks.task(name="g", max_attempts=0)(f)
    with pytest.raises(InvalidArgument, match="args"):
        tasks.task(name="h", **{"args": [1]})(f)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match="functions"):
        Worker(scheduler, 42)  # type: ignore[arg-type]


def test_an_async_producer_schedules_and_reads_results_through_its_handles(
    redis_server: RedisServer, namespace: str
) -> None:
    tasks, send_welcome, add = make_tasks()
    sync = Scheduler(redis_server.client(), namespace=namespace)

    async def produce() -> tuple[str, int]:
        s = AsyncScheduler(redis.asyncio.Redis(port=redis_server.port), namespace=namespace)
        try:
            tasks.bind(s)
            await send_welcome.schedule_async("w", 7)
            await add.schedule_async("sum", 3, 4)
            return await send_welcome.result_async("w", 20), await add.result_async("sum", 20)
        finally:
            await s.close()
            await s.client.aclose()

    try:
        with running(Worker(sync, tasks)):
            assert asyncio.run(produce()) == ("welcome 7", 7)
    finally:
        sync.close()
        sync.client.close()


def test_a_failed_handle_result_raises_as_the_scheduler_does(scheduler: Scheduler) -> None:
    tasks = Tasks(scheduler)

    @tasks.task
    def boom(n: int) -> Any:
        raise ValueError(f"bad {n}")

    from distsched.errors import TaskFailed

    boom.schedule("b", 3)
    with running(Worker(scheduler, tasks)):
        wait_state(scheduler, "b", State.FAILED)
        with pytest.raises(TaskFailed, match="bad 3"):
            boom.result("b", timeout=5)
