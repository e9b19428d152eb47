"""The worker registry: every live worker is listed by ``Scheduler.workers()`` and
``distsched workers``; a clean stop removes it at once, a killed one drops out by
housekeeping once it has been silent for a few leases."""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

import distsched
import distsched.model
import distsched.wire.records
from distsched import Scheduler, Worker
from distsched.model import WORKER_ALIVE_BEATS, WORKER_DROP_LEASES
from distsched.ops.protocol import Commands, Request
from distsched.wire.calls import Call
from distsched.worker.link import WorkerLink
from tests.conftest import CLI_COMMAND, CliProcess, RedisServer, running
from tests.test_cli import invoke
from tests.test_worker import wait_state, wait_until

LEASE_S = 1.2


class WorkerProcess(CliProcess):
    """``distsched worker APP`` in its own process, stderr in a file."""

    def __init__(
        self, server: RedisServer, namespace: str, tmp: Path, worker_id: str, app: str,
        concurrency: int,
    ) -> None:  # fmt: skip
        self.worker_id = worker_id
        super().__init__(
            tmp / f"{worker_id}.err",
            [*CLI_COMMAND, "--redis", server.url, "--namespace", namespace, "worker", app,
             "--worker-id", worker_id, "--concurrency", str(concurrency),
             "--lease", str(LEASE_S), "--grace", "1"],
        )  # fmt: skip


@pytest.fixture
def slow_lease(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    yield s
    s.clear()


@pytest.fixture
def fleet(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> Iterator[dict[str, WorkerProcess]]:
    """Two worker processes serving different functions: ``adder`` and ``napper``."""
    procs = {
        "adder": WorkerProcess(
            redis_server, namespace, tmp_path, "adder", "tests.cli_app:FUNCS", 2
        ),
        "napper": WorkerProcess(
            redis_server, namespace, tmp_path, "napper", "tests.worker_app:FUNCS", 3
        ),
    }
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.close()


def listed(s: Scheduler) -> dict[str, distsched.model.WorkerInfo]:
    return {info.worker_id: info for info in s.workers()}


def test_two_running_workers_are_listed_with_their_functions_and_counts(
    slow_lease: Scheduler, fleet: dict[str, WorkerProcess]
) -> None:
    s = slow_lease
    wait_until(lambda: set(listed(s)) == {"adder", "napper"}, 20, "both workers to register")
    for i in range(3):
        s.schedule(f"sum-{i}", fn="add", args=[i, 1])
    for i in range(3):
        wait_state(s, f"sum-{i}", distsched.State.SUCCEEDED)
    # The counts travel with the next heartbeat round.
    wait_until(lambda: listed(s)["adder"].counts.get("succeeded") == 3, 10, "the adder's counts")
    now = s.server_time()
    workers = listed(s)
    adder, napper = workers["adder"], workers["napper"]
    assert adder.functions == ("add", "whoami")
    assert napper.functions == ("nap",)
    assert (adder.concurrency, napper.concurrency) == (2, 3)
    assert (adder.pid, napper.pid) == (fleet["adder"].proc.pid, fleet["napper"].proc.pid)
    assert adder.host == napper.host == socket.gethostname()
    assert adder.version == napper.version == distsched.__version__
    assert adder.counts["claimed"] == 3 and adder.counts["failed"] == 0
    assert napper.counts.get("succeeded", 0) == 0
    assert adder.running == napper.running == 0
    for info in (adder, napper):
        assert info.alive
        assert info.lease_s == LEASE_S and info.heartbeat_s == pytest.approx(LEASE_S / 3)
        assert info.started <= info.last_heartbeat <= now
        assert info.seen_ago <= WORKER_ALIVE_BEATS * info.heartbeat_s


def test_a_running_function_is_counted_in_its_workers_entry(
    slow_lease: Scheduler, fleet: dict[str, WorkerProcess]
) -> None:
    s = slow_lease
    wait_until(lambda: set(listed(s)) == {"adder", "napper"}, 20, "both workers to register")
    s.schedule("long-nap", fn="nap", args=[30])
    wait_until(lambda: listed(s)["napper"].running == 1, 10, "the napper to report 1 running")
    assert listed(s)["adder"].running == 0


def test_a_cleanly_stopped_worker_leaves_the_registry_at_once(
    slow_lease: Scheduler, fleet: dict[str, WorkerProcess]
) -> None:
    s = slow_lease
    wait_until(lambda: set(listed(s)) == {"adder", "napper"}, 20, "both workers to register")
    napper = fleet["napper"].proc
    napper.send_signal(signal.SIGTERM)
    assert napper.wait(15) == 0, fleet["napper"].stderr()
    assert not s.client.hexists(s.keys.workers, "napper")
    assert set(listed(s)) == {"adder"}


def test_a_killed_worker_drops_out_by_housekeeping_once_silent_for_a_few_leases(
    slow_lease: Scheduler, fleet: dict[str, WorkerProcess]
) -> None:
    s = slow_lease
    wait_until(lambda: set(listed(s)) == {"adder", "napper"}, 20, "both workers to register")
    napper = fleet["napper"].proc
    napper.send_signal(signal.SIGKILL)
    napper.wait(10)
    # Nothing removes the entry of a killed worker at once: it is listed, then silent.
    assert "napper" in listed(s)
    wait_until(lambda: not listed(s)["napper"].alive, 10, "the killed worker to show as silent")
    silent = listed(s)["napper"]
    assert silent.seen_ago > WORKER_ALIVE_BEATS * silent.heartbeat_s
    assert silent.seen_ago <= WORKER_DROP_LEASES * LEASE_S
    # The live worker's housekeeping removes the entry itself (not just hides it).
    wait_until(
        lambda: not s.client.hexists(s.keys.workers, "napper"),
        WORKER_DROP_LEASES * LEASE_S + 10,
        "the killed worker's entry to be dropped",
    )
    assert set(listed(s)) == {"adder"}
    assert listed(s)["adder"].alive


def test_workers_hides_an_entry_past_its_drop_time_before_housekeeping_removes_it(
    slow_lease: Scheduler,
) -> None:
    s = slow_lease
    entry = distsched.model.WorkerInfo(
        "ghost", "h", 1, "0", 1, ("f",), 0.0, 0.0, 0, {}, heartbeat_s=0.1, lease_s=0.3
    )
    written = WorkerLink(s).register_worker(entry)
    assert [w.worker_id for w in s.workers()] == ["ghost"]
    # Back-date the heartbeat past 3 leases, as if the worker was killed long ago.
    old = distsched.model.WorkerInfo(
        "ghost", "h", 1, "0", 1, ("f",), written.started - 5, written.last_heartbeat - 5, 0,
        {}, heartbeat_s=0.1, lease_s=0.3,
    )  # fmt: skip
    s.client.hset(s.keys.workers, "ghost", distsched.wire.records.encode_worker(old))
    # The last claim it kept (for a re-send that will never come) goes with it.
    s.client.hset(s.keys.claims, mapping={"ghost": b"r1\n", "alive": b"r2\n"})
    assert s.workers() == []
    assert s.client.hexists(s.keys.workers, "ghost")
    assert WorkerLink(s).prune_workers() == 1
    assert not s.client.exists(s.keys.workers)
    assert s.client.hkeys(s.keys.claims) == [b"alive"]


def test_an_unreadable_registry_entry_is_skipped_and_pruned(
    api: Scheduler, redis_client: redis.Redis
) -> None:
    entry = distsched.model.WorkerInfo(
        "w1", "h", 7, "1.0", 4, ("a", "b"), 0.0, 0.0, 1, {"claimed": 2}, heartbeat_s=1.0,
        lease_s=3.0,
    )  # fmt: skip
    # The registry's writes are the bundled worker's, through the sync scheduler.
    link = WorkerLink(Scheduler(redis_client, namespace=api.namespace))
    link.register_worker(entry)
    redis_client.hset(api.keys.workers, "junk", b"\xc1 not msgpack")
    redis_client.hset(api.keys.workers, "partial", msgpack.packb({"host": "h"}))
    (only,) = api.workers()
    assert (only.worker_id, only.pid, only.functions, only.counts) == (
        "w1", 7, ("a", "b"), {"claimed": 2},
    )  # fmt: skip
    assert only.alive and only.started == only.last_heartbeat
    assert link.prune_workers() == 2
    assert set(redis_client.hkeys(api.keys.workers)) == {b"w1"}
    assert link.unregister_worker("w1") is True
    assert link.unregister_worker("w1") is False
    assert not redis_client.exists(api.keys.workers)


def test_deleting_the_namespace_deletes_the_worker_registry(slow_lease: Scheduler) -> None:
    s = slow_lease
    assert s.keys.workers in s.keys.all_keys()
    with running(Worker(s, {"f": lambda: None}, worker_id="solo")):
        wait_until(lambda: [w.worker_id for w in s.workers()] == ["solo"], 10, "registration")
        s.clear()
        assert not s.client.exists(s.keys.workers)


def test_the_workers_command_prints_a_table_and_json(
    redis_server: RedisServer, slow_lease: Scheduler, namespace: str
) -> None:
    s = slow_lease
    first = Worker(s, {"add": lambda a, b: a + b}, concurrency=2, worker_id="w-one")
    second = Worker(s, {"nap": lambda: None, "zip": lambda: None}, worker_id="w-<two>")
    with running(first), running(second):
        s.schedule("t", fn="add", args=[1, 2])
        wait_state(s, "t", distsched.State.SUCCEEDED)
        wait_until(lambda: listed(s)["w-one"].counts.get("succeeded") == 1, 10, "w-one's counts")
        table = invoke(redis_server, namespace, "workers")
        raw = invoke(redis_server, namespace, "workers", "--json")
    assert table.exit_code == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:6] == ["worker", "host", "pid", "version", "running", "state"]
    assert [row.split()[0] for row in rows] == ["w-<two>", "w-one"]
    one = next(row for row in rows if row.startswith("w-one"))
    assert "0/2" in one and "alive" in one and "add" in one and "succeeded 1" in one
    assert "nap, zip" in rows[0]
    assert raw.exit_code == 0, raw.stderr
    data = json.loads(raw.stdout)
    assert [w["worker_id"] for w in data] == ["w-<two>", "w-one"]
    assert data[1]["functions"] == ["add"] and data[1]["concurrency"] == 2
    assert data[1]["counts"]["succeeded"] == 1 and data[1]["alive"] is True
    # Once stopped cleanly, they are gone.
    assert invoke(redis_server, namespace, "workers", "--json").stdout.strip() in ("[]",)


class RecordingScheduler(Scheduler):
    """Records the script names and plain commands sent, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[Any, ...]] = []
        self.sent_lock = threading.Lock()

    def _request(self, request: Request) -> Any:
        with self.sent_lock:
            if isinstance(request, Call):
                self.sent.append(("script", request.script))
            elif isinstance(request, Commands):
                self.sent.extend(request.commands)
        return super()._request(request)


def test_a_worker_writes_its_entry_once_per_heartbeat_round_and_never_after_stopping(
    redis_client: redis.Redis, namespace: str
) -> None:
    s = RecordingScheduler(redis_client, namespace=namespace, lease_s=LEASE_S)
    try:
        worker = Worker(s, {"f": lambda: None}, worker_id="counted", heartbeat_s=0.05)
        with running(worker):
            # Each round reaps once (housekeeping) before it writes the entry.
            wait_until(lambda: s.sent.count(("script", "reap")) >= 10, 20, "ten rounds")
        with s.sent_lock:
            sent = list(s.sent)
        rounds = sent.count(("script", "reap"))
        writes = [c for c in sent if c[:3] == ("HSET", s.keys.workers, "counted")]
        removals = [i for i, c in enumerate(sent) if c[:2] == ("HDEL", s.keys.workers)]
        # One at start, then one per round (the last round may have been cut short).
        assert rounds <= len(writes) <= rounds + 1
        assert len(removals) == 1
        assert all(c[:2] != ("HSET", s.keys.workers) for c in sent[removals[0] :])
        assert not redis_client.exists(s.keys.workers)
    finally:
        s.clear()
