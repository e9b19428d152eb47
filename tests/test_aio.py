"""The asyncio scheduler shares scripts, keys and replies with the sync one."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from distsched import Outcome, Scheduler, State, TaskSpec, Wait
from distsched.aio import AsyncScheduler
from distsched.errors import (
    ClosedError,
    ConflictError,
    InvalidArgument,
    LeaseLostError,
    NotFoundError,
)
from distsched.model import TaskOptions, WaitReason
from tests.conftest import RedisServer, public_methods

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_async_scheduler_runs_the_same_lifecycle_as_the_sync_one(
    redis_server: RedisServer, namespace: str
) -> None:
    async def story() -> None:
        s = AsyncScheduler.from_url(redis_server.url, namespace=namespace, lease_s=5)
        try:
            # Same run_at: the higher priority goes first.
            await s.schedule("low", fn="f", priority=1, run_at=1_000.0)
            await s.schedule("high", fn="f", priority=9, args=(1, 2), run_at=1_000.0)
            first = await s.next("w")
            assert not isinstance(first, Wait)
            assert (first.task_id, first.args) == ("high", (1, 2))
            with pytest.raises(ConflictError):
                await s.schedule("high", fn="f")
            assert await s.cancel("high") is State.RUNNING
            assert await s.heartbeat(first) is True
            assert await s.confirm_cancel(first) is Outcome.APPLIED
            assert await s.confirm_cancel(first) is Outcome.DUPLICATE
            second = await s.next("w")
            assert not isinstance(second, Wait)
            assert await s.complete(second, {"n": 1}) is Outcome.APPLIED
            with pytest.raises(LeaseLostError):
                await s.heartbeat(second)
            info = await s.status("low")
            assert (info.state, info.result) == (State.SUCCEEDED, {"n": 1})
            assert await s.next("w") == Wait(WaitReason.EMPTY, None)
            with pytest.raises(NotFoundError):
                await s.cancel("nope")
            stats = await s.stats()
            assert stats["counts"]["succeeded"] == 1
            assert stats["counts"]["cancelled"] == 1
        finally:
            await s.close()
        with pytest.raises(ClosedError):
            await s.status("low")

    run(story())


def test_sync_scheduler_sees_what_the_async_one_wrote(
    redis_server: RedisServer, namespace: str
) -> None:
    async def produce() -> int:
        s = AsyncScheduler.from_url(redis_server.url, namespace=namespace)
        try:
            return await s.schedule("x", fn="f", delay=-1)
        finally:
            await s.close()

    version = run(produce())
    sync = Scheduler.from_url(redis_server.url, namespace=namespace)
    try:
        claim = sync.next("w")
        assert not isinstance(claim, Wait)
        assert (claim.task_id, claim.version) == ("x", version)
    finally:
        sync.close()


def test_async_status_names_the_root_cause_and_path_of_a_blocked_task(
    redis_server: RedisServer, namespace: str
) -> None:
    async def story() -> tuple[str, tuple[str, ...]]:
        s = AsyncScheduler.from_url(redis_server.url, namespace=namespace)
        try:
            await s.submit("a", fn="f")
            await s.submit("b", fn="f", deps=["a"])
            await s.submit("c", fn="f", deps=["b"])
            claim = await s.next("w")
            assert not isinstance(claim, Wait)
            assert await s.fail(claim, "boom") is Outcome.APPLIED
            info = await s.status("c")
            assert info.state is State.BLOCKED and info.blocked_by is not None
            return info.blocked_by.root, info.blocked_by.path
        finally:
            await s.close()

    assert run(story()) == ("a", ("a", "b", "c"))


def test_both_schedulers_have_the_same_public_methods_with_the_same_parameters() -> None:
    names = public_methods(Scheduler)
    assert names == public_methods(AsyncScheduler)
    for name in names:
        sync, aio = getattr(Scheduler, name), getattr(AsyncScheduler, name)
        assert inspect.signature(sync).parameters == inspect.signature(aio).parameters, name
        # Plain calls: they build an object and do no I/O.
        if name not in ("from_url", "batching"):
            assert inspect.iscoroutinefunction(aio), name


def test_async_from_url_is_a_plain_call_and_async_with_stores_max_running(
    redis_server: RedisServer, namespace: str
) -> None:
    async def story() -> None:
        s = AsyncScheduler.from_url(redis_server.url, namespace=namespace, max_running=3)
        assert isinstance(s, AsyncScheduler)
        async with s:
            assert (await s.stats())["max_running"] == 3
            assert await s.exists()
        with pytest.raises(ClosedError):
            await s.stats()

    run(story())


def test_sync_scheduler_is_a_context_manager_that_closes(
    redis_server: RedisServer, namespace: str
) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace, max_running=2) as s:
        assert s.stats()["max_running"] == 2
    with pytest.raises(ClosedError):
        s.stats()


def test_task_options_after_the_id_are_keyword_only_and_unknown_ones_are_refused(
    scheduler: Scheduler,
) -> None:
    with pytest.raises(TypeError):
        # mypy says call-arg, and arg-type as well when it reads Scheduler from its cache.
        scheduler.schedule("a", "f")  # type: ignore[call-arg, arg-type, unused-ignore]
    with pytest.raises(InvalidArgument) as refused:
        scheduler.schedule("a", fn="f", prority=3)  # type: ignore[call-arg]
    assert refused.value.field == "prority"
    assert not scheduler.exists()


def test_task_options_are_exactly_the_fields_of_taskspec() -> None:
    fields = [f.name for f in dataclasses.fields(TaskSpec) if f.name != "task_id"]
    assert sorted(fields) == sorted(TaskOptions.__annotations__)
