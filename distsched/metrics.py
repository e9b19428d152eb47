"""Observing workers.

- :class:`WorkerMetrics`: the hooks a :class:`~distsched.worker.Worker` calls as
  it works (all no-ops here; subclass to record what you need).
- :class:`PrometheusMetrics`: those hooks as Prometheus counters, histograms and
  gauges; :func:`serve_metrics` exposes a registry over HTTP.

``prometheus-client`` is optional (``pip install 'distsched[metrics]'``) and is
imported only by :class:`PrometheusMetrics` and :func:`serve_metrics`, so a worker
without metrics never loads it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, cast

from distsched.errors import DistschedError
from distsched.hooks import WorkerHooks
from distsched.model import (
    PRIORITY_LABELS,
    Claim,
    Outcome,
    State,
    Stats,
    priority_bucket,
    stage_counts,
)

INSTALL_HINT = "pip install 'distsched[metrics]'"

# Seconds. Claims are one script call; runs and waits span sub-millisecond no-ops
# to hour-long jobs.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RUN_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
OTHER_KEYS_LABEL = "(other)"
"""The ``key`` label of ready waits of the fairness keys outside the top keys."""


class MetricsUnavailable(DistschedError):
    """prometheus-client is not installed."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            f"metrics need the prometheus-client package: {INSTALL_HINT}"
        ) from None
    return prometheus_client


class WorkerMetrics(WorkerHooks):
    """The hooks a worker calls; every one is a no-op here.

    It is a :class:`~distsched.hooks.WorkerHooks` too: a subclass may also implement
    ``before_task``, ``after_task`` and ``on_failure``, which the worker calls around
    each run like those of its other hooks.

    Hooks run on the worker's own threads (claim loop, pool threads, reporter,
    heartbeat thread), so they must be quick, thread-safe and must not raise.
    Only :meth:`on_stats` and :meth:`on_pool` cost the worker anything extra: it
    reads ``Scheduler.overview()`` once per heartbeat round for them, on the
    heartbeat thread, and only when the worker was given a metrics object.
    """

    def on_claimed(self, n: int, latency_s: float) -> None:
        """A claim call returned ``n`` tasks (0 included) after ``latency_s`` seconds."""

    def on_started(self, claim: Claim, wait_s: float) -> None:
        """A function starts; ``wait_s`` is its start time minus the task's ``run_at``
        (server clock), i.e. how long a due task waited for a slot."""

    def on_finished(self, claim: Claim, duration_s: float) -> None:
        """A function returned or raised after ``duration_s`` seconds."""

    def on_outcome(self, kind: str, outcome: Outcome) -> None:
        """A report was answered. ``kind`` is ``complete``, ``spawn``, ``fail`` or
        ``confirm_cancel``."""

    def on_lease_lost(self, claim: Claim) -> None:
        """A heartbeat found that this worker's claim is no longer current."""

    def on_released(self, n: int) -> None:
        """``n`` claimed-but-unstarted tasks were handed back (shutdown)."""

    def on_housekeeping(self, reaped: int, compacted: int, purged: int) -> None:
        """A housekeeping round reaped expired leases (of any worker), dropped stale
        queue entries and purged terminal tasks past the retention."""

    def on_unserved(self, claim: Claim) -> None:
        """A task failed because no live worker of the namespace served its function
        within ``unserved_timeout`` (a deployment that lacks a function)."""

    def on_stats(self, stats: Mapping[str, Any]) -> None:
        """The namespace's ``Scheduler.overview()`` (``stats()`` plus the oldest due
        task's wait and lease expiries), read once per heartbeat round."""

    def on_pool(self, snapshot: Mapping[str, int]) -> None:
        """The worker's ``snapshot()``, taken once per heartbeat round."""


class PrometheusMetrics(WorkerMetrics):
    """Worker hooks recorded as Prometheus metrics in ``registry``.

    Pass a fresh ``prometheus_client.CollectorRegistry`` to keep several workers
    of one process apart (default: the global registry). Counters count what
    this worker did; the ``distsched_namespace_*`` and ``distsched_queue_*`` gauges
    show the whole namespace as of the last heartbeat round.
    """

    def __init__(self, registry: Any = None) -> None:
        prom = _prometheus()
        if registry is None:
            registry = prom.REGISTRY
        self.registry = registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Gauge(name, doc, labels, registry=registry)

        self.claimed = counter("distsched_tasks_claimed", "Tasks this worker claimed.")
        self.succeeded = counter(
            "distsched_tasks_succeeded", "Tasks this worker reported succeeded (applied)."
        )
        self.failed = counter(
            "distsched_tasks_failed",
            "Attempts this worker reported failed (applied; includes attempts then retried).",
        )
        self.cancelled = counter(
            "distsched_tasks_cancelled",
            "Running tasks that stopped on a cancellation request (applied).",
        )
        self.rejected = counter(
            "distsched_reports_rejected",
            "Reports that changed nothing: stale (token not current) or duplicate "
            "(this token was already applied).",
            ("reason",),
        )
        self.lost = counter(
            "distsched_leases_lost", "Running tasks of this worker whose lease was lost."
        )
        self.expired = counter(
            "distsched_leases_expired",
            "Expired leases (of any worker) reaped by this worker's housekeeping.",
        )
        self.released = counter(
            "distsched_tasks_released", "Claimed tasks handed back unstarted at shutdown."
        )
        self.purged = counter(
            "distsched_tasks_purged", "Terminal tasks purged by this worker's housekeeping."
        )
        self.unserved = counter(
            "distsched_tasks_unserved",
            "Tasks this worker failed because no live worker served their function.",
        )
        self.compacted = counter(
            "distsched_queue_compacted",
            "Stale queue entries dropped by this worker's housekeeping.",
        )
        self.claim_latency = prom.Histogram(
            "distsched_claim_latency_seconds",
            "Duration of claim calls (one script call each).",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.run_duration = prom.Histogram(
            "distsched_task_run_seconds",
            "How long task functions ran.",
            ("fn",),
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.start_wait = prom.Histogram(
            "distsched_task_start_wait_seconds",
            "From a task's run_at (server clock) to its function starting.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        # Per priority, so that starvation shows: a label per bucket of priorities
        # (model.priority_bucket: 0 to 9 each, then <0, 10-99, 100-999, >=1000).
        self.ready_wait = prom.Histogram(
            "distsched_task_ready_wait_seconds",
            "From a task's run_at (server clock) to its function starting, per priority "
            "bucket (0 to 9 exactly, else <0, 10-99, 100-999, >=1000).",
            ("priority",),
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.tasks = gauge(
            "distsched_namespace_tasks",
            'Tasks of the namespace per state; ready tasks not due yet under state="scheduled".',
            ("state",),
        )
        self.queue_entries = gauge(
            "distsched_queue_entries", "Entries in the namespace's ready queue, stale included."
        )
        self.queue_stale = gauge(
            "distsched_queue_stale_entries",
            "Queue entries of replaced or cancelled versions, not yet dropped.",
        )
        self.leases = gauge("distsched_namespace_leases", "Leases held in the namespace.")
        self.oldest_due = gauge(
            "distsched_oldest_due_wait_seconds",
            "How long the earliest due task of the namespace has waited to start "
            "(0 when none is due): how far behind the fleet is.",
        )
        self.leases_overdue = gauge(
            "distsched_namespace_leases_overdue",
            "Leases of the namespace past their deadline and not reaped yet.",
        )
        # Per fairness key, for the top keys stats() shows only (a bounded label set): a
        # key that leaves the top loses its series.
        self.key_running = gauge(
            "distsched_key_running", "Running tasks per fairness key (top keys).", ("key",)
        )
        self.key_queued = gauge(
            "distsched_key_queued", "Queued tasks per fairness key (top keys).", ("key",)
        )
        self.key_ready_wait = gauge(
            "distsched_key_ready_wait_seconds",
            "How long the first due task of each fairness key has waited (top keys).",
            ("key",),
        )
        # Every start's ready wait in a fair namespace, per key for the top keys of the
        # last stats read, the rest under OTHER_KEYS_LABEL: at most 11 series.
        self.key_task_wait = prom.Histogram(
            "distsched_key_task_ready_wait_seconds",
            "From a task's run_at (server clock) to its function starting, per fairness "
            f"key (the top keys of stats; the others as {OTHER_KEYS_LABEL!r}).",
            ("key",),
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.key_task_wait.labels(OTHER_KEYS_LABEL)
        self._key_labels: set[str] = set()
        self.pool = gauge(
            "distsched_worker_slots",
            "This worker's pool: executing, claimed but unstarted, reporting, free.",
            ("state",),
        )
        # Every label value exists from the start, so a scrape shows zeros, not gaps.
        for reason in (Outcome.STALE.value, Outcome.DUPLICATE.value):
            self.rejected.labels(reason)
        for state in State:
            self.tasks.labels(state.value)
        for slot in ("executing", "unstarted", "reporting", "free"):
            self.pool.labels(slot)
        for label in PRIORITY_LABELS:
            self.ready_wait.labels(label)
        self._applied = {
            "complete": self.succeeded,
            "spawn": self.succeeded,
            "fail": self.failed,
            "confirm_cancel": self.cancelled,
        }

    def on_claimed(self, n: int, latency_s: float) -> None:
        if n:
            self.claimed.inc(n)
        self.claim_latency.observe(latency_s)

    def on_started(self, claim: Claim, wait_s: float) -> None:
        self.start_wait.observe(max(0.0, wait_s))
        self.ready_wait.labels(priority_bucket(claim.priority)).observe(max(0.0, wait_s))
        if claim.key is not None:
            label = claim.key if claim.key in self._key_labels else OTHER_KEYS_LABEL
            self.key_task_wait.labels(label).observe(max(0.0, wait_s))

    def on_finished(self, claim: Claim, duration_s: float) -> None:
        # Only registered functions run, so the label's values are bounded.
        self.run_duration.labels(claim.fn).observe(duration_s)

    def on_outcome(self, kind: str, outcome: Outcome) -> None:
        if outcome is Outcome.APPLIED:
            self._applied.get(kind, self.failed).inc()
        else:
            self.rejected.labels(outcome.value).inc()

    def on_lease_lost(self, claim: Claim) -> None:
        self.lost.inc()

    def on_released(self, n: int) -> None:
        if n:
            self.released.inc(n)

    def on_housekeeping(self, reaped: int, compacted: int, purged: int) -> None:
        for metric, n in (
            (self.expired, reaped),
            (self.compacted, compacted),
            (self.purged, purged),
        ):
            if n:
                metric.inc(n)

    def on_unserved(self, claim: Claim) -> None:
        self.unserved.inc()

    def on_stats(self, stats: Mapping[str, Any]) -> None:
        # The ready tasks as two labels: scheduled (not due yet) and ready (due now).
        counts = stage_counts(cast(Stats, stats)) if "scheduled" in stats else stats["counts"]
        for state, count in counts.items():
            self.tasks.labels(state).set(count)
        self.queue_entries.set(stats["queue_entries"])
        self.queue_stale.set(max(0, stats["stale_entries"]))
        self.leases.set(stats["leases"])
        # Present when the worker read overview() (it does); a plain stats() leaves them.
        if "oldest_ready_age" in stats:
            self.oldest_due.set(stats["oldest_ready_age"] or 0.0)
        if "leases_expired" in stats:
            self.leases_overdue.set(stats["leases_expired"])
        shown: set[str] = set()
        for load in stats.get("keys", []):
            label = load["key"]
            shown.add(label)
            self.key_running.labels(label).set(load["running"])
            self.key_queued.labels(label).set(load["queued"])
            self.key_ready_wait.labels(label).set(load["ready_wait_s"] or 0.0)
        for label in self._key_labels - shown:
            for metric in (self.key_running, self.key_queued, self.key_ready_wait):
                metric.remove(label)
            if label != OTHER_KEYS_LABEL:
                # KeyError: no task of that key started while it was shown.
                with contextlib.suppress(KeyError):
                    self.key_task_wait.remove(label)
        self._key_labels = shown

    def on_pool(self, snapshot: Mapping[str, int]) -> None:
        for slot, n in snapshot.items():
            self.pool.labels(slot).set(n)


class MetricsServer:
    """An HTTP endpoint serving ``/metrics`` on a daemon thread."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.addr: str = httpd.server_address[0]
        self.port: int = int(httpd.server_port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


def process_registry() -> Any:
    """A fresh registry holding the process, platform and GC collectors, as the
    global one does, for a worker process's endpoint."""
    prom = _prometheus()
    registry = prom.CollectorRegistry()
    prom.ProcessCollector(registry=registry)
    prom.PlatformCollector(registry=registry)
    prom.GCCollector(registry=registry)
    return registry


def serve_metrics(port: int, addr: str = "127.0.0.1", registry: Any = None) -> MetricsServer:
    """Serve ``registry`` at ``http://addr:port/metrics`` (port 0: any free port).

    Raises :class:`MetricsUnavailable` without prometheus-client and ``OSError``
    when the address cannot be bound.
    """
    prom = _prometheus()
    httpd, thread = prom.start_http_server(
        port, addr=addr, registry=prom.REGISTRY if registry is None else registry
    )
    return MetricsServer(httpd, thread)
