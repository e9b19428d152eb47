"""Local Redis Clusters for the tests: real ``redis-server --cluster-enabled`` processes.

:class:`LocalCluster` starts masters (and replicas) on free ports, joins them with
``redis-cli --cluster create``, and offers what the fault tests do to a cluster:
kill the master of a namespace, move a slot slowly by hand, reshard with
``redis-cli``. Nodes use a short ``cluster-node-timeout`` so that a failover takes
seconds, not the default 15.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.cluster import ClusterNode
from redis.crc import key_slot

from distsched.keys import Keys
from tests.conftest import IN_CI, RedisServer, free_port, skip_valkey_without_tls

# Milliseconds without an answer before a node is considered failed.
NODE_TIMEOUT_MS = 1000

# What redis-cli says when its own check of the cluster, run before it changes anything,
# found a problem: the nodes do not agree yet on who serves which slot (gossip still under
# way) or a slot is still open. It changed nothing, and may run again once they agree.
REFUSED_BEFORE_STARTING = "Please fix your cluster problems"


# The client that creates and reshards the clusters: redis-cli on PATH unless
# DISTSCHED_TEST_CLI names another (valkey-cli, or redis-cli against Valkey nodes).
CLI_CHOICE = os.environ.get("DISTSCHED_TEST_CLI") or "redis-cli"


def require_redis_cli() -> str:
    cli = shutil.which(CLI_CHOICE)
    if cli is None:
        if IN_CI:
            pytest.fail(f"{CLI_CHOICE} is not found, and CI=true requires it for cluster tests")
        pytest.skip(f"{CLI_CHOICE} is not found (it creates the test clusters)")
    return cli


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Node:
    server: RedisServer
    node_id: str = ""
    tls_port: int | None = None  # clients and the cluster bus use TLS; ``port`` stays plain

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        """Where clients reach it (the TLS port in a TLS cluster)."""
        return f"127.0.0.1:{self.tls_port or self.port}"

    def admin(self) -> redis.Redis:
        """A plain connection to this node alone (no redirections followed)."""
        return self.server.client(socket_timeout=5, decode_responses=True)

    @property
    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, all on 127.0.0.1.

    With ``tls`` (a folder holding ``ca.crt``, ``server.crt`` and ``server.key``) clients
    and the cluster bus speak TLS; each node keeps a plain port for the tests' own
    administration.
    """

    def __init__(self, masters: int = 3, replicas: int = 0, tls: Path | None = None) -> None:
        self.cli = require_redis_cli()
        if tls is not None:
            skip_valkey_without_tls()
        self.tls = tls
        self.nodes: list[Node] = []
        try:
            for _ in range(masters * (1 + replicas)):
                tls_port = cluster_port() if tls is not None else None
                tls_args = [] if tls is None else [
                    "--tls-port", str(tls_port), "--tls-cluster", "yes",
                    "--tls-replication", "yes", "--tls-auth-clients", "no",
                    "--tls-cert-file", str(tls / "server.crt"),
                    "--tls-key-file", str(tls / "server.key"),
                    "--tls-ca-cert-file", str(tls / "ca.crt"),
                ]  # fmt: skip
                server = RedisServer(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                    # A replica takes over however long it was cut off from its master.
                    "--cluster-replica-validity-factor", "0",
                    # Replicas in sync at once, not after the default 5 s of waiting.
                    "--repl-diskless-sync-delay", "0",
                    *tls_args,
                    pick_port=free_port if tls is not None else cluster_port,
                )  # fmt: skip
                self.nodes.append(Node(server, tls_port=tls_port))
            self.redis_cli(
                "--cluster", "create", *(n.address for n in self.nodes),
                "--cluster-replicas", str(replicas), "--cluster-yes",
            )  # fmt: skip
            for node in self.nodes:
                with node.admin() as admin:
                    node.node_id = str(admin.execute_command("CLUSTER", "MYID"))
            self.wait_healthy(30)
            self.wait_agreed(30)
            wait_until(lambda: len(self.masters()) == masters, 30, "the replicas to attach")
            wait_until(self.replicas_in_sync, 30, "the replicas to be in sync")
        except BaseException:
            self.close()
            raise

    # -- plumbing

    def run_cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        tls = [] if self.tls is None else ["--tls", "--cacert", str(self.tls / "ca.crt")]
        return subprocess.run(
            [self.cli, *tls, *args], capture_output=True, text=True, timeout=timeout
        )

    def redis_cli(self, *args: str, timeout: float = 120) -> str:
        """Run redis-cli; its output, or an error that shows what it said."""
        done = self.run_cli(*args, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(
                f"{self.cli} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    @property
    def seed(self) -> Node:
        return next(n for n in self.nodes if n.alive)

    @property
    def url(self) -> str:
        """``redis+cluster://`` (``rediss+cluster://``) through one live node."""
        if self.tls is not None:
            return f"rediss+cluster://{self.seed.address}?ssl_ca_certs={self.tls / 'ca.crt'}"
        return f"redis+cluster://{self.seed.address}"

    def close(self) -> None:
        for node in self.nodes:
            node.server.close()

    # -- reading the topology

    def slot_of(self, namespace: str) -> int:
        return int(key_slot(Keys(namespace).meta.encode()))

    def by_id(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def owner(self, slot: int) -> Node:
        """The master serving ``slot`` now, asked of that node itself."""
        node = self.current_owner(slot)
        if node is None:
            raise AssertionError(f"no live master owns slot {slot}")
        return node

    def current_owner(self, slot: int) -> Node | None:
        """The live master that says it serves ``slot``, or None (a failover under way)."""
        for node in self.nodes:
            if any(start <= slot <= end for start, end in self._own_slots(node)):
                return node
        return None

    @staticmethod
    def _own_slots(node: Node) -> list[tuple[int, int]]:
        """The slot ranges ``node`` says it serves as a live master (none otherwise)."""
        if not node.alive:
            return []
        with node.admin() as admin:
            try:
                if admin.execute_command("ROLE")[0] != "master":
                    return []
                shards = admin.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                return []
        return [(start, end) for start, end, master, *_ in shards if int(master[1]) == node.port]

    def replicas_of(self, master: Node) -> list[Node]:
        """The live nodes that say themselves they replicate ``master``."""
        found = []
        for node in self.nodes:
            if not node.alive:
                continue
            with node.admin() as admin:
                try:
                    role = admin.execute_command("ROLE")
                except redis.RedisError:
                    continue
            if role[0] == "slave" and int(role[2]) == master.port:
                found.append(node)
        return found

    def masters(self) -> list[Node]:
        """The live nodes that say themselves they are masters serving slots (another node's
        view of the flags can lag behind a replica's attachment)."""
        return [node for node in self.nodes if self._own_slots(node)]

    def healthy(self) -> bool:
        """Every live node says the cluster is ok and agrees on who masters each slot."""
        try:
            views = []
            for node in self.nodes:
                if not node.alive:
                    continue
                with node.admin() as admin:
                    if admin.cluster("info")["cluster_state"] != "ok":
                        return False
                    views.append(sorted(
                        (s[0], s[1], s[2][1]) for s in admin.execute_command("CLUSTER", "SLOTS")
                    ))  # fmt: skip
            return all(v == views[0] for v in views)
        except redis.RedisError:
            return False

    def replicas_in_sync(self) -> bool:
        for node in self.nodes:
            with node.admin() as admin:
                info = admin.info("replication")
            if info["role"] == "slave" and (
                info.get("master_link_status") != "up" or info.get("master_sync_in_progress")
            ):
                return False
        return True

    def wait_healthy(self, timeout: float) -> None:
        wait_until(self.healthy, timeout, "the cluster to be healthy")

    def agreed(self) -> bool:
        """``redis-cli --cluster check`` passes: every node agrees on the slots, none is
        open, all are covered (what redis-cli checks before it changes the cluster)."""
        done = self.run_cli("--cluster", "check", self.seed.address, timeout=60)
        said = done.stdout + done.stderr
        return done.returncode == 0 and "[ERR]" not in said and "[WARNING]" not in said

    def wait_agreed(self, timeout: float) -> None:
        wait_until(self.agreed, timeout, "redis-cli --cluster check to pass")

    # -- faults

    def kill(self, node: Node) -> None:
        """``kill -9``: no goodbye to the clients nor to the other nodes."""
        node.server.kill()

    def migrate_slot_slowly(
        self,
        slot: int,
        target: Node,
        pause: float,
        progress: Callable[[int], None] | None = None,
        window: float | None = None,
    ) -> int:
        """Move ``slot`` to ``target`` by hand with a long MIGRATING window: one key at a
        time with ``pause`` seconds between, then ``CLUSTER SETSLOT NODE`` everywhere.
        With ``window``, the pause shrinks so that the keys the slot holds at the start
        move within about ``window`` seconds. Returns how many keys moved."""
        source = self.owner(slot)
        assert source.node_id != target.node_id
        with target.admin() as dst, source.admin() as src:
            if window is not None:
                held = int(src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
                pause = min(pause, window / max(held, 1))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            moved = 0
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1)
                if not keys:
                    break
                time.sleep(pause)
                src.execute_command(
                    "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", keys[0]
                )
                moved += 1
                if progress is not None:
                    progress(moved)
            # The new owner first, then the old one, then the other masters (as redis-cli
            # does); replicas learn it from them.
            for node in [target, source, *self.nodes]:
                if not node.alive:
                    continue
                with node.admin() as admin:
                    if admin.execute_command("ROLE")[0] == "master":
                        admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        return moved

    def supports_atomic_migration(self) -> bool:
        """Whether the nodes know Valkey 9's ``CLUSTER MIGRATESLOTS``."""
        with self.seed.admin() as admin:
            info = admin.info("server")
        version = str(info.get("valkey_version", "0")).split(".")[0]
        return info.get("server_name") == "valkey" and int(version) >= 9

    def migrate_slot_atomically(self, slot: int, target: Node, timeout: float = 60) -> None:
        """Move ``slot`` to ``target`` with ``CLUSTER MIGRATESLOTS`` (Valkey 9): the
        source streams the slot and hands it over at once; wait until ``target`` says it
        serves the slot and every live master agrees."""
        source = self.owner(slot)
        assert source.node_id != target.node_id
        with source.admin() as src:
            src.execute_command(
                "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", target.node_id
            )
        wait_until(lambda: self.current_owner(slot) is target, timeout, "the atomic migration")
        self.wait_agreed(timeout)

    def reshard(self, slot: int, target: Node) -> None:
        """Move ``slot`` with ``redis-cli --cluster reshard``, which moves the lowest
        slots of the source: ``slot`` must be the first of its owner's (see
        :func:`namespace_in_slot` and :meth:`first_slot`)."""
        source = self.owner(slot)
        assert self.first_slot(source) == slot
        args = (
            "--cluster", "reshard", self.seed.address,
            "--cluster-from", source.node_id, "--cluster-to", target.node_id,
            "--cluster-slots", "1", "--cluster-yes", "--cluster-pipeline", "1",
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            self.wait_agreed(60)
            done = self.run_cli(*args)
            said = done.stdout + done.stderr
            if done.returncode == 0:
                break
            # Only a refusal before it started is sent again: a reshard that failed
            # later may have moved the slot, and a second one would move another.
            if REFUSED_BEFORE_STARTING not in said or time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.cli} {' '.join(args)} exited {done.returncode}:\n{said}"
                )
        self.wait_agreed(60)

    def first_slot(self, master: Node) -> int:
        with master.admin() as admin:
            shards = admin.execute_command("CLUSTER", "SLOTS")
        return min(int(s[0]) for s in shards if int(s[2][1]) == master.port)


def close_cluster_client(client: redis.RedisCluster) -> None:
    """Close ``client`` with its nodes' connections (RedisCluster.close() leaves them open)."""
    nodes: list[ClusterNode] = cast(Any, client).get_nodes()  # redis-py leaves it untyped
    for node in nodes:
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()
    client.close()


def namespace_in_slot(slot: int, prefix: str = "ns") -> str:
    """A namespace whose keys hash to ``slot``."""
    for i in range(1_000_000):
        name = f"{prefix}{i}"
        if key_slot(Keys(name).meta.encode()) == slot:
            return name
    raise AssertionError(f"no namespace found for slot {slot}")


def local_cluster(masters: int, replicas: int) -> Iterator[LocalCluster]:
    cluster = LocalCluster(masters, replicas)
    try:
        yield cluster
    finally:
        cluster.close()
