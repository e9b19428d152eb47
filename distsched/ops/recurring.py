"""Recurring schedules: their definitions, and the tasks fired from their slots."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from distsched.errors import ConflictError, InvalidArgument, NotFoundError, ScriptError
from distsched.ops import routing as route
from distsched.ops.inspect import Inspect
from distsched.ops.protocol import Op
from distsched.schedules import (
    MAX_BACKFILL_SLOTS,
    MAX_FIRE_SLOTS,
    Definition,
    FiringState,
    Schedule,
    backfill_slots,
    instant_ms,
    plan_fire,
    tags_slot_ids,
    validate_name,
)
from distsched.schedules import definition as schedule_definition
from distsched.validate import _is_int
from distsched.wire.calls import (
    FIRE_HEADS,
    FIRE_TRIES,
    PROPAGATE_BUDGET,
    SERVER_TIME_LUA,
    Call,
    fire_call,
    fire_slots_per_call,
    recur_put_call,
    recur_remove_call,
)
from distsched.wire.payload import _bytes, _text, encode_payload
from distsched.wire.replies import _mapping, _pairs, decode_fired


def by_name(answers: list[list[Schedule]]) -> list[Schedule]:
    """The schedules of every stripe as one list, by name."""
    return sorted((sc for part in answers for sc in part), key=lambda sc: sc.name)


class Recurring(Inspect):
    """Add, read, change and fire the schedules of a namespace.

    In a striped namespace a schedule lives on the stripe of its name (read as a task
    id), with its definition, next fire time and firing state, and the tasks of its
    slots go to that stripe too (:func:`~distsched.schedules.tags_slot_ids`): one fire
    call on one stripe fires a slot, exactly once, as in an unstriped namespace.
    """

    # -------------------------------------------------------------- definitions

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

    @route.by_name("name")
    def add_schedule(self, name: str, fn: str, options: Mapping[str, Any]) -> Op[Schedule]:
        validate_name(name)
        tags_slot_ids(name, self.stripes)  # a name no slot id can keep on its stripe: refused
        now = yield from self.now_ms()
        d = schedule_definition(name, fn, now, options)
        encode_payload(d.fn, d.args, d.kwargs, self.max_payload_bytes, timeout=d.timeout_ms)
        next_ms = None if d.paused else d.timetable().after(now)
        return (yield from self._put_schedule(d, next_ms))

    @route.by_name("name")
    def get_schedule(self, name: str) -> Op[Schedule]:
        d, state, score = yield from self._load_schedule(validate_name(name))
        return d.info(score, state)

    @route.every(merge=by_name)
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

    @route.by_name("name")
    def remove_schedule(self, name: str) -> Op[bool]:
        (existed,) = yield from self.run(recur_remove_call(self.keys, name))
        return int(existed) == 1

    @route.by_name("name")
    def pause_schedule(self, name: str) -> Op[Schedule]:
        d, _, _ = yield from self._load_schedule(validate_name(name))
        return (yield from self._put_schedule(d.replace(paused=True), None))

    @route.by_name("name")
    def resume_schedule(self, name: str) -> Op[Schedule]:
        """Fire again from the next slot after now (slots while paused are not caught up)."""
        d, _, _ = yield from self._load_schedule(validate_name(name))
        now = yield from self.now_ms()
        d = d.replace(paused=False)
        return (yield from self._put_schedule(d, d.timetable().after(now)))

    # -------------------------------------------------------------- firing

    @route.by_name("name")
    def trigger(self, name: str) -> Op[str | None]:
        validate_name(name)
        for _ in range(FIRE_TRIES):
            d, state, _ = yield from self._load_schedule(name)
            call = fire_call(
                self.keys,
                d,
                state.rev,
                "trigger",
                [("now", "now")],
                self.max_payload_bytes,
                tagged=tags_slot_ids(name, self.stripes),
            )
            fired = decode_fired((yield from self.run(call)))
            if not fired.moved:
                return fired.last_task
        raise ConflictError(f"schedule {name!r} kept changing while it was triggered")

    @route.by_name("name")
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
                call = fire_call(
                    self.keys,
                    d,
                    state.rev,
                    "backfill",
                    part,
                    self.max_payload_bytes,
                    tagged=tags_slot_ids(name, self.stripes),
                )
                fired = decode_fired((yield from self.run(call)))
                if fired.moved:
                    moved = True
                    break
                created += fired.created
            if not moved:
                return created
        raise ConflictError(f"schedule {name!r} kept changing while it was backfilled")

    @route.by_name("name")
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

    @route.striped
    def fire_due(self, limit: int = FIRE_HEADS) -> Op[int]:
        """Fire the due slots of at most ``limit`` schedules of this stripe; the tasks
        created (every stripe's: :meth:`~distsched.ops.stripes.StripedOps.fire_due`)."""
        k = self.keys
        clock, heads = yield from self.read(
            ("EVAL", SERVER_TIME_LUA, 1, k.meta),
            ("ZRANGE", k.fires, 0, limit - 1, "WITHSCORES"),
            atomic=False,
        )
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
                call = Call(
                    "fire",
                    k.for_script("fire"),
                    [
                        PROPAGATE_BUDGET,
                        name,
                        rev,
                        "fire",
                        score,
                        "",
                        0,
                        "skip",
                        "",
                        "",
                        self.max_payload_bytes,
                        0,
                    ],
                )
                yield from self.run(call)
                continue
            try:
                # What only this worker may lack (the cron extra, a time zone, a payload
                # limit as large) is its own error: another worker may fire the slot.
                most = fire_slots_per_call(d, self.max_payload_bytes)
                plan = plan_fire(d, score, now, min(MAX_FIRE_SLOTS, most))
                call = fire_call(
                    k,
                    d,
                    rev,
                    "fire",
                    plan.slots,
                    self.max_payload_bytes,
                    score,
                    plan.next_ms,
                    plan.missed,
                    tagged=tags_slot_ids(name, self.stripes),
                )
            except (ValueError, ImportError) as exc:
                error = error or exc
                continue
            created += decode_fired((yield from self.run(call))).created
        if error is not None and not created:
            raise error
        return created
