"""One pool of slots shared by the workers of several namespaces (``WorkerPool``).

Each namespace has a worker of its own (its claims, wake-ups, heartbeats, reports), and
all of them draw their slots from one :class:`PoolShare` of ``concurrency`` slots. When
slots are free and several namespaces have work, the share decides which claims next:

- by weight (stride scheduling): each namespace has a *pass* that grows by the slots it
  was given over its weight, and the lowest pass goes next, so that under load the
  namespaces hold slots in proportion to their weights;
- in strict order: the first namespace of the list that has work goes next; the others
  get only the slots it leaves.

A namespace "has work" from the moment its worker asks for slots until one of its claims
comes up short (nothing more due there). One that comes back after a quiet spell starts
at the lowest pass of those with work, so it gets its share from then on, not a burst
for the time it was idle.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The longest a waiting worker sleeps before it reads the slots again by itself (a
# notification normally wakes it first).
RECHECK_S = 0.5
# A member with work that is not back for its turn within this long (its claim call
# waits for an unreachable Redis, say) no longer holds the others back.
AWAY_S = 0.2


@dataclass(eq=False)
class Member:
    """One namespace's place in the share."""

    name: str
    weight: float
    rank: int
    busy: Callable[[], int]  # the slots its worker holds now (its own Slots.busy)
    share: PoolShare = field(repr=False)
    pass_: float = 0.0
    wanting: bool = False  # has work: asked for slots, no short claim since
    waiting: bool = False  # blocked in wait_turn right now
    reserved: int = 0  # slots granted and not yet claimed
    left_at: float = 0.0  # when it last left wait_turn (monotonic)

    def wait_turn(self, stopping: threading.Event, limit: float | None = None) -> int:
        """See :meth:`PoolShare.wait_turn`."""
        return self.share.wait_turn(self, stopping, limit)

    def claimed(self, short: bool) -> None:
        """See :meth:`PoolShare.claimed`."""
        self.share.claimed(self, short)


class PoolShare:
    """``concurrency`` slots shared by members, by weight or in strict order."""

    def __init__(self, concurrency: int, strict: bool = False) -> None:
        self.concurrency = concurrency
        self.strict = strict
        self.members: list[Member] = []
        self.cond = threading.Condition()
        self._changes = 0

    def join(self, name: str, weight: float, busy: Callable[[], int]) -> Member:
        """Add a member (in the order of joining: the strict order)."""
        member = Member(name, weight, len(self.members), busy, self)
        with self.cond:
            self.members.append(member)
        return member

    def changed(self) -> None:
        """A member's slots changed (one was freed): waiting members look again.

        Called by the members' ``Slots`` under their own lock; the share never calls
        into a ``Slots`` while it holds its own, so the two locks cannot deadlock."""
        with self.cond:
            self._changes += 1
            self.cond.notify_all()

    def wait_turn(self, member: Member, stopping: threading.Event, limit: float | None) -> int:
        """Block until ``member`` may claim; return how many slots it may claim (0 when
        ``stopping`` is set or ``limit`` seconds passed first)."""
        deadline = None if limit is None else _now() + limit
        with self.cond:
            if not member.wanting:
                self._rejoin(member)
            member.wanting = member.waiting = True
        try:
            while not stopping.is_set():
                with self.cond:
                    seen = self._changes
                # Read outside the share's lock (each takes its member's own lock).
                busy = sum(m.busy() for m in self.members)
                with self.cond:
                    granted = self._grant(member, busy)
                    if granted:
                        return granted
                    left = self._until_change(_now())
                    if deadline is not None:
                        left = min(left, deadline - _now())
                    if left <= 0:
                        return 0
                    if self._changes == seen:
                        self.cond.wait(left)
            return 0
        finally:
            with self.cond:
                member.waiting = False
                member.left_at = _now()
                self.cond.notify_all()

    def claimed(self, member: Member, short: bool) -> None:
        """``member``'s claim is answered (its claims are in its slots now); ``short``:
        it got fewer than it asked, so it has no more work for now."""
        with self.cond:
            member.reserved = 0
            if short:
                member.wanting = False
            self._changes += 1
            self.cond.notify_all()

    def _rejoin(self, member: Member) -> None:
        """A member with work again starts level with those that kept theirs."""
        others = [m.pass_ for m in self.members if m.wanting and m is not member]
        if others:
            member.pass_ = max(member.pass_, min(others))

    def _grant(self, member: Member, busy: int) -> int:
        free = self.concurrency - busy - sum(m.reserved for m in self.members)
        if free <= 0 or self._next(self.members) is not member:
            return 0
        contenders = [m for m in self.members if m.wanting]
        weight = sum(m.weight for m in contenders) or member.weight
        # Its weight's share of the free slots at once (at least one): fewer, larger
        # claims while there is room, one slot at a time under load.
        granted = min(free, max(1, math.floor(free * member.weight / weight)))
        member.reserved += granted
        member.pass_ += granted / member.weight
        return granted

    def _until_change(self, now: float) -> float:
        """How long the turn can stay as it is by time alone: until a member away with
        work stops holding the others back, and at most ``RECHECK_S``."""
        away = [
            m.left_at + AWAY_S - now
            for m in self.members
            if m.wanting and not m.waiting and now - m.left_at < AWAY_S
        ]
        return min([RECHECK_S, *away])

    def _next(self, members: Sequence[Member]) -> Member | None:
        """The member whose turn it is: among those with work, the first (strict) or the
        lowest pass (then the first); None when none has work."""
        now = _now()
        contenders = [m for m in members if m.wanting and (m.waiting or now - m.left_at < AWAY_S)]
        if not contenders:
            return None
        if self.strict:
            return contenders[0]
        return min(contenders, key=lambda m: (m.pass_, m.rank))


def _now() -> float:
    return time.monotonic()
