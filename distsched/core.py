"""The operations of the schedulers (:class:`Ops`), as generators. No I/O.

The sync :class:`~distsched.client.Scheduler` and the asyncio
:class:`~distsched.aio.AsyncScheduler` are thin shells that drive these operations:
they send the :class:`~distsched.wire.calls.Call` values built here and hand the
replies back.

What the operations are built from lives in floors below: :mod:`distsched.model`
(values users see), :mod:`distsched.validate` (argument limits and checks),
:mod:`distsched.wire` (script calls, payloads, stored layouts, replies) and
:mod:`distsched.ops` (the request protocol, ``explain``). Every name that moved there
is still importable from here (the ``X as X`` imports below) until each importer
names its defining module.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis import exceptions as redis_exceptions

from distsched import limits
from distsched.errors import (
    BusyError,
    ConflictError,
    InvalidArgument,
    LeaseLostError,
    NotFoundError,
    ScriptError,
    Timeout,
    Unavailable,
)
from distsched.keys import Keys
from distsched.model import _TERMINAL as _TERMINAL
from distsched.model import PRIORITY_LABELS as PRIORITY_LABELS
from distsched.model import STATS_TOP_KEYS as STATS_TOP_KEYS
from distsched.model import WORKER_ALIVE_BEATS as WORKER_ALIVE_BEATS
from distsched.model import WORKER_DROP_LEASES as WORKER_DROP_LEASES
from distsched.model import Admitted as Admitted
from distsched.model import AttemptInfo as AttemptInfo
from distsched.model import BlockedBy as BlockedBy
from distsched.model import Chores as Chores
from distsched.model import Claim as Claim
from distsched.model import DepState as DepState
from distsched.model import Explanation as Explanation
from distsched.model import Fired as Fired
from distsched.model import KeyInfo as KeyInfo
from distsched.model import KeyLoad as KeyLoad
from distsched.model import MinuteCount as MinuteCount
from distsched.model import Order as Order
from distsched.model import OrderSetting as OrderSetting
from distsched.model import Outcome as Outcome
from distsched.model import Overview as Overview
from distsched.model import Reason as Reason
from distsched.model import State as State
from distsched.model import Stats as Stats
from distsched.model import TaskInfo as TaskInfo
from distsched.model import TaskOptions as TaskOptions
from distsched.model import TaskPage as TaskPage
from distsched.model import TaskRow as TaskRow
from distsched.model import TaskSpec as TaskSpec
from distsched.model import Wait as Wait
from distsched.model import WaitReason as WaitReason
from distsched.model import WorkerInfo as WorkerInfo
from distsched.model import priority_bucket as priority_bucket
from distsched.ops.explain import EXPLAIN_LIMIT as EXPLAIN_LIMIT
from distsched.ops.explain import SERVED_ANNOUNCE_S as SERVED_ANNOUNCE_S
from distsched.ops.explain import SERVED_LIVE_S as SERVED_LIVE_S
from distsched.ops.explain import explain_task
from distsched.ops.protocol import MAX_WAIT_S as MAX_WAIT_S
from distsched.ops.protocol import READ_RETRY_PAUSES as READ_RETRY_PAUSES
from distsched.ops.protocol import TRANSIENT_ERRORS as TRANSIENT_ERRORS
from distsched.ops.protocol import WAIT_MARGIN_MS as WAIT_MARGIN_MS
from distsched.ops.protocol import WAIT_REFRESH_S as WAIT_REFRESH_S
from distsched.ops.protocol import Commands as Commands
from distsched.ops.protocol import Done as Done
from distsched.ops.protocol import Failure as Failure
from distsched.ops.protocol import Listen as Listen
from distsched.ops.protocol import Op as Op
from distsched.ops.protocol import Request as Request
from distsched.ops.protocol import Sleep as Sleep
from distsched.ops.protocol import T as T
from distsched.ops.protocol import _one as _one
from distsched.ops.protocol import advance as advance
from distsched.ops.protocol import failure as failure
from distsched.schedules import (
    MAX_BACKFILL_SLOTS,
    MAX_FIRE_SLOTS,
    Definition,
    FiringState,
    Schedule,
    backfill_slots,
    instant_ms,
    plan_fire,
    validate_name,
)
from distsched.schedules import definition as schedule_definition
from distsched.validate import BACKOFF_CAP_MS as BACKOFF_CAP_MS
from distsched.validate import BACKOFF_MAX_S as BACKOFF_MAX_S
from distsched.validate import CLUSTER_SCHEMES as CLUSTER_SCHEMES
from distsched.validate import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from distsched.validate import FAIR_CAP_MAX as FAIR_CAP_MAX
from distsched.validate import FAIR_INTERVAL_MAX_MS as FAIR_INTERVAL_MAX_MS
from distsched.validate import FAIR_WEIGHT_MAX as FAIR_WEIGHT_MAX
from distsched.validate import MAX_ATTEMPTS_LIMIT as MAX_ATTEMPTS_LIMIT
from distsched.validate import MAX_DELAY_MS as MAX_DELAY_MS
from distsched.validate import MAX_DEPS as MAX_DEPS
from distsched.validate import MAX_FAIR_KEY_BYTES as MAX_FAIR_KEY_BYTES
from distsched.validate import MAX_MS as MAX_MS
from distsched.validate import MAX_TASK_ID_BYTES as MAX_TASK_ID_BYTES
from distsched.validate import ORDER_AGING_MAX_MS as ORDER_AGING_MAX_MS
from distsched.validate import PRIORITY_MAX as PRIORITY_MAX
from distsched.validate import PRIORITY_MIN as PRIORITY_MIN
from distsched.validate import PURGE_TASKS_MAX as PURGE_TASKS_MAX
from distsched.validate import TASKS_LIMIT_MAX as TASKS_LIMIT_MAX
from distsched.validate import TIMEOUT_MAX_MS as TIMEOUT_MAX_MS
from distsched.validate import URL_SCHEMES as URL_SCHEMES
from distsched.validate import _finite as _finite
from distsched.validate import _is_int as _is_int
from distsched.validate import _is_number as _is_number
from distsched.validate import _validate_cap as _validate_cap
from distsched.validate import _validate_rate as _validate_rate
from distsched.validate import cluster_seed as cluster_seed
from distsched.validate import list_state as list_state
from distsched.validate import seconds_to_ms as seconds_to_ms
from distsched.validate import task_spec as task_spec
from distsched.validate import time_argument as time_argument
from distsched.validate import timeout_ms as timeout_ms
from distsched.validate import validate_deps as validate_deps
from distsched.validate import validate_fair_key as validate_fair_key
from distsched.validate import validate_lease as validate_lease
from distsched.validate import validate_max_payload_bytes as validate_max_payload_bytes
from distsched.validate import validate_max_running as validate_max_running
from distsched.validate import validate_order as validate_order
from distsched.validate import validate_payload_limit as validate_payload_limit
from distsched.validate import validate_task_id as validate_task_id
from distsched.validate import validate_url as validate_url
from distsched.validate import validate_wait_timeout as validate_wait_timeout
from distsched.validate import validate_worker_id as validate_worker_id
from distsched.wire.calls import _EVERY_LEASE as _EVERY_LEASE
from distsched.wire.calls import CLAIM_MAX_DROP as CLAIM_MAX_DROP
from distsched.wire.calls import COMPACT_MINIMUM as COMPACT_MINIMUM
from distsched.wire.calls import DEFAULT_RETENTION_MS as DEFAULT_RETENTION_MS
from distsched.wire.calls import DEFAULT_RETENTION_S as DEFAULT_RETENTION_S
from distsched.wire.calls import EXPIRE_BATCH as EXPIRE_BATCH
from distsched.wire.calls import FIRE_HEADS as FIRE_HEADS
from distsched.wire.calls import FIRE_TRIES as FIRE_TRIES
from distsched.wire.calls import IDLE_MS as IDLE_MS
from distsched.wire.calls import IDLE_RECHECK_S as IDLE_RECHECK_S
from distsched.wire.calls import MINUTES_KEEP as MINUTES_KEEP
from distsched.wire.calls import MINUTES_MARGIN as MINUTES_MARGIN
from distsched.wire.calls import MINUTES_SCAN as MINUTES_SCAN
from distsched.wire.calls import MINUTES_TRIM_STEP as MINUTES_TRIM_STEP
from distsched.wire.calls import ORDER_REWRITE_MAX as ORDER_REWRITE_MAX
from distsched.wire.calls import PLACE_PART as PLACE_PART
from distsched.wire.calls import PROPAGATE_BUDGET as PROPAGATE_BUDGET
from distsched.wire.calls import PURGE_BATCH as PURGE_BATCH
from distsched.wire.calls import REAP_BATCH as REAP_BATCH
from distsched.wire.calls import REPORTS_PER_CALL as REPORTS_PER_CALL
from distsched.wire.calls import SERVER_TIME_LUA as SERVER_TIME_LUA
from distsched.wire.calls import Call as Call
from distsched.wire.calls import _deadline_suffix as _deadline_suffix
from distsched.wire.calls import _first_call_edges as _first_call_edges
from distsched.wire.calls import _key_reads as _key_reads
from distsched.wire.calls import _key_suffix as _key_suffix
from distsched.wire.calls import _parts as _parts
from distsched.wire.calls import _policy_suffix as _policy_suffix
from distsched.wire.calls import _token_values as _token_values
from distsched.wire.calls import add_deps_call as add_deps_call
from distsched.wire.calls import admission_suffix as admission_suffix
from distsched.wire.calls import call_payloads as call_payloads
from distsched.wire.calls import cancel_call as cancel_call
from distsched.wire.calls import claim_call as claim_call
from distsched.wire.calls import compact_call as compact_call
from distsched.wire.calls import complete_call as complete_call
from distsched.wire.calls import confirm_cancel_call as confirm_cancel_call
from distsched.wire.calls import expire_call as expire_call
from distsched.wire.calls import fail_call as fail_call
from distsched.wire.calls import fairness_call as fairness_call
from distsched.wire.calls import fire_call as fire_call
from distsched.wire.calls import fire_slots_per_call as fire_slots_per_call
from distsched.wire.calls import forget_call as forget_call
from distsched.wire.calls import heartbeat_call as heartbeat_call
from distsched.wire.calls import leave_call as leave_call
from distsched.wire.calls import order_call as order_call
from distsched.wire.calls import payload_weights as payload_weights
from distsched.wire.calls import placed_in_parts as placed_in_parts
from distsched.wire.calls import propagate_call as propagate_call
from distsched.wire.calls import purge_call as purge_call
from distsched.wire.calls import reap_call as reap_call
from distsched.wire.calls import recur_put_call as recur_put_call
from distsched.wire.calls import recur_remove_call as recur_remove_call
from distsched.wire.calls import release_call as release_call
from distsched.wire.calls import retry_call as retry_call
from distsched.wire.calls import schedule_batches as schedule_batches
from distsched.wire.calls import schedule_call as schedule_call
from distsched.wire.calls import schedule_values as schedule_values
from distsched.wire.calls import status_reads as status_reads
from distsched.wire.payload import _CONTAINERS as _CONTAINERS
from distsched.wire.payload import _CUT_PACKED as _CUT_PACKED
from distsched.wire.payload import _FIXED_SIZES as _FIXED_SIZES
from distsched.wire.payload import _NESTING as _NESTING
from distsched.wire.payload import _NOT_CONTAINER_BYTES as _NOT_CONTAINER_BYTES
from distsched.wire.payload import _SIZED as _SIZED
from distsched.wire.payload import CUT_MARK as CUT_MARK
from distsched.wire.payload import ERROR_CUT_MARK_BYTES as ERROR_CUT_MARK_BYTES
from distsched.wire.payload import ERROR_MAX_BYTES as ERROR_MAX_BYTES
from distsched.wire.payload import READ_DEPTH as READ_DEPTH
from distsched.wire.payload import _bounded_traceback as _bounded_traceback
from distsched.wire.payload import _bytes as _bytes
from distsched.wire.payload import _cut_tail as _cut_tail
from distsched.wire.payload import _deeper as _deeper
from distsched.wire.payload import _head as _head
from distsched.wire.payload import _may_nest as _may_nest
from distsched.wire.payload import _nested as _nested
from distsched.wire.payload import _rebuilt as _rebuilt
from distsched.wire.payload import _safe_str as _safe_str
from distsched.wire.payload import _text as _text
from distsched.wire.payload import _utf8 as _utf8
from distsched.wire.payload import cut_deep as cut_deep
from distsched.wire.payload import cut_packed as cut_packed
from distsched.wire.payload import decode_payload as decode_payload
from distsched.wire.payload import decode_payload_full as decode_payload_full
from distsched.wire.payload import decode_payload_trace as decode_payload_trace
from distsched.wire.payload import decode_value as decode_value
from distsched.wire.payload import encode_payload as encode_payload
from distsched.wire.payload import encode_result as encode_result
from distsched.wire.payload import error_text as error_text
from distsched.wire.payload import payload_values as payload_values
from distsched.wire.payload import unpack_error as unpack_error
from distsched.wire.records import _HEX_FLIP as _HEX_FLIP
from distsched.wire.records import _HISTORY_HEAD as _HISTORY_HEAD
from distsched.wire.records import _INDEX_CODE as _INDEX_CODE
from distsched.wire.records import _INDEX_CURSOR as _INDEX_CURSOR
from distsched.wire.records import _PACKED_RECORD as _PACKED_RECORD
from distsched.wire.records import _RANK_CURSOR as _RANK_CURSOR
from distsched.wire.records import _RECORD_INT as _RECORD_INT
from distsched.wire.records import _RECORD_RANGES as _RECORD_RANGES
from distsched.wire.records import _STATE_BY_CODE as _STATE_BY_CODE
from distsched.wire.records import EXPIRED_ERROR as EXPIRED_ERROR
from distsched.wire.records import FAIR_DUE_MAX as FAIR_DUE_MAX
from distsched.wire.records import HISTORY_KEEP as HISTORY_KEEP
from distsched.wire.records import RANKED_MARK as RANKED_MARK
from distsched.wire.records import Record as Record
from distsched.wire.records import _count_or_none as _count_or_none
from distsched.wire.records import _cursor_bytes as _cursor_bytes
from distsched.wire.records import _cursor_text as _cursor_text
from distsched.wire.records import _decode_rate as _decode_rate
from distsched.wire.records import _decode_record as _decode_record
from distsched.wire.records import _error_first_line as _error_first_line
from distsched.wire.records import _fair_due as _fair_due
from distsched.wire.records import _fair_prefix as _fair_prefix
from distsched.wire.records import _fairq_entry_due as _fairq_entry_due
from distsched.wire.records import _minute_of as _minute_of
from distsched.wire.records import _packed_fields as _packed_fields
from distsched.wire.records import _pair_of as _pair_of
from distsched.wire.records import _parse_list_cursor as _parse_list_cursor
from distsched.wire.records import _rank_hex as _rank_hex
from distsched.wire.records import _record_of as _record_of
from distsched.wire.records import _state_or_none as _state_or_none
from distsched.wire.records import decode_cause as decode_cause
from distsched.wire.records import decode_dependents as decode_dependents
from distsched.wire.records import decode_deps_list as decode_deps_list
from distsched.wire.records import decode_history as decode_history
from distsched.wire.records import decode_kept_claim as decode_kept_claim
from distsched.wire.records import decode_order as decode_order
from distsched.wire.records import decode_payload_limit as decode_payload_limit
from distsched.wire.records import decode_record as decode_record
from distsched.wire.records import decode_worker as decode_worker
from distsched.wire.records import edge_range as edge_range
from distsched.wire.records import encode_worker as encode_worker
from distsched.wire.records import fair_delayed_member as fair_delayed_member
from distsched.wire.records import fair_ranked_member as fair_ranked_member
from distsched.wire.records import id_prefix as id_prefix
from distsched.wire.records import member_priority as member_priority
from distsched.wire.records import parse_queue_member as parse_queue_member
from distsched.wire.records import queue_member as queue_member
from distsched.wire.records import state_index_member as state_index_member
from distsched.wire.replies import CLAIM_FIELDS as CLAIM_FIELDS
from distsched.wire.replies import TASKS_BUDGET_FACTOR as TASKS_BUDGET_FACTOR
from distsched.wire.replies import TASKS_FILTER_CHUNK as TASKS_FILTER_CHUNK
from distsched.wire.replies import _decode_key_info as _decode_key_info
from distsched.wire.replies import _Entry as _Entry
from distsched.wire.replies import _listed_info as _listed_info
from distsched.wire.replies import _mapping as _mapping
from distsched.wire.replies import _match_entry as _match_entry
from distsched.wire.replies import _pairs as _pairs
from distsched.wire.replies import blocked_path as blocked_path
from distsched.wire.replies import decode_claim_reply as decode_claim_reply
from distsched.wire.replies import decode_ended as decode_ended
from distsched.wire.replies import decode_fired as decode_fired
from distsched.wire.replies import decode_id_list as decode_id_list
from distsched.wire.replies import decode_outcomes as decode_outcomes
from distsched.wire.replies import decode_schedule_reply as decode_schedule_reply
from distsched.wire.replies import decode_stats as decode_stats
from distsched.wire.replies import decode_status as decode_status
from distsched.wire.replies import split_reply as split_reply
from distsched.wire.replies import task_result as task_result
from distsched.wire.replies import translate_error as translate_error

# --------------------------------------------------------------------------- operations
#
# Every public operation of the schedulers is a generator here: it yields the
# requests it needs (script calls, or plain commands sent together) and receives
# each reply through ``send`` (a refused script call arrives as a thrown error).
# The sync and asyncio shells only drive these generators over their connections,
# so the logic of an operation is written once, whatever the I/O model.


class ClaimShortcuts:
    """``ready`` and ``next``, written once over an operations class's ``claim``."""

    def claim(
        self, n: int, worker_id: str, listening: bool = False, request_id: str | None = None
    ) -> Op[tuple[list[Claim], Wait | None]]:
        raise NotImplementedError

    def ready(self, n: int, worker_id: str) -> Op[list[Claim]]:
        return (yield from self.claim(n, worker_id))[0]

    def next(self, worker_id: str) -> Op[Claim | Wait]:
        claims, wait = yield from self.claim(1, worker_id)
        if claims:
            return claims[0]
        assert wait is not None
        return wait


@dataclass(frozen=True)
class Ops(ClaimShortcuts):
    """The operations of one namespace, with the scheduler's settings (pure, no I/O)."""

    keys: Keys
    lease_ms: int
    max_payload_bytes: int
    # The caller's current trace context (W3C headers), sent along with the tasks it
    # schedules; None: none active (distsched.otel.current_trace when tracing is on).
    trace_context: Callable[[], Mapping[str, str] | None] | None = None

    # -------------------------------------------------------------- plumbing

    def run(self, call: Call) -> Op[list[Any]]:
        """Run one script; settle the dependents it left; return its own values.

        A task still settling its dependents cannot get a new version (``BUSY``):
        settle and send again, which always makes progress.
        """
        while True:
            try:
                reply = yield call
            except BusyError:
                yield from self.settle(PROPAGATE_BUDGET)
                continue
            left, values = split_reply(call.script, reply)
            if left > 0:
                yield from self.settle(PROPAGATE_BUDGET)
            return values

    def read(self, *commands: tuple[Any, ...], atomic: bool = True) -> Op[list[Any]]:
        """Send read-only commands together; again after a pause while Redis is
        briefly unavailable (a failover, a slot migration)."""
        request = Commands(commands, atomic)
        for pause in READ_RETRY_PAUSES:
            try:
                reply: list[Any] = yield request
                return reply
            except Unavailable:
                # While a cluster moves the slot, a transaction over keys split between
                # the old and the new node fails (ASK inside MULTI, TRYAGAIN) until the
                # move ends; sent apart, each command is redirected to where its key is.
                request = Commands(commands, atomic=False)
                yield Sleep(pause)
        reply = yield request
        return reply

    def once(self, call: Call) -> Op[tuple[int, list[Any]]]:
        """Send one script call as it is: (ids still propagating, its own values)."""
        return split_reply(call.script, (yield call))

    def settle(self, budget: int) -> Op[int]:
        if not _is_int(budget) or budget < 1:
            raise InvalidArgument("budget", "must be an int >= 1")
        total = 0
        call = propagate_call(self.keys, budget)
        while True:
            left, (used,) = split_reply("propagate", (yield call))
            total += int(used)
            if left == 0:
                return total

    # -------------------------------------------------------------- producers

    def admit_many(self, specs: Sequence[TaskSpec]) -> Op[list[Admitted]]:
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

    def schedule_many(self, specs: Sequence[TaskSpec]) -> Op[list[int]]:
        return [a.version for a in (yield from self.admit_many(specs))]

    def schedule(self, task_id: str, options: Mapping[str, Any]) -> Op[int]:
        return (yield from self.schedule_many([task_spec(task_id, options)]))[0]

    def admit(self, task_id: str, options: Mapping[str, Any]) -> Op[Admitted]:
        return (yield from self.admit_many([task_spec(task_id, options)]))[0]

    def cancel(self, task_id: str) -> Op[State]:
        (state,) = yield from self.run(cancel_call(self.keys, task_id))
        return State(_text(state))

    def retry(self, task_id: str, cascade: bool) -> Op[int]:
        (version,) = yield from self.run(retry_call(self.keys, task_id, cascade))
        return int(version)

    def add_deps(self, task_id: str, deps: Sequence[str], allow_unknown: bool) -> Op[None]:
        yield from self.run(add_deps_call(self.keys, task_id, deps, allow_unknown))

    # -------------------------------------------------------------- workers

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

    def heartbeat(self, claim: Claim) -> Op[bool]:
        (status,) = yield from self.heartbeat_many([claim])
        if status is None:
            raise LeaseLostError(f"lease of {claim.task_id!r} attempt {claim.attempt} was lost")
        return status

    def report(self, call: Call, count: int) -> Op[list[Outcome]]:
        if count == 0:
            return []
        return decode_outcomes((yield from self.run(call)))

    def complete_many(
        self, reports: Sequence[tuple[Claim, object]], encoded: bool = False
    ) -> Op[list[Outcome]]:
        call = complete_call(self.keys, reports, encoded=encoded)
        if len(reports) > REPORTS_PER_CALL:
            out: list[Outcome] = []
            for part in _parts(reports):
                out += yield from self.complete_many(part, encoded)
            return out
        return (yield from self.report(call, len(reports)))

    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> Op[list[Outcome]]:
        call = fail_call(self.keys, reports)
        if len(reports) > REPORTS_PER_CALL:
            out: list[Outcome] = []
            for part in _parts(reports):
                out += yield from self.fail_many(part)
            return out
        return (yield from self.report(call, len(reports)))

    def confirm_cancel(self, claim: Claim) -> Op[Outcome]:
        (outcome,) = yield from self.run(confirm_cancel_call(self.keys, claim))
        return Outcome(_text(outcome))

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

    def release(self, claims: Sequence[Claim], delay: float) -> Op[int]:
        call = release_call(self.keys, claims, delay)
        if not claims:
            return 0
        if len(claims) > REPORTS_PER_CALL:
            released = 0
            for part in _parts(claims):
                released += yield from self.release(part, delay)
            return released
        return sum(int(v) for v in (yield from self.run(call)))

    # -------------------------------------------------------------- housekeeping

    def reap(self, limit: int) -> Op[int]:
        return int((yield from self.run(reap_call(self.keys, limit=limit)))[0])

    def expire_lease(self, task_id: str) -> Op[int]:
        return int((yield from self.run(reap_call(self.keys, task_id=task_id)))[0])

    def purge(self, limit: int) -> Op[int]:
        if not _is_int(limit) or limit < 1:
            raise InvalidArgument("limit", "must be an int >= 1")
        return int((yield from self.run(purge_call(self.keys, limit)))[0])

    def purge_tasks(self, task_ids: Sequence[str]) -> Op[int]:
        call = forget_call(self.keys, task_ids)
        if not task_ids:
            return 0
        return int((yield from self.run(call))[0])

    def set_retention(self, retention_s: float) -> Op[None]:
        if retention_s is None:
            # purge_call takes None as "keep the stored retention": refuse it here.
            raise InvalidArgument("retention_s", "must be a number of seconds >= 0, got None")
        yield from self.run(purge_call(self.keys, 1, retention_s))

    def compact(self, budget: int) -> Op[int]:
        if not _is_int(budget) or budget < 1:
            raise InvalidArgument("budget", "must be an int >= 1")
        return int((yield from self.run(compact_call(self.keys, budget)))[0])

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
        trimmed = yield from self.trim_minutes()
        return Chores(
            reaped=reaped, expired=expired, compacted=compacted, purged=purged, trimmed=trimmed
        )

    def expire(self, limit: int) -> Op[int]:
        """End queued tasks whose deadline passed (at most ``limit`` deadline entries);
        return how many expired."""
        return int((yield from self.run(expire_call(self.keys, limit)))[0])

    def trim_minutes(self) -> Op[int]:
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

    def throughput(self, minutes: object = 60) -> Op[list[MinuteCount]]:
        if not _is_int(minutes) or not 1 <= minutes <= MINUTES_KEEP:  # type: ignore[operator]
            raise InvalidArgument("minutes", f"must be an int in [1, {MINUTES_KEEP}]")
        count = int(minutes)  # type: ignore[call-overload]
        now = yield from self.server_time()
        current = int(now * 1000) // 60_000
        first = current - count + 1
        fields = [f"{m}:{kind}" for m in range(first, current + 1) for kind in "sf"]
        (values,) = yield from self.read(("HMGET", self.keys.minutes, *fields))
        return [
            MinuteCount(
                minute=(first + i) * 60.0,
                succeeded=_count_or_none(values[2 * i]) or 0,
                failed=_count_or_none(values[2 * i + 1]) or 0,
            )
            for i in range(count)
        ]

    def set_max_running(self, max_running: int | None) -> Op[None]:
        limit = validate_max_running(max_running)
        if limit is None:
            yield _one(("HDEL", self.keys.meta, "max_running"))
        else:
            yield _one(("HSET", self.keys.meta, "max_running", limit))
            # Waiting workers may now have capacity: tell them all (a rare event), on
            # the channel they subscribe to with SSUBSCRIBE, or SUBSCRIBE before Redis 7.
            sharded = yield from self.uses_sharded_pubsub()
            yield _one(("SPUBLISH" if sharded else "PUBLISH", self.keys.wake, "capacity"))

    def payload_limit(self) -> Op[int]:
        (raw,) = yield from self.read(("HGET", self.keys.meta, "payload_max"))
        return decode_payload_limit(raw)

    def set_payload_limit(self, limit: int | None) -> Op[int]:
        chosen = validate_payload_limit(limit)
        if chosen is None:
            yield _one(("HDEL", self.keys.meta, "payload_max"))
        else:
            yield _one(("HSET", self.keys.meta, "payload_max", chosen))
        return (yield from self.payload_limit())

    def order(self) -> Op[OrderSetting]:
        (fields,) = yield from self.read(("HMGET", self.keys.meta, "order", "aging_ms"))
        return decode_order(fields[0], fields[1])

    def set_order(self, order: object, aging: object) -> Op[OrderSetting]:
        chosen, aging_ms = validate_order(order, aging)
        yield from self.run(order_call(self.keys, chosen, aging_ms))
        return OrderSetting(chosen, aging_ms / 1000.0)

    def set_key(
        self,
        key: str,
        cap: int | None = None,
        weight: int = 1,
        rate: int | None = None,
        per: float = 1.0,
    ) -> Op[KeyInfo]:
        key = validate_fair_key(key, allow_default=True)
        chosen = _validate_cap(cap)
        if not _is_int(weight) or not 1 <= weight <= FAIR_WEIGHT_MAX:
            raise InvalidArgument("weight", f"must be an int in [1, {FAIR_WEIGHT_MAX}]")
        limit = _validate_rate(rate, per)
        yield from self.run(fairness_call(self.keys, "key", key, chosen, weight, limit))
        return (yield from self.key_info(key))

    def set_default_key_cap(self, cap: int | None) -> Op[None]:
        chosen = _validate_cap(cap)
        yield from self.run(fairness_call(self.keys, "default", "", chosen, 1))

    def key_info(self, key: str) -> Op[KeyInfo]:
        key = validate_fair_key(key, allow_default=True)
        replies = yield from self.read(*_key_reads(self.keys, key))
        return _decode_key_info(key, replies)

    def fair_keys(self, limit: int = 100) -> Op[list[KeyInfo]]:
        if not _is_int(limit) or limit < 1:
            raise InvalidArgument("limit", "must be an int >= 1")
        k = self.keys
        ready, waiting, full, settings = yield from self.read(
            ("ZRANGE", k.fairready, 0, limit - 1),
            ("ZRANGE", k.fairwait, 0, limit - 1),
            ("ZRANGE", k.fairfull, 0, limit - 1),
            ("HSCAN", k.fair, 0, "COUNT", limit),
        )
        names: list[str] = [_text(raw) for raw in [*ready, *full, *waiting]]
        page = settings[1] if isinstance(settings, (list, tuple)) else {}
        fields = list(page) if isinstance(page, dict) else list(page)[0::2]
        for raw_field in fields:
            field_name = _text(raw_field)
            for tag in ("cap:", "w:", "run:", "rate:"):
                if field_name.startswith(tag):
                    names.append(field_name[len(tag) :])
        unique = list(dict.fromkeys(names))[:limit]
        if not unique:
            return []
        per_key = [_key_reads(k, name) for name in unique]
        replies = yield from self.read(*[read for reads in per_key for read in reads])
        infos, at = [], 0
        for name, reads in zip(unique, per_key, strict=True):
            infos.append(_decode_key_info(name, replies[at : at + len(reads)]))
            at += len(reads)
        return sorted(infos, key=lambda info: (-info.running, -info.queued, info.key))

    def uses_sharded_pubsub(self) -> Op[bool]:
        """Whether wake-ups travel on sharded channels: the server has SPUBLISH (Redis 7)."""
        try:
            (info,) = yield from self.read(("INFO", "server"), atomic=False)
        except (redis_exceptions.RedisError, ScriptError):
            # Not allowed to ask (an ACL), or a server without INFO (fakeredis): distsched
            # needs Redis 7 anyway.
            return True
        if isinstance(info, (bytes, str)):
            found = re.search(rb"redis_version:(\d+)", _bytes(info))
            version = found.group(1).decode() if found else "7"
        else:
            version = str(info.get("redis_version", "7"))
        major = version.split(".", 1)[0]
        return not major.isdigit() or int(major) >= 7

    def idle(self, worker_id: str) -> Op[None]:
        """Count ``worker_id`` as an idle worker listening on its channel, for IDLE_MS."""
        channel = self.keys.worker_channel(validate_worker_id(worker_id))
        now = yield from self.server_time()
        yield _one(("ZADD", self.keys.idle, int(now * 1000) + IDLE_MS, channel))

    def leave(self, worker_id: str) -> Op[bool]:
        channel = self.keys.worker_channel(validate_worker_id(worker_id))
        (woken,) = yield from self.run(
            Call("leave", self.keys.for_script("leave"), [channel, worker_id])
        )
        return int(woken) == 1

    def register_worker(self, info: WorkerInfo) -> Op[WorkerInfo]:
        """Write ``info`` into the worker registry, heartbeat stamped with the server's
        time now (and ``started`` too when it is 0): one HSET."""
        validate_worker_id(info.worker_id)
        now = yield from self.server_time()
        stamped = info.stamped(now)
        yield _one(("HSET", self.keys.workers, info.worker_id, encode_worker(stamped)))
        return stamped

    def unregister_worker(self, worker_id: str) -> Op[bool]:
        """Remove a stopping worker from the registry; True if it was there."""
        (removed,) = yield _one(("HDEL", self.keys.workers, validate_worker_id(worker_id)))
        return int(removed) == 1

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

    def workers(self) -> Op[list[WorkerInfo]]:
        """The registered workers, by id, without those past their drop time."""
        entries = yield from self._read_workers()
        return [
            info for _, info in entries if info is not None and info.seen_ago <= info.drop_after_s
        ]

    def _read_workers(self) -> Op[list[tuple[bytes | str, WorkerInfo | None]]]:
        now = yield from self.server_time()
        (raw,) = yield from self.read(("HGETALL", self.keys.workers))
        entries = sorted(_mapping(raw).items(), key=lambda item: _bytes(item[0]))
        return [(worker_id, decode_worker(worker_id, value, now)) for worker_id, value in entries]

    # -------------------------------------------------------------- inspection

    def status(self, task_id: str) -> Op[TaskInfo]:
        validate_task_id(task_id)
        k = self.keys
        reads: list[tuple[Any, ...]] = [("HGET", key, task_id) for key in status_reads(k)]
        reads.append(("ZSCORE", k.leases, task_id))
        reads.append(("ZRANGEBYLEX", k.edges, *edge_range(task_id)))
        record, payload, result, deps, cause, history, lease, edges = yield from self.read(*reads)
        blocked_by = None
        if cause:
            walk = blocked_path(task_id, cause)
            try:
                parent = next(walk)
                while True:
                    (raw,) = yield from self.read(("HGET", k.blocked, parent))
                    parent = walk.send(raw)
            except StopIteration as done:
                blocked_by = done.value
            except ValueError:  # a cause with junk in it: the path is unknown
                blocked_by = None
        return decode_status(
            task_id, record, payload, result, lease, deps,
            decode_dependents(task_id, edges), blocked_by, history,
        )  # fmt: skip

    def wait(self, task_id: str, timeout: float | None, handle: Any) -> Op[TaskInfo]:
        """The task's ``TaskInfo`` once it is terminal; ``Timeout`` after ``timeout``
        seconds (server clock); ``NotFoundError`` for an unknown id.

        A terminal task is answered from one read, writing nothing. Otherwise the id is
        registered in ``waits`` (``ZADD GT``: until when someone waits) *before* the
        state is read again, so a task that ends in between still finds the entry and
        is announced on ``ended``; then the op listens (``Listen``), reads again on
        each notice, and registers and reads again at the latest every ``WAIT_REFRESH_S``.
        """
        validate_task_id(task_id)
        limit = validate_wait_timeout(timeout)
        info = yield from self.status(task_id)
        if info.state.terminal:
            return info
        deadline: float | None = None
        while True:
            now = yield from self.server_time()
            if limit is not None and deadline is None:
                deadline = now + limit
            left = None if deadline is None else max(0.0, deadline - now)
            span = WAIT_REFRESH_S if left is None else min(left, WAIT_REFRESH_S)
            until_ms = int(now * 1000) + math.ceil(span * 1000) + WAIT_MARGIN_MS
            # Idempotent, so sent again like a read while Redis is briefly unavailable.
            yield from self.read(("ZADD", self.keys.waits, "GT", until_ms, task_id), atomic=False)
            info = yield from self.status(task_id)
            if info.state.terminal:
                return info
            if left is not None and left <= 0:
                raise Timeout(task_id, float(limit or 0.0))
            if (yield Listen(handle, span)):
                # Told: the script that ended it removed the entry; read before adding
                # one again, which would then only expire.
                info = yield from self.status(task_id)
                if info.state.terminal:
                    return info

    def result(self, task_id: str, timeout: float | None, handle: Any) -> Op[Any]:
        """``wait``, then the result of a succeeded task or the error of any other end."""
        info = yield from self.wait(task_id, timeout, handle)
        return task_result(info)

    def stats(self) -> Op[Stats]:
        k = self.keys
        meta, entries, leases, ranked, fair_entries = yield from self.read(
            ("HGETALL", k.meta),
            ("ZCARD", k.queue),
            ("ZCARD", k.leases),
            ("ZCARD", k.ranked),
            ("ZCARD", k.fairq),
        )
        # The entries of a fair namespace's keyed tasks count as queue entries.
        queued = int(entries) + int(fair_entries)
        data = decode_stats(_mapping(meta), queued, int(leases), int(ranked))
        fair = _mapping(meta).get(b"fair") or _mapping(meta).get("fair")
        if fair is not None and _text(fair) == "1":
            infos = yield from self.fair_keys(STATS_TOP_KEYS)
            now = yield from self.server_time()
            data["keys"] = [
                KeyLoad(
                    key=info.key,
                    running=info.running,
                    queued=info.queued,
                    cap=info.cap if info.cap is not None else info.default_cap,
                    ready_wait_s=(
                        max(0.0, now - info.head_due_at)
                        if info.head_due_at is not None and info.head_due_at <= now
                        else None
                    ),
                )
                for info in infos
            ]
        return data

    def server_time(self) -> Op[float]:
        # A plain TIME goes to whichever node the client picks; the one clock that
        # decides due-ness and leases is that of the master holding the namespace's
        # slot, so the call names a namespace key and a cluster client routes it there.
        (reply,) = yield from self.read(("EVAL", SERVER_TIME_LUA, 1, self.keys.meta), atomic=False)
        seconds, micros = reply
        return float(seconds) + float(micros) / 1e6

    def overview(self, soon_s: float, scan: int) -> Op[Overview]:
        soon = _finite(soon_s)
        if soon is None or soon < 0:
            raise InvalidArgument("soon_s", "must be a number of seconds >= 0")
        if not _is_int(scan) or scan < 1:
            raise InvalidArgument("scan", "must be an int >= 1")
        data = yield from self.stats()
        now = yield from self.server_time()
        now_ms = int(now * 1000)
        k = self.keys
        aging_ms = round(data["aging_s"] * 1000)
        expired, expiring, due, ranked = yield from self.read(
            ("ZCOUNT", k.leases, "-inf", f"({now_ms}"),
            ("ZCOUNT", k.leases, now_ms, now_ms + int(soon * 1000)),
            ("ZRANGEBYSCORE", k.queue, "-inf", now_ms, "WITHSCORES", "LIMIT", 0, scan),
            ("ZRANGE", k.ranked, 0, scan - 1, "WITHSCORES"),
        )
        # (version, id, priority, due ms) of the first due entries of each set: in the
        # ready set of the priority order the due time is rank + priority * aging.
        entries = [
            (*parse_queue_member(member), member_priority(member), float(score))
            for member, score in _pairs(due)
        ]
        for member, score in _pairs(ranked):
            priority = member_priority(member)
            entries.append(
                (*parse_queue_member(member), priority, float(score) + priority * aging_ms)
            )
        oldest: float | None = None
        by_priority: dict[str, float] = {}
        if entries:
            (records,) = yield from self.read(
                ("HMGET", k.tasks, *[task_id for _, task_id, _, _ in entries])
            )
            for (version, _, priority, due_ms), raw in zip(entries, records, strict=True):
                if raw is None:
                    continue
                try:
                    record = decode_record(raw)
                except ScriptError:  # a corrupt record: claim.lua fails it
                    continue
                if record.state is State.READY and record.version == version:
                    age = max(0.0, now - due_ms / 1000.0)
                    oldest = age if oldest is None else max(oldest, age)
                    bucket = priority_bucket(priority)
                    by_priority[bucket] = max(by_priority.get(bucket, 0.0), age)
        total = data["queue_entries"]
        return Overview(
            **data,
            server_time=now,
            stale_ratio=(data["stale_entries"] / total) if total else 0.0,
            leases_expired=int(expired),
            leases_expiring=int(expiring),
            leases_soon_s=soon,
            oldest_ready_age=oldest,
            oldest_ready_age_by_priority=by_priority,
        )

    def explain(self, task_id: str) -> Op[Explanation]:
        return (yield from explain_task(self, task_id))

    def _blocked_path(self, task_id: str, cause: Any) -> Op[BlockedBy | None]:
        """The path from a blocked task's root cause, one read per hop, at most
        EXPLAIN_LIMIT hops (a longer chain is cut at the root's end)."""
        walk = blocked_path(task_id, cause)
        try:
            parent = next(walk)
            for _ in range(EXPLAIN_LIMIT):
                (raw,) = yield from self.read(("HGET", self.keys.blocked, parent))
                parent = walk.send(raw)
            # Too long a chain: the rest of it is not read, so the path ends there.
            walk.send(None)
        except StopIteration as done:
            result: BlockedBy = done.value
            return result
        except ValueError:  # a cause with junk in it: the path is unknown
            return None
        return None

    def leases(self) -> Op[list[tuple[str, float]]]:
        (rows,) = yield from self.read(("ZRANGE", self.keys.leases, 0, -1, "WITHSCORES"))
        return [
            (
                member.decode("utf-8", "replace") if isinstance(member, bytes) else member,
                float(score) / 1000.0,
            )
            for member, score in _pairs(rows)
        ]

    def scan_tasks(self, cursor: int, count: int) -> Op[tuple[int, list[TaskRow]]]:
        if not _is_int(cursor) or cursor < 0:
            raise InvalidArgument("cursor", "must be an int >= 0")
        if not _is_int(count) or count < 1:
            raise InvalidArgument("count", "must be an int >= 1")
        (reply,) = yield _one(("HSCAN", self.keys.tasks, cursor, "COUNT", count))
        next_cursor, fields = reply
        rows = []
        for raw_id, raw in _mapping(fields).items():
            try:
                record = decode_record(raw)
            except ScriptError:  # a corrupt record has no row; status() names it
                continue
            updated_at = record.updated_ms / 1000.0
            task_id = raw_id.decode("utf-8", "replace") if isinstance(raw_id, bytes) else raw_id
            row = TaskRow(task_id, record.state, record.version, record.attempt, updated_at)
            rows.append(row)
        return int(next_cursor), rows

    def tasks(
        self, state: object, fn: object = None, limit: object = 50, cursor: object = None
    ) -> Op[TaskPage]:
        st = list_state(state)
        if fn is not None and (not isinstance(fn, str) or not fn):
            raise InvalidArgument("fn", "must be a non-empty str or None")
        if not _is_int(limit) or not 1 <= limit <= TASKS_LIMIT_MAX:  # type: ignore[operator]
            raise InvalidArgument("limit", f"must be an int in [1, {TASKS_LIMIT_MAX}]")
        want_items = int(limit)  # type: ignore[call-overload]
        if cursor is not None:
            if not isinstance(cursor, str):
                raise InvalidArgument("cursor", "must be a str or None")
            _parse_list_cursor(st, cursor)
        k = self.keys
        budget = want_items * TASKS_BUDGET_FACTOR
        examined = 0
        items: list[TaskInfo] = []
        position: str | None = cursor
        while len(items) < want_items and examined < budget:
            chunk = want_items - len(items)
            if fn is not None:
                chunk = max(chunk, TASKS_FILTER_CHUNK)
            chunk = min(chunk, budget - examined)
            entries, exhausted = yield from self._list_entries(st, position, chunk)
            examined += max(len(entries), 1)
            if entries:
                ids = [e.task_id for e in entries]
                reads = [("HMGET", key, *ids) for key in (k.tasks, k.payloads, k.results)]
                reads += [("HMGET", k.deps, *ids), ("HMGET", k.history, *ids)]
                records, payloads, results, deps, history = yield from self.read(*reads)
            stopped = False
            for i, entry in enumerate(entries):
                position = entry.cursor
                info = _listed_info(st, entry, records[i], payloads[i], results[i], deps[i],
                                    history[i], fn)  # fmt: skip
                if info is not None:
                    items.append(info)
                    if len(items) >= want_items:
                        stopped = i < len(entries) - 1 or not exhausted
                        break
            if len(items) >= want_items:
                if not stopped:
                    position = None
                break
            if exhausted:
                position = None
                break
        return TaskPage(tuple(items), position)

    def _list_entries(
        self, state: State, position: str | None, want: int
    ) -> Op[tuple[list[_Entry], bool]]:
        """The next ``want`` entries of a state's listing after ``position``, and whether
        the listing ends within them (one more is read to tell)."""
        k = self.keys
        if state in _INDEX_CODE:
            code = _INDEX_CODE[state].encode()
            low = b"(" + _cursor_bytes(position) if position else b"[" + code
            high = b"(" + bytes([code[0] + 1])
            (members,) = yield from self.read(
                ("ZRANGEBYLEX", k.states, low, high, "LIMIT", 0, want + 1), atomic=False
            )
            entries = [
                _Entry(_bytes(m)[15:].decode("utf-8", "replace"), _bytes(m), None,
                       _cursor_text(_bytes(m)))
                for m in members[:want]
            ]  # fmt: skip
            return entries, len(members) <= want
        if state is State.READY:
            # The ready set of the priority order first (claim order; empty in the default
            # order), then the queue; a cursor into the ready set starts with RANKED_MARK.
            in_ranked = not position or position.startswith(RANKED_MARK)
            if in_ranked:
                after_ranked = position[len(RANKED_MARK) :] if position else None
                entries, done = yield from self._list_sorted(
                    k.ranked, state, after_ranked, want, RANKED_MARK
                )
                if not done:
                    return entries, False
                if len(entries) >= want:
                    # The queue may hold more: the next page goes on from there.
                    return entries, False
                rest, done = yield from self._list_sorted(
                    k.queue, state, None, want - len(entries), ""
                )
                return entries + rest, done
            return (yield from self._list_sorted(k.queue, state, position, want, ""))
        return (yield from self._list_sorted(k.leases, state, position, want, ""))

    def _list_sorted(
        self, key: str, state: State, position: str | None, want: int, mark: str
    ) -> Op[tuple[list[_Entry], bool]]:
        """``_list_entries`` of one sorted set (queue, ready set or leases); cursors get
        ``mark`` in front."""
        start, after = 0, None
        if position:
            after = _parse_list_cursor(state, position)
            score, member = after
            rank, now_score, below = yield from self.read(
                ("ZRANK", key, member),
                ("ZSCORE", key, member),
                ("ZCOUNT", key, "-inf", f"({score}"),
            )
            if rank is not None and now_score is not None and int(float(now_score)) == score:
                start, after = int(rank) + 1, None
            else:
                # The cursor's entry left (claimed, ended): go on from where it stood.
                start = int(below)
        read = want
        while True:
            (rows,) = yield from self.read(
                ("ZRANGE", key, start, start + read, "WITHSCORES"), atomic=False
            )
            pairs = [(_bytes(m), int(float(sc))) for m, sc in _pairs(rows)]
            exhausted = len(pairs) <= read
            pairs = pairs[:read]
            if after is not None:
                # Entries of the cursor's score that sorted before it are still there:
                # pass them, reading twice as many each time.
                before = sum((sc, m) <= after for m, sc in pairs)
                if before == len(pairs) and not exhausted:
                    start, read = start + len(pairs), read * 2
                    continue
                kept = [(m, sc) for m, sc in pairs if (sc, m) > after]
                exhausted = exhausted and len(kept) <= want
                pairs = kept[:want]
            break
        entries = []
        for member, score in pairs:
            task_id = (member[22:] if state is State.READY else member).decode("utf-8", "replace")
            text = f"{mark}{score}:{_cursor_text(member)}"
            entries.append(_Entry(task_id, member, score, text))
        return entries, exhausted

    def exists(self) -> Op[bool]:
        # One key per command: while a cluster moves the namespace's slot, a command
        # naming several keys is refused (TRYAGAIN) until the move ends, one naming a
        # single key is redirected to wherever that key is.
        counts = yield from self.read(*(("EXISTS", key) for key in self.keys.all_keys()))
        return any(int(count) for count in counts)

    def clear(self) -> Op[None]:
        yield _one(("DEL", *self.keys.all_keys()))

    # -------------------------------------------------------------- schedules

    def now_ms(self) -> Op[int]:
        """The server's clock (of the namespace's node), in epoch ms."""
        return round((yield from self.server_time()) * 1000)

    def _load_schedule(self, name: str) -> Op[tuple[Definition, FiringState, int | None]]:
        k = self.keys
        raw, state, score = yield from self.read(
            ("HGET", k.schedules, name), ("HGET", k.firing, name), ("ZSCORE", k.fires, name)
        )
        if raw is None:
            raise NotFoundError(f"no schedule {name!r}")
        try:
            d = Definition.decode(name, _bytes(raw))
        except ValueError as exc:
            raise ScriptError(str(exc)) from None
        return d, FiringState.decode(state), None if score is None else round(float(score))

    def _put_schedule(self, d: Definition, next_ms: int | None) -> Op[Schedule]:
        yield from self.run(recur_put_call(self.keys, d, uuid.uuid4().hex, next_ms))
        return (yield from self.get_schedule(d.name))

    def add_schedule(self, name: str, fn: str, options: Mapping[str, Any]) -> Op[Schedule]:
        validate_name(name)
        now = yield from self.now_ms()
        d = schedule_definition(name, fn, now, options)
        encode_payload(d.fn, d.args, d.kwargs, self.max_payload_bytes, timeout=d.timeout_ms)
        next_ms = None if d.paused else d.timetable().after(now)
        return (yield from self._put_schedule(d, next_ms))

    def get_schedule(self, name: str) -> Op[Schedule]:
        d, state, score = yield from self._load_schedule(validate_name(name))
        return d.info(score, state)

    def schedules(self) -> Op[list[Schedule]]:
        k = self.keys
        defs, states, fires = yield from self.read(
            ("HGETALL", k.schedules),
            ("HGETALL", k.firing),
            ("ZRANGE", k.fires, 0, -1, "WITHSCORES"),
        )
        state_of = {_text(n): v for n, v in _mapping(states).items()}
        next_of = {_text(n): round(float(v)) for n, v in _pairs(fires)}
        out: list[Schedule] = []
        for raw_name, raw in _mapping(defs).items():
            name = _text(raw_name)
            try:
                d = Definition.decode(name, _bytes(raw))
            except ValueError:
                continue  # junk written by hand: shown by get_schedule's error
            out.append(d.info(next_of.get(name), FiringState.decode(state_of.get(name))))
        return sorted(out, key=lambda sc: sc.name)

    def remove_schedule(self, name: str) -> Op[bool]:
        (existed,) = yield from self.run(recur_remove_call(self.keys, name))
        return int(existed) == 1

    def pause_schedule(self, name: str) -> Op[Schedule]:
        d, _, _ = yield from self._load_schedule(validate_name(name))
        return (yield from self._put_schedule(d.replace(paused=True), None))

    def resume_schedule(self, name: str) -> Op[Schedule]:
        """Fire again from the next slot after now (slots while paused are not caught up)."""
        d, _, _ = yield from self._load_schedule(validate_name(name))
        now = yield from self.now_ms()
        d = d.replace(paused=False)
        return (yield from self._put_schedule(d, d.timetable().after(now)))

    def trigger(self, name: str) -> Op[str | None]:
        validate_name(name)
        for _ in range(FIRE_TRIES):
            d, state, _ = yield from self._load_schedule(name)
            call = fire_call(self.keys, d, state.rev, "trigger", [("now", "now")],
                             self.max_payload_bytes)  # fmt: skip
            fired = decode_fired((yield from self.run(call)))
            if not fired.moved:
                return fired.last_task
        raise ConflictError(f"schedule {name!r} kept changing while it was triggered")

    def backfill(self, name: str, start: object, end: object, limit: int) -> Op[int]:
        validate_name(name)
        if not _is_int(limit) or not 1 <= limit <= MAX_BACKFILL_SLOTS:
            raise InvalidArgument("limit", f"must be an int in [1, {MAX_BACKFILL_SLOTS}]")
        start_ms, end_ms = instant_ms(start, "start"), instant_ms(end, "end")
        if start_ms is None or end_ms is None:
            raise InvalidArgument("start", "give start and end")
        if end_ms < start_ms:
            raise InvalidArgument("end", "must not be before start")
        now = yield from self.now_ms()
        if end_ms > now:
            raise InvalidArgument("end", "must not be in the future (backfill fills the past)")
        # A payload too large for every slot in one call is sent in parts (each creates
        # its own slots' tasks, atomically); a change of the schedule between parts
        # starts again from its definition, the slots created so far kept.
        created = 0
        for _ in range(FIRE_TRIES):
            d, state, _ = yield from self._load_schedule(name)
            slots = backfill_slots(d, start_ms, end_ms, limit)
            if not slots:
                return created
            pairs = [(slot, slot + d.jitter_for(slot)) for slot in slots]
            per = fire_slots_per_call(d, self.max_payload_bytes)
            moved = False
            for first in range(0, len(pairs), per):
                part = pairs[first : first + per]
                call = fire_call(self.keys, d, state.rev, "backfill", part, self.max_payload_bytes)
                fired = decode_fired((yield from self.run(call)))
                if fired.moved:
                    moved = True
                    break
                created += fired.created
            if not moved:
                return created
        raise ConflictError(f"schedule {name!r} kept changing while it was backfilled")

    def next_fires(self, name: str, n: int) -> Op[list[float]]:
        if not _is_int(n) or not 1 <= n <= MAX_BACKFILL_SLOTS:
            raise InvalidArgument("n", f"must be an int in [1, {MAX_BACKFILL_SLOTS}]")
        d, _, score = yield from self._load_schedule(validate_name(name))
        if score is not None:
            first: int | None = d.timetable().at_or_after(score)
        elif d.paused:
            first = d.timetable().after((yield from self.now_ms()))
        else:
            return []  # ended
        out: list[float] = []
        table = d.timetable()
        while first is not None and len(out) < n:
            out.append(first / 1000.0)
            first = table.after(first)
        return out

    def fire_due(self, limit: int = FIRE_HEADS) -> Op[int]:
        """Fire the due slots of at most ``limit`` schedules; the tasks created."""
        k = self.keys
        clock, heads = yield from self.read(
            ("EVAL", SERVER_TIME_LUA, 1, k.meta), ("ZRANGE", k.fires, 0, limit - 1, "WITHSCORES"),
            atomic=False,
        )  # fmt: skip
        now = int(clock[0]) * 1000 + int(clock[1]) // 1000
        due = [(_text(n), round(float(v))) for n, v in _pairs(heads) if float(v) <= now]
        if not due:
            return 0
        names = [name for name, _ in due]
        defs, states = yield from self.read(
            ("HMGET", k.schedules, *names), ("HMGET", k.firing, *names)
        )
        created = 0
        error: Exception | None = None
        for (name, score), raw, state in zip(due, defs, states, strict=True):
            rev = FiringState.decode(state).rev
            if raw is None or not rev:
                # Junk (a definition or state written by other means): it leaves fires.
                yield from self.run(Call("recur", k.for_script("recur"), ["drop", name]))
                continue
            try:
                d = Definition.decode(name, _bytes(raw))
            except ValueError:
                # Junk that would stay due for ever: the schedule leaves fires (without a
                # next fire time, and nothing created); get_schedule shows why.
                call = Call("fire", k.for_script("fire"),
                            [PROPAGATE_BUDGET, name, rev, "fire", score, "", 0, "skip", "", "",
                             self.max_payload_bytes, 0])  # fmt: skip
                yield from self.run(call)
                continue
            try:
                # What only this worker may lack (the cron extra, a time zone, a payload
                # limit as large) is its own error: another worker may fire the slot.
                most = fire_slots_per_call(d, self.max_payload_bytes)
                plan = plan_fire(d, score, now, min(MAX_FIRE_SLOTS, most))
                call = fire_call(k, d, rev, "fire", plan.slots, self.max_payload_bytes,
                                 score, plan.next_ms, plan.missed)  # fmt: skip
            except (ValueError, ImportError) as exc:
                error = error or exc
                continue
            created += decode_fired((yield from self.run(call))).created
        if error is not None and not created:
            raise error
        return created

    def noop(self) -> Op[None]:
        """An operation that sends nothing (lets a shell run its pending set-up)."""
        return
        yield  # a generator all the same
