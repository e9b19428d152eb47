"""The runtime path of a task: admission, claims, reports, leases, housekeeping, workers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from distsched import limits
from distsched.errors import ConflictError, InvalidArgument, LeaseLostError, NotFoundError
from distsched.model import (
    Admitted,
    Changed,
    Chores,
    Claim,
    DependencyResult,
    Outcome,
    Spawn,
    State,
    TaskSpec,
    Wait,
    WorkerInfo,
)
from distsched.ops import merges
from distsched.ops import routing as route
from distsched.ops.inspect import Inspect
from distsched.ops.protocol import Commands, Op, _one
from distsched.validate import _is_int, validate_task_id, validate_worker_id
from distsched.wire.calls import (
    EXPIRE_BATCH,
    IDLE_MS,
    MINUTES_KEEP,
    MINUTES_MARGIN,
    MINUTES_SCAN,
    MINUTES_TRIM_STEP,
    PLACE_PART,
    PURGE_BATCH,
    REAP_BATCH,
    REPORTS_PER_CALL,
    SERVER_TIME_LUA,
    Call,
    _parts,
    add_deps_call,
    amend_call,
    cancel_call,
    claim_call,
    compact_call,
    complete_call,
    confirm_cancel_call,
    dep_results_call,
    encode_checkpoint,
    enqueue_call,
    expire_call,
    fail_call,
    finish_call,
    forget_call,
    heartbeat_call,
    is_plain,
    pause_call,
    payload_weights,
    placed_in_parts,
    progress_call,
    purge_call,
    reap_call,
    release_call,
    retry_call,
    schedule_batches,
    schedule_call,
    schedule_values,
    spawn_call,
    waitpoint_call,
)
from distsched.wire.payload import _text
from distsched.wire.records import (
    _count_or_none,
    _minute_of,
    decode_kept_claim,
    decode_parent_entry,
    decode_record,
    encode_worker,
    id_prefix,
)
from distsched.wire.replies import (
    decode_change,
    decode_claim_reply,
    decode_dep_results,
    decode_enqueue_reply,
    decode_finish_reply,
    decode_outcomes,
    decode_schedule_reply,
)

# The spawned tasks of a workflow read per page by ``cancel_workflow``.
WORKFLOW_PAGE = 500

# A batch of reports is checked whole, on stripe 0, before any part of it is sent to its
# stripe: a bad item refuses all of it, as in an unstriped namespace.


def _check_heartbeats(ops: Inspect, claims: Sequence[Claim]) -> None:
    heartbeat_call(ops.keys, claims, ops.lease_ms)


def _check_completions(
    ops: Inspect, reports: Sequence[tuple[Claim, object]], encoded: bool = False
) -> None:
    complete_call(ops.keys, reports, encoded=encoded)


def _check_failures(ops: Inspect, reports: Sequence[tuple[Claim, object]]) -> None:
    fail_call(ops.keys, reports)


def _check_releases(ops: Inspect, claims: Sequence[Claim], delay: float) -> None:
    release_call(ops.keys, claims, delay)


def _check_forget(ops: Inspect, task_ids: Sequence[str]) -> None:
    forget_call(ops.keys, task_ids)


class Runtime(Inspect):
    """What producers and workers do to tasks, and the chores that keep a namespace tidy."""

    # -------------------------------------------------------------- producers

    @route.striped
    def admit_many(self, specs: Sequence[TaskSpec]) -> Op[list[Admitted]]:
        if (
            self.lean.open()
            and isinstance(specs, (list, tuple))
            and specs
            and all(map(is_plain, specs))
        ):
            admitted = yield from self._enqueue(specs)
            if admitted is not None:
                return admitted
        batches = schedule_batches(specs)
        if len(batches) > 1:
            return (yield from self._admit_in_batches(specs, batches))
        # Read here, where the operation starts: in the caller's thread or asyncio task.
        trace = self.trace_context() if self.trace_context is not None else None
        wide = placed_in_parts(specs)
        if not wide:
            call = schedule_call(self.keys, specs, self.max_payload_bytes, trace)
            if not specs:
                return []
            batches = schedule_batches(specs, payload_weights(call))
            if len(batches) > 1:
                return (yield from self._admit_in_batches(specs, batches))
            values = yield from self.run(call)
            return decode_schedule_reply(specs, values)
        # A task with more required dependencies than one part goes into the batch's one
        # call held, with its first part; each further part is a call of its own, the last
        # lifting the hold. No call makes it claimable before the last part, so claims see
        # the batch as if it had been scheduled in one call. Everything is checked first.
        firsts, rests = list(specs), {}
        for i in wide:
            spec = specs[i]
            schedule_values(spec, self.max_payload_bytes, trace)
            first_size = max(0, PLACE_PART - len(spec.optional_deps))
            firsts[i] = replace(spec, deps=list(spec.deps)[:first_size])
            rests[i] = list(spec.deps)[first_size:]
        call = schedule_call(self.keys, firsts, self.max_payload_bytes, trace, held=wide)
        batches = schedule_batches(specs, payload_weights(call))
        if len(batches) > 1:
            return (yield from self._admit_in_batches(specs, batches))
        admitted = decode_schedule_reply(firsts, (yield from self.run(call)))
        for i in wide:
            if admitted[i].created:
                yield from self._place_rest(specs[i], admitted[i].version, rests[i])
        return admitted

    def _enqueue(self, specs: Sequence[TaskSpec]) -> Op[list[Admitted] | None]:
        """Plain tasks the short way (lua/enqueue.lua); None when they need schedule.lua
        (nothing was written) or more than one call."""
        if len(specs) > limits.MAX_TASKS_PER_CALL:
            return None
        trace = self.trace_context() if self.trace_context is not None else None
        call = enqueue_call(self.keys, specs, self.max_payload_bytes, trace)
        if len(specs) > 1 and len(schedule_batches(specs, payload_weights(call))) > 1:
            return None
        outcome = decode_enqueue_reply(specs, (yield from self.run(call)))
        if isinstance(outcome, str):
            if outcome == "settings":
                self.lean.close()
            return None
        return outcome

    def _admit_in_batches(
        self, specs: Sequence[TaskSpec], batches: list[list[int]]
    ) -> Op[list[Admitted]]:
        """A batch larger than one call's caps, in calls of ``batches`` (dependencies
        first): each call is atomic, the whole is not. Everything is checked first."""
        trace = self.trace_context() if self.trace_context is not None else None
        seen: set[str] = set()
        for spec in specs:
            if isinstance(spec, TaskSpec) and isinstance(spec.task_id, str):
                if spec.task_id in seen:
                    raise InvalidArgument("task_id", f"{spec.task_id!r} appears twice in one batch")
                seen.add(spec.task_id)
        for at in batches:
            schedule_call(self.keys, [specs[i] for i in at], self.max_payload_bytes, trace)
        result: list[Admitted | None] = [None] * len(specs)
        for at in batches:
            admitted = yield from self.admit_many([specs[i] for i in at])
            for i, one in zip(at, admitted, strict=True):
                result[i] = one
        return [a for a in result if a is not None]

    def _place_rest(self, spec: TaskSpec, version: int, rest: list[str]) -> Op[None]:
        """Add ``rest`` to the held ``version`` in parts; the last lifts the hold."""
        for start in range(0, len(rest), PLACE_PART):
            last = start + PLACE_PART >= len(rest)
            part = add_deps_call(
                self.keys,
                spec.task_id,
                rest[start : start + PLACE_PART],
                spec.allow_unknown,
                (version, last),
            )
            try:
                yield from self.run(part)
            except ConflictError:
                # The version ended (a dependency had failed, or it was cancelled) or
                # was replaced meanwhile: it never runs, and the rest has nothing to add.
                return

    @route.by_id("task_id")
    def cancel(self, task_id: str) -> Op[State]:
        (state,) = yield from self.run(cancel_call(self.keys, task_id))
        return State(_text(state))

    @route.by_id("task_id")
    def amend(
        self,
        task_id: str,
        priority: object = None,
        run_at: object = None,
        delay: object = None,
        max_attempts: object = None,
        version: object = None,
    ) -> Op[Changed]:
        call = amend_call(
            self.keys,
            task_id,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            version=version,
        )
        values = yield from self.run(call)
        return decode_change(task_id, values)

    @route.by_id("task_id")
    def pause_task(self, task_id: str, version: object = None) -> Op[Changed]:
        values = yield from self.run(pause_call(self.keys, "pause", task_id, version))
        return decode_change(task_id, values)

    @route.by_id("task_id")
    def resume_task(self, task_id: str, version: object = None) -> Op[Changed]:
        values = yield from self.run(pause_call(self.keys, "resume", task_id, version))
        return decode_change(task_id, values)

    @route.by_id("task_id")
    def cancel_workflow(self, task_id: str) -> Op[int]:
        """Cancel the workflow of ``task_id``: its root and every task spawned under it
        (started or not), one ``cancel.lua`` call each, read from ``spawned`` in pages.
        Returns how many tasks were cancelled or asked to stop."""
        validate_task_id(task_id)
        k = self.keys
        (raw,) = yield from self.read(("HGET", k.parents, task_id))
        entry = decode_parent_entry(raw)
        root = entry.root if entry is not None else task_id
        prefix = id_prefix(root)
        cursor, end = b"[" + prefix, b"(" + prefix + b"\xff"
        touched = 0
        ids = [root]
        while True:
            for one in ids:
                try:
                    before = yield from self._state_of(one)
                    state = yield from self.cancel(one)
                except NotFoundError:
                    continue
                if before in (State.PENDING, State.READY, State.RUNNING) and (
                    state is State.CANCELLED or state is State.RUNNING
                ):
                    touched += 1
            (members,) = yield from self.read(
                ("ZRANGEBYLEX", k.spawned, cursor, end, "LIMIT", 0, WORKFLOW_PAGE)
            )
            if not members:
                return touched
            ids = [bytes(m)[len(prefix) :].decode("utf-8", "surrogatepass") for m in members]
            cursor = b"(" + bytes(members[-1])

    def _state_of(self, task_id: str) -> Op[State]:
        """The state of ``task_id`` (NotFoundError when it has no record)."""
        (raw,) = yield from self.read(("HGET", self.keys.tasks, task_id))
        if raw is None:
            raise NotFoundError(task_id)
        return decode_record(raw, task_id).state

    @route.by_id("task_id")
    def retry(self, task_id: str, cascade: bool) -> Op[int]:
        (version,) = yield from self.run(retry_call(self.keys, task_id, cascade))
        # A retried waitpoint waits again: its timer is scored for the new version now
        # (lua/lib/deadline.lua; a task that is no waitpoint costs one O(1) call).
        yield from self.run(waitpoint_call(self.keys, "arm", task_id))
        return int(version)

    @route.by_id("task_id")
    def complete_waitpoint(
        self, task_id: str, payload: object, version: object, by: object
    ) -> Op[Outcome]:
        call = waitpoint_call(self.keys, "complete", task_id, version, payload, by)
        if len(call.args[4]) > self.max_payload_bytes:
            raise InvalidArgument(
                "payload", f"is {len(call.args[4])} bytes, limit {self.max_payload_bytes}"
            )
        (outcome,) = yield from self.run(call)
        return Outcome(_text(outcome))

    @route.by_id("task_id")
    def fail_waitpoint(
        self, task_id: str, error: object, version: object, by: object
    ) -> Op[Outcome]:
        call = waitpoint_call(self.keys, "fail", task_id, version, error, by)
        (outcome,) = yield from self.run(call)
        return Outcome(_text(outcome))

    @route.striped
    def add_deps(self, task_id: str, deps: Sequence[str], allow_unknown: bool) -> Op[None]:
        yield from self.run(add_deps_call(self.keys, task_id, deps, allow_unknown))

    @route.by_id("task_id")
    def dependency_results(
        self, task_id: str, ids: Sequence[str] | None = None, version: int | None = None
    ) -> Op[dict[str, DependencyResult]]:
        """What ``task_id``'s dependencies (all, or ``ids``) hold now, in one bounded
        read (lua/dep_results.lua); ``version`` fences it to a running attempt's version."""
        values = yield from self.run(dep_results_call(self.keys, task_id, ids, version))
        return decode_dep_results(values)[1]

    # -------------------------------------------------------------- workers

    @route.striped
    def claim(
        self, n: int, worker_id: str, listening: bool = False, request_id: str | None = None
    ) -> Op[tuple[list[Claim], Wait | None]]:
        if not isinstance(listening, bool):
            raise InvalidArgument("listening", "must be a bool")
        if _is_int(n) and n > limits.MAX_CLAIM:
            # Up to n: one call hands out at most MAX_CLAIM, the rest is for the next.
            n = limits.MAX_CLAIM
        call = claim_call(self.keys, worker_id, n, self.lease_ms, listening, request_id)
        reply = yield from self.run(call)
        return decode_claim_reply(reply)

    @route.striped
    def finish(
        self,
        reports: Sequence[tuple[Claim, object]],
        n: int,
        worker_id: str,
        listening: bool = False,
        request_id: str | None = None,
        encoded: bool = False,
    ) -> Op[tuple[list[Outcome], list[Claim], Wait | None]]:
        """Report ``reports`` as succeeded (as :meth:`complete_many`, at most
        ``MAX_REPORTS_PER_CALL``) and claim up to ``n`` tasks (as :meth:`claim`), in one
        script call (lua/finish.lua): their outcomes, the claims, and why fewer than ``n``."""
        if not isinstance(listening, bool):
            raise InvalidArgument("listening", "must be a bool")
        if _is_int(n) and n > limits.MAX_CLAIM:
            n = limits.MAX_CLAIM
        claim = claim_call(self.keys, worker_id, n, self.lease_ms, listening, request_id)
        call = finish_call(self.keys, reports, claim, encoded=encoded)
        return decode_finish_reply(len(reports), (yield from self.run(call)))

    @route.by_ids("claims", route.in_order, route.task_id_of, _check_heartbeats)
    def heartbeat_many(self, claims: Sequence[Claim]) -> Op[list[bool | None]]:
        call = heartbeat_call(self.keys, claims, self.lease_ms)  # validates even when empty
        if not claims:
            return []
        if len(claims) > REPORTS_PER_CALL:
            out: list[bool | None] = []
            for part in _parts(claims):
                out += yield from self.heartbeat_many(part)
            return out
        return [None if int(v) == 0 else int(v) == 2 for v in (yield from self.run(call))]

    @route.by_id("claim", route.task_id_of)
    def heartbeat(self, claim: Claim) -> Op[bool]:
        (status,) = yield from self.heartbeat_many([claim])
        if status is None:
            raise LeaseLostError(f"lease of {claim.task_id!r} attempt {claim.attempt} was lost")
        return status

    def _report(self, call: Call, count: int) -> Op[list[Outcome]]:
        if count == 0:
            return []
        return decode_outcomes((yield from self.run(call)))

    @route.by_ids("reports", route.in_order, route.report_task_id, _check_completions)
    def complete_many(
        self, reports: Sequence[tuple[Claim, object]], encoded: bool = False
    ) -> Op[list[Outcome]]:
        call = complete_call(self.keys, reports, encoded=encoded)
        if len(reports) > REPORTS_PER_CALL:
            out: list[Outcome] = []
            for part in _parts(reports):
                out += yield from self.complete_many(part, encoded)
            return out
        return (yield from self._report(call, len(reports)))

    @route.striped
    def spawn(self, claim: Claim, spawn: Spawn) -> Op[Outcome]:
        """``claim`` succeeds and adds ``spawn``'s tasks in the same step (lua/spawn.lua)."""
        call = spawn_call(self.keys, claim, spawn, self.max_payload_bytes)
        (outcome,) = yield from self.run(call)
        return Outcome(_text(outcome))

    @route.by_ids("reports", route.in_order, route.report_task_id, _check_failures)
    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> Op[list[Outcome]]:
        call = fail_call(self.keys, reports)
        if len(reports) > REPORTS_PER_CALL:
            out: list[Outcome] = []
            for part in _parts(reports):
                out += yield from self.fail_many(part)
            return out
        return (yield from self._report(call, len(reports)))

    @route.by_id("claim", route.task_id_of)
    def confirm_cancel(self, claim: Claim) -> Op[Outcome]:
        (outcome,) = yield from self.run(confirm_cancel_call(self.keys, claim))
        return Outcome(_text(outcome))

    @route.by_id("claim", route.task_id_of)
    def report_progress(self, claim: Claim, fraction: object, note: object) -> Op[Outcome]:
        call = progress_call(self.keys, claim, fraction, note)
        (outcome,) = yield from self.run(call)
        return Outcome(_text(outcome))

    @route.by_id("claim", route.task_id_of)
    def save_checkpoint(self, claim: Claim, value: object) -> Op[Outcome]:
        call = progress_call(self.keys, claim, checkpoint=encode_checkpoint(value))
        (outcome,) = yield from self.run(call)
        return Outcome(_text(outcome))

    @route.every(merge=route.total)
    def hand_back_lost_claim(self, worker_id: str, request_id: str) -> Op[int]:
        validate_worker_id(worker_id)
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgument("request_id", "must be a non-empty str")
        (raw,) = yield from self.read(("HGET", self.keys.claims, worker_id))
        if raw is None:
            return 0
        kept_request, tokens = decode_kept_claim(raw)
        if kept_request != request_id:
            # That call claimed nothing, or never ran: nothing of it is held.
            return 0
        claims = [
            Claim(task_id, version, attempt, fn="", args=(), kwargs={}, priority=0, run_at=0.0)
            for task_id, version, attempt in tokens
        ]
        # The tokens fence it: a task reaped and claimed again since is not touched.
        released = yield from self.release(claims, 0.0)
        yield _one(("HDEL", self.keys.claims, worker_id))
        return released

    @route.by_ids("claims", route.total_of_parts, route.task_id_of, _check_releases)
    def release(self, claims: Sequence[Claim], delay: object) -> Op[int]:
        call = release_call(self.keys, claims, delay)
        if not claims:
            return 0
        if len(claims) > REPORTS_PER_CALL:
            released = 0
            for part in _parts(claims):
                released += yield from self.release(part, delay)
            return released
        return sum(int(v) for v in (yield from self.run(call)))

    # -------------------------------------------------------------- worker presence

    @route.every(merge=route.last_of)
    def idle(self, worker_id: str) -> Op[None]:
        """Count ``worker_id`` as an idle worker listening on its channel, for IDLE_MS."""
        channel = self.keys.worker_channel(validate_worker_id(worker_id))
        now = yield from self.server_time()
        yield _one(("ZADD", self.keys.idle, int(now * 1000) + IDLE_MS, channel))

    @route.every(merge=route.any_of)
    def leave(self, worker_id: str, pass_wake: bool = False) -> Op[bool]:
        channel = self.keys.worker_channel(validate_worker_id(worker_id))
        args = [channel, worker_id, "pass" if pass_wake else ""]
        (woken,) = yield from self.run(Call("leave", self.keys.for_script("leave"), args))
        return int(woken) == 1

    @route.first
    def register_worker(self, info: WorkerInfo) -> Op[WorkerInfo]:
        """Write ``info`` into the worker registry, heartbeat stamped with the server's
        time now (and ``started`` too when it is 0): one HSET."""
        validate_worker_id(info.worker_id)
        now = yield from self.server_time()
        stamped = info.stamped(now)
        yield _one(("HSET", self.keys.workers, info.worker_id, encode_worker(stamped)))
        return stamped

    @route.first
    def unregister_worker(self, worker_id: str) -> Op[bool]:
        """Remove a stopping worker from the registry; True if it was there."""
        (removed,) = yield _one(("HDEL", self.keys.workers, validate_worker_id(worker_id)))
        return int(removed) == 1

    @route.striped
    def prune_workers(self) -> Op[int]:
        """Drop the registry entries whose last heartbeat is older than their
        ``drop_after_s`` (on the server clock), and unreadable ones; return how many."""
        gone = yield from self._read_workers()
        dead = [
            worker_id
            for worker_id, info in gone
            if info is None or info.seen_ago > info.drop_after_s
        ]
        if not dead:
            return 0
        # A worker that wrote again since the read loses its entry until its next round:
        # it is rewritten every heartbeat, and only entries long silent are picked.
        # The last claim a dead worker kept (lib/kept.lua) goes with it: nobody will
        # send that claim again.
        removed, _ = yield Commands(
            (("HDEL", self.keys.workers, *dead), ("HDEL", self.keys.claims, *dead)), atomic=False
        )
        return int(removed)

    # -------------------------------------------------------------- housekeeping

    @route.every(merge=route.total)
    def reap(self, limit: int) -> Op[int]:
        return int((yield from self.run(reap_call(self.keys, limit=limit)))[0])

    @route.by_id("task_id")
    def expire_lease(self, task_id: str) -> Op[int]:
        return int((yield from self.run(reap_call(self.keys, task_id=task_id)))[0])

    @route.every(merge=route.total)
    def expire(self, limit: int) -> Op[int]:
        """End queued tasks whose deadline passed (at most ``limit`` deadline entries);
        return how many expired."""
        return int((yield from self.run(expire_call(self.keys, limit)))[0])

    @route.every(merge=route.total)
    def purge(self, limit: int) -> Op[int]:
        if not _is_int(limit) or limit < 1:
            raise InvalidArgument("limit", "must be an int >= 1")
        return int((yield from self.run(purge_call(self.keys, limit)))[0])

    @route.by_ids("task_ids", route.total_of_parts, check=_check_forget)
    def purge_tasks(self, task_ids: Sequence[str]) -> Op[int]:
        call = forget_call(self.keys, task_ids)
        if not task_ids:
            return 0
        return int((yield from self.run(call))[0])

    @route.every(merge=route.total)
    def compact(self, budget: int) -> Op[int]:
        if not _is_int(budget) or budget < 1:
            raise InvalidArgument("budget", "must be an int >= 1")
        return int((yield from self.run(compact_call(self.keys, budget)))[0])

    @route.every(merge=merges.chores)
    def housekeeping(self, purge_calls: int) -> Op[Chores]:
        if not _is_int(purge_calls) or purge_calls < 0:
            raise InvalidArgument("purge_calls", "must be an int >= 0")
        reaped = yield from self.reap(REAP_BATCH)
        expired = yield from self.expire(EXPIRE_BATCH)
        compacted = yield from self.compact(limits.MAX_COMPACT_BUDGET)
        purged = 0
        for _ in range(purge_calls):
            removed = yield from self.purge(PURGE_BATCH)
            purged += removed
            if removed < PURGE_BATCH:
                break
        trimmed = yield from self._trim_minutes()
        return Chores(
            reaped=reaped, expired=expired, compacted=compacted, purged=purged, trimmed=trimmed
        )

    def _trim_minutes(self) -> Op[int]:
        """Delete per-minute counters older than ``MINUTES_KEEP + MINUTES_MARGIN`` minutes,
        at most ``MINUTES_TRIM_STEP`` minutes per call; return the fields deleted.

        The meta field ``minutes_from`` is the first minute not deleted yet, so each call
        deletes forward from there by name, without reading the hash.
        """
        k = self.keys
        clock, stored, size = yield from self.read(
            ("EVAL", SERVER_TIME_LUA, 1, k.meta),
            ("HGET", k.meta, "minutes_from"),
            ("HLEN", k.minutes),
            atomic=False,
        )
        current = (int(clock[0]) * 1000 + int(clock[1]) // 1000) // 60_000
        cutoff = current - MINUTES_KEEP - MINUTES_MARGIN
        start = _count_or_none(stored)
        if start is not None and start > current:
            # A first minute after the present one (junk, a clock set back) would stop the
            # trimming for good: start again as if none were stored.
            start = None
        if start is None and int(size) > MINUTES_SCAN:
            # Never trimmed and large (written by an older version's clients meanwhile?):
            # start a week back rather than read it all.
            start = cutoff - 7 * MINUTES_KEEP
        elif start is None and int(size) > 0:
            # Never trimmed: start at the oldest minute there is (a hash this small).
            (names,) = yield from self.read(("HKEYS", k.minutes))
            found = [m for m in map(_minute_of, names) if m is not None]
            start = min(found, default=cutoff)
        if start is None or int(size) == 0:
            start = cutoff if start is None else max(start, cutoff)  # nothing to delete
        if start >= cutoff:
            if _count_or_none(stored) != start:
                yield _one(("HSET", k.meta, "minutes_from", start))
            return 0
        stop = min(cutoff, start + MINUTES_TRIM_STEP)
        fields = [f"{m}:{kind}" for m in range(start, stop) for kind in "sf"]
        removed, _ = yield Commands(
            (("HDEL", k.minutes, *fields), ("HSET", k.meta, "minutes_from", stop)), atomic=True
        )
        return int(removed)

    @route.striped
    def clear(self) -> Op[None]:
        # UNLINK: each key leaves the keyspace at once and a large one is freed by
        # Redis in the background, so the call stays short whatever the namespace holds.
        yield _one(("UNLINK", *self.keys.all_keys()))
