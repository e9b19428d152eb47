"""The command line and the operator reads on a Redis Cluster (§9, §11)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result

from distsched import Claim, Outcome, Scheduler, State
from distsched.cli import cli
from distsched.cli.common import cluster_url
from distsched.errors import InvalidArgument
from tests.cluster_fixtures import LocalCluster, Node
from tests.conftest import CLI_COMMAND, REPO_ROOT, subprocess_env
from tests.test_cli import _runner, assert_one_line_error
from tests.test_tls import OPENSSL, make_certificates, unavailable

NAMESPACE = "cli-cluster"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(masters=3)
    yield c
    c.close()


@pytest.fixture
def scheduler(cluster: LocalCluster) -> Iterator[Scheduler]:
    with Scheduler.from_url(cluster.url, namespace=NAMESPACE) as s:
        yield s
        s.clear()


def not_owner(cluster: LocalCluster, namespace: str) -> Node:
    owner = cluster.owner(cluster.slot_of(namespace))
    return next(n for n in cluster.masters() if n.node_id != owner.node_id)


def run(*args: str) -> Result:
    return _runner().invoke(
        cli, list(args), catch_exceptions=False,
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None, "DISTSCHED_CLUSTER": None},
    )  # fmt: skip


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


@pytest.mark.parametrize("how", ["redis+cluster URL", "--cluster flag"])
def test_every_command_reaches_the_cluster_through_a_node_that_does_not_own_the_namespace(
    cluster: LocalCluster, scheduler: Scheduler, how: str
) -> None:
    node = not_owner(cluster, NAMESPACE)
    if how == "--cluster flag":
        connect = ["--redis", f"redis://{node.address}", "--cluster"]
    else:
        connect = ["--redis", f"redis+cluster://{node.address}"]
    base = [*connect, "--namespace", NAMESPACE]
    assert ok(run(*base, "schedule", "a", "--fn", "add", "--args", "[1, 2]")).strip() == "1"
    ok(run(*base, "schedule", "later", "--fn", "add", "--delay", "1h"))
    assert "state:" in ok(run(*base, "status", "a")) and "ready" in ok(run(*base, "status", "a"))
    assert ok(run(*base, "cancel", "later")).strip() == "cancelled"
    claim = scheduler.next("w")
    assert isinstance(claim, Claim) and claim.task_id == "a"
    listed = ok(run(*base, "leases", "list"))
    assert "a" in listed.split() and "w" in listed.split()
    stats = ok(run(*base, "stats"))
    assert "running" in stats and "cancelled" in stats
    assert "1" in ok(run(*base, "leases", "expire", "a"))
    assert scheduler.status("a").state is State.FAILED
    assert scheduler.status("later").state is State.CANCELLED


def test_a_plain_url_to_a_cluster_node_is_a_one_line_error_naming_the_cluster_url(
    cluster: LocalCluster, scheduler: Scheduler
) -> None:
    node = not_owner(cluster, NAMESPACE)
    url = f"redis://{node.address}"
    for args in (["schedule", "x", "--fn", "f"], ["status", "x"], ["stats"], ["leases", "list"]):
        result = run("--redis", url, "--namespace", NAMESPACE, *args)
        assert_one_line_error(result, f"redis+cluster://{node.address}", "--cluster")
    # Also through the owner: which node owns the namespace changes with resharding.
    owner = cluster.owner(cluster.slot_of(NAMESPACE))
    result = run("--redis", f"redis://{owner.address}", "--namespace", NAMESPACE, "stats")
    assert_one_line_error(result, "redis+cluster://", "--cluster")
    assert not scheduler.exists()


def test_a_user_and_password_in_a_cluster_url_reach_every_node(
    cluster: LocalCluster, scheduler: Scheduler
) -> None:
    for node in cluster.nodes:
        with node.admin() as admin:
            admin.execute_command(
                "ACL", "SETUSER", "app", "reset", "on", ">s3cret", "~ds:*", "&ds:*", "+@all"
            )
    try:
        node = not_owner(cluster, NAMESPACE)
        good = f"redis+cluster://app:s3cret@{node.address}"
        ok(run("--redis", good, "--namespace", NAMESPACE, "schedule", "acl", "--fn", "f"))
        assert scheduler.status("acl").state is State.READY
        bad = f"redis://app:wrong@{node.address}"
        result = run("--redis", bad, "--cluster", "--namespace", NAMESPACE, "stats")
        line = assert_one_line_error(result)
        assert "wrong" not in line
    finally:
        for node in cluster.nodes:
            with node.admin() as admin:
                admin.execute_command("ACL", "DELUSER", "app")


def test_cluster_turns_a_plain_url_into_a_cluster_url_and_refuses_a_socket() -> None:
    assert cluster_url("redis://u:p@h:7000/0") == "redis+cluster://u:p@h:7000/0"
    assert cluster_url("rediss://h:7000?ssl_cert_reqs=none") == (
        "rediss+cluster://h:7000?ssl_cert_reqs=none"
    )
    assert cluster_url("rediss+cluster://h:7000") == "rediss+cluster://h:7000"
    with pytest.raises(InvalidArgument, match="--cluster"):
        cluster_url("unix:///tmp/redis.sock")
    result = run("--redis", "unix:///tmp/redis.sock", "--cluster", "stats")
    assert_one_line_error(result, "--redis", "--cluster")


def test_the_worker_command_runs_tasks_on_a_cluster_and_stops_on_sigterm(
    cluster: LocalCluster, scheduler: Scheduler
) -> None:
    for i in range(4):
        scheduler.schedule(f"add-{i}", fn="add", args=[i, 10])
    node = not_owner(cluster, NAMESPACE)
    proc = subprocess.Popen(
        [*CLI_COMMAND, "--redis", f"redis://{node.address}", "--cluster",
         "--namespace", NAMESPACE, "worker", "tests.cli_app:FUNCS", "--concurrency", "2",
         "--lease", "5s", "--grace", "2s"],
        cwd=REPO_ROOT, env=subprocess_env(DISTSCHED_REDIS_URL=None, DISTSCHED_CLUSTER=None),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        ids = [f"add-{i}" for i in range(4)]
        while not all(scheduler.status(t).state is State.SUCCEEDED for t in ids):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not run the tasks"
            time.sleep(0.05)
        # A task scheduled while it waits on an empty queue runs too (the wake-up works).
        scheduler.schedule("late", fn="add", args=[1, 1])
        while scheduler.status("late").state is not State.SUCCEEDED:
            assert time.monotonic() < deadline + 10, "the late task did not run"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert [scheduler.status(f"add-{i}").result for i in range(4)] == [10, 11, 12, 13]
    assert "Traceback" not in err
    assert scheduler.stats()["leases"] == 0


def test_server_time_reads_the_clock_of_the_master_that_owns_the_namespace(
    cluster: LocalCluster, scheduler: Scheduler
) -> None:
    owner = cluster.owner(cluster.slot_of(NAMESPACE))
    for node in cluster.nodes:
        with node.admin() as admin:
            admin.config_resetstat()
    for _ in range(10):
        assert abs(scheduler.server_time() - time.time()) < 5
    calls = {}
    for node in cluster.nodes:
        with node.admin() as admin:
            stats = admin.info("commandstats")
        calls[node.address] = {
            name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "time")
        }
    assert calls.pop(owner.address)["eval"] == 10
    assert all(c == {"eval": 0, "time": 0} for c in calls.values()), calls


def test_a_tls_cluster_is_reached_with_a_rediss_cluster_url_or_rediss_and_the_flag(
    tmp_path: Path,
) -> None:
    if OPENSSL is None:
        unavailable("openssl is not on PATH")
    make_certificates(tmp_path)
    try:
        tls = LocalCluster(masters=3, tls=tmp_path)
    except subprocess.CalledProcessError as exc:
        unavailable(f"redis-cli could not create a TLS cluster: {exc.stderr.strip()[-300:]}")
    try:
        ca = tmp_path / "ca.crt"
        node = not_owner(tls, NAMESPACE)
        flagged = ["--redis", f"rediss://{node.address}?ssl_ca_certs={ca}", "--cluster"]
        ok(run(*flagged, "--namespace", NAMESPACE, "schedule", "t", "--fn", "f"))
        assert "ready" in ok(run("--redis", tls.url, "--namespace", NAMESPACE, "status", "t"))
        with Scheduler.from_url(tls.url, namespace=NAMESPACE) as s:
            claim = s.next("w")
            assert isinstance(claim, Claim) and claim.task_id == "t"
            assert s.complete(claim) is Outcome.APPLIED
            assert abs(s.server_time() - time.time()) < 5
        assert "succeeded" in ok(run(*flagged, "--namespace", NAMESPACE, "status", "t"))
    finally:
        tls.close()
