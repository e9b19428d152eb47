"""The wake-up subscription: wakes the claim loop, delivers cancel requests at once."""

from __future__ import annotations

import contextlib
import logging
import threading

from distsched.client import Scheduler
from distsched.context import StopReason
from distsched.errors import ClosedError
from distsched.worker.common import TRANSIENT, backoff
from distsched.worker.jobs import Slots

log = logging.getLogger("distsched.worker")

# How often the listener checks its stop flag while it waits for messages.
STOP_CHECK_S = 0.05


class Listener:
    """Holds the namespace's wake-up subscription on its own thread.

    A ``cancel <version> <task id>`` message reaches the running function at once,
    without waiting for the next heartbeat (which would deliver it too); any other
    message wakes the claim loop.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        slots: Slots,
        wake: threading.Event,
        heartbeat_now: threading.Event,
    ) -> None:
        self.scheduler = scheduler
        self.slots = slots
        self.wake = wake
        self.heartbeat_now = heartbeat_now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distsched-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        retry = backoff()
        while not self._stop.is_set():
            pubsub = self.scheduler.client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.scheduler.keys.wake)
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=STOP_CHECK_S)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        # Messages published before this point were never seen: claim
                        # again, and learn of missed cancel requests from a heartbeat.
                        retry = backoff()
                        self.wake.set()
                        self.heartbeat_now.set()
                    elif msg["type"] == "message":
                        self.on_message(msg["data"])
            except TRANSIENT as exc:
                log.warning("wake-up subscription lost (%s); resubscribing", exc)
                self._stop.wait(next(retry))
            except ClosedError:
                return
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def on_message(self, data: bytes) -> None:
        kind, _, rest = data.partition(b" ")
        if kind != b"cancel":
            self.wake.set()
            return
        version, _, task_id = rest.partition(b" ")
        try:
            wanted = (task_id.decode("utf-8"), int(version))
        except (UnicodeDecodeError, ValueError):
            return
        for job in self.slots.matching(*wanted):
            job.ctx._signal_stop(StopReason.CANCEL)
