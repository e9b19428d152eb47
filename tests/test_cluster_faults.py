"""A Redis Cluster changing under load: failover, slot migration, resharding (§8, §12).

Each test runs a producer thread and two worker processes (the ``distsched worker``
command) against a local cluster, changes the cluster under them, and then checks
what the contract promises: every ``schedule`` that returned ends succeeded (nothing
acknowledged is lost, nothing stuck), no (version, attempt) of a task runs twice and a
version runs again only as a new attempt after a lost lease, and the same worker
processes carry on to the end. Each prints a summary line (run with ``-s``): tasks
lost, stuck, run twice, and how long producers and workers took to recover.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import pytest
import redis

from distsched import Scheduler, State
from distsched.errors import ConflictError
from tests.cluster_fixtures import LocalCluster, Node, namespace_in_slot, wait_until
from tests.conftest import CLI_COMMAND, REPO_ROOT, subprocess_env

pytestmark = pytest.mark.slow

# Longer than the slow migration's window, during which no lease can be extended.
LEASE = "10s"
TASK_MS = 20


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """Three masters with a replica each, for this test alone (it breaks the cluster)."""
    c = LocalCluster(masters=3, replicas=1)
    yield c
    c.close()


@pytest.fixture
def fleets() -> Iterator[list[Fleet]]:
    """The fleets a test starts (it appends them), killed at its end if still running."""
    started: list[Fleet] = []
    yield started
    for fleet in started:
        fleet.kill()


@dataclass(frozen=True)
class Run:
    at: float  # time.monotonic() when the function started (one clock for all processes)
    task_id: str
    version: int
    attempt: int
    pid: int


class Fleet:
    """Worker processes started with the command line, for the whole test."""

    def __init__(self, url: str, namespace: str, tmp: Path, size: int = 2) -> None:
        self.runs_path = tmp / "runs.txt"
        self.runs_path.touch()
        self.logs: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        env = subprocess_env(
            DISTSCHED_REDIS_URL=None,
            DISTSCHED_CLUSTER=None,
            DISTSCHED_TEST_RUNS=str(self.runs_path),
        )
        for i in range(size):
            log_path = tmp / f"worker-{i}.log"
            self.logs.append(log_path)
            log: IO[bytes] = log_path.open("wb")
            self.procs.append(subprocess.Popen(
                [*CLI_COMMAND, "--redis", url, "--namespace", namespace, "worker",
                 "tests.cluster_app:FUNCS", "--concurrency", "4", "--lease", LEASE,
                 "--grace", "5s"],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            log.close()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def log_text(self) -> str:
        return "\n".join(p.read_text("utf-8", "replace") for p in self.logs)

    def runs(self) -> list[Run]:
        out = []
        for line in self.runs_path.read_text("utf-8").splitlines():
            at, task_id, version, attempt, pid = line.split()
            out.append(Run(float(at), task_id, int(version), int(attempt), int(pid)))
        return out

    def kill(self) -> None:
        """End every process still running, whatever the test did."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes


@dataclass
class Producer:
    """Schedules ``t0``, ``t1``, ... one at a time until stopped. A call that fails
    (Redis unavailable) is sent again until it returns: what returned is acknowledged."""

    url: str
    namespace: str
    acked: dict[str, float] = field(default_factory=dict)  # id -> monotonic ack time
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="producer")
        self.thread.start()

    def _run(self) -> None:
        try:
            with Scheduler.from_url(self.url, namespace=self.namespace) as s:
                i = 0
                while not self.stop.is_set():
                    task_id = f"t{i}"
                    # A completion the dying master acknowledged but never passed to its
                    # replica is lost with it (replication is asynchronous): the task's
                    # lease then expires on the new master, and it runs as a new attempt.
                    while True:
                        try:
                            s.schedule(task_id, fn="record", args=[TASK_MS], max_attempts=3)
                            break
                        except redis.ConnectionError:  # Unavailable
                            if self.stop.is_set():
                                return  # not acknowledged
                            self.failures += 1
                            time.sleep(0.05)
                        except ConflictError:
                            break  # the lost reply's schedule was applied: it already runs
                    self.acked[task_id] = time.monotonic()
                    i += 1
                    time.sleep(0.01)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), "the producer hung"
        assert self.error is None, repr(self.error)


@dataclass
class Operator:
    """Reads the namespace as operators do, throughout: ``distsched stats``, ``status``
    and ``leases list`` through the command line, and ``status``, ``stats`` and
    ``overview`` through a scheduler of its own (a command line call is slow to start)."""

    url: str
    namespace: str
    # (started, ended, what, ok, error), times from time.monotonic()
    results: list[tuple[float, float, str, bool, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._cli, name="operator-cli"),
            threading.Thread(target=self._api, name="operator-api"),
        ]
        for thread in self.threads:
            thread.start()

    def _cli(self) -> None:
        env = subprocess_env(DISTSCHED_REDIS_URL=None, DISTSCHED_CLUSTER=None)
        commands = [["stats"], ["status", "t0"], ["leases", "list"]]
        i = 0
        while not self.stop.is_set():
            args = commands[i % len(commands)]
            started = time.monotonic()
            done = subprocess.run(
                [*CLI_COMMAND, "--redis", self.url, "--namespace", self.namespace, *args],
                cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            self.results.append(
                (started, time.monotonic(), "cli " + " ".join(args), done.returncode == 0,
                 done.stderr.strip())
            )  # fmt: skip
            i += 1
            self.stop.wait(0.3)

    def _api(self) -> None:
        with Scheduler.from_url(self.url, namespace=self.namespace) as s:
            reads: list[tuple[str, Callable[[], object]]] = [
                ("status", lambda: s.status("t0")),
                ("stats", s.stats),
                ("overview", s.overview),
            ]
            i = 0
            while not self.stop.is_set():
                what, read = reads[i % len(reads)]
                started = time.monotonic()
                try:
                    read()
                    ok, error = True, ""
                except Exception as exc:
                    ok, error = False, repr(exc)
                self.results.append((started, time.monotonic(), what, ok, error))
                i += 1
                self.stop.wait(0.1)

    def during(self, start: float, end: float) -> list[tuple[float, float, str, bool, str]]:
        return [r for r in self.results if r[0] < end and r[1] > start]

    def failed(self) -> list[tuple[float, float, str, bool, str]]:
        return [r for r in self.results if not r[3]]

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)


@dataclass
class Verdict:
    acknowledged: int
    lost: list[str]
    stuck: list[str]
    run_twice: list[str]  # (version, attempt) run more than once: never allowed
    rerun_after_lease_loss: list[str]  # a version run again as a later attempt
    producer_gap: float  # the longest wait between two acknowledged schedules
    worker_gap: float  # the longest time without any run starting

    def line(self, what: str, **extra: float) -> str:
        more = "".join(f", {k} {v:.2f} s" for k, v in extra.items())
        return (
            f"{what}: {self.acknowledged} acknowledged, {len(self.lost)} lost, "
            f"{len(self.stuck)} stuck, {len(self.run_twice)} run twice, "
            f"{len(self.rerun_after_lease_loss)} rerun after a lost lease, "
            f"producer gap {self.producer_gap:.2f} s, worker gap {self.worker_gap:.2f} s{more}"
        )


def settle_and_judge(
    url: str, namespace: str, producer: Producer, fleet: Fleet, timeout: float = 40
) -> Verdict:
    """Wait (up to ``timeout``) for every acknowledged task to succeed; then judge."""
    acked = dict(producer.acked)
    with Scheduler.from_url(url, namespace=namespace) as s:
        deadline = time.monotonic() + timeout
        states: dict[str, State] = {}
        while True:
            ids = [i for i in acked if states.get(i) is not State.SUCCEEDED]
            for task_id in ids:
                try:
                    states[task_id] = s.status(task_id).state
                except LookupError:
                    states[task_id] = State.CANCELLED  # vanished: counted as lost below
            if all(states[i] is State.SUCCEEDED for i in acked):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        missing = [i for i in acked if states[i] is not State.SUCCEEDED]
        lost = []
        for task_id in missing:
            try:
                s.status(task_id)
            except LookupError:
                lost.append(task_id)
        stuck = [i for i in missing if i not in lost]
        stuck_detail = []
        for task_id in stuck:
            info = s.status(task_id)
            stuck_detail.append(f"{task_id} ({info.state.value}: {info.error})")
    runs = fleet.runs()
    per_token = Counter((r.task_id, r.version, r.attempt) for r in runs)
    run_twice = sorted(f"{t}/v{v}/a{a}" for (t, v, a), n in per_token.items() if n > 1)
    attempts: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r in runs:
        attempts[(r.task_id, r.version)].add(r.attempt)
    rerun = sorted(f"{t}/v{v}" for (t, v), a in attempts.items() if len(a) > 1)
    ack_times = sorted(acked.values())
    run_times = sorted(r.at for r in runs)
    return Verdict(
        acknowledged=len(acked),
        lost=lost,
        stuck=stuck_detail,
        run_twice=run_twice,
        rerun_after_lease_loss=rerun,
        producer_gap=max((b - a for a, b in itertools.pairwise(ack_times)), default=0.0),
        worker_gap=max((b - a for a, b in itertools.pairwise(run_times)), default=0.0),
    )


def first_after(times: list[float], moment: float) -> float:
    later = [t for t in times if t > moment]
    assert later, "nothing happened after the fault"
    return min(later) - moment


def wait_for_runs(fleet: Fleet, count: int, timeout: float) -> None:
    wait_until(lambda: len(fleet.runs()) >= count, timeout, f"{count} runs")


def claims_lost_with_the_master(verdict: Verdict, fleet: Fleet, killed_at: float) -> list[str]:
    """The claims run twice whose first run started before the master was killed and the
    other after: a claim the dead master acknowledged before its replica had it is lost
    (replication is asynchronous), so its task is claimed again, as the same attempt."""
    starts: dict[str, list[float]] = defaultdict(list)
    for r in fleet.runs():
        starts[f"{r.task_id}/v{r.version}/a{r.attempt}"].append(r.at)
    return [
        token
        for token in verdict.run_twice
        if min(starts[token]) < killed_at and sorted(starts[token])[1] > killed_at
    ]


def under_load(
    cluster: LocalCluster, namespace: str, tmp_path: Path, fleets: list[Fleet]
) -> tuple[int, Node, Fleet, Producer]:
    """The namespace's slot, a master that does not own it, and a fleet and a producer
    already running tasks there."""
    slot = cluster.slot_of(namespace)
    source = cluster.owner(slot)
    target = next(m for m in cluster.masters() if m.node_id != source.node_id)
    fleet = Fleet(cluster.url, namespace, tmp_path)
    fleets.append(fleet)
    producer = Producer(cluster.url, namespace)
    return slot, target, fleet, producer


def check(verdict: Verdict, fleet: Fleet, codes: list[int | None]) -> None:
    assert verdict.lost == [], verdict.lost
    assert verdict.stuck == [], verdict.stuck
    assert verdict.run_twice == [], verdict.run_twice
    assert codes == [0] * len(codes), (codes, fleet.log_text()[-4000:])
    assert "Traceback" not in fleet.log_text(), fleet.log_text()[-4000:]


def test_killing_the_namespaces_master_under_load_loses_nothing_acknowledged(
    cluster: LocalCluster, tmp_path: Path, fleets: list[Fleet]
) -> None:
    namespace = "failover"
    owner = cluster.owner(cluster.slot_of(namespace))
    [replica] = cluster.replicas_of(owner)
    fleet = Fleet(cluster.url, namespace, tmp_path)
    fleets.append(fleet)
    producer = Producer(cluster.url, namespace)
    producer.start()
    try:
        wait_for_runs(fleet, 50, 30)
        killed_at = time.monotonic()
        cluster.kill(owner)
        wait_until(lambda: cluster.current_owner(cluster.slot_of(namespace)) is replica, 30,
                   "the replica to take over")  # fmt: skip
        took_over = time.monotonic() - killed_at
        cluster.wait_healthy(30)
        before = len(fleet.runs())
        wait_for_runs(fleet, before + 100, 40)
        assert fleet.alive(), fleet.log_text()[-4000:]
    finally:
        producer.finish()
    verdict = settle_and_judge(cluster.url, namespace, producer, fleet)
    codes = fleet.stop()
    producer_recovery = first_after(sorted(producer.acked.values()), killed_at)
    worker_recovery = first_after([r.at for r in fleet.runs()], killed_at + took_over)
    print(
        "\n" + verdict.line(
            "failover", replica_took_over=took_over, producer_recovered=producer_recovery,
            workers_ran_again_after_takeover=worker_recovery,
        )
    )  # fmt: skip
    lost_claims = claims_lost_with_the_master(verdict, fleet, killed_at)
    # The dead master took at most the writes of its last moments with it.
    assert len(lost_claims) <= 10, lost_claims
    others = [token for token in verdict.run_twice if token not in lost_claims]
    check(replace(verdict, run_twice=others), fleet, codes)


def test_a_slow_slot_migration_under_load_stops_no_worker_and_loses_nothing(
    cluster: LocalCluster, tmp_path: Path, fleets: list[Fleet]
) -> None:
    namespace = "migrating"
    slot, target, fleet, producer = under_load(cluster, namespace, tmp_path, fleets)
    operator = Operator(cluster.url, namespace)
    producer.start()
    try:
        wait_for_runs(fleet, 50, 30)
        operator.start()
        started = time.monotonic()
        # Seconds of MIGRATING window, kept well under the lease however many keys the
        # namespace holds by then (one moves per pause): a window longer than the lease
        # lets leases lapse, and a lapsed lease may run a task again, as promised.
        moved = cluster.migrate_slot_slowly(slot, target, pause=0.6, window=6.0)
        window = time.monotonic() - started
        assert cluster.owner(slot) is target
        before = len(fleet.runs())
        wait_for_runs(fleet, before + 100, 40)
        assert fleet.alive(), fleet.log_text()[-4000:]
    finally:
        try:
            producer.finish()
        finally:
            operator.finish()
    verdict = settle_and_judge(cluster.url, namespace, producer, fleet)
    codes = fleet.stop()
    during = operator.during(started, started + window)
    failed = operator.failed()
    print(
        "\n" + verdict.line("slow migration", migrating_window=window)
        + f", {moved} keys moved, {len(during)} operator reads during the window"
        + f" ({sum(r[2].startswith('cli') for r in during)} CLI), {len(failed)} failed,"
        + f" slowest read {max((r[1] - r[0] for r in during), default=0.0):.2f} s"
    )  # fmt: skip
    check(verdict, fleet, codes)
    assert any(r[2].startswith("cli") for r in during), "no CLI read ran during the migration"
    assert any(not r[2].startswith("cli") for r in during), "no read ran during the migration"
    assert failed == [], failed


def test_an_atomic_slot_migration_under_load_loses_nothing_and_barely_pauses_anyone(
    cluster: LocalCluster, tmp_path: Path, fleets: list[Fleet]
) -> None:
    if not cluster.supports_atomic_migration():
        pytest.skip("the server has no CLUSTER MIGRATESLOTS (Valkey 9): CI runs it on Valkey")
    namespace = "atomic"
    slot, target, fleet, producer = under_load(cluster, namespace, tmp_path, fleets)
    producer.start()
    try:
        wait_for_runs(fleet, 50, 30)
        started = time.monotonic()
        cluster.migrate_slot_atomically(slot, target)
        moved_in = time.monotonic() - started
        before = len(fleet.runs())
        wait_for_runs(fleet, before + 100, 40)
        assert fleet.alive(), fleet.log_text()[-4000:]
    finally:
        producer.finish()
    verdict = settle_and_judge(cluster.url, namespace, producer, fleet)
    codes = fleet.stop()
    print("\n" + verdict.line("atomic migration", moved_in=moved_in))
    check(verdict, fleet, codes)
    # No window of refused calls: nobody waits anywhere near a legacy migration's seconds.
    assert verdict.producer_gap < 2.0 and verdict.worker_gap < 2.0, verdict


def test_resharding_the_namespaces_slot_under_load_with_the_cli_throughout(
    cluster: LocalCluster, tmp_path: Path, fleets: list[Fleet]
) -> None:
    # redis-cli reshard moves the lowest slots of a master: a namespace in the first one.
    source = cluster.masters()[0]
    namespace = namespace_in_slot(cluster.first_slot(source), "reshard")
    slot, target, fleet, producer = under_load(cluster, namespace, tmp_path, fleets)
    operator = Operator(cluster.url, namespace)
    producer.start()
    try:
        wait_for_runs(fleet, 50, 30)
        operator.start()
        time.sleep(2)  # the command line's reads under load, before the reshard
        started = time.monotonic()
        cluster.reshard(slot, target)
        took = time.monotonic() - started
        assert cluster.owner(slot) is target
        before = len(fleet.runs())
        wait_for_runs(fleet, before + 100, 40)
        assert fleet.alive(), fleet.log_text()[-4000:]
    finally:
        try:
            producer.finish()
        finally:
            operator.finish()
    verdict = settle_and_judge(cluster.url, namespace, producer, fleet)
    codes = fleet.stop()
    failed = operator.failed()
    print(
        "\n" + verdict.line("reshard", reshard_took=took)
        + f", {len(operator.results)} operator reads"
        + f" ({len(operator.during(started, started + took))} while it ran), {len(failed)} failed"
    )  # fmt: skip
    check(verdict, fleet, codes)
    assert failed == [], failed
