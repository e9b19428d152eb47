"""The asyncio ``AsyncScheduler``: the same operations as ``Scheduler``, awaited.

It drives the operations of :mod:`distsched.core` over a ``redis.asyncio``
client; every method has the name, parameters and meaning of its
:class:`~distsched.client.Scheduler` twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aredis
from redis.exceptions import RedisClusterException, RedisError

from distsched import core, limits
from distsched.client import BaseScheduler, client_from_url
from distsched.core import (
    Chores,
    Claim,
    Explanation,
    KeyInfo,
    Order,
    OrderSetting,
    Outcome,
    Overview,
    State,
    Stats,
    TaskInfo,
    TaskPage,
    TaskRow,
    TaskSpec,
    Wait,
)
from distsched.keys import Keys
from distsched.schedules import MAX_BACKFILL_SLOTS, Schedule, ScheduleOptions
from distsched.scripts import Registry
from distsched.subscription import AsyncWaitHub

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")


class AsyncScheduler(BaseScheduler):
    """``Scheduler`` for asyncio code: every method is a coroutine with the same meaning.

    Building it does no I/O (``AsyncScheduler.from_url(...)`` is a plain call); a
    ``max_running`` given here is stored, and ``stripes`` checked against the stored
    count, by the first call that reaches Redis, or on entering ``async with``.
    """

    def __init__(
        self,
        client: aredis.Redis | aredis.RedisCluster,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = core.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> None:
        super().__init__(namespace, lease_s, max_payload_bytes, stripes)
        limit = core.validate_max_running(max_running)
        self.client = client
        self._owns_client = False
        self._scripts = Registry(client)
        self._setup: core.Op[None] | None = None
        self._waits = AsyncWaitHub(client, self._ops.ended_channels, self.uses_sharded_pubsub)
        if limit is not None:
            self._setup = self._ops.set_max_running(limit)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = core.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> AsyncScheduler:
        """See :meth:`Scheduler.from_url`."""
        client = client_from_url(url, aredis.Redis.from_url, aredis.RedisCluster.from_url)
        scheduler = cls(client, namespace, lease_s, max_running, max_payload_bytes, stripes)
        scheduler._owns_client = True
        return scheduler

    async def __aenter__(self) -> AsyncScheduler:
        await self._drive(self._ops.noop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ I/O

    async def _drive(self, op: core.Op[T], gate: asyncio.Semaphore | None = None) -> T:
        self._check_open()
        self._in_flight += 1
        try:
            if self._setup is not None:
                setup, self._setup = self._setup, None
                await self._drive(setup)
            step = core.advance(op, None)
            while not isinstance(step, core.Done):
                step = core.advance(op, await self._send(step, gate))
            return step.value
        finally:
            self._in_flight -= 1
            if self._closed and self._in_flight == 0:
                await self._close_client()

    async def _send(self, request: core.Request, gate: asyncio.Semaphore | None = None) -> Any:
        try:
            if gate is None or isinstance(request, core.Listen):
                return await self._request(request)
            async with gate:
                return await self._request(request)
        except (RedisError, RedisClusterException) as exc:
            return core.failure(exc)

    async def _request(self, request: core.Request) -> Any:
        if isinstance(request, core.Sleep):
            return await asyncio.sleep(request.seconds)
        if isinstance(request, core.Listen):
            fired = await request.handle.wait(request.seconds)
            self._check_open()
            return fired
        if isinstance(request, core.Call):
            return await self._scripts[request.script](keys=request.keys, args=request.args)
        # redis-py's asyncio cluster client is left unable to load scripts after a
        # transaction: its reads go without MULTI (each command is still one slot's).
        atomic = request.atomic and not isinstance(self.client, aredis.RedisCluster)
        pipe = self.client.pipeline(transaction=atomic)
        for command in request.commands:
            pipe.execute_command(*command)
        return await pipe.execute()

    # ------------------------------------------------------------------ producers

    async def schedule(self, task_id: str, **options: Unpack[core.TaskOptions]) -> int:
        """See :meth:`Scheduler.schedule`."""
        return await self._drive(self._ops.schedule(task_id, options))

    async def submit(self, task_id: str, **options: Unpack[core.TaskOptions]) -> int:
        """See :meth:`Scheduler.submit`."""
        return await self._drive(self._ops.schedule(task_id, options))

    async def schedule_many(self, specs: Sequence[TaskSpec]) -> list[int]:
        """See :meth:`Scheduler.schedule_many`."""
        return await self._drive(self._ops.schedule_many(specs))

    async def submit_graph(self, specs: Sequence[TaskSpec]) -> list[int]:
        """See :meth:`Scheduler.submit_graph`."""
        return await self._drive(self._ops.submit_graph(specs))

    async def admit(self, task_id: str, **options: Unpack[core.TaskOptions]) -> core.Admitted:
        """See :meth:`Scheduler.admit`."""
        return await self._drive(self._ops.admit(task_id, options))

    async def admit_many(self, specs: Sequence[TaskSpec]) -> list[core.Admitted]:
        """See :meth:`Scheduler.admit_many`."""
        return await self._drive(self._ops.admit_many(specs))

    async def cancel(self, task_id: str) -> State:
        """See :meth:`Scheduler.cancel`."""
        return await self._drive(self._ops.cancel(task_id))

    async def retry(self, task_id: str, cascade: bool = True) -> int:
        """See :meth:`Scheduler.retry`."""
        return await self._drive(self._ops.retry(task_id, cascade))

    async def add_deps(
        self, task_id: str, deps: Sequence[str], allow_unknown: bool = False
    ) -> None:
        """See :meth:`Scheduler.add_deps`."""
        return await self._drive(self._ops.add_deps(task_id, deps, allow_unknown))

    async def settle(self, budget: int = core.PROPAGATE_BUDGET) -> int:
        """See :meth:`Scheduler.settle`."""
        return await self._drive(self._ops.settle(budget))

    # ------------------------------------------------------------------ schedules

    async def add_schedule(
        self, name: str, fn: str, **options: Unpack[ScheduleOptions]
    ) -> Schedule:
        """Add (or replace) the schedule ``name``: a task running ``fn`` at every slot.

        Give ``cron`` (with ``tz``, default ``"UTC"``) or ``interval`` seconds; the other
        options are those of :class:`~distsched.schedules.Schedule`. Each slot's task
        has the id ``<name>@<slot epoch ms>`` and is created by the workers exactly once.
        Replacing a schedule keeps its counters and last run. Returns the schedule.
        Cron needs the ``cron`` extra (``MissingExtraError`` otherwise).
        """
        return await self._drive(self._ops.add_schedule(name, fn, options))

    async def get_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.get_schedule`."""
        return await self._drive(self._ops.get_schedule(name))

    async def schedules(self) -> list[Schedule]:
        """See :meth:`Scheduler.schedules`."""
        return await self._drive(self._ops.schedules())

    async def remove_schedule(self, name: str) -> bool:
        """See :meth:`Scheduler.remove_schedule`."""
        return await self._drive(self._ops.remove_schedule(name))

    async def pause_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.pause_schedule`."""
        return await self._drive(self._ops.pause_schedule(name))

    async def resume_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.resume_schedule`."""
        return await self._drive(self._ops.resume_schedule(name))

    async def trigger(self, name: str) -> str | None:
        """See :meth:`Scheduler.trigger`."""
        return await self._drive(self._ops.trigger(name))

    async def backfill(
        self,
        name: str,
        start: float | datetime.datetime,
        end: float | datetime.datetime,
        limit: int = MAX_BACKFILL_SLOTS,
    ) -> int:
        """See :meth:`Scheduler.backfill`."""
        return await self._drive(self._ops.backfill(name, start, end, limit))

    async def next_fires(self, name: str, n: int = 5) -> list[float]:
        """See :meth:`Scheduler.next_fires`."""
        return await self._drive(self._ops.next_fires(name, n))

    async def fire_due(self, limit: int = core.FIRE_HEADS) -> int:
        """See :meth:`Scheduler.fire_due`."""
        return await self._drive(self._ops.fire_due(limit))

    async def wait(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        """See :meth:`Scheduler.wait` (one subscription per scheduler, a task of the loop
        of its first wait). At most ``subscription.WAIT_IO_CONCURRENCY`` waits of a
        scheduler talk to Redis at once, so that thousands gathered stay within
        redis.asyncio's connection pool."""
        # Checked before the shared subscription is started for nothing.
        core.validate_task_id(task_id)
        core.validate_wait_timeout(timeout)
        await self._drive(self._ops.noop())  # the stripes, whose channels it subscribes to
        async with self._waits.watch(task_id) as waiter:
            return await self._drive(self._ops.wait(task_id, timeout, waiter), self._waits.gate)

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """See :meth:`Scheduler.result`."""
        # Checked before the shared subscription is started for nothing.
        core.validate_task_id(task_id)
        core.validate_wait_timeout(timeout)
        await self._drive(self._ops.noop())  # the stripes, whose channels it subscribes to
        async with self._waits.watch(task_id) as waiter:
            return await self._drive(self._ops.result(task_id, timeout, waiter), self._waits.gate)

    # ------------------------------------------------------------------ workers

    async def claim(
        self,
        n: int,
        worker_id: str,
        *,
        listening: bool = False,
        request_id: str | None = None,
    ) -> tuple[list[Claim], Wait | None]:
        """See :meth:`Scheduler.claim`."""
        return await self._drive(self._ops.claim(n, worker_id, listening, request_id))

    async def hand_back_lost_claim(self, worker_id: str, request_id: str) -> int:
        """See :meth:`Scheduler.hand_back_lost_claim`."""
        return await self._drive(self._ops.hand_back_lost_claim(worker_id, request_id))

    async def ready(self, n: int, worker_id: str) -> list[Claim]:
        """See :meth:`Scheduler.ready`."""
        return await self._drive(self._ops.ready(n, worker_id))

    async def next(self, worker_id: str) -> Claim | Wait:
        """See :meth:`Scheduler.next`."""
        return await self._drive(self._ops.next(worker_id))

    async def heartbeat(self, claim: Claim) -> bool:
        """See :meth:`Scheduler.heartbeat`."""
        return await self._drive(self._ops.heartbeat(claim))

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[bool | None]:
        """See :meth:`Scheduler.heartbeat_many`."""
        return await self._drive(self._ops.heartbeat_many(claims))

    async def complete(self, claim: Claim, result: object = None) -> Outcome:
        """See :meth:`Scheduler.complete`."""
        return (await self._drive(self._ops.complete_many([(claim, result)])))[0]

    async def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """See :meth:`Scheduler.complete_many`."""
        return await self._drive(self._ops.complete_many(reports))

    async def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        """See :meth:`Scheduler.complete_encoded`."""
        return await self._drive(self._ops.complete_many(reports, encoded=True))

    async def fail(self, claim: Claim, error: object) -> Outcome:
        """See :meth:`Scheduler.fail`."""
        return (await self._drive(self._ops.fail_many([(claim, error)])))[0]

    async def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """See :meth:`Scheduler.fail_many`."""
        return await self._drive(self._ops.fail_many(reports))

    async def confirm_cancel(self, claim: Claim) -> Outcome:
        """See :meth:`Scheduler.confirm_cancel`."""
        return await self._drive(self._ops.confirm_cancel(claim))

    async def release(self, claims: Sequence[Claim], *, delay: float = 0.0) -> int:
        """See :meth:`Scheduler.release`."""
        return await self._drive(self._ops.release(claims, delay))

    async def wait_for_wake(self, timeout: float | None) -> bool:
        """See :meth:`Scheduler.wait_for_wake`."""
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        waiter = "wait:" + uuid.uuid4().hex
        channels = await self.wake_channels(waiter)
        sharded = await self.uses_sharded_pubsub()
        pubsub: Any = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            await (pubsub.ssubscribe if sharded else pubsub.subscribe)(*channels)
            while True:
                left = core.IDLE_RECHECK_S if deadline is None else deadline - loop.time()
                if left <= 0:
                    return False
                await self._drive(self._ops.idle(waiter))
                if await pubsub.get_message(timeout=min(left, core.IDLE_RECHECK_S)) is not None:
                    return True
        finally:
            with contextlib.suppress(RedisError):
                await self.leave(waiter)
            await pubsub.aclose()

    async def wake_channels(self, worker_id: str | None = None) -> list[str]:
        """See :meth:`Scheduler.wake_channels`."""
        return await self._drive(self._ops.wake_channels(worker_id))

    async def stripe_keys(self) -> list[Keys]:
        """See :meth:`Scheduler.stripe_keys`."""
        return await self._drive(self._ops.stripe_keys())

    async def leave(self, worker_id: str) -> bool:
        """See :meth:`Scheduler.leave`."""
        return await self._drive(self._ops.leave(worker_id))

    async def workers(self) -> list[core.WorkerInfo]:
        """See :meth:`Scheduler.workers`."""
        return await self._drive(self._ops.workers())

    async def register_worker(self, info: core.WorkerInfo) -> core.WorkerInfo:
        """See :meth:`Scheduler.register_worker`."""
        return await self._drive(self._ops.register_worker(info))

    async def unregister_worker(self, worker_id: str) -> bool:
        """See :meth:`Scheduler.unregister_worker`."""
        return await self._drive(self._ops.unregister_worker(worker_id))

    async def prune_workers(self) -> int:
        """See :meth:`Scheduler.prune_workers`."""
        return await self._drive(self._ops.prune_workers())

    async def uses_sharded_pubsub(self) -> bool:
        """See :meth:`Scheduler.uses_sharded_pubsub`."""
        return await self._drive(self._ops.uses_sharded_pubsub())

    # ------------------------------------------------------------------ housekeeping

    async def reap(self, limit: int = core.REAP_BATCH) -> int:
        """See :meth:`Scheduler.reap`."""
        return await self._drive(self._ops.reap(limit))

    async def expire(self, limit: int = core.EXPIRE_BATCH) -> int:
        """See :meth:`Scheduler.expire`."""
        return await self._drive(self._ops.expire(limit))

    async def expire_lease(self, task_id: str) -> int:
        """See :meth:`Scheduler.expire_lease`."""
        return await self._drive(self._ops.expire_lease(task_id))

    async def purge(self, limit: int = core.PURGE_BATCH) -> int:
        """See :meth:`Scheduler.purge`."""
        return await self._drive(self._ops.purge(limit))

    async def purge_tasks(self, task_ids: Sequence[str]) -> int:
        """See :meth:`Scheduler.purge_tasks`."""
        return await self._drive(self._ops.purge_tasks(task_ids))

    async def set_retention(self, retention_s: float) -> None:
        """See :meth:`Scheduler.set_retention`."""
        return await self._drive(self._ops.set_retention(retention_s))

    async def compact(self, budget: int = limits.MAX_COMPACT_BUDGET) -> int:
        """See :meth:`Scheduler.compact`."""
        return await self._drive(self._ops.compact(budget))

    async def housekeeping(self, purge_calls: int = 20) -> Chores:
        """See :meth:`Scheduler.housekeeping`."""
        return await self._drive(self._ops.housekeeping(purge_calls))

    async def payload_limit(self) -> int:
        """See :meth:`Scheduler.payload_limit`."""
        return await self._drive(self._ops.payload_limit())

    async def set_payload_limit(self, limit: int | None) -> int:
        """See :meth:`Scheduler.set_payload_limit`."""
        return await self._drive(self._ops.set_payload_limit(limit))

    async def set_max_running(self, max_running: int | None) -> None:
        """See :meth:`Scheduler.set_max_running`."""
        return await self._drive(self._ops.set_max_running(max_running))

    async def set_order(
        self, order: Order | str = Order.PRIORITY, aging: float = 60.0
    ) -> OrderSetting:
        """See :meth:`Scheduler.set_order`."""
        return await self._drive(self._ops.set_order(order, aging))

    async def order(self) -> OrderSetting:
        """See :meth:`Scheduler.order`."""
        return await self._drive(self._ops.order())

    async def set_key(
        self,
        key: str,
        cap: int | None = None,
        weight: int = 1,
        rate: int | None = None,
        per: float = 1.0,
    ) -> KeyInfo:
        """See :meth:`Scheduler.set_key`."""
        return await self._drive(self._ops.set_key(key, cap, weight, rate, per))

    async def set_default_key_cap(self, cap: int | None) -> None:
        """See :meth:`Scheduler.set_default_key_cap`."""
        return await self._drive(self._ops.set_default_key_cap(cap))

    async def key_info(self, key: str) -> KeyInfo:
        """See :meth:`Scheduler.key_info`."""
        return await self._drive(self._ops.key_info(key))

    async def fair_keys(self, limit: int = 100) -> list[KeyInfo]:
        """See :meth:`Scheduler.fair_keys`."""
        return await self._drive(self._ops.fair_keys(limit))

    # ------------------------------------------------------------------ inspection

    async def status(self, task_id: str) -> TaskInfo:
        """See :meth:`Scheduler.status`."""
        return await self._drive(self._ops.status(task_id))

    async def stats(self) -> Stats:
        """See :meth:`Scheduler.stats`."""
        return await self._drive(self._ops.stats())

    async def overview(self, soon_s: float = 5.0, scan: int = 100) -> Overview:
        """See :meth:`Scheduler.overview`."""
        return await self._drive(self._ops.overview(soon_s, scan))

    async def explain(self, task_id: str) -> Explanation:
        """See :meth:`Scheduler.explain`."""
        return await self._drive(self._ops.explain(task_id))

    async def leases(self) -> list[tuple[str, float]]:
        """See :meth:`Scheduler.leases`."""
        return await self._drive(self._ops.leases())

    async def server_time(self) -> float:
        """See :meth:`Scheduler.server_time`."""
        return await self._drive(self._ops.server_time())

    async def tasks(
        self,
        state: str | State,
        *,
        fn: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """See :meth:`Scheduler.tasks`."""
        return await self._drive(self._ops.tasks(state, fn, limit, cursor))

    async def throughput(self, minutes: int = 60) -> list[core.MinuteCount]:
        """See :meth:`Scheduler.throughput`."""
        return await self._drive(self._ops.throughput(minutes))

    async def scan_tasks(self, cursor: int = 0, count: int = 1000) -> tuple[int, list[TaskRow]]:
        """See :meth:`Scheduler.scan_tasks`."""
        return await self._drive(self._ops.scan_tasks(cursor, count))

    async def exists(self) -> bool:
        """See :meth:`Scheduler.exists`."""
        return await self._drive(self._ops.exists())

    async def clear(self) -> None:
        """See :meth:`Scheduler.clear`."""
        return await self._drive(self._ops.clear())

    async def close(self) -> None:
        """See :meth:`Scheduler.close`."""
        if self._closed:
            return
        self._closed = True
        await self._waits.close()
        if self._in_flight == 0:  # else the last call in flight closes the client when it ends
            await self._close_client()

    async def _close_client(self) -> None:
        if self._owns_client:
            await self.client.aclose()
