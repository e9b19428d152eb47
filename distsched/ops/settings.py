"""The namespace's settings, written: capacity, payload limit, order, fairness keys, retention."""

from __future__ import annotations

from distsched.errors import InvalidArgument
from distsched.model import KeyInfo, OrderSetting
from distsched.ops import merges
from distsched.ops import routing as route
from distsched.ops.inspect import Inspect
from distsched.ops.protocol import Op, _one
from distsched.validate import (
    FAIR_WEIGHT_MAX,
    _is_int,
    _validate_cap,
    _validate_rate,
    validate_fair_key,
    validate_max_running,
    validate_order,
    validate_payload_limit,
)
from distsched.wire.calls import fairness_call, order_call, purge_call

# The most a test clock may run ahead of the server's, about 70 years (lua/lib/run.lua:
# MAX_CLOCK_MS).
CLOCK_MAX_MS = 2**41


class Settings(Inspect):
    """Writes of the settings every script of the namespace reads."""

    # -------------------------------------------------------------- settings

    @route.striped
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

    @route.every(merge=route.last_of)
    def advance_clock(self, ms: int) -> Op[None]:
        """Move the namespace's clock ``ms`` forward (the test clock of distsched.testing)."""
        if not _is_int(ms) or not 0 <= ms <= CLOCK_MAX_MS:
            raise InvalidArgument(
                "by",
                f"must move the clock forward by at most 2^41 ms (about 70 years), got {ms!r} ms",
            )
        yield _one(("HINCRBY", self.keys.meta, "clock_ms", ms))
        # Entries may be due now: idle workers claim again.
        sharded = yield from self.uses_sharded_pubsub()
        yield _one(("SPUBLISH" if sharded else "PUBLISH", self.keys.wake, "clock"))

    @route.every(merge=route.first_of)
    def set_payload_limit(self, limit: int | None) -> Op[int]:
        chosen = validate_payload_limit(limit)
        if chosen is None:
            yield _one(("HDEL", self.keys.meta, "payload_max"))
        else:
            yield _one(("HSET", self.keys.meta, "payload_max", chosen))
        return (yield from self.payload_limit())

    @route.every(merge=route.last_of)
    def set_order(self, order: object, aging: object) -> Op[OrderSetting]:
        chosen, aging_ms = validate_order(order, aging)
        yield from self.run(order_call(self.keys, chosen, aging_ms))
        return OrderSetting(chosen, aging_ms / 1000.0)

    @route.every(merge=route.last_of)
    def set_retention(self, retention_s: object) -> Op[None]:
        if retention_s is None:
            # purge_call takes None as "keep the stored retention": refuse it here.
            raise InvalidArgument("retention_s", "must be a number of seconds >= 0, got None")
        yield from self.run(purge_call(self.keys, 1, retention_s))

    # -------------------------------------------------------------- fairness keys

    @route.every(merge=merges.key_infos)
    def set_key(
        self, key: str, cap: int | None, weight: int, rate: int | None, per: object
    ) -> Op[KeyInfo]:
        # The defaults are the shells' (Scheduler.set_key): they always send all five.
        key = validate_fair_key(key, allow_default=True)
        chosen = _validate_cap(cap)
        if not _is_int(weight) or not 1 <= weight <= FAIR_WEIGHT_MAX:
            raise InvalidArgument("weight", f"must be an int in [1, {FAIR_WEIGHT_MAX}]")
        limit = _validate_rate(rate, per)
        yield from self.run(fairness_call(self.keys, "key", key, chosen, weight, limit))
        return (yield from self.key_info(key))

    @route.every(merge=route.last_of)
    def set_default_key_cap(self, cap: int | None) -> Op[None]:
        chosen = _validate_cap(cap)
        yield from self.run(fairness_call(self.keys, "default", "", chosen, 1))
