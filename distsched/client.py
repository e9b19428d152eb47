"""The synchronous ``Scheduler``: a thin shell over :mod:`distsched.core`."""

from __future__ import annotations

import datetime as _dt
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.exceptions import NoPermissionError, ResponseError

from distsched import core
from distsched.core import Call, Claim, Outcome, State, TaskInfo, TaskSpec, Wait
from distsched.errors import BusyError, ClosedError, InvalidArgument, LeaseLostError
from distsched.keys import Keys
from distsched.scripts import Registry


class BaseScheduler:
    """State shared by the sync and asyncio schedulers: keys, lease, limits."""

    def __init__(
        self,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_payload_bytes: int = core.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.keys = Keys(namespace)
        self.namespace = namespace
        self.lease_ms = core.validate_lease(lease_s)
        self.lease_s = float(lease_s)
        self.max_payload_bytes = core.validate_max_payload_bytes(max_payload_bytes)
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the scheduler is closed")

    def _schedule_call(self, specs: Sequence[TaskSpec]) -> Call:
        return core.schedule_call(self.keys, specs, self.max_payload_bytes)

    @staticmethod
    def _spec(
        task_id: str,
        fn: str,
        run_at: float | _dt.datetime | None,
        priority: int,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        delay: float | None,
        deps: Sequence[str],
        optional_deps: Sequence[str],
        max_attempts: int,
        backoff: float,
        allow_unknown: bool,
    ) -> TaskSpec:
        return TaskSpec(
            task_id=task_id,
            fn=fn,
            run_at=run_at,
            priority=priority,
            args=args,
            kwargs=kwargs,
            delay=delay,
            deps=deps,
            optional_deps=optional_deps,
            max_attempts=max_attempts,
            backoff=backoff,
            allow_unknown=allow_unknown,
        )


class Scheduler(BaseScheduler):
    """Schedule, claim and report tasks in one namespace of one Redis.

    Thread-safe: the underlying redis-py client pools its connections.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = core.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(namespace, lease_s, max_payload_bytes)
        limit = core.validate_max_running(max_running)
        self.client = client
        self._owns_client = False
        self._scripts = Registry(client)
        self._lock = threading.Lock()
        if limit is not None:
            self.set_max_running(limit)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "default",
        lease_s: float = 30.0,
        max_running: int | None = None,
        **kwargs: Any,
    ) -> Scheduler:
        """Connect to ``redis://``, ``rediss://`` or ``unix://`` ``url``."""
        url = core.validate_url(url)
        try:
            client = redis.Redis.from_url(url)
        except ValueError as exc:
            raise InvalidArgument("url", str(exc)) from None
        try:
            scheduler = cls(
                client, namespace=namespace, lease_s=lease_s, max_running=max_running, **kwargs
            )
        except BaseException:
            client.close()
            raise
        scheduler._owns_client = True
        return scheduler

    # ------------------------------------------------------------------ plumbing

    def _run(self, call: Call, client: Any = None) -> Any:
        self._check_open()
        try:
            return self._scripts[call.script](keys=call.keys, args=call.args, client=client)
        except NoPermissionError:
            # An ACL refusal is the operator's business: keep redis-py's own exception.
            raise
        except ResponseError as exc:
            raise core.translate_error(str(exc)) from None

    def _transition(self, call: Call) -> Any:
        """Run a transition; then settle the dependents it left (see ``settle``).

        A task still settling its dependents cannot get a new version (``BUSY``):
        settle and try again, which always makes progress.
        """
        while True:
            try:
                reply = self._run(call)
            except BusyError:
                self.settle()
                continue
            if core.propagation_left(call.script, reply):
                self.settle()
            return reply

    def settle(self, budget: int = core.PROPAGATE_BUDGET) -> int:
        """Tell waiting dependents about every task that ended, in bounded script calls.

        Each call settles at most ``budget`` dependency edges, so Redis is never
        blocked for long however large the graph. Returns the edges settled.
        """
        total = 0
        while True:
            used, left = self._run(core.propagate_call(self.keys, budget))
            total += int(used)
            if int(left) == 0:
                return total

    # ------------------------------------------------------------------ producers

    def schedule(
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
        """Schedule ``fn(*args, **kwargs)`` as a new version of ``task_id``; return the version.

        A pending or ready task of that id is replaced; a running one raises
        ``ConflictError``; a terminal one starts over as the new version.
        """
        spec = self._spec(
            task_id, fn, run_at, priority, args, kwargs, delay, deps, optional_deps,
            max_attempts, backoff, allow_unknown,
        )  # fmt: skip
        return self.schedule_many([spec])[0]

    def schedule_many(self, specs: Sequence[TaskSpec]) -> list[int]:
        """Schedule a batch atomically in one round trip; return the versions in order."""
        self._check_open()
        call = self._schedule_call(specs)  # validates the container even when empty
        if not specs:
            return []
        return [int(v) for v in self._transition(call)[1:]]

    def cancel(self, task_id: str) -> State:
        """Cancel a task; return its state after the call (§5)."""
        return State(core._text(self._transition(core.cancel_call(self.keys, task_id))[0]))

    def submit(
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
        """``schedule`` read dependencies-first: run ``fn`` once ``deps`` have succeeded.

        Raises ``UnknownDependencyError`` for a dependency that does not exist
        (unless ``allow_unknown``) and ``CycleError`` for a dependency cycle.
        """
        spec = self._spec(
            task_id, fn, run_at, priority, args, kwargs, delay, deps, optional_deps,
            max_attempts, backoff, allow_unknown,
        )  # fmt: skip
        return self.schedule_many([spec])[0]

    def submit_graph(self, specs: Sequence[TaskSpec]) -> list[int]:
        """Register a whole graph atomically: all of it or none of it. Returns the versions."""
        return self.schedule_many(specs)

    def retry(self, task_id: str, cascade: bool = True) -> int:
        """A new version of a failed, cancelled or blocked task; returns its version.

        With ``cascade`` the tasks it blocked get new versions too and wait again.
        """
        return int(self._transition(core.retry_call(self.keys, task_id, cascade))[1])

    def add_deps(self, task_id: str, deps: Sequence[str], allow_unknown: bool = False) -> None:
        """Add required dependencies to a pending task (``ConflictError`` otherwise)."""
        self._transition(core.add_deps_call(self.keys, task_id, deps, allow_unknown))

    # ------------------------------------------------------------------ workers

    def ready(self, n: int, worker_id: str) -> list[Claim]:
        """Claim up to ``n`` due tasks (fewer when capacity is short), in queue order."""
        claims, _ = core.decode_claim_reply(
            self._run(core.claim_call(self.keys, worker_id, n, self.lease_ms))
        )
        return claims

    def claim(self, n: int, worker_id: str) -> tuple[list[Claim], Wait | None]:
        """Claim up to ``n`` tasks; also say why fewer were claimed, with the delay hint."""
        result: tuple[list[Claim], Wait | None] = core.decode_claim_reply(
            self._run(core.claim_call(self.keys, worker_id, n, self.lease_ms))
        )
        return result

    def next(self, worker_id: str) -> Claim | Wait:
        """Claim the next due task, or say how long to wait and why."""
        claims, wait = self.claim(1, worker_id)
        if claims:
            return claims[0]
        assert wait is not None
        return wait

    def heartbeat(self, claim: Claim) -> bool:
        """Extend ``claim``'s lease; True when cancellation was requested.

        Raises ``LeaseLostError`` when the token is no longer current.
        """
        status = self.heartbeat_many([claim])[0]
        if status is None:
            raise LeaseLostError(f"lease of {claim.task_id!r} attempt {claim.attempt} was lost")
        return status

    def heartbeat_many(self, claims: Sequence[Claim]) -> list[bool | None]:
        """Extend many leases in one call: True/False (cancel requested) or None (lost)."""
        self._check_open()
        if not claims:
            return []
        reply = self._run(core.heartbeat_call(self.keys, claims, self.lease_ms))
        return [None if int(v) == 0 else int(v) == 2 for v in reply]

    def complete(self, claim: Claim, result: object = None) -> Outcome:
        """Report success of ``claim`` (fenced by its token)."""
        return self.complete_many([(claim, result)])[0]

    def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """Report many successes in one round trip."""
        self._check_open()
        if not reports:
            return []
        return core.decode_outcomes(self._transition(core.complete_call(self.keys, reports))[1:])

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        """``complete_many`` with results already msgpack-encoded (b"" for none)."""
        self._check_open()
        if not reports:
            return []
        call = core.complete_call(self.keys, reports, encoded=True)
        return core.decode_outcomes(self._transition(call)[1:])

    def fail(self, claim: Claim, error: object) -> Outcome:
        """Report that ``claim``'s function raised: retried after backoff while attempts remain."""
        return self.fail_many([(claim, error)])[0]

    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        self._check_open()
        if not reports:
            return []
        return core.decode_outcomes(self._transition(core.fail_call(self.keys, reports))[1:])

    def confirm_cancel(self, claim: Claim) -> Outcome:
        """The function stopped on a cancellation request: the task ends cancelled."""
        reply = self._transition(core.confirm_cancel_call(self.keys, claim))
        return Outcome(core._text(reply[0]))

    def release(self, claims: Sequence[Claim], *, delay: float = 0.0) -> int:
        """Hand back claims whose function never started; no attempt is spent.

        With ``delay`` (seconds) the tasks become due again no sooner than that
        from now; their ``run_at`` is kept. Returns how many were handed back.
        """
        self._check_open()
        if not core._is_number(delay) or not math.isfinite(delay) or delay < 0:
            raise InvalidArgument("delay", "must be a finite number of seconds >= 0")
        if not claims:
            return 0
        call = core.release_call(self.keys, claims)
        if delay > 0:
            call.args.append(max(1, round(delay * 1000)))
        return sum(int(v) for v in self._transition(call)[1:])

    def reap(self, limit: int = core.REAP_BATCH) -> int:
        """Handle expired leases now; return how many."""
        return int(self._transition(core.reap_call(self.keys, limit=limit))[0])

    def purge(self, limit: int = core.PURGE_BATCH) -> int:
        """Remove up to ``limit`` terminal tasks older than the retention; return how many."""
        return int(self._run(core.purge_call(self.keys, limit))[0])

    def set_retention(self, retention_s: float) -> None:
        """Keep terminal tasks this many seconds (per namespace; default 24 hours)."""
        if retention_s is None:
            # purge_call takes None as "keep the stored retention": refuse it here.
            raise InvalidArgument("retention_s", "must be a number of seconds >= 0, got None")
        self._run(core.purge_call(self.keys, 1, retention_s))

    def compact(self, budget: int = core.PROPAGATE_BUDGET) -> int:
        """Drop stale queue entries if they pile up (one bounded step); return how many."""
        return int(self._run(core.compact_call(self.keys, budget))[0])

    def housekeeping(self, purge_calls: int = 20) -> dict[str, int]:
        """The periodic chores every worker runs: reap leases, compact, purge.

        Purging goes on while whole batches come back, up to ``purge_calls``
        bounded calls, so a busy namespace's history is removed about as fast as
        it is made (one batch per round would fall behind a few hundred tasks a
        second). Returns how many leases were reaped, stale queue entries
        dropped and terminal tasks purged.
        """
        reaped = self.reap()
        compacted = self.compact()
        purged = 0
        for _ in range(purge_calls):
            removed = self.purge()
            purged += removed
            if removed < core.PURGE_BATCH:
                break
        return {"reaped": reaped, "compacted": compacted, "purged": purged}

    def expire_lease(self, task_id: str) -> int:
        """Expire ``task_id``'s lease at once, as if its holder had vanished (operators)."""
        return int(self._transition(core.reap_call(self.keys, task_id=task_id))[0])

    # ------------------------------------------------------------------ inspection

    def status(self, task_id: str) -> TaskInfo:
        """A snapshot of one task; ``NotFoundError`` for an unknown id."""
        self._check_open()
        core.validate_task_id(task_id)
        pipe = self.client.pipeline(transaction=True)
        for key in core.status_reads(self.keys):
            pipe.hget(key, task_id)
        pipe.zscore(self.keys.leases, task_id)
        pipe.zrangebylex(self.keys.edges, *core.edge_range(task_id))
        record, payload, result, deps, cause, lease, edges = pipe.execute()
        blocked_by = self._blocked_by(task_id, cause) if cause else None
        return core.decode_status(
            task_id, record, payload, result, lease, deps,
            core.decode_dependents(task_id, edges), blocked_by,
        )  # fmt: skip

    def _blocked_by(self, task_id: str, cause: bytes) -> core.BlockedBy:
        walk = core.blocked_path(task_id, cause)
        try:
            parent = next(walk)
            while True:
                parent = walk.send(self.client.hget(self.keys.blocked, parent))
        except StopIteration as done:
            result: core.BlockedBy = done.value
            return result

    def stats(self) -> dict[str, Any]:
        """Counts per state, queue entries vs live ones, leases, capacity."""
        self._check_open()
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.keys.meta)
        pipe.zcard(self.keys.queue)
        pipe.zcard(self.keys.leases)
        meta, entries, leases = pipe.execute()
        return core.decode_stats(meta, int(entries), int(leases))

    def leases(self) -> list[tuple[str, float]]:
        """Running task ids with their lease deadlines (epoch seconds, server clock)."""
        self._check_open()
        rows: Any = self.client.zrange(self.keys.leases, 0, -1, withscores=True)
        return [(core._text(member), float(score) / 1000.0) for member, score in rows]

    def server_time(self) -> float:
        """The Redis server's clock, epoch seconds (the clock that decides due-ness)."""
        self._check_open()
        seconds, micros = self.client.time()
        return float(seconds) + float(micros) / 1e6

    def set_max_running(self, max_running: int | None) -> None:
        """Set the fleet-wide bound on running tasks (None removes it). Last writer wins."""
        self._check_open()
        limit = core.validate_max_running(max_running)
        if limit is None:
            self.client.hdel(self.keys.meta, "max_running")
        else:
            self.client.hset(self.keys.meta, "max_running", limit)
            # Waiting workers may now have capacity.
            self.client.publish(self.keys.wake, "capacity")

    def close(self) -> None:
        """Close the scheduler: every later call raises ``ClosedError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._owns_client:
            # Idle connections only: calls already in flight finish on theirs.
            self.client.connection_pool.disconnect(inuse_connections=False)
