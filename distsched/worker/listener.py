"""The wake-up subscription: wakes the claim loop, delivers cancel requests at once."""

from __future__ import annotations

import threading

from distsched.context import StopReason
from distsched.subscription import Subscriber
from distsched.worker.jobs import Slots
from distsched.worker.link import WorkerLink


class Listener:
    """Holds the worker's wake-up subscriptions on its own thread.

    Two channels, both in the namespace's slot: the worker's own channel, where a
    ``ready`` message says there is work for it (the scripts wake one idle worker per
    task), and the namespace's wake channel, where a ``cancel <version> <task id>``
    message reaches the running function at once, without waiting for the next
    heartbeat (which would deliver it too), and any other message wakes the claim loop.
    The subscription itself is a :class:`~distsched.subscription.Subscriber`: sharded
    where the server has it, subscribed again after any error, never ending before
    :meth:`stop`. In a striped namespace it holds both channels of every stripe.
    """

    def __init__(
        self,
        link: WorkerLink,
        slots: Slots,
        wake: threading.Event,
        heartbeat_now: threading.Event,
        worker_id: str | None = None,
    ) -> None:
        self.link = link
        self.slots = slots
        self.wake = wake
        self.heartbeat_now = heartbeat_now
        self._subscriber = Subscriber(
            link.scheduler.client,
            lambda: link.wake_channels(worker_id),
            link.uses_sharded_pubsub,
            self.on_message,
            self.on_subscribed,
            name="distsched-listener",
        )

    def start(self) -> None:
        self._subscriber.start()

    def stop(self, timeout: float) -> None:
        self._subscriber.stop(timeout)

    def on_subscribed(self) -> None:
        # Messages published before this point were never seen: claim again, and learn
        # of missed cancel requests from a heartbeat.
        self.wake.set()
        self.heartbeat_now.set()

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
