"""``max_running`` of a striped namespace, kept as per-stripe shares. No I/O.

Each stripe's scripts bound its running tasks by its own ``max_running``: its share of
the namespace-wide bound (stripe 0's meta field ``stripes_max``). Shares move toward the
stripes with due work, under a lock, without the running tasks of all stripes ever
exceeding the bound: shares are lowered first, and raised only by the room left.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from distsched import validate
from distsched.errors import ConflictError
from distsched.keys import Keys
from distsched.ops import protocol
from distsched.ops.namespace import Ops
from distsched.ops.protocol import Op
from distsched.wire import payload
from distsched.wire.replies import _pairs

# The field of stripe 0's meta that holds the namespace-wide max_running of a striped
# namespace (each stripe's own ``max_running`` is then its share of it).
STRIPES_MAX_FIELD = "stripes_max"
# How long the share mover holds its lock (ms): far more than its few commands take.
STRIPE_LOCK_MS = 2000
# A scheduler asks to move shares toward a stripe at capacity at most this often (s).
REBALANCE_EVERY_S = 0.2
# Tries (with a pause between) to take the lock to set max_running.
LOCK_TRIES = 40
LOCK_PAUSE_S = 0.05


def int_or_none(raw: Any) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def even_shares(total: int, count: int, first: Sequence[int] = ()) -> list[int]:
    """``total`` split over ``count`` parts as evenly as possible; the parts named in
    ``first`` (in that order), then the others by index, get the remainder."""
    shares = [total // count] * count
    order = list(dict.fromkeys([*first, *range(count)]))
    for i in order[: total % count]:
        shares[i] += 1
    return shares


class ShareMover:
    """Sets and moves the shares of max_running of a striped namespace's stripes."""

    keys: Keys
    # Stripe 0's operations.
    base: Ops
    # When this scheduler last moved shares (server clock), and whether that left a
    # share owed to a stripe with due work.
    _rebalanced_at: float
    _owed: bool

    def resolve(self) -> Op[tuple[Ops, ...]]:
        raise NotImplementedError

    def known(self) -> tuple[Ops, ...]:
        raise NotImplementedError

    def set_max_running(self, max_running: int | None) -> Op[None]:
        limit = validate.validate_max_running(max_running)
        stripes = yield from self.resolve()
        if len(stripes) == 1:
            return (yield from stripes[0].set_max_running(limit))
        token = yield from self._lock(wait=True)
        try:
            meta = self.keys.meta
            if limit is None:
                yield protocol._one(("HDEL", meta, STRIPES_MAX_FIELD))
                for ops in stripes:
                    yield protocol._one(("HDEL", ops.keys.meta, "max_running"))
                    yield from self._wake(ops)
                return None
            yield protocol._one(("HSET", meta, STRIPES_MAX_FIELD, limit))
            yield from self._move_shares(stripes, limit, even_shares(limit, len(stripes)))
        finally:
            yield from self._unlock(token)
        return None

    def _lock(self, wait: bool) -> Op[str | None]:
        """Take the share mover's lock (a key with a deadline); None when it is held."""
        token = uuid.uuid4().hex
        for _ in range(LOCK_TRIES if wait else 1):
            (taken,) = yield protocol._one(
                ("SET", self.keys.stripelock, token, "NX", "PX", STRIPE_LOCK_MS)
            )
            if taken:
                return token
            if wait:
                yield protocol.Sleep(LOCK_PAUSE_S)
        if wait:
            raise ConflictError("max_running is being changed by another caller; try again")
        return None

    def _unlock(self, token: str | None) -> Op[None]:
        if token is None:
            return
        (held,) = yield protocol._one(("GET", self.keys.stripelock))
        if held is not None and payload._text(held) == token:
            yield protocol._one(("DEL", self.keys.stripelock))

    def _wake(self, ops: Ops) -> Op[None]:
        sharded = yield from self.base.uses_sharded_pubsub()
        yield protocol._one(("SPUBLISH" if sharded else "PUBLISH", ops.keys.wake, "capacity"))

    def _shares(self, stripes: Sequence[Ops]) -> Op[tuple[list[int], list[int]]]:
        """Each stripe's share (its max_running) and running count."""
        replies = yield protocol.Commands(
            tuple(("HMGET", ops.keys.meta, "max_running", "count:running") for ops in stripes),
            atomic=False,
        )
        caps = [int_or_none(r[0]) or 0 for r in replies]
        running = [int_or_none(r[1]) or 0 for r in replies]
        return caps, running

    def _move_shares(
        self, stripes: Sequence[Ops], limit: int, targets: Sequence[int]
    ) -> Op[tuple[bool, bool]]:
        """Move the shares toward ``targets`` without the running tasks of all stripes
        ever exceeding ``limit``; the lock is held. Returns (a share grew, a share is
        still below its target).

        Shares are lowered first. A stripe's running count only grows up to its share,
        so once the lowering is written, ``max(share, running)`` read afterwards bounds
        what each stripe can ever run; a share is raised only by the room left under
        ``limit`` after those bounds.
        """
        caps, _ = yield from self._shares(stripes)
        for s, ops in enumerate(stripes):
            if targets[s] < caps[s]:
                yield protocol._one(("HSET", ops.keys.meta, "max_running", targets[s]))
        caps, running = yield from self._shares(stripes)
        room = limit - sum(max(c, r) for c, r in zip(caps, running, strict=True))
        grew = False
        for s, ops in enumerate(stripes):
            more = min(targets[s] - caps[s], room)
            if more > 0:
                room -= more
                yield protocol._one(("HSET", ops.keys.meta, "max_running", caps[s] + more))
                yield from self._wake(ops)
                grew = True
                caps[s] += more
        owed = any(caps[s] < targets[s] for s in range(len(stripes)))
        return grew, owed

    def _rebalance_toward(self, full: Sequence[int]) -> Op[tuple[bool, bool]]:
        """Move shares of max_running toward the stripes with due work (``full``: those
        a claim found at their share). At most every ``REBALANCE_EVERY_S`` per scheduler;
        returns (a share grew, a share is still owed to a stripe)."""
        stripes = self.known()
        (total_raw,) = yield from self.base.read(("HGET", self.keys.meta, STRIPES_MAX_FIELD))
        limit = int_or_none(total_raw)
        if limit is None:
            return False, False
        now = yield from self.base.server_time()
        if now - self._rebalanced_at < REBALANCE_EVERY_S:
            return False, self._owed
        self._rebalanced_at = now
        token = yield from self._lock(wait=False)
        if token is None:
            # Another scheduler moves shares now; this one looks again soon.
            return False, True
        try:
            now_ms = int(now * 1000)
            heads = yield protocol.Commands(
                tuple(
                    cmd
                    for ops in stripes
                    for cmd in (
                        ("ZRANGE", ops.keys.queue, 0, 0, "WITHSCORES"),
                        ("ZCARD", ops.keys.ranked),
                        ("ZCARD", ops.keys.fairready),
                    )
                ),
                atomic=False,
            )
            wanting = list(full)
            for s in range(len(stripes)):
                queue_head, ranked, fair_ready = heads[3 * s : 3 * s + 3]
                pairs = _pairs(queue_head)
                due = bool(pairs) and float(pairs[0][1]) <= now_ms
                if (due or int(ranked) or int(fair_ready)) and s not in wanting:
                    wanting.append(s)
            caps, running = yield from self._shares(stripes)
            # A stripe without due work keeps what runs there; the rest of max_running
            # is split evenly between the stripes with due work.
            targets = [0] * len(stripes)
            for s in range(len(stripes)):
                if s not in wanting:
                    targets[s] = min(caps[s], running[s])
            # By stripe, so that the same demand always gives the same shares.
            wanting.sort()
            rest = max(0, limit - sum(targets))
            split = even_shares(rest, len(wanting))
            for i, s in enumerate(wanting):
                targets[s] = split[i]
            grew, self._owed = yield from self._move_shares(stripes, limit, targets)
            return grew, self._owed
        finally:
            yield from self._unlock(token)
