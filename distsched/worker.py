"""The worker: a fixed pool that claims due tasks and runs registered functions.

Threads of one worker:
- the claim loop (the thread that calls :meth:`Worker.run`): claims at most as
  many tasks as there are free slots, then waits on the namespace's wake-up
  channel with the server's delay hint as timeout;
- ``concurrency`` pool threads for ``def`` functions;
- one event-loop thread for ``async def`` functions (started when needed);
- the heartbeat thread: extends leases, delivers cancellation and lease loss
  to running functions, and reaps expired leases of the whole fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from distsched import core
from distsched.client import Scheduler
from distsched.context import TaskContext, _reset_current, _set_current
from distsched.core import Claim, Outcome
from distsched.errors import Cancelled, ClosedError, ConflictError, InvalidArgument
from distsched.metrics import WorkerMetrics

log = logging.getLogger("distsched.worker")

TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
# The claim loop checks its stop flag at least this often while it waits.
STOP_CHECK_S = 0.05
RETRY_MIN_S = 0.05
RETRY_MAX_S = 2.0
# The most outcomes sent in one report call.
REPORT_BATCH = 512
SHUTDOWN_STOP = "worker shut down: the function stopped on its signal after the grace period"


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _backoff() -> Iterator[float]:
    delay = RETRY_MIN_S
    while True:
        yield delay
        delay = min(RETRY_MAX_S, delay * 2)


@dataclass
class _Job:
    claim: Claim
    ctx: TaskContext
    started: bool = False
    released: bool = False
    report_done: threading.Event = field(default_factory=threading.Event)


class Worker:
    """Run registered functions for the tasks of one scheduler's namespace.

    ``functions`` maps the names used in ``schedule(fn=...)`` to callables,
    ``def`` or ``async def``. At most ``concurrency`` functions run at once and
    no more tasks than free slots are ever claimed.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        functions: Mapping[str, Callable[..., Any]],
        concurrency: int = 8,
        worker_id: str | None = None,
        heartbeat_s: float | None = None,
        grace: float = 30.0,
        cancel_wait: float = 10.0,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise InvalidArgument("concurrency", "must be an int >= 1")
        if not isinstance(functions, Mapping) or not all(
            isinstance(k, str) and callable(v) for k, v in functions.items()
        ):
            raise InvalidArgument("functions", "must map names (str) to callables")
        self.scheduler = scheduler
        self.functions = dict(functions)
        self.concurrency = concurrency
        self.worker_id = worker_id or default_worker_id()
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else scheduler.lease_s / 3.0
        self.grace = grace
        self.cancel_wait = cancel_wait
        # Hooks (distsched.metrics); with none given they are no-ops and the heartbeat
        # thread reads no namespace stats for them.
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self._observed = metrics is not None
        # Server clock minus this machine's, measured on the heartbeat thread, so start
        # waits are measured against run_at on the clock that decided due-ness.
        self._clock_offset = 0.0

        self._cond = threading.Condition()
        self._jobs: dict[tuple[str, int, int], _Job] = {}
        self._free = concurrency
        self._running_now = 0
        self.peak_running = 0
        self.counts: dict[str, int] = {
            "claimed": 0,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "released": 0,
            "stale": 0,
            "duplicate": 0,
        }

        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stop_grace: float | None = None
        self._sigint_seen = False
        self._work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._reports: queue.SimpleQueue[tuple[_Job, str, object] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat_stop = threading.Event()
        # Set to run a heartbeat round at once instead of at the next interval.
        self._heartbeat_now = threading.Event()
        self._listener_stop = threading.Event()
        self._wake = threading.Event()

    # ------------------------------------------------------------------ public

    def run(self) -> None:
        """Claim and run tasks until :meth:`stop` or SIGTERM/SIGINT, then shut down (§8)."""
        restore = self._install_signal_handlers()
        try:
            self._start_threads()
            try:
                self._claim_loop()
            finally:
                self._shutdown()
        finally:
            restore()
            self._stopped.set()

    def stop(self, grace: float | None = None) -> None:
        """Ask the worker to shut down; running functions get ``grace`` seconds to finish."""
        if grace is not None:
            self._stop_grace = grace
        self._stopping.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`run` has returned; True if it did within ``timeout``."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> int:
        """How many functions are executing right now."""
        with self._cond:
            return self._running_now

    def snapshot(self) -> dict[str, int]:
        """One consistent look at the pool: executing, claimed but not started, and
        finished with the report still on its way (those still hold their lease)."""
        with self._cond:
            unstarted = sum(1 for j in self._jobs.values() if not j.started and not j.released)
            return {
                "executing": self._running_now,
                "unstarted": unstarted,
                "reporting": len(self._jobs) - unstarted - self._running_now,
                "free": self._free,
            }

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT and self._sigint_seen:
                # Second Ctrl-C: leave now; leases expire and the tasks are retried.
                os._exit(130)
            if signum == signal.SIGINT:
                self._sigint_seen = True
            log.info("signal %s: shutting down", signum)
            self.stop()

        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in previous:
            signal.signal(s, on_signal)

        def restore() -> None:
            for s, handler in previous.items():
                signal.signal(s, handler)

        return restore

    # ------------------------------------------------------------------ threads

    def _start_threads(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._pool_thread, name=f"distsched-pool-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        if any(inspect.iscoroutinefunction(f) for f in self.functions.values()):
            ready = threading.Event()
            t = threading.Thread(
                target=self._loop_thread, args=(ready,), name="distsched-loop", daemon=True
            )
            t.start()
            ready.wait()
            self._threads.append(t)
        self._reporter = threading.Thread(
            target=self._reporter_thread, name="distsched-reporter", daemon=True
        )
        self._reporter.start()
        for target, name in (
            (self._heartbeat_thread, "distsched-heartbeat"),
            (self._listener_thread, "distsched-listener"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _loop_thread(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                # close() alone leaves the default executor's threads (asyncio.to_thread)
                # running past run(); join them here.
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def _pool_thread(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            self._execute_sync(job)

    # ------------------------------------------------------------------ claiming

    def _claim_loop(self) -> None:
        retry = _backoff()
        while not self._stopping.is_set():
            with self._cond:
                while self._free == 0 and not self._stopping.is_set():
                    self._cond.wait(1.0)
                free = self._free
            if self._stopping.is_set():
                break
            # A wake-up from here on means the claim below may have missed something.
            self._wake.clear()
            try:
                started = time.monotonic()
                claims, wait = self.scheduler.claim(free, self.worker_id)
                self.metrics.on_claimed(len(claims), time.monotonic() - started)
            except ClosedError:
                break
            except TRANSIENT as exc:
                pause = next(retry)
                log.warning("redis unavailable (%s); retrying in %.2fs", exc, pause)
                self._stopping.wait(pause)
                continue
            retry = _backoff()
            for claim in claims:
                self._dispatch(claim)
            if wait is None or wait.delay == 0:
                continue
            # Sleep until the next entry is due, or until the listener hears of an earlier
            # task or freed capacity. No polling: the server's delay hint is the timeout.
            self._wake.wait(wait.delay)

    def _listener_thread(self) -> None:
        """Hold the wake-up subscription: wake the claim loop, deliver cancel requests."""
        retry = _backoff()
        while not self._listener_stop.is_set():
            pubsub = self.scheduler.client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.scheduler.keys.wake)
                while not self._listener_stop.is_set():
                    msg = pubsub.get_message(timeout=STOP_CHECK_S)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        # Messages published before this point were never seen: claim
                        # again, and learn of missed cancel requests from a heartbeat.
                        retry = _backoff()
                        self._wake.set()
                        self._heartbeat_now.set()
                    elif msg["type"] == "message":
                        self._on_message(msg["data"])
            except TRANSIENT as exc:
                log.warning("wake-up subscription lost (%s); resubscribing", exc)
                self._listener_stop.wait(next(retry))
            except ClosedError:
                return
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def _on_message(self, data: bytes) -> None:
        kind, _, rest = data.partition(b" ")
        if kind != b"cancel":
            self._wake.set()
            return
        # "cancel <version> <task id>": the request reaches the function at once, without
        # waiting for the next heartbeat (which would deliver it too).
        version, _, task_id = rest.partition(b" ")
        with self._cond:
            jobs = [
                j
                for j in self._jobs.values()
                if j.claim.task_id.encode("utf-8") == task_id
                and str(j.claim.version).encode() == version
            ]
        for job in jobs:
            job.ctx._signal_stop()

    def _dispatch(self, claim: Claim) -> None:
        job = _Job(claim=claim, ctx=TaskContext(claim))
        with self._cond:
            self._free -= 1
            self._jobs[claim.token] = job
            self.counts["claimed"] += 1
        fn = self.functions.get(claim.fn)
        if fn is not None and inspect.iscoroutinefunction(fn) and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._execute_async(job, fn), self._loop)
        else:
            self._work.put(job)

    # ------------------------------------------------------------------ running

    def _begin(self, job: _Job) -> bool:
        with self._cond:
            if job.released:
                return False
            job.started = True
            self._running_now += 1
            self.peak_running = max(self.peak_running, self._running_now)
            return True

    def _end(self, job: _Job) -> None:
        """The function returned: its slot is free; the job stays until its report lands."""
        with self._cond:
            self._running_now -= 1
            self._free += 1
            self._cond.notify_all()

    def _refusal(self, claim: Claim) -> str | None:
        if claim.payload_error is not None:
            return f"payload decode error: {claim.payload_error}"
        if claim.fn not in self.functions:
            return (
                f"unregistered function {claim.fn!r}: this worker serves {sorted(self.functions)}"
            )
        return None

    def _execute_sync(self, job: _Job) -> None:
        if not self._begin(job):
            return
        try:
            refusal = self._refusal(job.claim)
            if refusal is not None:
                self._report(job, "fail", refusal)
                return
            fn = self.functions[job.claim.fn]
            token = _set_current(job.ctx)
            started = self._started(job)
            try:
                result = fn(*job.claim.args, **job.claim.kwargs)
                if inspect.isawaitable(result):
                    # An async callable not detected as such (e.g. a partial).
                    result = asyncio.run(_await(result))
            except Cancelled as exc:
                self._finished(job, started)
                self._report_cancelled(job, exc)
            except BaseException as exc:
                self._finished(job, started)
                self._report(job, "fail", exc)
            else:
                self._finished(job, started)
                self._report(job, "complete", result)
            finally:
                _reset_current(token)
        finally:
            self._end(job)

    async def _execute_async(self, job: _Job, fn: Callable[..., Any]) -> None:
        if not self._begin(job):
            return
        try:
            assert self._loop is not None
            job.ctx._bind_loop(self._loop)
            _set_current(job.ctx)
            started = self._started(job)
            try:
                result = await fn(*job.claim.args, **job.claim.kwargs)
            except Cancelled as exc:
                self._finished(job, started)
                self._report_cancelled(job, exc)
            except BaseException as exc:  # any failure of user code is reported
                # CancelledError included: left unreported, the task would sit until its lease
                # lapsed and then be retried as if the worker had vanished.
                self._finished(job, started)
                self._report(job, "fail", exc)
            else:
                self._finished(job, started)
                self._report(job, "complete", result)
        finally:
            self._end(job)

    def _started(self, job: _Job) -> float:
        wait = time.time() + self._clock_offset - job.claim.run_at
        self.metrics.on_started(job.claim, wait)
        return time.monotonic()

    def _finished(self, job: _Job, started: float) -> None:
        self.metrics.on_finished(job.claim, time.monotonic() - started)

    def _report_cancelled(self, job: _Job, exc: Cancelled) -> None:
        if job.ctx._cancel_was_requested:
            self._report(job, "confirm_cancel", None)
        else:
            # Lease lost (or Cancelled raised unprompted): not a cancellation of the task.
            self._report(job, "fail", exc)

    def _report(self, job: _Job, kind: str, value: object) -> None:
        """Hand an outcome to the reporter thread, which sends reports in batches."""
        if kind == "complete":
            try:
                value = core.encode_result(value)
            except InvalidArgument as exc:
                kind, value = "fail", f"result not storable: {exc}"
        elif kind == "fail":
            value = core.error_text(value)
        self._reports.put((job, kind, value))

    def _reporter_thread(self) -> None:
        # Reports that pile up during one round trip go together in the next, so the
        # batch grows with the load and an idle worker still reports at once.
        while True:
            first = self._reports.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < REPORT_BATCH:
                try:
                    item = self._reports.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._send_reports(batch)
            if stop:
                return

    def _send_reports(self, batch: list[tuple[_Job, str, object]]) -> None:
        by_kind: dict[str, list[tuple[_Job, object]]] = {}
        for job, kind, value in batch:
            by_kind.setdefault(kind, []).append((job, value))
        for kind, items in by_kind.items():
            if kind == "confirm_cancel":
                for job, _ in items:
                    self._send(kind, [(job, None)])
            else:
                self._send(kind, items)

    def _send(self, kind: str, items: list[tuple[_Job, object]]) -> None:
        """Send one kind of report, retrying through transient Redis faults."""
        retry = _backoff()
        deadline = time.monotonic() + max(60.0, 2 * self.scheduler.lease_s)
        while True:
            try:
                if kind == "complete":
                    outcomes = self.scheduler.complete_encoded(
                        [(job.claim, value) for job, value in items]  # type: ignore[misc]
                    )
                elif kind == "confirm_cancel":
                    job = items[0][0]
                    try:
                        outcomes = [self.scheduler.confirm_cancel(job.claim)]
                    except ConflictError:
                        # Only this worker's shutdown signalled it; nobody cancelled the
                        # task, so the interrupted run is a failed attempt (retried if any remain).
                        kind, items = "fail", [(job, SHUTDOWN_STOP)]
                        continue
                else:
                    outcomes = self.scheduler.fail_many(
                        [(job.claim, value) for job, value in items]
                    )
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    log.error("giving up reporting %d outcomes: %s", len(items), exc)
                    break
                time.sleep(next(retry))
                continue
            except ClosedError:
                break
            except Exception:
                log.exception("reporting %d %s outcomes failed", len(items), kind)
                break
            for outcome in outcomes:
                self._count(kind, outcome)
            break
        with self._cond:
            for job, _ in items:
                self._jobs.pop(job.claim.token, None)
            self._cond.notify_all()
        for job, _ in items:
            job.report_done.set()

    def _count(self, kind: str, outcome: Outcome) -> None:
        with self._cond:
            if outcome is Outcome.APPLIED:
                key = {"complete": "succeeded", "confirm_cancel": "cancelled"}.get(kind, "failed")
            else:
                key = outcome.value
            self.counts[key] += 1
        self.metrics.on_outcome(kind, outcome)

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat_thread(self) -> None:
        while True:
            self._heartbeat_now.wait(self.heartbeat_s)
            self._heartbeat_now.clear()
            if self._heartbeat_stop.is_set():
                return
            self._heartbeat_once()

    def _heartbeat_once(self) -> None:
        with self._cond:
            jobs = [j for j in self._jobs.values() if not j.released]
        try:
            if jobs:
                statuses = self.scheduler.heartbeat_many([j.claim for j in jobs])
                for job, status in zip(jobs, statuses, strict=True):
                    if status is None:
                        if not job.ctx.lease_lost:
                            self.metrics.on_lease_lost(job.claim)
                        job.ctx._signal_stop(lease_lost=True)
                    elif status:
                        job.ctx._signal_stop()
            chores = self.scheduler.housekeeping()
            self.metrics.on_housekeeping(chores["reaped"], chores["compacted"], chores["purged"])
            if self._observed:
                self._observe_namespace()
        except TRANSIENT as exc:
            log.warning("heartbeat failed: %s", exc)
        except ClosedError:
            return
        except Exception:
            # A refused call (corrupt record, read-only replica, OOM) must not end this
            # thread: without heartbeats every running task would lose its lease.
            log.exception("heartbeat round failed")

    def _observe_namespace(self) -> None:
        before = time.time()
        server = self.scheduler.server_time()
        self._clock_offset = server - (before + time.time()) / 2.0
        self.metrics.on_stats(self.scheduler.stats())
        self.metrics.on_pool(self.snapshot())

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self) -> None:
        self._stopping.set()
        grace = self.grace if self._stop_grace is None else self._stop_grace
        # 1. Claimed but not started: hand them back without spending an attempt.
        with self._cond:
            unstarted = [j for j in self._jobs.values() if not j.started and not j.released]
            for job in unstarted:
                job.released = True
                self._jobs.pop(job.claim.token, None)
                self._free += 1
        if unstarted:
            self._release([j.claim for j in unstarted])
        # 2. Running: wait for them up to the grace period, 3. then signal them to stop.
        if not self._wait_idle(grace):
            with self._cond:
                for job in self._jobs.values():
                    job.ctx._signal_stop()
            if not self._wait_idle(self.cancel_wait):
                log.error("%d task functions did not stop; their leases will expire", self.running)
        # 4. Last: the reporter (once every outcome is sent), heartbeats, the event loop
        # and the pool threads.
        self._reports.put(None)
        self._reporter.join(timeout=max(5.0, self.cancel_wait))
        self._heartbeat_stop.set()
        self._heartbeat_now.set()
        self._listener_stop.set()
        for _ in range(self.concurrency):
            self._work.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                t.join(timeout=1.0)

    def _release(self, claims: list[Claim]) -> None:
        retry = _backoff()
        for _ in range(20):
            try:
                released = self.scheduler.release(claims)
            except TRANSIENT:
                time.sleep(next(retry))
                continue
            except ClosedError:
                return
            with self._cond:
                self.counts["released"] += released
            self.metrics.on_released(released)
            return

    def _wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


async def _await(awaitable: Any) -> Any:
    return await awaitable
