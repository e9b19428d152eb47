"""The task page's live notices: server-sent events (``GET /api/task/events?id=ID``).

A stream says ``progress`` each time the task reports progress and ``ended`` once it
ends (then it closes); the page then reads ``/api/task`` once. Behind each stream is one
``Scheduler.wait`` (with ``on_progress``) in a thread of its own, so the notices come
from the subscription every wait shares, not from reading Redis on a timer: a task that
reports nothing costs a read every ``watch_s`` seconds, when the wait is renewed.
Streams are bounded (``max_streams``); beyond, the page keeps its timed refresh.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable

import redis
from starlette.responses import Response, StreamingResponse

from distsched.client import Scheduler
from distsched.errors import ClosedError, DistschedError, NotFoundError, Timeout

log = logging.getLogger("distsched.dashboard")

# At most this many task pages get notices at once (one thread each).
MAX_STREAMS = 16
# How long one wait lasts before it is renewed: also how long a thread may outlive the
# page that closed its stream.
WATCH_S = 30.0
# A comment line this often keeps proxies from closing a quiet stream.
KEEPALIVE_S = 15.0
# How soon a browser reconnects a stream that broke (ms).
RETRY_MS = 5000


class TaskNotices:
    """The notice streams of one dashboard app, counted against ``max_streams``."""

    def __init__(
        self, scheduler: Scheduler, max_streams: int = MAX_STREAMS, watch_s: float = WATCH_S
    ) -> None:
        self.scheduler = scheduler
        self.max_streams = max_streams
        self.watch_s = watch_s
        self._open = 0
        self._lock = threading.Lock()

    @property
    def open_streams(self) -> int:
        """How many notice streams are open now."""
        return self._open

    def response(self, task_id: str) -> Response:
        """The event stream of ``task_id`` (known to exist), or 503 when too many are open."""
        with self._lock:
            if self._open >= self.max_streams:
                return Response("too many live pages", 503, headers={"Retry-After": "30"})
            self._open += 1
        return StreamingResponse(
            self._stream(task_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _stream(self, task_id: str) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        stop = threading.Event()

        def put(kind: str) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, kind)
            except RuntimeError:  # the loop closed: nobody listens any more
                stop.set()

        thread = threading.Thread(
            target=self._watch,
            args=(task_id, put, stop),
            name="distsched-dashboard-notices",
            daemon=True,
        )
        try:
            thread.start()
            yield f"retry: {RETRY_MS}\n\n"
            while True:
                try:
                    kind = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield ": still watching\n\n"
                    continue
                yield f"event: {kind}\ndata: {kind}\n\n"
                if kind != "progress":
                    return
        finally:
            stop.set()
            with self._lock:
                self._open -= 1

    def _watch(self, task_id: str, put: Callable[[str], None], stop: threading.Event) -> None:
        """Wait for the task in turns of ``watch_s`` until it ends or the stream closes."""
        try:
            while not stop.is_set():
                try:
                    self.scheduler.wait(
                        task_id, timeout=self.watch_s, on_progress=lambda _p: put("progress")
                    )
                except Timeout:
                    continue
                put("ended")
                return
        except NotFoundError:
            put("gone")
        except ClosedError:
            pass  # the app is shutting down
        except (redis.RedisError, DistschedError) as exc:
            log.warning("live notices of task %r stopped: %s", task_id, exc)
            put("stopped")
