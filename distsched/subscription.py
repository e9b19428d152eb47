"""Pub/sub subscriptions that stay up: the worker's wake-ups and the schedulers' waits.

A :class:`Subscriber` holds one subscription on a thread of its own, sharded
(``SSUBSCRIBE``) where the server has it, plain ``SUBSCRIBE`` before Redis 7, on a
single server or a Redis Cluster (where every channel of a namespace lives on the
namespace's shard). It subscribes again after any error, and says so: messages
published while it was away were never seen, so whoever relies on them must look
again. :class:`AsyncSubscriber` is the same as an asyncio task.

:class:`WaitHub` and :class:`AsyncWaitHub` are what ``Scheduler.wait`` and
``AsyncScheduler.wait`` use: one subscription to the namespace's ``ended`` channel per
scheduler, shared by every waiter of that scheduler (a map of task id to waiters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import ClusterPubSub as AsyncClusterPubSub
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterPubSub, RedisCluster

from distsched.errors import ClosedError
from distsched.wire import replies

log = logging.getLogger("distsched.subscription")

# The most waits of one asyncio scheduler that send requests at once (listening is not
# counted): redis.asyncio's pool refuses more than 100 connections in use by default.
WAIT_IO_CONCURRENCY = 32
# How often a subscriber checks its stop flag while it waits for messages.
STOP_CHECK_S = 0.25
# How long a subscription held on several cluster nodes waits on each in turn (s).
MULTI_NODE_POLL_S = 0.005
# Pauses between attempts to subscribe again: doubling from the first, capped.
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 2.0


def backoff() -> Iterator[float]:
    """Pauses between tries: doubling from RETRY_FIRST_S, capped at RETRY_CAP_S."""
    pause = RETRY_FIRST_S
    while True:
        yield pause
        pause = min(pause * 2, RETRY_CAP_S)


class SubscriptionLost(Exception):
    """The server ended a subscription (a slot moved to another node): subscribe again."""


class Subscriber:
    """One subscription to ``channels``, held on its own thread until :meth:`stop`.

    ``on_message(data)`` gets each message's payload; ``on_subscribed()`` is called
    each time the subscription is (re)established, since messages published before
    that point were never seen. ``sharded()`` says whether to use SSUBSCRIBE (asked
    once; ``ClosedError`` from it ends the thread). Any error is logged, and the
    subscriber subscribes again after a pause: it never ends before :meth:`stop`.
    """

    def __init__(
        self,
        client: Any,
        channels: Sequence[str] | Callable[[], Sequence[str]],
        sharded: Callable[[], bool],
        on_message: Callable[[bytes], None],
        on_subscribed: Callable[[], None],
        name: str,
    ) -> None:
        self.client = client
        # A callable is asked (again after an error) when subscribing.
        self._channels = channels
        self.channels = [] if callable(channels) else list(channels)
        self._sharded = sharded
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._retry = backoff()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        self._retry = backoff()
        sharded: bool | None = None
        while not self._stop.is_set():
            pubsub: Any = None
            try:
                if sharded is None:
                    sharded = self._sharded()
                pubsub = self.client.pubsub()
                self._subscribe(pubsub, sharded)
                while not self._stop.is_set():
                    msg = self._next_message(pubsub, sharded)
                    if msg is not None and dispatch(msg, self._on_message, self._on_subscribed):
                        self._retry = backoff()
            except ClosedError:
                return
            except Exception as exc:
                # Transient or not (a refused subscription, a moved slot, a dropped
                # connection): the users of the messages look again by themselves.
                self._lost(exc)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _subscribe(self, pubsub: Any, sharded: bool) -> None:
        if callable(self._channels):
            self.channels = list(self._channels())
        if sharded:
            pubsub.ssubscribe(*self.channels)
        else:
            pubsub.subscribe(*self.channels)

    def _next_message(self, pubsub: Any, sharded: bool) -> Any:
        if sharded and isinstance(pubsub, ClusterPubSub):
            # redis-py waits on each node's connection in turn: with the stripes of a
            # namespace on several nodes, a short wait on each keeps a message on the
            # last one from waiting behind the others.
            nodes = len(pubsub.node_pubsub_mapping)
            wait = STOP_CHECK_S if nodes <= 1 else MULTI_NODE_POLL_S
            return pubsub.get_sharded_message(timeout=wait)  # type: ignore[no-untyped-call]
        return pubsub.get_message(timeout=STOP_CHECK_S)

    def _lost(self, exc: Exception) -> None:
        pause = next(self._retry)
        channels = " ".join(self.channels)
        log.warning("subscription to %s lost (%s); again in %.2fs", channels, exc, pause)
        refresh_slots(self.client)
        self._stop.wait(pause)


def message_within(pubsub: Any, get: Callable[..., Any], timeout: float) -> Any:
    """``get(timeout=timeout)``; but when ``pubsub`` holds channels on several cluster
    nodes, which redis-py waits on one after the other, short waits on each in turn
    until ``timeout``, so that a message on the last node is not held back."""
    nodes = getattr(pubsub, "node_pubsub_mapping", None)
    if not isinstance(pubsub, ClusterPubSub) or nodes is None or len(nodes) <= 1:
        return get(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        msg = get(timeout=MULTI_NODE_POLL_S)
        if msg is not None or time.monotonic() >= deadline:
            return msg


def dispatch(
    msg: Mapping[str, Any],
    on_message: Callable[[bytes], None],
    on_subscribed: Callable[[], None],
) -> bool:
    """Hand one pub/sub event to its callback; True when it confirms a subscription.

    Raises ``SubscriptionLost`` when the server ended the subscription (after a slot
    moved in a cluster): the caller subscribes again.
    """
    kind = msg["type"]
    if kind in ("subscribe", "ssubscribe"):
        on_subscribed()
        return True
    if kind in ("message", "smessage"):
        on_message(msg["data"])
    elif kind in ("unsubscribe", "sunsubscribe"):
        raise SubscriptionLost(f"{kind} {msg['channel']!r}")
    return False


def refresh_slots(client: Any) -> None:
    """After a resharding a cluster client's slot map may still name the old node."""
    if isinstance(client, RedisCluster):
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()


class AsyncSubscriber:
    """:class:`Subscriber` as an asyncio task of the loop that starts it."""

    def __init__(
        self,
        client: Any,
        channels: Sequence[str],
        sharded: Callable[[], Awaitable[bool]],
        on_message: Callable[[bytes], None],
        on_subscribed: Callable[[], None],
    ) -> None:
        self.client = client
        self.channels = list(channels)
        self._sharded = sharded
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._retry = backoff()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, timeout: float = 2.0) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        # redis-py's timed reads may swallow a cancellation: the loop also checks the
        # flag at least every STOP_CHECK_S.
        task.cancel()
        await asyncio.wait({task}, timeout=timeout)

    async def _loop(self) -> None:
        sharded: bool | None = None
        while not self._stopping:
            pubsub: Any = None
            try:
                if sharded is None:
                    sharded = await self._sharded()
                pubsub = self.client.pubsub()
                await self._listen(pubsub, sharded)
            except ClosedError:
                return
            except Exception as exc:
                if self._stopping:
                    return
                await self._lost(exc)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    async def _listen(self, pubsub: Any, sharded: bool) -> None:
        if sharded:
            await pubsub.ssubscribe(*self.channels)
        else:
            await pubsub.subscribe(*self.channels)
        while not self._stopping:
            if sharded and isinstance(pubsub, AsyncClusterPubSub):
                msg = await pubsub.get_sharded_message(timeout=STOP_CHECK_S)
            else:
                msg = await pubsub.get_message(timeout=STOP_CHECK_S)
            if msg is not None and dispatch(msg, self._on_message, self._on_subscribed):
                self._retry = backoff()

    async def _lost(self, exc: Exception) -> None:
        pause = next(self._retry)
        channels = " ".join(self.channels)
        log.warning("subscription to %s lost (%s); again in %.2fs", channels, exc, pause)
        if isinstance(self.client, AsyncRedisCluster):
            with contextlib.suppress(Exception):
                await self.client.initialize()
        await asyncio.sleep(pause)


# --------------------------------------------------------------------------- waits


class Waiter:
    """One ``wait`` of a sync scheduler: set when its task may have ended."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def notify(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` for a notice; True when one came (then re-armed)."""
        fired = self._event.wait(seconds)
        self._event.clear()
        return fired


class AsyncWaiter:
    """One ``wait`` of an asyncio scheduler."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
            fired = True
        except asyncio.TimeoutError:
            fired = False
        self._event.clear()
        return fired


class _Registry:
    """Task id -> the waiters of one scheduler (the part both hubs share)."""

    def __init__(self) -> None:
        self.waiting: dict[str, set[Any]] = {}

    def add(self, task_id: str, waiter: Any) -> None:
        self.waiting.setdefault(task_id, set()).add(waiter)

    def remove(self, task_id: str, waiter: Any) -> None:
        waiters = self.waiting.get(task_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self.waiting[task_id]

    def on_message(self, data: bytes) -> None:
        task_id = replies.decode_ended(data)
        for waiter in list(self.waiting.get(task_id, ())) if task_id is not None else ():
            waiter.notify()

    def notify_all(self) -> None:
        # (Re)subscribed: a notice may have been published while nobody listened.
        for waiters in list(self.waiting.values()):
            for waiter in list(waiters):
                waiter.notify()


class WaitHub:
    """The waits of one sync scheduler: one subscription to ``ended``, started on the
    first wait, shared by every waiter, stopped by :meth:`close`."""

    def __init__(
        self, client: Any, channels: Callable[[], Sequence[str]], sharded: Callable[[], bool]
    ) -> None:
        self._client = client
        self._channels = channels
        self._sharded = sharded
        self._lock = threading.Lock()
        self._registry = _Registry()
        self._subscriber: Subscriber | None = None
        self._closed = False

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[Waiter]:
        waiter = Waiter()
        with self._lock:
            if self._closed:
                raise ClosedError("the scheduler is closed")
            self._registry.add(task_id, waiter)
            if self._subscriber is None:
                self._subscriber = Subscriber(
                    self._client,
                    self._channels(),
                    self._sharded,
                    self._on_message,
                    self._notify_all,
                    name="distsched-waits",
                )
                self._subscriber.start()
        try:
            yield waiter
        finally:
            with self._lock:
                self._registry.remove(task_id, waiter)

    def _on_message(self, data: bytes) -> None:
        with self._lock:
            self._registry.on_message(data)

    def _notify_all(self) -> None:
        with self._lock:
            self._registry.notify_all()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the subscription and wake every waiter (each then sees the scheduler closed)."""
        with self._lock:
            self._closed = True
            subscriber, self._subscriber = self._subscriber, None
            self._registry.notify_all()
        if subscriber is not None:
            subscriber.stop(timeout)


class AsyncWaitHub:
    """:class:`WaitHub` for an asyncio scheduler: the subscription is a task of the loop
    of the first wait."""

    def __init__(
        self,
        client: Any,
        channels: Callable[[], Sequence[str]],
        sharded: Callable[[], Awaitable[bool]],
    ) -> None:
        self._client = client
        self._channels = channels
        self._sharded = sharded
        self._registry = _Registry()
        self._subscriber: AsyncSubscriber | None = None
        self._closed = False
        self.gate = asyncio.Semaphore(WAIT_IO_CONCURRENCY)

    @contextlib.asynccontextmanager
    async def watch(self, task_id: str) -> AsyncIterator[AsyncWaiter]:
        if self._closed:
            raise ClosedError("the scheduler is closed")
        waiter = AsyncWaiter()
        self._registry.add(task_id, waiter)
        if self._subscriber is None:
            self._subscriber = AsyncSubscriber(
                self._client,
                self._channels(),
                self._sharded,
                self._registry.on_message,
                self._registry.notify_all,
            )
            self._subscriber.start()
        try:
            yield waiter
        finally:
            self._registry.remove(task_id, waiter)

    async def close(self) -> None:
        self._closed = True
        self._registry.notify_all()
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            await subscriber.stop()
