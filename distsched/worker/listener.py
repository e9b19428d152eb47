"""The wake-up subscription: wakes the claim loop, delivers cancel requests at once."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from redis.cluster import ClusterPubSub, RedisCluster

from distsched.client import Scheduler
from distsched.context import StopReason
from distsched.errors import ClosedError
from distsched.worker.common import backoff
from distsched.worker.jobs import Slots

log = logging.getLogger("distsched.worker")

# How often the listener checks its stop flag while it waits for messages.
STOP_CHECK_S = 0.25


class SubscriptionLost(Exception):
    """The server ended a subscription (a slot moved to another node): subscribe again."""


class Listener:
    """Holds the worker's wake-up subscriptions on its own thread.

    Two channels, both in the namespace's slot: the worker's own channel, where a
    ``ready`` message says there is work for it (the scripts wake one idle worker per
    task), and the namespace's wake channel, where a ``cancel <version> <task id>``
    message reaches the running function at once, without waiting for the next
    heartbeat (which would deliver it too), and any other message wakes the claim loop.
    Sharded pub/sub (SSUBSCRIBE) where the server has it, else SUBSCRIBE. Any error
    is logged, and the listener subscribes again after a pause: it never ends before
    :meth:`stop`.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        slots: Slots,
        wake: threading.Event,
        heartbeat_now: threading.Event,
        worker_id: str | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.slots = slots
        self.wake = wake
        self.heartbeat_now = heartbeat_now
        keys = scheduler.keys
        self.channels = [keys.wake] + ([keys.worker_channel(worker_id)] if worker_id else [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distsched-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        retry = backoff()
        sharded: bool | None = None
        while not self._stop.is_set():
            pubsub: Any = None
            try:
                if sharded is None:
                    sharded = self.scheduler.uses_sharded_pubsub()
                pubsub = self.scheduler.client.pubsub()  # type: ignore[no-untyped-call]
                if sharded:
                    pubsub.ssubscribe(*self.channels)
                else:
                    pubsub.subscribe(*self.channels)
                while not self._stop.is_set():
                    if sharded and isinstance(pubsub, ClusterPubSub):
                        msg = pubsub.get_sharded_message(timeout=STOP_CHECK_S)  # type: ignore[no-untyped-call]
                    else:
                        msg = pubsub.get_message(timeout=STOP_CHECK_S)
                    if msg is None:
                        continue
                    kind = msg["type"]
                    if kind in ("subscribe", "ssubscribe"):
                        # Messages published before this point were never seen: claim
                        # again, and learn of missed cancel requests from a heartbeat.
                        retry = backoff()
                        self.wake.set()
                        self.heartbeat_now.set()
                    elif kind in ("message", "smessage"):
                        self.on_message(msg["data"])
                    elif kind in ("unsubscribe", "sunsubscribe"):
                        raise SubscriptionLost(f"{kind} {msg['channel']!r}")
            except ClosedError:
                return
            except Exception as exc:
                # Transient or not (a refused subscription, a moved slot, a dropped
                # connection), a worker without wake-ups still claims on its re-check.
                pause = next(retry)
                log.warning("wake-up subscription lost (%s); again in %.2fs", exc, pause)
                self._refresh_slots()
                self._stop.wait(pause)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _refresh_slots(self) -> None:
        # After a resharding the client's slot map may still name the old node.
        client = self.scheduler.client
        if isinstance(client, RedisCluster):
            with contextlib.suppress(Exception):
                client.nodes_manager.initialize()

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
