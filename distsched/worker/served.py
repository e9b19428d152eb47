"""Which functions the live workers of a namespace serve (§8, unserved functions).

Each worker announces its function names in the namespace's ``served`` hash
(name -> last announcement, ms on the server clock) when it starts and then
every ``ANNOUNCE_S`` from its heartbeat thread. A worker that claims a task whose
function it does not serve asks this record what to do with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from distsched.model import Claim
from distsched.ops.explain import SERVED_ANNOUNCE_S, SERVED_LIVE_S
from distsched.worker.link import WorkerLink

log = logging.getLogger("distsched.worker")

# A task whose function a live worker serves comes back this soon: that worker gets it
# as soon as it has a free slot, and this one does not claim it in a tight loop.
HANDBACK_DELAY_S = 0.5
# While no live worker serves the function, a hand-back is checked again this often.
UNSERVED_RECHECK_S = 2.0
# Every worker announces its functions this often, whatever its own timeout, so that
# any worker can judge any other's announcements; an announcement counts for LIVE_S.
# The rule lives in the core, which Scheduler.explain reads it from too.
ANNOUNCE_S = SERVED_ANNOUNCE_S
LIVE_S = SERVED_LIVE_S


@dataclass(frozen=True)
class HandBack:
    """Give the claim back unstarted; it is due again after ``delay`` seconds."""

    delay: float
    served_elsewhere: bool = False
    """Whether another live worker of the namespace serves the function."""


@dataclass(frozen=True)
class GiveUp:
    """Fail the task: no live worker served its function for the whole timeout."""

    reason: str


class ServedFunctions:
    """This worker's entry in the record of served functions, and the rule for the rest.

    A function counts as served while its last announcement is at most
    ``window_s`` old: the larger of ``unserved_timeout`` and ``LIVE_S``, so that a
    live worker never looks gone between two announcements.
    """

    def __init__(
        self, link: WorkerLink, functions: Collection[str], unserved_timeout: float
    ) -> None:
        self.link = link
        self.scheduler = link.scheduler
        self.functions = sorted(functions)
        self.timeout = unserved_timeout
        self.refresh_s = ANNOUNCE_S
        self.window_s = max(unserved_timeout, LIVE_S)
        self._next_refresh = 0.0

    def refresh_due_in(self) -> float:
        """Seconds until the next announcement is due (0 when it is due now)."""
        return max(0.0, self._next_refresh - time.monotonic())

    def announce(self) -> None:
        """Write this worker's functions with the server's time now.

        Raises what Redis raised; the next announcement is then tried at the next
        heartbeat round.
        """
        if not self.functions:
            self._next_refresh = time.monotonic() + self.refresh_s
            return
        now_ms = int(self.scheduler.server_time() * 1000)
        # On every stripe: explain() reads it next to the task, in the task's slot.
        for keys in self.link.stripe_keys():
            self.scheduler.client.hset(keys.served, mapping=dict.fromkeys(self.functions, now_ms))
        self._next_refresh = time.monotonic() + self.refresh_s

    def postpone(self, seconds: float) -> None:
        """Try the next announcement ``seconds`` from now (after a failed one)."""
        self._next_refresh = time.monotonic() + seconds

    def decide(self, claims: Sequence[Claim]) -> list[HandBack | GiveUp]:
        """For each claim of a function this worker does not serve: hand it back or fail it.

        A task fails only when it has been due for ``unserved_timeout`` and no live
        worker announced its function within ``window_s``.
        """
        now = self.scheduler.server_time()
        names = sorted({c.fn for c in claims})
        raw = self.scheduler.client.hmget(self.scheduler.keys.served, names)
        seen = {name: int(value) / 1000.0 for name, value in zip(names, raw, strict=True) if value}
        decisions: list[HandBack | GiveUp] = []
        for claim in claims:
            last = seen.get(claim.fn)
            if last is not None and now - last <= self.window_s:
                decisions.append(HandBack(HANDBACK_DELAY_S, served_elsewhere=True))
                continue
            waited = now - claim.run_at
            left = self.timeout - waited
            if left > 0:
                decisions.append(HandBack(min(UNSERVED_RECHECK_S, max(HANDBACK_DELAY_S, left))))
                continue
            since = "never" if last is None else f"{now - last:.0f}s ago"
            decisions.append(
                GiveUp(
                    f"unserved function {claim.fn!r}: no live worker of the namespace served it "
                    f"for {waited:.1f}s (unserved_timeout {self.timeout:g}s; last served: "
                    f"{since}); this worker serves {self.functions}"
                )
            )
        return decisions
