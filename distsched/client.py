"""The synchronous ``Scheduler``: it sends what :mod:`distsched.ops` builds.

Each public method drives one :class:`~distsched.ops.namespace.Ops` operation over a
redis-py client; the asyncio :class:`~distsched.aio.AsyncScheduler` drives the
same operations, so the two have the same methods with the same meaning.
"""

from __future__ import annotations

import datetime
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from distsched import limits, model, otel, validate
from distsched.batching import BatchingProducer
from distsched.errors import ClosedError, InvalidArgument
from distsched.keys import Keys
from distsched.model import (
    Chores,
    Claim,
    Duration,
    Explanation,
    KeyInfo,
    Order,
    OrderSetting,
    Outcome,
    Overview,
    Spawn,
    State,
    Stats,
    TaskInfo,
    TaskPage,
    TaskRow,
    TaskSpec,
    Wait,
)
from distsched.ops import failures as failure_ops
from distsched.ops import protocol
from distsched.ops.namespace import Ops
from distsched.ops.stripes import StripedOps
from distsched.retention import RetentionPlan
from distsched.schedules import MAX_BACKFILL_SLOTS, Schedule, ScheduleOptions
from distsched.scripts import Registry
from distsched.subscription import WaitHub
from distsched.wire import calls

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")


class BaseScheduler:
    """What the sync and asyncio schedulers share: settings, keys and operations."""

    def __init__(
        self,
        namespace: str = "default",
        lease_s: Duration = 30.0,
        max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> None:
        self.namespace = namespace
        self.lease_ms = validate.validate_lease(lease_s)
        self.lease_s = self.lease_ms / 1000.0
        self.max_payload_bytes = validate.validate_max_payload_bytes(max_payload_bytes)
        # The producer's active span travels with its tasks (distsched.otel).
        self._ops = StripedOps(
            Keys(namespace),
            self.lease_ms,
            self.max_payload_bytes,
            trace_context=otel.current_trace,
            stripes=stripes,
        )
        self._closed = False
        # Calls under way: the client of a closed scheduler is closed when the last ends.
        self._in_flight = 0

    @property
    def keys(self) -> Keys:
        """The key names of the namespace (stripe 0's; ``keys.of_stripe(s)`` those of
        stripe ``s``, with its placement once the scheduler has made a call)."""
        return self._ops.keys

    @property
    def warn_unserved(self) -> bool:
        """Whether scheduling a task for a function that live workers announce none of
        logs a warning on the ``distsched`` logger, once per function name, with the
        closest served names as suggestions (default True). The served functions are
        read at most every few seconds, so scheduling stays one round trip."""
        return self._ops.served.log

    @warn_unserved.setter
    def warn_unserved(self, value: bool) -> None:
        self._ops.served.log = bool(value)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the scheduler is closed")


UNCAPPED_CONNECTIONS = 2**31


def slot_owner(nodes: Any) -> Callable[[int], str | None]:
    """The master serving a slot, by the cluster client's slot map (``nodes_manager`` of
    either redis-py cluster client); None while the map is not known."""

    def owner(slot: int) -> str | None:
        try:
            node = nodes.get_node_from_slot(slot)
        except Exception:  # no map yet, or a slot no node serves
            return None
        return None if node is None else str(node.name)

    return owner


def client_from_url(url: str, single: Any, cluster: Any, node: Any) -> Any:
    """A redis-py client for ``url`` (validated): ``single(url)``, or for a
    ``redis+cluster://`` / ``rediss+cluster://`` URL ``cluster(first seed's URL,
    startup_nodes=[node(host, port) of each other seed])`` (sync or asyncio classes)."""
    url = validate.validate_url(url)
    seeds = validate.cluster_seeds(url)
    # redis-py 8.2 caps a pool at 100 connections and fails the call beyond: a web
    # server's threads, or a worker's slots, would fail under a burst. Open what the
    # calls in flight need, as earlier redis-py did; ``?max_connections=N`` in the URL
    # still sets a cap (the URL's options win over these).
    pool = {"max_connections": UNCAPPED_CONNECTIONS}
    try:
        if seeds is None:
            return single(url, **pool)
        others = []
        for seed in seeds[1:]:
            parsed = urllib.parse.urlsplit(seed)
            others.append(node(parsed.hostname, parsed.port or 6379))
        if others:
            return cluster(seeds[0], startup_nodes=others, **pool)
        return cluster(seeds[0], **pool)
    except ValueError as exc:
        raise InvalidArgument("url", str(exc)) from None


class Scheduler(BaseScheduler):
    """Schedule, claim and report tasks in one namespace of one Redis.

    ``max_running`` (when not None) is stored as the namespace's fleet-wide bound on
    running tasks (last writer wins). ``stripes`` spreads the namespace over that many
    hash slots (README, "Scaling out"): it is stored with the namespace by the first
    scheduler that gives it, and a different count is refused (``ConflictError``)
    unless the namespace is empty; None takes the stored count (1 when none).
    Thread-safe: redis-py pools its connections. Use it as a context manager, or call
    :meth:`close`.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        namespace: str = "default",
        lease_s: Duration = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> None:
        super().__init__(namespace, lease_s, max_payload_bytes, stripes)
        limit = validate.validate_max_running(max_running)
        self.client = client
        if isinstance(client, RedisCluster):
            self._ops.owner = slot_owner(client.nodes_manager)
        self._owns_client = False
        self._scripts = Registry(client)
        self._lock = threading.Lock()
        self._waits = WaitHub(client, self._ops.ended_channels, self._sharded_pubsub)
        if stripes is not None:
            # A count that does not match the stored one is refused here, at once.
            self._drive(self._ops.call(Ops.noop))
        if limit is not None:
            self.set_max_running(limit)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "default",
        lease_s: Duration = 30.0,
        max_running: int | None = None,
        max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
        stripes: int | None = None,
    ) -> Scheduler:
        """Connect to a URL; closing the scheduler closes the connection.

        ``redis://``, ``rediss://`` (TLS) and ``unix://`` name one server;
        ``redis+cluster://host:port`` and ``rediss+cluster://`` a Redis Cluster through
        any one of its nodes, or through any of several listed comma-separated
        (``redis+cluster://h1:7000,h2:7000``). User names and passwords go in the URL as
        usual. The client opens as many connections as calls are in flight at once;
        ``?max_connections=N`` in the URL caps them (a call beyond the cap then fails).
        """
        client = client_from_url(url, redis.Redis.from_url, RedisCluster.from_url, ClusterNode)
        try:
            scheduler = cls(client, namespace, lease_s, max_running, max_payload_bytes, stripes)
        except BaseException:
            client.close()
            raise
        scheduler._owns_client = True
        return scheduler

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ I/O

    def _sharded_pubsub(self) -> bool:
        return self._drive(self._ops.call(Ops.uses_sharded_pubsub))

    def _drive(self, op: protocol.Op[T]) -> T:
        with self._lock:
            self._check_open()
            self._in_flight += 1
        try:
            step = protocol.advance(op, None)
            while not isinstance(step, protocol.Done):
                step = protocol.advance(op, self._send(step))
            return step.value
        finally:
            with self._lock:
                self._in_flight -= 1
                last = self._closed and self._in_flight == 0
            if last:
                self._close_client()

    def _send(self, request: protocol.Request) -> Any:
        try:
            return self._request(request)
        except (RedisError, RedisClusterException) as exc:
            return protocol.failure(exc)

    def _request(self, request: protocol.Request) -> Any:
        if isinstance(request, protocol.Sleep):
            return time.sleep(request.seconds)
        if isinstance(request, protocol.Listen):
            fired = request.handle.wait(request.seconds)
            self._check_open()
            return fired
        if isinstance(request, calls.Call):
            return self._scripts[request.script](keys=request.keys, args=request.args)
        pipe = self.client.pipeline(transaction=request.atomic)
        for command in request.commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call,unused-ignore]
        return pipe.execute()

    # ------------------------------------------------------------------ producers

    def schedule(self, task_id: str, **options: Unpack[model.TaskOptions]) -> int:
        """Schedule ``fn(*args, **kwargs)`` as a new version of ``task_id``; return the version.

        The options are those of :class:`~distsched.model.TaskSpec` (``fn``, ``args``,
        ``kwargs``, ``run_at`` or ``delay``, ``priority``, ``deps``, ``optional_deps``,
        ``max_attempts``, ``backoff``, ``allow_unknown``, ``dedupe``, ``dedupe_window``,
        ``debounce``, ``deadline``, ``ttl``, ``key``, ``timeout``), given as keywords.
        ``timeout`` is the time limit of each run in seconds (README, "Time limits"). A
        pending or ready task of that id is replaced; a running one raises
        ``ConflictError``; a terminal one starts over as the new version. With ``dedupe``
        an existing queued or running version is kept and returned instead (:meth:`admit`
        tells which happened).

        With more than 1,000 required ``deps`` the task is placed in parts of 1,000, one
        script call each, and held (never claimable) until the last part: workers see it
        as if it had been scheduled at once. Should the call stop part way, the task stays
        held (``status().placing``) until the id is scheduled again or cancelled.
        """
        return self._drive(self._ops.schedule(task_id, options))

    def submit(self, task_id: str, **options: Unpack[model.TaskOptions]) -> int:
        """``schedule`` read dependencies-first: run ``fn`` once ``deps`` have succeeded.

        Raises ``UnknownDependencyError`` for a dependency that does not exist
        (unless ``allow_unknown``) and ``CycleError`` for a dependency cycle.
        """
        return self._drive(self._ops.schedule(task_id, options))

    def schedule_many(self, specs: Sequence[TaskSpec]) -> list[int]:
        """Schedule a batch atomically in one round trip; return the versions in order.

        In a striped namespace, one atomic call per stripe the batch's ids map to. A task
        with more than 1,000 required dependencies is placed in parts as :meth:`schedule`
        does it, after the batch's call, held until its last part.
        """
        return self._drive(self._ops.schedule_many(specs))

    def submit_graph(self, specs: Sequence[TaskSpec]) -> list[int]:
        """Register a whole graph atomically: all of it or none of it. Returns the versions.

        In a striped namespace every id of the graph must map to one stripe (give them
        the same ``{tag}``); otherwise ``InvalidArgument`` names two ids, and nothing
        is written. A task with more than 1,000 required dependencies is placed in parts as
        :meth:`schedule` does it, after the graph's call, held until its last part.
        """
        return self._drive(self._ops.submit_graph(specs))

    def admit(self, task_id: str, **options: Unpack[model.TaskOptions]) -> model.Admitted:
        """``schedule``, telling whether a new version was written.

        With ``dedupe`` (or ``dedupe_window``) an existing version may be kept: the
        result's ``version`` is then that version and ``created`` is False.
        ``schedule`` returns the same version without saying which.
        """
        return self._drive(self._ops.admit(task_id, options))

    def admit_many(self, specs: Sequence[TaskSpec]) -> list[model.Admitted]:
        """``schedule_many``, telling for each task whether a new version was written."""
        return self._drive(self._ops.admit_many(specs))

    def batching(self, window_s: float = 0.0, max_tasks: int = 500) -> BatchingProducer:
        """A producer whose ``schedule`` calls, from many threads, are sent together.

        For a service that enqueues one task per request: calls that arrive while a
        batch is in flight go together in the next one (at most ``max_tasks``; a call
        also waits up to ``window_s`` for others to join it), each caller still
        returning its own version, or raising its own error, once its task is written.
        An idle producer adds no delay. Close it (or use ``with``) before the scheduler.
        """
        return BatchingProducer(self, window_s, max_tasks)

    def cancel(self, task_id: str) -> State:
        """Cancel a task; return its state after the call.

        A pending or ready task is cancelled and never runs; a running one gets a
        cancellation request its function can act on; a terminal one is left as it is.
        """
        return self._drive(self._ops.call(Ops.cancel, task_id))

    def amend(
        self,
        task_id: str,
        *,
        priority: int | None = None,
        run_at: float | datetime.datetime | None = None,
        delay: model.Duration | None = None,
        max_attempts: int | None = None,
        version: int | None = None,
    ) -> model.Changed:
        """Change a task in place, without a new version: its ``priority`` or due time
        (``run_at`` or ``delay``, as :meth:`schedule` takes them) while it is queued
        (ready or pending), or its ``max_attempts`` while it is queued or running.

        A ready task moves to its new place in the queue and keeps its version, so among
        tasks of equal due time and priority it keeps its first-in first-out place. A
        ``max_attempts`` below the attempt that runs now or next is refused
        (``InvalidArgument``). With ``version``, nothing changes unless it is the task's
        current version (``Change.CONFLICT``). Every change given is made, or none
        (``Changed.change`` says which and why).
        """
        return self._drive(
            self._ops.call(Ops.amend, task_id, priority, run_at, delay, max_attempts, version)
        )

    def pause_task(self, task_id: str, version: int | None = None) -> model.Changed:
        """Pause a queued (ready or pending) task: it stays queued, counted in its state,
        but no worker claims it until :meth:`resume_task`. A pending one stays pending
        when its dependencies finish. Cancel, retry and purge work on it as on any task;
        a new version of it (scheduled again, retried) is not paused.
        """
        return self._drive(self._ops.call(Ops.pause_task, task_id, version))

    def resume_task(self, task_id: str, version: int | None = None) -> model.Changed:
        """Undo :meth:`pause_task`: a ready task goes back to its place in the queue, a
        pending one waits only for its dependencies again."""
        return self._drive(self._ops.call(Ops.resume_task, task_id, version))

    def paused_tasks(self, limit: int = 100) -> list[TaskInfo]:
        """The paused tasks, longest paused first: at most ``limit`` (1 to 1000) per stripe.

        Read from the hash of pauses, examining at most 10 x ``limit`` entries per stripe
        (entries left by versions that are no longer queued are passed over). A paused
        ready task is not in ``tasks(state="ready")`` (it has no queue entry); a paused
        pending one is in ``tasks(state="pending")``, with ``paused`` set.
        """
        return self._drive(self._ops.call(Ops.paused_tasks, limit))

    def cancel_workflow(self, task_id: str) -> int:
        """Cancel the whole workflow ``task_id`` belongs to: its root (the first task that
        spawned) and every task spawned under it, however deep, started or not. Pending
        and ready tasks end cancelled; running ones are asked to stop (as ``cancel``
        does), and a spawn they still report adds nothing. Runs in bounded calls, one
        per task. Returns how many tasks were cancelled or asked to stop.
        """
        return self._drive(self._ops.call(Ops.cancel_workflow, task_id))

    def retry(self, task_id: str, cascade: bool = True) -> int:
        """A new version of a failed, cancelled or blocked task; returns its version.

        With ``cascade`` the tasks it blocked get new versions too and wait again.
        """
        return self._drive(self._ops.call(Ops.retry, task_id, cascade))

    def create_waitpoint(
        self,
        task_id: str,
        timeout: Duration,
        *,
        deps: Sequence[str] = (),
        optional_deps: Sequence[str] = (),
        allow_unknown: bool = False,
        dedupe: bool = False,
        fn: str = "",
        kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """Create a waitpoint: a task no worker runs, which waits for a call from any
        service (:meth:`complete_waitpoint`, :meth:`fail_waitpoint`, or the
        ``waitpoint.lua`` script) and holds no worker slot meanwhile; returns its version.

        It stays ``pending`` until completed (``succeeded``, the payload its result, which
        its dependents read as any dependency's result), failed, or ``timeout`` seconds
        pass once it awaits nothing else: then it ends ``failed`` with the error ``timed
        out waiting for completion`` and its dependents are blocked. With ``deps`` it
        waits for them first (an approval after a build step) and its timeout counts from
        when the last succeeded. ``optional_deps``, ``allow_unknown`` and ``dedupe`` are
        :meth:`schedule`'s; ``fn`` and ``kwargs`` only label it (``fn`` defaults to
        ``distsched.waitpoint``). Other tasks depend on it
        as on any task; :meth:`retry` makes a new version that waits again, with its
        timeout counted afresh.
        """
        return self._drive(
            self._ops.schedule(
                task_id,
                {
                    "waitpoint": timeout,
                    "deps": deps,
                    "optional_deps": optional_deps,
                    "allow_unknown": allow_unknown,
                    "dedupe": dedupe,
                    "fn": fn,
                    "kwargs": kwargs,
                },
            )
        )

    def complete_waitpoint(
        self, task_id: str, payload: object = None, *, version: int | None = None, by: str = ""
    ) -> Outcome:
        """Complete waitpoint ``task_id``: it ends ``succeeded`` with ``payload`` (any
        msgpack-encodable value) as its result, and its dependents are released.

        Applies once per version: ``APPLIED``; ``DUPLICATE`` when that version was already
        completed or failed by a call; ``STALE`` for another version than the current one
        (``version``: None means the current), or one that ended otherwise (timed out,
        cancelled, blocked). ``by`` names the caller in the task's history.
        ``ConflictError`` when the task is no waitpoint, or still waits for its own
        dependencies; ``NotFoundError`` for an unknown id.
        """
        return self._drive(self._ops.call(Ops.complete_waitpoint, task_id, payload, version, by))

    def fail_waitpoint(
        self, task_id: str, error: str, *, version: int | None = None, by: str = ""
    ) -> Outcome:
        """Fail waitpoint ``task_id`` with ``error`` (a non-empty text, cut to 4096 bytes):
        it ends ``failed`` and its dependents are blocked; replies as
        :meth:`complete_waitpoint`."""
        return self._drive(self._ops.call(Ops.fail_waitpoint, task_id, error, version, by))

    def add_deps(self, task_id: str, deps: Sequence[str], allow_unknown: bool = False) -> None:
        """Add required dependencies to a pending task (``ConflictError`` otherwise)."""
        return self._drive(self._ops.add_deps(task_id, deps, allow_unknown))

    def dependency_results(
        self, task_id: str, ids: Sequence[str] | None = None
    ) -> dict[str, model.DependencyResult]:
        """What ``task_id``'s dependencies hold now, by id, read in one atomic call.

        Every dependency of the task's current version (required and optional, in the
        order given), or only ``ids``: each entry says the dependency's state, its
        result when it succeeded, or the error it ended with. One read takes at most
        ``limits.MAX_DEP_RESULTS`` (1000) dependencies whose results hold at most
        ``limits.MAX_DEP_RESULT_BYTES`` (2 MiB) together, else
        ``DependencyResultsTooLarge`` and nothing is read (one id asked alone is read
        whatever its size). An id that is not a dependency of the task raises
        ``NotADependencyError``; an unknown task ``NotFoundError``.
        """
        return self._drive(self._ops.call(Ops.dependency_results, task_id, ids))

    def settle(self, budget: int = calls.PROPAGATE_BUDGET) -> int:
        """Tell waiting dependents about every task that ended, in bounded script calls.

        Each call settles at most ``budget`` dependency edges, so Redis is never
        blocked for long however large the graph. Returns the edges settled.
        Every operation already does this for what it changed.
        """
        return self._drive(self._ops.call(Ops.settle, budget))

    # ------------------------------------------------------------------ schedules

    def add_schedule(self, name: str, fn: str, **options: Unpack[ScheduleOptions]) -> Schedule:
        """Add (or replace) the schedule ``name``: a task running ``fn`` at every slot.

        Give ``cron`` (with ``tz``, default ``"UTC"``) or ``interval`` seconds; the other
        options are those of :class:`~distsched.schedules.Schedule`. Each slot's task
        has the id ``<name>@<slot epoch ms>`` (in a striped namespace, ``{<name>}@<slot
        epoch ms>`` unless the name has a ``{tag}``, so that the task shares the
        schedule's stripe) and is created by the workers exactly once. Replacing a
        schedule keeps its counters and last run. Returns the schedule. Cron needs the
        ``cron`` extra (``MissingExtraError`` otherwise).
        """
        return self._drive(self._ops.call(Ops.add_schedule, name, fn, options))

    def get_schedule(self, name: str) -> Schedule:
        """The schedule ``name`` (``NotFoundError`` if none)."""
        return self._drive(self._ops.call(Ops.get_schedule, name))

    def schedules(self) -> list[Schedule]:
        """Every schedule of the namespace, by name."""
        return self._drive(self._ops.call(Ops.schedules))

    def remove_schedule(self, name: str) -> bool:
        """Remove a schedule (its tasks stay); True if it existed."""
        return self._drive(self._ops.call(Ops.remove_schedule, name))

    def pause_schedule(self, name: str) -> Schedule:
        """Stop firing ``name`` until :meth:`resume_schedule`."""
        return self._drive(self._ops.call(Ops.pause_schedule, name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire ``name`` again from its next slot after now; slots while paused are not
        caught up."""
        return self._drive(self._ops.call(Ops.resume_schedule, name))

    def trigger(self, name: str) -> str | None:
        """Run schedule ``name`` now, through its overlap policy: the id of the task
        created, or None when the policy skipped it."""
        return self._drive(self._ops.call(Ops.trigger, name))

    def backfill(
        self,
        name: str,
        start: float | datetime.datetime,
        end: float | datetime.datetime,
        limit: int = MAX_BACKFILL_SLOTS,
    ) -> int:
        """Create the tasks of the slots of ``name`` within ``[start, end]`` (a past range;
        at most ``limit`` slots, from the earliest): the number created. A slot whose
        task exists already (fired, or backfilled before) creates nothing."""
        return self._drive(self._ops.call(Ops.backfill, name, start, end, limit))

    def next_fires(self, name: str, n: int = 5) -> list[float]:
        """The next ``n`` fire times of ``name`` (epoch seconds); for a paused schedule,
        those it would have if resumed now; none once it has ended."""
        return self._drive(self._ops.call(Ops.next_fires, name, n))

    def fire_due(self, limit: int = calls.FIRE_HEADS) -> int:
        """Create the tasks of the due slots of at most ``limit`` schedules (of each
        stripe, in a striped namespace): the number created. Workers call it when a claim
        says a slot is due; racing callers are safe (each slot fires once)."""
        return self._drive(self._ops.fire_due(limit))

    def wait(
        self,
        task_id: str,
        timeout: Duration | None = None,
        *,
        on_progress: Callable[[model.Progress], object] | None = None,
    ) -> TaskInfo:
        """Block until ``task_id`` has ended (succeeded, failed, cancelled or blocked);
        return its final ``TaskInfo``.

        Raises ``Timeout`` when ``timeout`` seconds (None: no limit) pass first, and
        ``NotFoundError`` for an unknown id. No polling: the script that ends the task
        publishes a notice, which one subscription per scheduler, shared by all its
        waiting threads, receives. A task that is replaced by a new version while
        waited for is waited for in its new version.

        ``on_progress`` is called, in the waiting thread, with each new ``Progress``
        the running task reports while it is waited for (each report is announced on
        the same subscription, so this does not poll either). Reports that follow each
        other quickly may be seen as one: the callback gets the latest.
        """
        # Checked before the shared subscription is started for nothing.
        validate.validate_task_id(task_id)
        validate.validate_wait_timeout(timeout)
        self._drive(self._ops.call(Ops.noop))  # the stripes, whose channels it subscribes to
        with self._waits.watch(task_id) as waiter:
            return self._drive(self._ops.call(Ops.wait, task_id, timeout, waiter, on_progress))

    def result(
        self,
        task_id: str,
        timeout: Duration | None = None,
        *,
        on_progress: Callable[[model.Progress], object] | None = None,
    ) -> Any:
        """``wait``, then the task's result: its stored result when it succeeded.

        Otherwise raises ``TaskFailed`` (``.traceback``: the remote error text with its
        traceback), ``TaskCancelled`` or ``TaskBlocked`` (``.root``, ``.path``); and
        ``Timeout``/``NotFoundError`` as ``wait`` does. ``on_progress`` as for ``wait``.
        """
        # Checked before the shared subscription is started for nothing.
        validate.validate_task_id(task_id)
        validate.validate_wait_timeout(timeout)
        self._drive(self._ops.call(Ops.noop))  # the stripes, whose channels it subscribes to
        with self._waits.watch(task_id) as waiter:
            return self._drive(self._ops.call(Ops.result, task_id, timeout, waiter, on_progress))

    # ------------------------------------------------------------------ workers

    def claim(
        self,
        n: int,
        worker_id: str,
        *,
        listening: bool = False,
        request_id: str | None = None,
    ) -> tuple[list[Claim], Wait | None]:
        """Claim up to ``n`` tasks; also say why fewer were claimed, with the delay hint.

        With ``listening=True`` the caller listens on ``keys.worker_channel(worker_id)``:
        a claim that gets fewer than ``n`` registers it as idle, and it is sent ``ready``
        there when it has work. Only one idle caller gets the delay hint for a head not due
        yet (the others get ``delay=None``); each should claim again within
        ``wire.calls.IDLE_RECHECK_S`` seconds.

        With ``request_id`` the tokens claimed are kept (until this worker's next claim):
        if the call fails in a way where it may have run (a lost connection, a timeout),
        :meth:`~distsched.worker.link.WorkerLink.hand_back_lost_claim` with the same id puts
        them back.
        """
        return self._drive(self._ops.claim(n, worker_id, listening, request_id))

    def ready(self, n: int, worker_id: str) -> list[Claim]:
        """Claim up to ``n`` due tasks (fewer when capacity is short), in queue order."""
        return self._drive(self._ops.ready(n, worker_id))

    def next(self, worker_id: str) -> Claim | Wait:
        """Claim the next due task, or say how long to wait and why."""
        return self._drive(self._ops.next(worker_id))

    def heartbeat(self, claim: Claim) -> bool:
        """Extend ``claim``'s lease; True when cancellation was requested.

        Raises ``LeaseLostError`` when the token is no longer current.
        """
        return self._drive(self._ops.call(Ops.heartbeat, claim))

    def heartbeat_many(self, claims: Sequence[Claim]) -> list[bool | None]:
        """Extend many leases in one call: True/False (cancel requested) or None (lost)."""
        return self._drive(self._ops.call(Ops.heartbeat_many, claims))

    def report_progress(self, claim: Claim, fraction: float, note: str = "") -> Outcome:
        """Report how far ``claim``'s attempt got: ``fraction`` in [0, 1] and a short
        ``note`` (at most 200 bytes of UTF-8). ``STALE`` (nothing written) when the
        token is no longer the running attempt. Waiters and ``status`` see it at once.
        """
        return self._drive(self._ops.call(Ops.report_progress, claim, fraction, note))

    def save_checkpoint(self, claim: Claim, value: object) -> Outcome:
        """Keep ``value`` (any msgpack value, at most 64 KiB encoded; None clears it) as
        the checkpoint of ``claim``'s version: the next attempt of the same version reads
        it with :meth:`checkpoint`. ``STALE`` (nothing written) when the token is no
        longer the running attempt."""
        return self._drive(self._ops.call(Ops.save_checkpoint, claim, value))

    def checkpoint(self, claim: Claim) -> Any:
        """The last checkpoint an attempt of ``claim``'s version saved; None when none."""
        return self._drive(self._ops.call(Ops.checkpoint, claim))

    def complete(self, claim: Claim, result: object = None) -> Outcome:
        """Report success of ``claim`` (fenced by its token)."""
        return self._drive(self._ops.call(Ops.complete_many, [(claim, result)]))[0]

    def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """Report many successes in one round trip."""
        return self._drive(self._ops.call(Ops.complete_many, reports))

    def spawn(self, claim: Claim, spawn: Spawn) -> Outcome:
        """Report success of ``claim`` and add the tasks of ``spawn`` (:class:`Spawn`) in
        the same atomic step, fenced by its token: a stale or repeated report adds nothing.

        A worker calls this for a function that returns a :class:`Spawn`. Raises
        ``ConflictError`` when a spawned id exists already (nothing is written).
        """
        return self._drive(self._ops.spawn(claim, spawn))

    def fail(self, claim: Claim, error: object) -> Outcome:
        """Report that ``claim``'s function raised: retried after backoff while attempts remain."""
        return self._drive(self._ops.call(Ops.fail_many, [(claim, error)]))[0]

    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        """Report many failures in one round trip."""
        return self._drive(self._ops.call(Ops.fail_many, reports))

    def confirm_cancel(self, claim: Claim) -> Outcome:
        """The function stopped on a cancellation request: the task ends cancelled."""
        return self._drive(self._ops.call(Ops.confirm_cancel, claim))

    def release(self, claims: Sequence[Claim], *, delay: Duration = 0.0) -> int:
        """Hand back claims whose function never started; no attempt is spent.

        With ``delay`` (seconds) the tasks become due again no sooner than that
        from now; their ``run_at`` is kept. Returns how many were handed back.
        """
        return self._drive(self._ops.call(Ops.release, claims, delay))

    def leave(self, worker_id: str) -> bool:
        """A listening worker that stops: it is no longer idle, and its kept claim goes.

        When it was the one idle worker waiting for a queue head not due yet, another
        idle worker is woken to take that over (returns True then).
        """
        return self._drive(self._ops.call(Ops.leave, worker_id))

    def workers(self) -> list[model.WorkerInfo]:
        """The workers of the namespace as they last registered themselves, by id.

        Each worker rewrites its entry on every heartbeat; ``alive`` turns False when
        it missed a few, and entries silent for ``WorkerInfo.drop_after_s`` are gone.
        """
        return self._drive(self._ops.call(Ops.workers))

    # ------------------------------------------------------------------ housekeeping

    def reap(self, limit: int = calls.REAP_BATCH) -> int:
        """Handle expired leases now; return how many."""
        return self._drive(self._ops.call(Ops.reap, limit))

    def expire(self, limit: int = calls.EXPIRE_BATCH) -> int:
        """End queued tasks whose deadline passed now (as the housekeeping does); return
        how many expired."""
        return self._drive(self._ops.call(Ops.expire, limit))

    def expire_lease(self, task_id: str) -> int:
        """Expire ``task_id``'s lease at once, as if its holder had vanished (operators)."""
        return self._drive(self._ops.call(Ops.expire_lease, task_id))

    def purge(self, limit: int = calls.PURGE_BATCH) -> int:
        """Remove up to ``limit`` terminal tasks older than the retention; return how many."""
        return self._drive(self._ops.call(Ops.purge, limit))

    def purge_tasks(self, task_ids: Sequence[str]) -> int:
        """Remove these terminal tasks now, whatever the retention, with everything they
        own (as retention removes them); return how many were removed.

        At most 1000 ids per call. An id that is not terminal, or still telling its
        dependents that it ended, is left as it is; an unknown id is skipped. Dependents
        keep their own records (a later dependency on a removed id is unknown).
        """
        return self._drive(self._ops.call(Ops.purge_tasks, task_ids))

    def set_retention(self, retention_s: Duration) -> None:
        """Keep terminal tasks this many seconds (per namespace; default 24 hours)."""
        return self._drive(self._ops.call(Ops.set_retention, retention_s))

    def compact(self, budget: int = limits.MAX_COMPACT_BUDGET) -> int:
        """Drop stale queue entries if they pile up (one bounded step); return how many."""
        return self._drive(self._ops.call(Ops.compact, budget))

    def housekeeping(self, purge_calls: int = 20) -> Chores:
        """The periodic chores every worker runs: reap leases, expire tasks past their
        deadline, compact, purge.

        Purging goes on while whole batches come back, up to ``purge_calls``
        bounded calls, so a busy namespace's history is removed about as fast as
        it is made; per-minute counters older than a day are deleted. Returns how many
        leases were reaped, tasks expired, stale queue entries dropped, terminal tasks purged and
        counter fields deleted.
        """
        return self._drive(self._ops.call(Ops.housekeeping, purge_calls))

    def payload_limit(self) -> int:
        """The namespace's payload limit in bytes: the largest encoded payload the scripts
        accept (``set_payload_limit``; the default 1 MiB while none is set)."""
        return self._drive(self._ops.call(Ops.payload_limit))

    def set_payload_limit(self, limit: int | None) -> int:
        """Set the namespace's payload limit to ``limit`` bytes, at most
        ``limits.PAYLOAD_CEILING_BYTES`` (1 MiB, also the default: a namespace may set a
        lower limit); None restores the default.
        Returns the limit now applied.

        An operator's call: the scripts take the limit from the namespace, so no
        producer can raise it for itself. A scheduler's own ``max_payload_bytes`` is only
        a check before sending, which can lower the limit for its calls but never raise it.
        """
        return self._drive(self._ops.call(Ops.set_payload_limit, limit))

    def set_max_running(self, max_running: int | None) -> None:
        """Set the fleet-wide bound on running tasks (None removes it). Last writer wins."""
        return self._drive(self._ops.set_max_running(max_running))

    def set_order(
        self, order: Order | str = Order.PRIORITY, aging: Duration = 60.0
    ) -> OrderSetting:
        """Choose the order in which claims take the namespace's due tasks.

        ``"default"``: (due time, -priority, sequence), first due, first served.
        ``"priority"``: among due tasks, the lowest ``due time - priority * aging`` first
        (then the higher priority, then the earlier submitted): the highest priority goes
        first, and each second a task waits counts as ``1 / aging`` points of priority,
        so none waits more than ``(p_max - p) * aging`` seconds behind tasks of higher
        priority that became due after it (README, "Ordering"). ``aging`` is in seconds
        per priority point (0 to 1,000,000, kept to the ms).

        The order may change while tasks are queued: switching to ``"priority"`` ranks the
        queued tasks as claims reach them; switching back, or a new ``aging``, rewrites the
        ready set in the same call, and is refused (``ConflictError``) while it holds more
        than 100,000 entries (in a namespace with fairness keys, counted with the keyed
        tasks' entries). Inside each fairness key claims follow this order; across keys
        they take turns (README, "Tenants and fairness"). Last writer wins.
        """
        return self._drive(self._ops.call(Ops.set_order, order, aging))

    def order(self) -> OrderSetting:
        """The namespace's claim order and aging (``set_order``)."""
        return self._drive(self._ops.call(Ops.order))

    def set_key(
        self,
        key: str,
        cap: int | None = None,
        weight: int = 1,
        rate: int | None = None,
        per: Duration = 1.0,
    ) -> KeyInfo:
        """Set the concurrency cap and weight of fairness key ``key`` (``""``: the default
        key of tasks given none), replacing its earlier settings.

        ``cap``: the most tasks of the key running at once, fleet-wide (None: the
        namespace default of ``set_default_key_cap``, if any; 0 holds its tasks). ``weight``:
        its share of claims while several keys have due work (README, "Tenants and
        fairness"). ``rate``: the most units of the key started per ``per`` seconds, a task
        taking its ``cost`` (1 unless scheduled with one; a token bucket of ``rate`` units on
        the server clock; None: no limit); a key short of its next task's units is skipped
        until they are there. Turns the namespace fair if it was not.
        Takes effect at the next claim.
        """
        return self._drive(self._ops.call(Ops.set_key, key, cap, weight, rate, per))

    def set_default_key_cap(self, cap: int | None) -> None:
        """Set the cap of every fairness key that has none of its own (None: no cap)."""
        return self._drive(self._ops.call(Ops.set_default_key_cap, cap))

    def key_info(self, key: str) -> KeyInfo:
        """The settings, running and queued counts of fairness key ``key``."""
        return self._drive(self._ops.call(Ops.key_info, key))

    def fair_keys(self, limit: int = 100) -> list[KeyInfo]:
        """Up to ``limit`` fairness keys with work or settings, most running first."""
        return self._drive(self._ops.fair_keys(limit))

    # ------------------------------------------------------------------ inspection

    def status(self, task_id: str) -> TaskInfo:
        """A snapshot of one task; ``NotFoundError`` for an unknown id."""
        return self._drive(self._ops.call(Ops.status, task_id))

    def progress(self, task_id: str) -> model.Progress | None:
        """The last progress the current version of ``task_id`` reported (None: none);
        ``NotFoundError`` for an unknown id."""
        return self._drive(self._ops.call(Ops.progress, task_id))

    def stats(self) -> Stats:
        """Counts per state, queue entries vs live ones, leases, capacity, retention."""
        return self._drive(self._ops.stats())

    def overview(self, soon_s: Duration = 5.0, scan: int = 100) -> Overview:
        """``stats()`` plus lease expiries and how far behind the fleet is (server clock).

        ``oldest_ready_age`` looks at the first ``scan`` due queue entries.
        """
        return self._drive(self._ops.overview(soon_s, scan))

    def explain(self, task_id: str) -> Explanation:
        """Why ``task_id`` is not running (or that it is): reasons and the facts behind them.

        Bounded reads whatever the namespace's size; ``NotFoundError`` for an unknown id.
        """
        return self._drive(self._ops.call(Ops.explain, task_id))

    def unserved(self, fn: str) -> str | None:
        """Why tasks of ``fn`` may not run: a sentence (with a did-you-mean) when live
        workers announce the functions they serve and none serves ``fn``; None when one
        does, or when no live worker announced any. Reads them at most every few seconds.
        """
        return self._drive(self._ops.unserved(fn))

    def leases(self) -> list[tuple[str, float]]:
        """Running task ids with their lease deadlines (epoch seconds, server clock)."""
        return self._drive(self._ops.call(Ops.leases))

    def server_time(self) -> float:
        """The Redis server's clock, epoch seconds (the clock that decides due-ness)."""
        return self._drive(self._ops.call(Ops.server_time))

    def tasks(
        self,
        state: str | State,
        *,
        fn: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of the tasks in ``state``, without scanning the namespace.

        Pending and terminal tasks come newest first (by the time they entered the
        state), ready tasks in due order (the order workers claim them; in a namespace
        with fairness keys, the tasks of each key other than the default one after the
        rest, key by key), running tasks by lease deadline. Pass the page's ``cursor``
        back for the next page; it is None when there is no more. Paging returns each
        task once while nothing changes; a task that moves meanwhile may be missed or
        leave the listing.

        ``fn`` keeps the tasks of that function only. Each call examines at most
        ``10 * limit`` entries, so a filtered page may hold fewer than ``limit`` tasks
        (even none) with a cursor to go on. ``limit`` is in [1, 1000]. Items carry no
        ``dependents`` or ``blocked_by`` (see :meth:`status`).
        """
        return self._drive(self._ops.tasks(state, fn, limit, cursor))

    def failures(
        self, *, cursor: str | None = None, count: int = failure_ops.FAILURES_BATCH_DEFAULT
    ) -> model.FailurePage:
        """The next ``count`` failed tasks (newest first, 1 to 500) grouped by error.

        Each call reads one bounded batch of the failed index, however many tasks
        failed: pass the page's ``cursor`` back for the next batch (None: no more),
        and add pages up with :func:`distsched.ops.failures.merge_groups`. A page may
        hold fewer tasks (even none: the entries of tasks that just moved on, the end of
        one stripe) with a cursor to go on. A group's key is the error's last line with
        numbers and hex ids replaced by ``#``.
        """
        return self._drive(failure_ops.failures(self._ops, cursor, count))

    def retry_failures(
        self,
        error: str,
        *,
        cascade: bool = True,
        batch: int = failure_ops.FAILURES_BATCH_DEFAULT,
        limit: int | None = None,
    ) -> model.BulkOutcome:
        """Retry every failed task whose error is in the group ``error`` (a group key
        as :meth:`failures` lists it, or any error line grouped the same way).

        Walks the failed tasks newest first, ``batch`` (1 to 500) per read, one retry
        script per matching task, so each Redis call stays short; at most ``limit``
        tasks. Tasks that fail after the walk started are not visited. With
        ``cascade`` the tasks each one blocked are retried with it.
        """
        return self._drive(failure_ops.retry_failures(self._ops, error, cascade, batch, limit))

    def purge_failures(
        self,
        error: str,
        *,
        batch: int = failure_ops.FAILURES_BATCH_DEFAULT,
        limit: int | None = None,
    ) -> model.BulkOutcome:
        """Remove now every failed task whose error is in the group ``error``, as
        :meth:`purge_tasks` does, ``batch`` (1 to 500) failed tasks read and one
        removal script per step; at most ``limit`` tasks."""
        return self._drive(failure_ops.purge_failures(self._ops, error, batch, limit))

    def throughput(self, minutes: int = 60) -> list[model.MinuteCount]:
        """Attempts that succeeded and failed per minute over the last ``minutes``
        minutes (1 to 1440), oldest first, up to the current minute (server clock), with
        zeros where nothing ended. A failed attempt counts even if the task was retried;
        a lost lease counts as failed."""
        return self._drive(self._ops.call(Ops.throughput, minutes))

    def retention_plan(self, sample: int = 64) -> RetentionPlan:
        """The memory the namespace's ended tasks take and will take: bytes per ended
        task (from the ``sample`` newest, 1 to 64), endings per second over the last ten
        minutes, and their product with the retention, against the server's
        ``maxmemory`` where the user may read ``INFO`` (docs: "Planning for retention")."""
        return self._drive(self._ops.call(Ops.retention_plan, sample))

    def scan_tasks(self, cursor: int = 0, count: int = 1000) -> tuple[int, list[TaskRow]]:
        """One step of a scan over every task's record: ``(next cursor, rows)``.

        Start at cursor 0 and go on until the cursor returned is 0 again; a task
        may be listed twice, and tasks changed meanwhile may show either state.
        """
        return self._drive(self._ops.scan_tasks(cursor, count))

    def exists(self) -> bool:
        """True when the namespace has any data in this Redis."""
        return self._drive(self._ops.call(Ops.exists))

    def clear(self) -> None:
        """Delete every task, schedule and setting of the namespace (irreversible).

        Each stripe's keys go in one ``UNLINK``: the keys leave at once and Redis frees
        the memory of large ones in the background. Workers still running see an empty
        namespace. The command line's ``distsched namespace wipe --yes`` calls this."""
        return self._drive(self._ops.clear())

    def close(self) -> None:
        """Close the scheduler: every later call raises ``ClosedError``.

        Calls already in flight finish. A client made by ``from_url`` is closed too.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = self._in_flight == 0
        self._waits.close()
        if idle:  # else the last call in flight closes the client when it ends
            self._close_client()

    def _close_client(self) -> None:
        if not self._owns_client:
            return
        if isinstance(self.client, RedisCluster):
            # RedisCluster.close() leaves its nodes' pools connected.
            nodes: list[ClusterNode] = cast(Any, self.client).get_nodes()  # untyped in redis-py
            for node in nodes:
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        self.client.close()
