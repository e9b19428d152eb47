"""Stripes placed on purpose: a striped namespace on a cluster spans distinct masters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from redis.cluster import RedisCluster
from redis.crc import key_slot

from distsched import InvalidArgument, Scheduler, State, TaskSpec, Worker
from distsched.cli import cli
from distsched.client import slot_owner
from distsched.errors import ConflictError
from distsched.keys import Keys
from distsched.placement import (
    SALTS_FIELD,
    choose_salts,
    decode_salts,
    masters_spanned,
    slot_of,
)
from distsched.worker.link import WorkerLink
from tests.cluster_fixtures import LocalCluster, close_cluster_client
from tests.conftest import RedisServer

NAMES = [f"clicks{i}" for i in range(9)]


def three_masters(slot: int) -> str:
    """The slot map redis-cli makes for three masters."""
    return "m0" if slot <= 5460 else "m1" if slot <= 10922 else "m2"


def test_a_stripes_tag_carries_its_salt_and_every_stripe_keeps_the_namespaces_salts() -> None:
    keys = Keys("mail", 0, (0, 5, 17))
    assert [keys.of_stripe(s).tag for s in range(3)] == ["mail", "mail{1.5", "mail{2.17"]
    assert keys.of_stripe(2).tasks == "ds:{mail{2.17}:tasks"
    assert Keys("mail", 1).tag == "mail{1"  # no salts: the plain tag
    assert Keys("mail", 2, (0, 0, 0)).tag == "mail{2"
    with pytest.raises(InvalidArgument, match="salts"):
        Keys("mail", 0, (0, -1))


def test_placed_salts_put_three_stripes_on_three_masters_where_plain_tags_often_do_not() -> None:
    plain_spans = []
    for name in NAMES:
        salts = choose_salts(name, 3, three_masters)
        placed = [Keys(name, s, salts) for s in range(3)]
        assert len(set(masters_spanned(placed, three_masters))) == 3, (name, salts)
        plain = [Keys(name, s) for s in range(3)]
        plain_spans.append(len(set(masters_spanned(plain, three_masters))))
    print(f"\nplain tags span 3 masters for {plain_spans.count(3)} of {len(NAMES)} names")
    assert plain_spans.count(3) < len(NAMES)


def test_more_stripes_than_masters_are_spread_evenly() -> None:
    salts = choose_salts("wide", 7, three_masters)
    where = masters_spanned([Keys("wide", s, salts) for s in range(7)], three_masters)
    loads = sorted(Counter(where).values())
    assert loads == [2, 2, 3]


@pytest.mark.parametrize("raw", [None, b"", b"0,x", b"1,2,3", b"0,2", b"0,2,99999", "0,-1,2"])
def test_salts_written_by_other_means_are_taken_as_plain_tags(raw: object) -> None:
    assert decode_salts(raw, 3) == ()
    assert decode_salts(b"0,4,9", 3) == (0, 4, 9)


def test_on_one_server_no_salts_are_stored(redis_server: RedisServer, namespace: str) -> None:
    with Scheduler.from_url(redis_server.url, namespace=namespace, stripes=3) as s:
        s.schedule("t", fn="f")
        assert s.client.hget(s.keys.meta, SALTS_FIELD) is None
        assert [k.tag for k in WorkerLink(s).stripe_keys()] == [
            namespace,
            f"{namespace}{{1",
            f"{namespace}{{2",
        ]


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    made = LocalCluster(masters=3, replicas=0)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster(local: LocalCluster) -> Iterator[tuple[LocalCluster, RedisCluster]]:
    """The module's cluster, and a client for this test alone."""
    client = RedisCluster(host="127.0.0.1", port=local.seed.port)
    yield local, client
    close_cluster_client(client)


def test_striped_namespaces_on_a_cluster_span_as_many_masters_as_they_have_stripes(
    cluster: tuple[LocalCluster, RedisCluster],
) -> None:
    _, client = cluster
    owner = slot_owner(client.nodes_manager)
    for name in NAMES:
        with Scheduler(client, namespace=name, stripes=3) as s:
            keys = WorkerLink(s).stripe_keys()
            assert len(set(masters_spanned(keys, owner))) == 3, name
            stored = client.hget(s.keys.meta, SALTS_FIELD)
        # Another client (a worker starting later) reads the same placement.
        with Scheduler(client, namespace=name) as later:
            assert WorkerLink(later).stripe_keys() == keys
            assert stored is None or decode_salts(stored, 3) == keys[0].salts
        client.delete(keys[0].meta)


def test_a_placed_namespace_runs_its_tasks_on_the_stripes_its_ids_map_to(
    cluster: tuple[LocalCluster, RedisCluster],
) -> None:
    _, client = cluster
    with Scheduler(client, namespace="placed-run", stripes=3) as s:
        s.schedule_many([TaskSpec(f"t{i}", "f", args=[i]) for i in range(300)])
        Worker(s, {"f": lambda i: i}, concurrency=4).run_until_idle()
        assert all(s.status(f"t{i}").state is State.SUCCEEDED for i in range(300))
        held = [client.hlen(k.tasks) for k in WorkerLink(s).stripe_keys()]
        assert sum(held) == 300 and all(held)
        s.clear()


def test_the_stripes_command_shows_the_masters_and_places_an_empty_namespace_again(
    cluster: tuple[LocalCluster, RedisCluster],
) -> None:
    local, client = cluster
    owner = slot_owner(client.nodes_manager)
    # A name whose plain tags put two stripes on one master.
    name = next(
        n for n in (f"crowded{i}" for i in range(200))
        if len(set(masters_spanned([Keys(n, s) for s in range(3)], owner))) < 3
    )  # fmt: skip
    with Scheduler(client, namespace=name, stripes=3) as s:
        client.hdel(s.keys.meta, SALTS_FIELD)  # as a namespace made before placement
    base = ["--redis", f"redis+cluster://{local.seed.address}", "--namespace", name]
    shown = CliRunner().invoke(cli, [*base, "stripes"], catch_exceptions=False).stdout
    assert "sharing a master" in shown and "--place" in shown
    placed = CliRunner().invoke(cli, [*base, "stripes", "--place"], catch_exceptions=False)
    assert "stripes span 3 of 3 master(s) (as many as they can)" in placed.stdout
    with Scheduler(client, namespace=name) as s:
        s.schedule("t", fn="f")
        with pytest.raises(ConflictError, match="placed again"):
            WorkerLink(s).place_stripes()
        s.clear()
    client.delete(Keys(name).meta)


def test_slot_of_agrees_with_redis_pys_slot_of_a_key_with_that_tag() -> None:
    for tag in ("mail", "mail{1", "mail{2.17", "ünï"):
        assert slot_of(tag) == key_slot(f"ds:{{{tag}}}:meta".encode())
