"""A namespace spread over several hash slots ("stripes"), as pure operations. No I/O.

Stripe 0 of namespace ``ns`` is ``ds:{ns}:...``, the namespace's own keys; stripe
``s`` > 0 is ``ds:{ns{s}:...`` (:class:`~distsched.keys.Keys`), a slot of its own that
Redis Cluster may place on another master. Each stripe is a complete namespace for the
scripts: every script runs unchanged on the stripe it is given. What this module adds:

- the stripe count, stored once in stripe 0's ``meta`` (field ``stripes``; absent: 1)
  and read by every scheduler on its first call;
- the routing of a task id to its stripe (:func:`~distsched.keys.stripe_of`, the id's
  ``{tag}`` as Redis Cluster hashes keys), so a call naming an id goes to one stripe;
- claims across stripes (round robin), and ``max_running`` kept across stripes by
  per-stripe shares that move toward the stripes with due work
  (:mod:`distsched.ops.shares`);
- reads that merge what every stripe holds (stats, overview, fairness keys, listings).

Every other operation of :class:`~distsched.ops.namespace.Ops` declares its route (one
stripe, stripe 0, every stripe: :mod:`distsched.ops.routing`) and goes through
:meth:`StripedOps.call`. With one stripe each operation is the plain operation of the
namespace, plus one ``HGET`` (the stripe count) on a scheduler's first call.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from distsched import validate
from distsched.errors import ConflictError, InvalidArgument, Unavailable
from distsched.keys import MAX_STRIPES, Keys, stripe_of
from distsched.model import (
    Admitted,
    Claim,
    KeyInfo,
    Outcome,
    Overview,
    Spawn,
    Stats,
    TaskPage,
    TaskRow,
    TaskSpec,
    Wait,
    WaitReason,
)
from distsched.ops import merges, protocol
from distsched.ops import routing as route
from distsched.ops.base import Shortcuts
from distsched.ops.namespace import Ops
from distsched.ops.protocol import Op
from distsched.ops.routing import Router
from distsched.ops.served import ServedCache, unserved_message
from distsched.ops.shares import (
    REBALANCE_EVERY_S,
    STRIPES_MAX_FIELD,
    ShareMover,
    int_or_none,
)
from distsched.placement import SALTS_FIELD, choose_salts, decode_salts, encode_salts
from distsched.wire import replies
from distsched.wire.calls import (
    FIRE_HEADS,
    payload_weights,
    placed_in_parts,
    schedule_batches,
    schedule_call,
)

T = TypeVar("T")

# The field of stripe 0's meta hash that holds the stripe count.
STRIPES_FIELD = "stripes"

log = logging.getLogger("distsched")


def validate_stripes(stripes: object) -> int | None:
    """``stripes`` as a stripe count (None: whatever the namespace has stored)."""
    if stripes is None:
        return None
    if not isinstance(stripes, int) or isinstance(stripes, bool) or not 1 <= stripes <= MAX_STRIPES:
        raise InvalidArgument("stripes", f"must be an int in [1, {MAX_STRIPES}] or None")
    return stripes


def combine_waits(waits: Sequence[Wait]) -> Wait | None:
    """One wait for a claim across stripes: a due schedule slot first, then the soonest
    due entry, then capacity, then empty."""
    if not waits:
        return None
    if any(w.reason is WaitReason.FIRE for w in waits):
        return Wait(WaitReason.FIRE, 0.0)
    delays = [w.delay for w in waits if w.delay is not None]
    soonest = min(delays) if delays else None
    for reason in (WaitReason.NOT_DUE, WaitReason.CAPACITY):
        if any(w.reason is reason for w in waits):
            return Wait(reason, soonest)
    return Wait(WaitReason.EMPTY, soonest)


class StripedOps(Router[Ops], ShareMover, Shortcuts):
    """The operations of one namespace over its stripes (pure, no I/O).

    ``stripes``: the count this scheduler expects (None: the stored one, 1 if none).
    A count that differs from the stored one is refused (``ConflictError``) unless
    every stripe of the namespace is empty: then it is stored instead.
    """

    def __init__(
        self,
        keys: Keys,
        lease_ms: int,
        max_payload_bytes: int,
        trace_context: Callable[[], Mapping[str, str] | None] | None = None,
        stripes: int | None = None,
    ) -> None:
        self.keys = keys
        self.lease_ms = lease_ms
        self.max_payload_bytes = max_payload_bytes
        self.trace_context = trace_context
        self.requested = validate_stripes(stripes)
        self.base = self._ops_of(0)
        self._stripes: tuple[Ops, ...] | None = None
        # Where the next claim starts: a random stripe, then one further each call.
        self._cursor = random.randrange(MAX_STRIPES)
        self._rebalanced_at = 0.0
        # Whether the last move left a share owed to a stripe with due work.
        self._owed = False
        self.served = ServedCache()
        # On a cluster, the master serving a slot (set by the shell): a namespace that
        # takes several stripes places them on distinct masters (distsched.placement).
        self.owner: Callable[[int], str | None] | None = None

    def _ops_of(self, stripe: int, stripes: int = 1) -> Ops:
        return Ops(
            self.keys.of_stripe(stripe),
            self.lease_ms,
            self.max_payload_bytes,
            self.trace_context,
            stripes,
        )

    # -------------------------------------------------------------- the stripe count

    @property
    def count(self) -> int | None:
        """The stripe count once known (after the first call), else None."""
        return None if self._stripes is None else len(self._stripes)

    def known(self) -> tuple[Ops, ...]:
        """The stripes' operations; only after the first call has read the count."""
        if self._stripes is None:
            raise RuntimeError("the stripe count is read by the scheduler's first call")
        return self._stripes

    def resolve(self) -> Op[tuple[Ops, ...]]:
        """The operations of each stripe, reading (or storing) the count on first use."""
        if self._stripes is not None:
            return self._stripes
        k = self.keys
        (row,) = yield from self.base.read(
            ("HMGET", k.meta, STRIPES_FIELD, SALTS_FIELD), atomic=False
        )
        stored_raw, salts_raw = row
        stored = int_or_none(stored_raw)
        if stored is not None and not 1 <= stored <= MAX_STRIPES:
            stored = None
        have = stored or 1
        self.keys = dataclasses.replace(self.keys, salts=decode_salts(salts_raw, have))
        want = self.requested if self.requested is not None else have
        if want != have:
            yield from self._change_count(have, want)
        self._stripes = tuple(self._ops_of(s, want) for s in range(want))
        return self._stripes

    def _change_count(self, have: int, want: int) -> Op[None]:
        """Store a new stripe count: only in a namespace without tasks or schedules,
        since ids map to stripes by their hash modulo the count, and a schedule lives on
        the stripe of its name with the slot tasks it fired (moved, its next slot could
        fire again beside a task of the old stripe, or not at all)."""
        every = yield from self._refuse_unless_empty(have, f"opened with stripes={want}", want)
        meta = self.keys.meta
        (limit_raw, total_raw) = yield from self.base.read(
            ("HGET", meta, "max_running"), ("HGET", meta, STRIPES_MAX_FIELD)
        )
        limit = int_or_none(total_raw) if have > 1 else int_or_none(limit_raw)
        salts = self.placed_salts(want)
        if want == 1:
            yield protocol._one(("HDEL", meta, STRIPES_FIELD, STRIPES_MAX_FIELD, SALTS_FIELD))
        elif salts:
            yield protocol._one(
                ("HSET", meta, STRIPES_FIELD, want, SALTS_FIELD, encode_salts(salts))
            )
        else:
            yield protocol._one(("HSET", meta, STRIPES_FIELD, want))
            yield protocol._one(("HDEL", meta, SALTS_FIELD))
        self.keys = dataclasses.replace(self.keys, salts=salts)
        self._stripes = tuple(self._ops_of(s, want) for s in range(want))
        # The namespace-wide max_running moves with the count: whole or in shares.
        for ops in every:
            yield protocol._one(("HDEL", ops.keys.meta, "max_running"))
        if limit is not None:
            yield from self.set_max_running(limit)

    def _refuse_unless_empty(self, have: int, change: str, more: int = 0) -> Op[list[Ops]]:
        """Raise ``ConflictError`` unless no stripe (of ``have``, or ``more``) holds a task
        or a schedule; return the operations of those stripes."""
        every = [self._ops_of(s) for s in range(max(have, more))]
        sizes = yield from self.base.read(
            *(("HLEN", ops.keys.tasks) for ops in every),
            *(("HLEN", ops.keys.schedules) for ops in every),
            atomic=False,
        )
        for what, part in (("tasks", sizes[: len(every)]), ("schedules", sizes[len(every) :])):
            busy = [s for s, size in enumerate(part) if int(size)]
            if busy:
                raise ConflictError(
                    f"namespace {self.keys.namespace!r} has {have} stripe(s) in Redis and "
                    f"holds {what} (stripe {busy[0]}); it cannot be {change}: open it with "
                    f"stripes={have} or stripes=None, or empty it first (Scheduler.clear(), "
                    "which removes its schedules too)"
                )
        return every

    def place(self) -> Op[tuple[int, ...]]:
        """Place the stripes of an empty namespace on distinct masters again (after a
        reshard put two on one master); the salts stored (() on one server)."""
        stripes = yield from self.resolve()
        yield from self._refuse_unless_empty(len(stripes), "placed again")
        salts = self.placed_salts(len(stripes))
        meta = self.keys.meta
        if salts:
            yield protocol._one(("HSET", meta, SALTS_FIELD, encode_salts(salts)))
        else:
            yield protocol._one(("HDEL", meta, SALTS_FIELD))
        self.keys = dataclasses.replace(self.keys, salts=salts)
        self._stripes = tuple(self._ops_of(s, len(stripes)) for s in range(len(stripes)))
        return salts

    def placed_salts(self, stripes: int) -> tuple[int, ...]:
        """Salts that put ``stripes`` stripes on distinct masters of the cluster the
        shell described (``owner``); () on one server, or for one stripe."""
        if self.owner is None or stripes == 1:
            return ()
        salts = choose_salts(self.keys.namespace, stripes, self.owner)
        return salts if any(salts) else ()

    def stripe_keys(self) -> Op[list[Keys]]:
        """The keys of every stripe, stripe 0 first."""
        return [ops.keys for ops in (yield from self.resolve())]

    def _groups(
        self, items: Sequence[Any], task_id: Callable[[Any], Any]
    ) -> Op[dict[int, list[int]]]:
        """The positions of ``items`` per stripe (by their task ids), stripes in order."""
        stripes = yield from self.resolve()
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(route.stripe_for(task_id(item), len(stripes)), []).append(i)
        return dict(sorted(groups.items()))

    # -------------------------------------------------------------- producers

    def _check_deps(self, specs: Sequence[Any], stripes: int) -> None:
        """Refuse a dependency between two stripes, naming both ids and the fix."""
        for spec in specs:
            if not isinstance(spec, TaskSpec) or not isinstance(spec.task_id, str):
                continue
            own = stripe_of(spec.task_id, stripes)
            for field_name in ("deps", "optional_deps"):
                deps = getattr(spec, field_name)
                if isinstance(deps, (str, bytes)) or not isinstance(deps, Sequence):
                    continue
                for dep in deps:
                    if isinstance(dep, str) and stripe_of(dep, stripes) != own:
                        raise InvalidArgument(
                            field_name,
                            cross_stripe_message(spec.task_id, own, dep, stripe_of(dep, stripes)),
                        )

    def admit_many(
        self, specs: Sequence[TaskSpec], *, one_stripe: bool = False
    ) -> Op[list[Admitted]]:
        admitted = yield from self._admit_many(specs, one_stripe)
        yield from self._warn_unserved(specs)
        return admitted

    def _warn_unserved(self, specs: Sequence[TaskSpec]) -> Op[None]:
        """Warn, once per name, of the functions of ``specs`` that live workers announce
        and none serves; the served functions are read at most every SERVED_CACHE_S."""
        # A waitpoint's fn only labels it: no worker is meant to serve it.
        names = self.served.unchecked(
            getattr(spec, "fn", None) for spec in specs if getattr(spec, "waitpoint", None) is None
        )
        if not names:
            return
        if self.served.stale():
            try:
                self.served.store((yield from self.base.live_functions()))
            except Exception as exc:  # the tasks are scheduled: a hint is not worth an error
                log.debug("reading the served functions failed: %s", exc)
                return
        self.served.warn(names, self.keys.namespace)

    def unserved(self, fn: str) -> Op[str | None]:
        """Why tasks of ``fn`` may not run (no live worker serves it), else None."""
        if self.served.stale():
            self.served.store((yield from self.base.live_functions()))
        return unserved_message(fn, self.served.live, self.keys.namespace)

    def _admit_many(self, specs: Sequence[TaskSpec], one_stripe: bool) -> Op[list[Admitted]]:
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].admit_many(specs))
        if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
            raise InvalidArgument("specs", "must be a sequence of TaskSpec")
        self._check_deps(specs, len(stripes))
        groups = yield from self._groups(specs, route.task_id_of)
        if one_stripe and len(groups) > 1:
            (a, first), (b, second) = list(groups.items())[:2]
            raise InvalidArgument(
                "specs",
                (
                    f"a graph is submitted to one stripe, atomically: {specs[first[0]].task_id!r} "
                    f"maps to stripe {a} and {specs[second[0]].task_id!r} to stripe {b}; give "
                    "every id of the graph the same {tag} (e.g. '{order-7}charge')"
                ),
            )
        trace = self.trace_context() if self.trace_context is not None else None
        # Every group is checked before anything is written.
        calls = {
            s: schedule_call(stripes[s].keys, [specs[i] for i in at], self.max_payload_bytes, trace)
            for s, at in groups.items()
        }
        result: list[Admitted | None] = [None] * len(specs)
        for s, at in groups.items():
            group = [specs[i] for i in at]
            sizes = payload_weights(calls[s])
            if placed_in_parts(group) or len(schedule_batches(group, sizes)) > 1:
                # Its stripe places the tasks with many dependencies in parts, and sends
                # a group over one call's caps in several calls.
                admitted = yield from stripes[s].admit_many(group)
            else:
                admitted = replies.decode_schedule_reply(
                    group, (yield from stripes[s].run(calls[s]))
                )
            for i, one in zip(at, admitted, strict=True):
                result[i] = one
        return [a for a in result if a is not None]

    def submit_graph(self, specs: Sequence[TaskSpec]) -> Op[list[int]]:
        return [a.version for a in (yield from self.admit_many(specs, one_stripe=True))]

    def add_deps(self, task_id: str, deps: Sequence[str], allow_unknown: bool) -> Op[None]:
        stripes = yield from self.resolve()
        if len(stripes) > 1 and isinstance(task_id, str):
            self._check_deps([TaskSpec(task_id, deps=deps)], len(stripes))
        ops = stripes[route.stripe_for(task_id, len(stripes))]
        yield from ops.add_deps(task_id, deps, allow_unknown)

    def spawn(self, claim: Claim, spawn: Spawn) -> Op[Outcome]:
        """A spawn on the parent's stripe: every spawned id must be on it too (its
        dependencies, the join's edges, live there)."""
        stripes = yield from self.resolve()
        if not isinstance(claim, Claim) or not isinstance(claim.task_id, str):
            return (yield from stripes[0].spawn(claim, spawn))
        own = route.stripe_for(claim.task_id, len(stripes))
        if len(stripes) > 1 and isinstance(spawn, Spawn):
            specs = [*spawn.children, *([spawn.join] if spawn.join is not None else [])]
            for spec in specs:
                if isinstance(spec, TaskSpec) and isinstance(spec.task_id, str):
                    theirs = stripe_of(spec.task_id, len(stripes))
                    if theirs != own:
                        raise InvalidArgument(
                            "children.task_id",
                            cross_stripe_message(spec.task_id, theirs, claim.task_id, own),
                        )
        return (yield from stripes[own].spawn(claim, spawn))

    # -------------------------------------------------------------- workers

    def finish(
        self,
        reports: Sequence[tuple[Claim, object]],
        n: int,
        worker_id: str,
        listening: bool = False,
        request_id: str | None = None,
        encoded: bool = False,
    ) -> Op[tuple[list[Outcome], list[Claim], Wait | None]]:
        """One call in a namespace of one stripe; over several, the reports go to their
        stripes and the claim takes its turn over them, as apart."""
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (
                yield from stripes[0].finish(reports, n, worker_id, listening, request_id, encoded)
            )
        outcomes = yield from self.call(Ops.complete_many, reports, encoded)
        claims, wait = yield from self.claim(n, worker_id, listening, request_id)
        return outcomes, claims, wait

    def claim(
        self, n: int, worker_id: str, listening: bool = False, request_id: str | None = None
    ) -> Op[tuple[list[Claim], Wait | None]]:
        """Up to ``n`` tasks from the stripes in turn, starting one stripe further each
        call: with every stripe backlogged, a stripe's first due task waits at most
        ``stripes - 1`` calls of this caller (README, "Scaling out")."""
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].claim(n, worker_id, listening, request_id))
        count = len(stripes)
        start = self._cursor % count
        self._cursor = start + 1
        claims: list[Claim] = []
        waits: list[Wait] = []
        full: list[int] = []
        for step in range(count):
            s = (start + step) % count
            got, wait = yield from stripes[s].claim(
                n - len(claims), worker_id, listening, request_id
            )
            claims.extend(got)
            if wait is not None:
                waits.append(wait)
                if wait.reason is WaitReason.CAPACITY:
                    full.append(s)
            if len(claims) >= n:
                # A due schedule slot of a stripe is said with the claims, as one stripe
                # says it: the caller fires, then claims again (a busy fleet fires too).
                fire = any(w.reason is WaitReason.FIRE for w in waits)
                return claims, (Wait(WaitReason.FIRE, 0.0) if fire else None)
        if full:
            return claims, (yield from self._wait_when_full(full, waits))
        return claims, combine_waits(waits)

    def _wait_when_full(self, full: list[int], waits: list[Wait]) -> Op[Wait | None]:
        """The wait of a claim that found the stripes ``full`` at their share of
        ``max_running``: shares move toward them first."""
        try:
            grew, owed = yield from self._rebalance_toward(full)
        except Unavailable:
            grew, owed = False, True  # moved by a later call
        if grew:
            # A stripe got more of max_running: claim again at once.
            return Wait(WaitReason.CAPACITY, 0.0)
        wait = combine_waits(waits)
        if not owed:
            return wait
        # A share waits for running tasks of other stripes to end, which wakes nobody
        # here: look again after the next move is allowed.
        delay = REBALANCE_EVERY_S
        if wait is not None and wait.delay is not None:
            delay = min(delay, wait.delay)
        return Wait(WaitReason.CAPACITY, delay)

    def fire_due(self, limit: int = FIRE_HEADS) -> Op[int]:
        """Fire the due slots of at most ``limit`` schedules of each stripe (a schedule
        and the tasks of its slots live on the stripe of its name); the tasks created.
        What one stripe cannot fire here (the cron extra missing, a time zone...) does not
        keep the others from firing: it is raised after them if nothing was created."""
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].fire_due(limit))
        created = 0
        error: Exception | None = None
        for ops in stripes:
            try:
                created += yield from ops.fire_due(limit)
            except (ValueError, ImportError) as exc:
                error = error or exc
        if error is not None and not created:
            raise error
        return created

    def wake_channels(self, worker_id: str | None) -> Op[list[str]]:
        """The channels a worker listens on: every stripe's wake channel, and its own
        channel on every stripe (scripts wake idle workers per stripe)."""
        channels: list[str] = []
        for ops in (yield from self.resolve()):
            channels.append(ops.keys.wake)
            if worker_id is not None:
                channels.append(ops.keys.worker_channel(worker_id))
        return channels

    def ended_channels(self) -> list[str]:
        """Every stripe's ``ended`` channel (after the first call)."""
        return [ops.keys.ended for ops in self.known()]

    def prune_workers(self) -> Op[int]:
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from self.base.prune_workers())
        gone = yield from self.base._read_workers()
        dead = [w for w, info in gone if info is None or info.seen_ago > info.drop_after_s]
        removed = yield from self.base.prune_workers()
        if dead:
            # Their kept claims on the other stripes go too.
            yield protocol.Commands(
                tuple(("HDEL", ops.keys.claims, *dead) for ops in stripes[1:]), atomic=False
            )
        return removed

    # -------------------------------------------------------------- fairness keys

    def fair_keys(self, limit: int = 100) -> Op[list[KeyInfo]]:
        by_key: dict[str, list[KeyInfo]] = {}
        for ops in (yield from self.resolve()):
            for info in (yield from ops.fair_keys(limit)):
                by_key.setdefault(info.key, []).append(info)
        merged = [merges.key_infos(infos) for infos in by_key.values()]
        return sorted(merged, key=lambda i: (-i.running, -i.queued, i.key))[:limit]

    # -------------------------------------------------------------- inspection

    def stats(self) -> Op[Stats]:
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].stats())
        parts: list[Stats] = []
        for ops in stripes:
            parts.append((yield from ops.stats()))
        (total_raw,) = yield from self.base.read(("HGET", self.keys.meta, STRIPES_MAX_FIELD))
        return _merge_stats(parts, int_or_none(total_raw))

    def overview(self, soon_s: object, scan: int) -> Op[Overview]:
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].overview(soon_s, scan))
        parts: list[Overview] = []
        for ops in stripes:
            parts.append((yield from ops.overview(soon_s, scan)))
        (total_raw,) = yield from self.base.read(("HGET", self.keys.meta, STRIPES_MAX_FIELD))
        data = _merge_stats(list(parts), int_or_none(total_raw))
        ages = [p["oldest_ready_age"] for p in parts if p["oldest_ready_age"] is not None]
        by_priority: dict[str, float] = {}
        for p in parts:
            for bucket, age in p["oldest_ready_age_by_priority"].items():
                by_priority[bucket] = max(by_priority.get(bucket, 0.0), age)
        total = data["queue_entries"]
        return Overview(
            **data,
            server_time=parts[0]["server_time"],
            stale_ratio=(data["stale_entries"] / total) if total else 0.0,
            leases_expired=sum(p["leases_expired"] for p in parts),
            leases_expiring=sum(p["leases_expiring"] for p in parts),
            leases_soon_s=parts[0]["leases_soon_s"],
            oldest_ready_age=max(ages) if ages else None,
            oldest_ready_age_by_priority=by_priority,
        )

    def tasks(
        self, state: object, fn: object = None, limit: object = 50, cursor: object = None
    ) -> Op[TaskPage]:
        """With stripes, a listing goes stripe after stripe (stripe 0 first), each in its
        own order, a page filled from the next stripes when one ends; the cursor is
        ``<stripe>:<that stripe's cursor>``."""
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].tasks(state, fn, limit, cursor))
        s, inner = parse_stripe_cursor(cursor, len(stripes))
        # The first stripe's call checks the arguments.
        page = yield from stripes[s].tasks(state, fn, limit, inner)
        want = validate.tasks_limit(limit)
        items = list(page.items)
        while True:
            if page.cursor is not None:
                return TaskPage(tuple(items), f"{s}:{page.cursor}")
            s += 1
            if s == len(stripes):
                return TaskPage(tuple(items), None)
            if len(items) >= want:
                return TaskPage(tuple(items), f"{s}:")
            page = yield from stripes[s].tasks(state, fn, want - len(items), None)
            items.extend(page.items)

    def failed_errors(
        self, cursor: str | None, count: int
    ) -> Op[tuple[list[tuple[str, str | None]], str | None]]:
        """With stripes, one stripe's batch per call (stripe 0 first); the cursor is
        ``<stripe>:<that stripe's cursor>``."""
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].failed_errors(cursor, count))
        s, inner = parse_stripe_cursor(cursor, len(stripes))
        rows, following = yield from stripes[s].failed_errors(inner, count)
        if following is not None:
            return rows, f"{s}:{following}"
        return rows, (f"{s + 1}:" if s + 1 < len(stripes) else None)

    def scan_tasks(self, cursor: int, count: int) -> Op[tuple[int, list[TaskRow]]]:
        """With stripes, the cursor is ``stripe + stripes * that stripe's cursor``."""
        stripes = yield from self.resolve()
        n = len(stripes)
        if n == 1:
            return (yield from stripes[0].scan_tasks(cursor, count))
        if not validate._is_int(cursor) or cursor < 0:
            raise InvalidArgument("cursor", "must be an int >= 0")
        s, inner = cursor % n, cursor // n
        following, rows = yield from stripes[s].scan_tasks(inner, count)
        if following:
            return s + n * following, rows
        return (s + 1 if s + 1 < n else 0), rows

    def clear(self) -> Op[None]:
        for ops in (yield from self.resolve()):
            yield from ops.clear()
        # The stripe count went with stripe 0's meta: read (or stored) again next call.
        self._stripes = None


def cross_stripe_message(task_id: str, own: int, dep: str, theirs: int) -> str:
    return (
        f"{task_id!r} (stripe {own}) cannot depend on {dep!r} (stripe {theirs}): a "
        "dependency must be on its dependent's stripe; give both ids the same {tag}, "
        "e.g. '{order-7}" + task_id + "' and '{order-7}" + dep + "'"
    )


def parse_stripe_cursor(cursor: object, stripes: int) -> tuple[int, str | None]:
    """(stripe, that stripe's cursor or None) of a listing cursor of a striped namespace."""
    if cursor is None:
        return 0, None
    if not isinstance(cursor, str):
        raise InvalidArgument("cursor", "must be a str or None")
    head, sep, inner = cursor.partition(":")
    if not sep or not head.isdigit() or not int(head) < stripes:
        raise InvalidArgument("cursor", "is not a cursor of this listing")
    return int(head), (inner or None)


_SummedField = Literal[
    "queue_entries",
    "ranked_entries",
    "live_entries",
    "stale_entries",
    "leases",
    "running",
    "sequence",
    "scheduled",
    "due",
]


def _total(parts: Sequence[Stats], name: _SummedField) -> int:
    return sum(int(p[name]) for p in parts)


def _merge_stats(parts: Sequence[Stats], max_running: int | None) -> Stats:
    counts: dict[str, int] = {}
    for p in parts:
        for state, n in p["counts"].items():
            counts[state] = counts.get(state, 0) + n
    first = parts[0]
    return Stats(
        counts=counts,
        scheduled=_total(parts, "scheduled"),
        due=_total(parts, "due"),
        queue_entries=_total(parts, "queue_entries"),
        ranked_entries=_total(parts, "ranked_entries"),
        live_entries=_total(parts, "live_entries"),
        stale_entries=_total(parts, "stale_entries"),
        leases=_total(parts, "leases"),
        running=_total(parts, "running"),
        max_running=max_running,
        retention_s=first["retention_s"],
        sequence=_total(parts, "sequence"),
        order=first["order"],
        aging_s=first["aging_s"],
        keys=first["keys"],
    )
