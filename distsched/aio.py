"""The asyncio ``AsyncScheduler``: the same operations as ``Scheduler``, awaited.

It drives the operations of :mod:`distsched.ops` over a ``redis.asyncio``
client; every method has the name, parameters and meaning of its
:class:`~distsched.client.Scheduler` twin.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import RedisClusterException, RedisError

from distsched import limits, model, validate
from distsched.batching import AsyncBatchingProducer
from distsched.client import BaseScheduler, client_from_url, slot_owner
from distsched.model import (
    Chores,
    Claim,
    Duration,
    Explanation,
    KeyInfo,
    Order,
    OrderSetting,
    Outcome,
    Overview,
    Spawn,
    State,
    Stats,
    TaskInfo,
    TaskPage,
    TaskRow,
    TaskSpec,
    Wait,
)
from distsched.ops import failures as failure_ops
from distsched.ops import protocol
from distsched.ops.namespace import Ops
from distsched.retention import RetentionPlan
from distsched.schedules import MAX_BACKFILL_SLOTS, Schedule, ScheduleOptions
from distsched.scripts import Registry
from distsched.subscription import AsyncWaitHub
from distsched.wire import calls

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
        lease_s: Duration = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> None:
        super().__init__(namespace, lease_s, max_payload_bytes, stripes)
        limit = validate.validate_max_running(max_running)
        self.client = client
        if isinstance(client, aredis.RedisCluster):
            self._ops.owner = slot_owner(client.nodes_manager)
        self._owns_client = False
        self._scripts = Registry(client)
        self._setup: protocol.Op[None] | None = None
        self._waits = AsyncWaitHub(client, self._ops.ended_channels, self._sharded_pubsub)
        if limit is not None:
            self._setup = self._ops.set_max_running(limit)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "default",
        lease_s: Duration = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> AsyncScheduler:
        """See :meth:`Scheduler.from_url`."""
        client = client_from_url(
            url,
            aredis.Redis.from_url,
            aredis.RedisCluster.from_url,
            ClusterNode,
        )
        scheduler = cls(client, namespace, lease_s, max_running, max_payload_bytes, stripes)
        scheduler._owns_client = True
        return scheduler

    async def __aenter__(self) -> AsyncScheduler:
        await self._drive(self._ops.call(Ops.noop))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ I/O

    async def _sharded_pubsub(self) -> bool:
        return await self._drive(self._ops.call(Ops.uses_sharded_pubsub))

    async def _drive(self, op: protocol.Op[T], gate: asyncio.Semaphore | None = None) -> T:
        self._check_open()
        self._in_flight += 1
        try:
            if self._setup is not None:
                setup, self._setup = self._setup, None
                await self._drive(setup)
            step = protocol.advance(op, None)
            while not isinstance(step, protocol.Done):
                step = protocol.advance(op, await self._send(step, gate))
            return step.value
        finally:
            self._in_flight -= 1
            if self._closed and self._in_flight == 0:
                await self._close_client()

    async def _send(self, request: protocol.Request, gate: asyncio.Semaphore | None = None) -> Any:
        try:
            if gate is None or isinstance(request, protocol.Listen):
                return await self._request(request)
            async with gate:
                return await self._request(request)
        except (RedisError, RedisClusterException) as exc:
            return protocol.failure(exc)

    async def _request(self, request: protocol.Request) -> Any:
        if isinstance(request, protocol.Sleep):
            return await asyncio.sleep(request.seconds)
        if isinstance(request, protocol.Listen):
            fired = await request.handle.wait(request.seconds)
            self._check_open()
            return fired
        if isinstance(request, calls.Call):
            return await self._scripts[request.script](keys=request.keys, args=request.args)
        # redis-py's asyncio cluster client is left unable to load scripts after a
        # transaction: its reads go without MULTI (each command is still one slot's).
        atomic = request.atomic and not isinstance(self.client, aredis.RedisCluster)
        pipe = self.client.pipeline(transaction=atomic)
        for command in request.commands:
            pipe.execute_command(*command)
        return await pipe.execute()

    # ------------------------------------------------------------------ producers

    async def schedule(self, task_id: str, **options: Unpack[model.TaskOptions]) -> int:
        """See :meth:`Scheduler.schedule`."""
        return await self._drive(self._ops.schedule(task_id, options))

    async def submit(self, task_id: str, **options: Unpack[model.TaskOptions]) -> int:
        """See :meth:`Scheduler.submit`."""
        return await self._drive(self._ops.schedule(task_id, options))

    async def schedule_many(self, specs: Sequence[TaskSpec]) -> list[int]:
        """See :meth:`Scheduler.schedule_many`."""
        return await self._drive(self._ops.schedule_many(specs))

    async def submit_graph(self, specs: Sequence[TaskSpec]) -> list[int]:
        """See :meth:`Scheduler.submit_graph`."""
        return await self._drive(self._ops.submit_graph(specs))

    async def admit(self, task_id: str, **options: Unpack[model.TaskOptions]) -> model.Admitted:
        """See :meth:`Scheduler.admit`."""
        return await self._drive(self._ops.admit(task_id, options))

    async def admit_many(self, specs: Sequence[TaskSpec]) -> list[model.Admitted]:
        """See :meth:`Scheduler.admit_many`."""
        return await self._drive(self._ops.admit_many(specs))

    def batching(self, window_s: float = 0.0, max_tasks: int = 500) -> AsyncBatchingProducer:
        """See :meth:`Scheduler.batching`: ``await producer.schedule(...)`` from many
        coroutines of one event loop."""
        return AsyncBatchingProducer(self, window_s, max_tasks)

    async def cancel(self, task_id: str) -> State:
        """See :meth:`Scheduler.cancel`."""
        return await self._drive(self._ops.call(Ops.cancel, task_id))

    async def amend(
        self,
        task_id: str,
        *,
        priority: int | None = None,
        run_at: float | datetime.datetime | None = None,
        delay: model.Duration | None = None,
        max_attempts: int | None = None,
        version: int | None = None,
    ) -> model.Changed:
        """See :meth:`Scheduler.amend`."""
        return await self._drive(
            self._ops.call(Ops.amend, task_id, priority, run_at, delay, max_attempts, version)
        )

    async def pause_task(self, task_id: str, version: int | None = None) -> model.Changed:
        """See :meth:`Scheduler.pause_task`."""
        return await self._drive(self._ops.call(Ops.pause_task, task_id, version))

    async def resume_task(self, task_id: str, version: int | None = None) -> model.Changed:
        """See :meth:`Scheduler.resume_task`."""
        return await self._drive(self._ops.call(Ops.resume_task, task_id, version))

    async def paused_tasks(self, limit: int = 100) -> list[TaskInfo]:
        """See :meth:`Scheduler.paused_tasks`."""
        return await self._drive(self._ops.call(Ops.paused_tasks, limit))

    async def cancel_workflow(self, task_id: str) -> int:
        """See :meth:`Scheduler.cancel_workflow`."""
        return await self._drive(self._ops.call(Ops.cancel_workflow, task_id))

    async def retry(self, task_id: str, cascade: bool = True) -> int:
        """See :meth:`Scheduler.retry`."""
        return await self._drive(self._ops.call(Ops.retry, task_id, cascade))

    async def create_waitpoint(
        self,
        task_id: str,
        timeout: Duration,
        *,
        deps: Sequence[str] = (),
        optional_deps: Sequence[str] = (),
        allow_unknown: bool = False,
        dedupe: bool = False,
        fn: str = "",
        kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """See :meth:`Scheduler.create_waitpoint`."""
        return await self._drive(
            self._ops.schedule(
                task_id,
                {
                    "waitpoint": timeout,
                    "deps": deps,
                    "optional_deps": optional_deps,
                    "allow_unknown": allow_unknown,
                    "dedupe": dedupe,
                    "fn": fn,
                    "kwargs": kwargs,
                },
            )
        )

    async def complete_waitpoint(
        self, task_id: str, payload: object = None, *, version: int | None = None, by: str = ""
    ) -> Outcome:
        """See :meth:`Scheduler.complete_waitpoint`."""
        return await self._drive(
            self._ops.call(Ops.complete_waitpoint, task_id, payload, version, by)
        )

    async def fail_waitpoint(
        self, task_id: str, error: str, *, version: int | None = None, by: str = ""
    ) -> Outcome:
        """See :meth:`Scheduler.fail_waitpoint`."""
        return await self._drive(self._ops.call(Ops.fail_waitpoint, task_id, error, version, by))

    async def add_deps(
        self, task_id: str, deps: Sequence[str], allow_unknown: bool = False
    ) -> None:
        """See :meth:`Scheduler.add_deps`."""
        return await self._drive(self._ops.add_deps(task_id, deps, allow_unknown))

    async def dependency_results(
        self, task_id: str, ids: Sequence[str] | None = None
    ) -> dict[str, model.DependencyResult]:
        """See :meth:`Scheduler.dependency_results`."""
        return await self._drive(self._ops.call(Ops.dependency_results, task_id, ids))

    async def settle(self, budget: int = calls.PROPAGATE_BUDGET) -> int:
        """See :meth:`Scheduler.settle`."""
        return await self._drive(self._ops.call(Ops.settle, budget))

    # ------------------------------------------------------------------ schedules

    async def add_schedule(
        self, name: str, fn: str, **options: Unpack[ScheduleOptions]
    ) -> Schedule:
        """Add (or replace) the schedule ``name``: a task running ``fn`` at every slot.

        Give ``cron`` (with ``tz``, default ``"UTC"``) or ``interval`` seconds; the other
        options are those of :class:`~distsched.schedules.Schedule`. Each slot's task
        has the id ``<name>@<slot epoch ms>`` (in a striped namespace, ``{<name>}@<slot
        epoch ms>`` unless the name has a ``{tag}``, so that the task shares the
        schedule's stripe) and is created by the workers exactly once. Replacing a
        schedule keeps its counters and last run. Returns the schedule. Cron needs the
        ``cron`` extra (``MissingExtraError`` otherwise).
        """
        return await self._drive(self._ops.call(Ops.add_schedule, name, fn, options))

    async def get_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.get_schedule`."""
        return await self._drive(self._ops.call(Ops.get_schedule, name))

    async def schedules(self) -> list[Schedule]:
        """See :meth:`Scheduler.schedules`."""
        return await self._drive(self._ops.call(Ops.schedules))

    async def remove_schedule(self, name: str) -> bool:
        """See :meth:`Scheduler.remove_schedule`."""
        return await self._drive(self._ops.call(Ops.remove_schedule, name))

    async def pause_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.pause_schedule`."""
        return await self._drive(self._ops.call(Ops.pause_schedule, name))

    async def resume_schedule(self, name: str) -> Schedule:
        """See :meth:`Scheduler.resume_schedule`."""
        return await self._drive(self._ops.call(Ops.resume_schedule, name))

    async def trigger(self, name: str) -> str | None:
        """See :meth:`Scheduler.trigger`."""
        return await self._drive(self._ops.call(Ops.trigger, name))

    async def backfill(
        self,
        name: str,
        start: float | datetime.datetime,
        end: float | datetime.datetime,
        limit: int = MAX_BACKFILL_SLOTS,
    ) -> int:
        """See :meth:`Scheduler.backfill`."""
        return await self._drive(self._ops.call(Ops.backfill, name, start, end, limit))

    async def next_fires(self, name: str, n: int = 5) -> list[float]:
        """See :meth:`Scheduler.next_fires`."""
        return await self._drive(self._ops.call(Ops.next_fires, name, n))

    async def fire_due(self, limit: int = calls.FIRE_HEADS) -> int:
        """See :meth:`Scheduler.fire_due`."""
        return await self._drive(self._ops.fire_due(limit))

    async def wait(
        self,
        task_id: str,
        timeout: Duration | None = None,
        *,
        on_progress: Callable[[model.Progress], object] | None = None,
    ) -> TaskInfo:
        """See :meth:`Scheduler.wait` (one subscription per scheduler, a task of the loop
        of its first wait). At most ``subscription.WAIT_IO_CONCURRENCY`` waits of a
        scheduler talk to Redis at once, so that thousands gathered stay within
        redis.asyncio's connection pool. ``on_progress`` is called on the loop."""
        # Checked before the shared subscription is started for nothing.
        validate.validate_task_id(task_id)
        validate.validate_wait_timeout(timeout)
        await self._drive(self._ops.call(Ops.noop))  # the stripes, whose channels it subscribes to
        async with self._waits.watch(task_id) as waiter:
            return await self._drive(
                self._ops.call(Ops.wait, task_id, timeout, waiter, on_progress), self._waits.gate
            )

    async def result(
        self,
        task_id: str,
        timeout: Duration | None = None,
        *,
        on_progress: Callable[[model.Progress], object] | None = None,
    ) -> Any:
        """See :meth:`Scheduler.result`."""
        # Checked before the shared subscription is started for nothing.
        validate.validate_task_id(task_id)
        validate.validate_wait_timeout(timeout)
        await self._drive(self._ops.call(Ops.noop))  # the stripes, whose channels it subscribes to
        async with self._waits.watch(task_id) as waiter:
            return await self._drive(
                self._ops.call(Ops.result, task_id, timeout, waiter, on_progress), self._waits.gate
            )

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

    async def ready(self, n: int, worker_id: str) -> list[Claim]:
        """See :meth:`Scheduler.ready`."""
        return await self._drive(self._ops.ready(n, worker_id))

    async def next(self, worker_id: str) -> Claim | Wait:
        """See :meth:`Scheduler.next`."""
        return await self._drive(self._ops.next(worker_id))

    async def report_progress(self, claim: Claim, fraction: float, note: str = "") -> Outcome:
        """See :meth:`Scheduler.report_progress`."""
        return await self._drive(self._ops.call(Ops.report_progress, claim, fraction, note))

    async def save_checkpoint(self, claim: Claim, value: object) -> Outcome:
        """See :meth:`Scheduler.save_checkpoint`."""
        return await self._drive(self._ops.call(Ops.save_checkpoint, claim, value))

    async def checkpoint(self, claim: Claim) -> Any:
        """See :meth:`Scheduler.checkpoint`."""
        return await self._drive(self._ops.call(Ops.checkpoint, claim))

    async def heartbeat(self, claim: Claim) -> bool:
        """See :meth:`Scheduler.heartbeat`."""
        return await self._drive(self._ops.call(Ops.heartbeat, claim))

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[bool | None]:
        """See :meth:`Scheduler.heartbeat_many`."""
        return await self._drive(self._ops.call(Ops.heartbeat_many, claims))

    async def complete(self, claim: Claim, result: object = None) -> Outcome:
        """See :meth:`Scheduler.complete`."""
        return (await self._drive(self._ops.call(Ops.complete_many, [(claim, result)])))[0]

    async def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """See :meth:`Scheduler.complete_many`."""
        return await self._drive(self._ops.call(Ops.complete_many, reports))

    async def spawn(self, claim: Claim, spawn: Spawn) -> Outcome:
        """See :meth:`Scheduler.spawn`."""
        return await self._drive(self._ops.spawn(claim, spawn))

    async def fail(self, claim: Claim, error: object) -> Outcome:
        """See :meth:`Scheduler.fail`."""
        return (await self._drive(self._ops.call(Ops.fail_many, [(claim, error)])))[0]

    async def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """See :meth:`Scheduler.fail_many`."""
        return await self._drive(self._ops.call(Ops.fail_many, reports))

    async def confirm_cancel(self, claim: Claim) -> Outcome:
        """See :meth:`Scheduler.confirm_cancel`."""
        return await self._drive(self._ops.call(Ops.confirm_cancel, claim))

    async def release(self, claims: Sequence[Claim], *, delay: Duration = 0.0) -> int:
        """See :meth:`Scheduler.release`."""
        return await self._drive(self._ops.call(Ops.release, claims, delay))

    async def leave(self, worker_id: str) -> bool:
        """See :meth:`Scheduler.leave`."""
        return await self._drive(self._ops.call(Ops.leave, worker_id))

    async def workers(self) -> list[model.WorkerInfo]:
        """See :meth:`Scheduler.workers`."""
        return await self._drive(self._ops.call(Ops.workers))

    # ------------------------------------------------------------------ housekeeping

    async def reap(self, limit: int = calls.REAP_BATCH) -> int:
        """See :meth:`Scheduler.reap`."""
        return await self._drive(self._ops.call(Ops.reap, limit))

    async def expire(self, limit: int = calls.EXPIRE_BATCH) -> int:
        """See :meth:`Scheduler.expire`."""
        return await self._drive(self._ops.call(Ops.expire, limit))

    async def expire_lease(self, task_id: str) -> int:
        """See :meth:`Scheduler.expire_lease`."""
        return await self._drive(self._ops.call(Ops.expire_lease, task_id))

    async def purge(self, limit: int = calls.PURGE_BATCH) -> int:
        """See :meth:`Scheduler.purge`."""
        return await self._drive(self._ops.call(Ops.purge, limit))

    async def purge_tasks(self, task_ids: Sequence[str]) -> int:
        """See :meth:`Scheduler.purge_tasks`."""
        return await self._drive(self._ops.call(Ops.purge_tasks, task_ids))

    async def set_retention(self, retention_s: Duration) -> None:
        """See :meth:`Scheduler.set_retention`."""
        return await self._drive(self._ops.call(Ops.set_retention, retention_s))

    async def compact(self, budget: int = limits.MAX_COMPACT_BUDGET) -> int:
        """See :meth:`Scheduler.compact`."""
        return await self._drive(self._ops.call(Ops.compact, budget))

    async def housekeeping(self, purge_calls: int = 20) -> Chores:
        """See :meth:`Scheduler.housekeeping`."""
        return await self._drive(self._ops.call(Ops.housekeeping, purge_calls))

    async def payload_limit(self) -> int:
        """See :meth:`Scheduler.payload_limit`."""
        return await self._drive(self._ops.call(Ops.payload_limit))

    async def set_payload_limit(self, limit: int | None) -> int:
        """See :meth:`Scheduler.set_payload_limit`."""
        return await self._drive(self._ops.call(Ops.set_payload_limit, limit))

    async def set_max_running(self, max_running: int | None) -> None:
        """See :meth:`Scheduler.set_max_running`."""
        return await self._drive(self._ops.set_max_running(max_running))

    async def set_order(
        self, order: Order | str = Order.PRIORITY, aging: Duration = 60.0
    ) -> OrderSetting:
        """See :meth:`Scheduler.set_order`."""
        return await self._drive(self._ops.call(Ops.set_order, order, aging))

    async def order(self) -> OrderSetting:
        """See :meth:`Scheduler.order`."""
        return await self._drive(self._ops.call(Ops.order))

    async def set_key(
        self,
        key: str,
        cap: int | None = None,
        weight: int = 1,
        rate: int | None = None,
        per: Duration = 1.0,
    ) -> KeyInfo:
        """See :meth:`Scheduler.set_key`."""
        return await self._drive(self._ops.call(Ops.set_key, key, cap, weight, rate, per))

    async def set_default_key_cap(self, cap: int | None) -> None:
        """See :meth:`Scheduler.set_default_key_cap`."""
        return await self._drive(self._ops.call(Ops.set_default_key_cap, cap))

    async def key_info(self, key: str) -> KeyInfo:
        """See :meth:`Scheduler.key_info`."""
        return await self._drive(self._ops.call(Ops.key_info, key))

    async def fair_keys(self, limit: int = 100) -> list[KeyInfo]:
        """See :meth:`Scheduler.fair_keys`."""
        return await self._drive(self._ops.fair_keys(limit))

    # ------------------------------------------------------------------ inspection

    async def status(self, task_id: str) -> TaskInfo:
        """See :meth:`Scheduler.status`."""
        return await self._drive(self._ops.call(Ops.status, task_id))

    async def progress(self, task_id: str) -> model.Progress | None:
        """See :meth:`Scheduler.progress`."""
        return await self._drive(self._ops.call(Ops.progress, task_id))

    async def stats(self) -> Stats:
        """See :meth:`Scheduler.stats`."""
        return await self._drive(self._ops.stats())

    async def overview(self, soon_s: Duration = 5.0, scan: int = 100) -> Overview:
        """See :meth:`Scheduler.overview`."""
        return await self._drive(self._ops.overview(soon_s, scan))

    async def explain(self, task_id: str) -> Explanation:
        """See :meth:`Scheduler.explain`."""
        return await self._drive(self._ops.call(Ops.explain, task_id))

    async def unserved(self, fn: str) -> str | None:
        """See :meth:`Scheduler.unserved`."""
        return await self._drive(self._ops.unserved(fn))

    async def leases(self) -> list[tuple[str, float]]:
        """See :meth:`Scheduler.leases`."""
        return await self._drive(self._ops.call(Ops.leases))

    async def server_time(self) -> float:
        """See :meth:`Scheduler.server_time`."""
        return await self._drive(self._ops.call(Ops.server_time))

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

    async def failures(
        self, *, cursor: str | None = None, count: int = failure_ops.FAILURES_BATCH_DEFAULT
    ) -> model.FailurePage:
        """See :meth:`Scheduler.failures`."""
        return await self._drive(failure_ops.failures(self._ops, cursor, count))

    async def retry_failures(
        self,
        error: str,
        *,
        cascade: bool = True,
        batch: int = failure_ops.FAILURES_BATCH_DEFAULT,
        limit: int | None = None,
    ) -> model.BulkOutcome:
        """See :meth:`Scheduler.retry_failures`."""
        return await self._drive(
            failure_ops.retry_failures(self._ops, error, cascade, batch, limit)
        )

    async def purge_failures(
        self,
        error: str,
        *,
        batch: int = failure_ops.FAILURES_BATCH_DEFAULT,
        limit: int | None = None,
    ) -> model.BulkOutcome:
        """See :meth:`Scheduler.purge_failures`."""
        return await self._drive(failure_ops.purge_failures(self._ops, error, batch, limit))

    async def throughput(self, minutes: int = 60) -> list[model.MinuteCount]:
        """See :meth:`Scheduler.throughput`."""
        return await self._drive(self._ops.call(Ops.throughput, minutes))

    async def retention_plan(self, sample: int = 64) -> RetentionPlan:
        """See :meth:`Scheduler.retention_plan`."""
        return await self._drive(self._ops.call(Ops.retention_plan, sample))

    async def scan_tasks(self, cursor: int = 0, count: int = 1000) -> tuple[int, list[TaskRow]]:
        """See :meth:`Scheduler.scan_tasks`."""
        return await self._drive(self._ops.scan_tasks(cursor, count))

    async def exists(self) -> bool:
        """See :meth:`Scheduler.exists`."""
        return await self._drive(self._ops.call(Ops.exists))

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
