"""A worker program the fault tests kill, stop and signal as a separate process.

``python tests/fault_procs.py URL NAMESPACE [--concurrency N] [--lease S] [--grace G]``
    (URL ``redis://`` or, for a Redis Cluster, ``redis+cluster://``)
    Runs a ``Worker`` on the main thread (so SIGTERM/SIGINT trigger its shutdown),
    prints ``started`` first and, after a clean shutdown, one JSON line with the
    worker's counts. Its task functions write what they see to lists outside the
    namespace's own keys (``runs_key`` and friends below), as JSON rows:

    ``record(ms)``
        appends ``[task_id, version, attempt, pid]`` to ``runs_key`` when it starts
        and to ``ends_key`` when it returns, after sleeping ``ms`` milliseconds;
        returns ``[pid, attempt]``.
    ``watch()``
        attempt 1 appends its token to ``runs_key``, then waits (up to 60 s) for its
        signal, appends ``[lease_lost, cancel_requested, pid]`` to ``seen_key`` and
        returns normally, so that its worker reports a completion; later attempts
        return at once. Returns ``"attempt N"``.

    Every ``complete``/``fail``/``confirm_cancel`` the worker sends is appended to
    ``reports_key`` with the answer it got: ``[task_id, version, attempt, kind, outcome,
    pid]``. A row is written only after Redis answered, so a process killed in between
    leaves none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import redis

from distsched import Claim, Outcome, Scheduler, Worker, current_task
from distsched.client import client_from_url
from distsched.worker.link import WorkerLink


def runs_key(namespace: str) -> str:
    return f"test:{namespace}:runs"


def ends_key(namespace: str) -> str:
    return f"test:{namespace}:ends"


def seen_key(namespace: str) -> str:
    return f"test:{namespace}:seen"


def reports_key(namespace: str) -> str:
    return f"test:{namespace}:reports"


def rows(client: redis.Redis, key: str) -> list[list[Any]]:
    """The JSON rows of one of the lists above, oldest first."""
    raws: Any = client.lrange(key, 0, -1)
    return [json.loads(raw) for raw in raws]


def log_reports(
    s: Scheduler, kind: str, claims: Sequence[Claim], outcomes: Sequence[Outcome]
) -> None:
    pid = os.getpid()
    for claim, outcome in zip(claims, outcomes, strict=True):
        row = [claim.task_id, claim.version, claim.attempt, kind, outcome.value, pid]
        s.client.rpush(reports_key(s.namespace), json.dumps(row))


class ReportingScheduler(Scheduler):
    """A scheduler that logs every report the worker makes together with its answer."""

    def _log(self, kind: str, claims: Sequence[Claim], outcomes: Sequence[Outcome]) -> None:
        log_reports(self, kind, claims, outcomes)

    def complete_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        outcomes = super().complete_many(reports)
        self._log("complete", [claim for claim, _ in reports], outcomes)
        return outcomes

    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        outcomes = super().fail_many(reports)
        self._log("fail", [claim for claim, _ in reports], outcomes)
        return outcomes

    def confirm_cancel(self, claim: Claim) -> Outcome:
        outcome = super().confirm_cancel(claim)
        self._log("confirm_cancel", [claim], [outcome])
        return outcome


class ReportingLink(WorkerLink):
    """Logs the completions the worker sends pre-encoded, with their answers."""

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        outcomes = super().complete_encoded(reports)
        log_reports(self.scheduler, "complete", [claim for claim, _ in reports], outcomes)
        return outcomes


class ReportingWorker(Worker):
    link_class = ReportingLink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=0.5)
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args(argv)
    ns = args.namespace
    pid = os.getpid()
    # A redis+cluster:// URL names a Redis Cluster (the striped recurring test's).
    client = client_from_url(
        args.url, redis.Redis.from_url, redis.RedisCluster.from_url, redis.cluster.ClusterNode
    )
    s = ReportingScheduler(client, namespace=ns, lease_s=args.lease)

    def token() -> str:
        ctx = current_task()
        return json.dumps([ctx.task_id, ctx.version, ctx.attempt, pid])

    def record(ms: int) -> list[int]:
        row = token()
        client.rpush(runs_key(ns), row)
        time.sleep(ms / 1000.0)
        client.rpush(ends_key(ns), row)
        return [pid, current_task().attempt]

    def watch() -> str:
        ctx = current_task()
        if ctx.attempt == 1:
            client.rpush(runs_key(ns), token())
            ctx.wait_cancelled(60.0)
            client.rpush(seen_key(ns), json.dumps([ctx.lease_lost, ctx.cancel_requested, pid]))
        return f"attempt {ctx.attempt}"

    worker = ReportingWorker(
        s, {"record": record, "watch": watch}, concurrency=args.concurrency, grace=args.grace
    )
    print("started", flush=True)
    try:
        worker.run()
    finally:
        s.close()
        client.close()
    print(json.dumps(worker.counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
