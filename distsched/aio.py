"""The asyncio ``AsyncScheduler``: the same scripts, keys and core as ``Scheduler``."""

from __future__ import annotations

import asyncio
import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import NoPermissionError, ResponseError

from distsched import core
from distsched.client import BaseScheduler
from distsched.core import Call, Claim, Outcome, State, TaskInfo, TaskSpec, Wait
from distsched.errors import BusyError, InvalidArgument, LeaseLostError
from distsched.scripts import Registry


class AsyncScheduler(BaseScheduler):
    """``Scheduler`` for asyncio code: every method is a coroutine with the same meaning."""

    def __init__(
        self,
        client: aredis.Redis,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_payload_bytes: int = core.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(namespace, lease_s, max_payload_bytes)
        self.client = client
        self._scripts = Registry(client)
        self._owns_client = False

    @classmethod
    async def from_url(
        cls,
        url: str,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_running: int | None = None,
        **kwargs: Any,
    ) -> AsyncScheduler:
        """Connect to ``url``; ``max_running`` is stored when not None (last writer wins)."""
        limit = core.validate_max_running(max_running)
        url = core.validate_url(url)
        try:
            client = aredis.Redis.from_url(url)
        except ValueError as exc:
            raise InvalidArgument("url", str(exc)) from None
        try:
            scheduler = cls(client, namespace=namespace, lease_s=lease_s, **kwargs)
            if limit is not None:
                await scheduler.set_max_running(limit)
        except BaseException:
            await client.aclose()
            raise
        scheduler._owns_client = True
        return scheduler

    async def _run(self, call: Call) -> Any:
        self._check_open()
        try:
            return await self._scripts[call.script](keys=call.keys, args=call.args)
        except NoPermissionError:
            # An ACL refusal is the operator's business: keep redis-py's own exception.
            raise
        except ResponseError as exc:
            raise core.translate_error(str(exc)) from None

    async def _transition(self, call: Call) -> Any:
        """See ``Scheduler._transition``."""
        while True:
            try:
                reply = await self._run(call)
            except BusyError:
                await self.settle()
                continue
            if core.propagation_left(reply):
                await self.settle()
            return reply

    async def settle(self, budget: int = core.PROPAGATE_BUDGET) -> int:
        """See ``Scheduler.settle``."""
        total = 0
        while True:
            left, used = await self._run(core.propagate_call(self.keys, budget))
            total += int(used)
            if int(left) == 0:
                return total

    async def schedule(
        self,
        task_id: str,
        run_at: float | _dt.datetime | None = None,
        priority: int = 0,
        fn: str = "",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        delay: float | None = None,
        deps: Sequence[str] = (),
        optional_deps: Sequence[str] = (),
        max_attempts: int = 1,
        backoff: float = 1.0,
        allow_unknown: bool = False,
    ) -> int:
        """See ``Scheduler.schedule``."""
        spec = self._spec(
            task_id, fn, run_at, priority, args, kwargs, delay, deps, optional_deps,
            max_attempts, backoff, allow_unknown,
        )  # fmt: skip
        return (await self.schedule_many([spec]))[0]

    async def schedule_many(self, specs: Sequence[TaskSpec]) -> list[int]:
        self._check_open()
        call = self._schedule_call(specs)  # validates the container even when empty
        if not specs:
            return []
        return [int(v) for v in (await self._transition(call))[1:]]

    async def cancel(self, task_id: str) -> State:
        reply = await self._transition(core.cancel_call(self.keys, task_id))
        return State(core._text(reply[1]))

    async def submit(
        self,
        task_id: str,
        fn: str = "",
        deps: Sequence[str] = (),
        optional_deps: Sequence[str] = (),
        run_at: float | _dt.datetime | None = None,
        priority: int = 0,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        delay: float | None = None,
        max_attempts: int = 1,
        backoff: float = 1.0,
        allow_unknown: bool = False,
    ) -> int:
        """See ``Scheduler.submit``."""
        spec = self._spec(
            task_id, fn, run_at, priority, args, kwargs, delay, deps, optional_deps,
            max_attempts, backoff, allow_unknown,
        )  # fmt: skip
        return (await self.schedule_many([spec]))[0]

    async def submit_graph(self, specs: Sequence[TaskSpec]) -> list[int]:
        """See ``Scheduler.submit_graph``."""
        return await self.schedule_many(specs)

    async def retry(self, task_id: str, cascade: bool = True) -> int:
        """See ``Scheduler.retry``."""
        return int((await self._transition(core.retry_call(self.keys, task_id, cascade)))[1])

    async def add_deps(
        self, task_id: str, deps: Sequence[str], allow_unknown: bool = False
    ) -> None:
        """See ``Scheduler.add_deps``."""
        await self._transition(core.add_deps_call(self.keys, task_id, deps, allow_unknown))

    async def claim(self, n: int, worker_id: str) -> tuple[list[Claim], Wait | None]:
        reply = await self._run(core.claim_call(self.keys, worker_id, n, self.lease_ms))
        return core.decode_claim_reply(reply)

    async def ready(self, n: int, worker_id: str) -> list[Claim]:
        return (await self.claim(n, worker_id))[0]

    async def next(self, worker_id: str) -> Claim | Wait:
        claims, wait = await self.claim(1, worker_id)
        if claims:
            return claims[0]
        assert wait is not None
        return wait

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[bool | None]:
        self._check_open()
        if not claims:
            return []
        reply = await self._run(core.heartbeat_call(self.keys, claims, self.lease_ms))
        return [None if int(v) == 0 else int(v) == 2 for v in reply[1:]]

    async def heartbeat(self, claim: Claim) -> bool:
        status = (await self.heartbeat_many([claim]))[0]
        if status is None:
            raise LeaseLostError(f"lease of {claim.task_id!r} attempt {claim.attempt} was lost")
        return status

    async def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        self._check_open()
        if not reports:
            return []
        reply = await self._transition(core.complete_call(self.keys, reports))
        return core.decode_outcomes(reply[1:])

    async def complete(self, claim: Claim, result: object = None) -> Outcome:
        return (await self.complete_many([(claim, result)]))[0]

    async def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        self._check_open()
        if not reports:
            return []
        reply = await self._transition(core.fail_call(self.keys, reports))
        return core.decode_outcomes(reply[1:])

    async def fail(self, claim: Claim, error: object) -> Outcome:
        return (await self.fail_many([(claim, error)]))[0]

    async def confirm_cancel(self, claim: Claim) -> Outcome:
        reply = await self._transition(core.confirm_cancel_call(self.keys, claim))
        return Outcome(core._text(reply[1]))

    async def release(self, claims: Sequence[Claim]) -> int:
        self._check_open()
        if not claims:
            return 0
        reply = await self._transition(core.release_call(self.keys, claims))
        return sum(int(v) for v in reply[1:])

    async def reap(self, limit: int = core.REAP_BATCH) -> int:
        return int((await self._transition(core.reap_call(self.keys, limit=limit)))[1])

    async def expire_lease(self, task_id: str) -> int:
        return int((await self._transition(core.reap_call(self.keys, task_id=task_id)))[1])

    async def status(self, task_id: str) -> TaskInfo:
        """See ``Scheduler.status``."""
        self._check_open()
        core.validate_task_id(task_id)
        pipe = self.client.pipeline(transaction=True)
        for key in core.status_reads(self.keys):
            pipe.hget(key, task_id)
        pipe.zscore(self.keys.leases, task_id)
        pipe.zrangebylex(self.keys.edges, *core.edge_range(task_id))
        record, payload, result, deps, cause, lease, edges = await pipe.execute()
        blocked_by = None
        if cause:
            walk = core.blocked_path(task_id, cause)
            try:
                parent = next(walk)
                while True:
                    parent = walk.send(await self.client.hget(self.keys.blocked, parent))
            except StopIteration as done:
                blocked_by = done.value
        return core.decode_status(
            task_id, record, payload, result, lease, deps,
            core.decode_dependents(task_id, edges), blocked_by,
        )  # fmt: skip

    async def stats(self) -> dict[str, Any]:
        self._check_open()
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.keys.meta)
        pipe.zcard(self.keys.queue)
        pipe.zcard(self.keys.leases)
        meta, entries, leases = await pipe.execute()
        return core.decode_stats(meta, int(entries), int(leases))

    async def set_max_running(self, max_running: int | None) -> None:
        self._check_open()
        limit = core.validate_max_running(max_running)
        if limit is None:
            await self.client.hdel(self.keys.meta, "max_running")
        else:
            await self.client.hset(self.keys.meta, "max_running", limit)
            await self.client.publish(self.keys.wake, "capacity")

    async def wait_for_wake(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for a wake-up message.

        Subscribes only for the call, so a message published before it is not seen:
        use it after a claim that returned ``Wait``, with ``Wait.delay`` as timeout.
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.keys.wake)
            while True:
                left = 1.0 if deadline is None else deadline - loop.time()
                if left <= 0:
                    return False
                if await pubsub.get_message(timeout=left) is not None:
                    return True
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        """Close: every later call raises ``ClosedError``."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self.client.aclose()
