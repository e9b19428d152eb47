"""Weighted rate limits: a task takes its ``cost`` in units of its fairness key's rate.

A key's rate is a token bucket of ``rate`` units refilled at ``rate`` per ``per`` seconds;
a task of cost ``c`` starts only once ``c`` units are there, and takes them. The tests use
windows of an hour, so that the real time a test takes refills next to nothing, and move
the namespace's test clock to refill exactly the units they mean to.
"""

from __future__ import annotations

import random
import subprocess
import textwrap
import time
from typing import Any

import pytest
import redis

from distsched import Scheduler, TaskSpec, scripts
from distsched.errors import InvalidArgument
from distsched.keys import Keys
from distsched.model import Reason
from distsched.ops.namespace import Ops
from distsched.tasks import Tasks
from tests.conftest import RedisServer, namespace_keys, python_command, subprocess_env
from tests.test_cli import invoke

HOUR = 3600.0
# With rate 10 per hour, one unit comes back every 360 s of the namespace's clock.
UNIT_S = 360.0


def advance(server: RedisServer, namespace: str, seconds: float) -> None:
    """Move the namespace's test clock (the clock every script reads) ``seconds`` on."""
    with Scheduler.from_url(server.url, namespace=namespace) as s:
        s._drive(s._ops.call(Ops.advance_clock, round(seconds * 1000)))


def started(claims: Any) -> list[str]:
    return [c.task_id for c in claims]


def test_a_task_takes_its_cost_in_units_of_its_keys_rate(
    api: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    api.set_key("llm", rate=10, per=HOUR)
    api.schedule_many(
        [
            TaskSpec("a", "f", key="llm", cost=6),
            TaskSpec("b", "f", key="llm", cost=3),
            TaskSpec("c", "f", key="llm", cost=4),
            TaskSpec("d", "f", key="llm"),
        ]
    )
    claims, _ = api.claim(10, "w")
    # 6 + 3 of the 10 units: c needs 4 and 1 is left, so c and the key's tasks behind it wait.
    assert started(claims) == ["a", "b"]
    info = api.key_info("llm")
    assert (info.rate, info.units, info.units_used, info.turn) == (10, 1, 9, "waiting")
    assert (api.status("a").cost, api.status("c").cost, api.status("d").cost) == (6, 4, 1)
    why = api.explain("c")
    assert Reason.KEY_RATE in why.reasons
    assert (why.cost, why.key_units, why.key_rate) == (4, 1, 10)
    # The 3 missing units come back in 3 * 360 s.
    assert why.key_next_at is not None
    assert 3 * UNIT_S - 5 < why.key_next_at - why.server_time <= 3 * UNIT_S
    advance(redis_server, namespace, 3 * UNIT_S - 10)
    assert started(api.claim(10, "w")[0]) == []
    advance(redis_server, namespace, 10)
    assert started(api.claim(10, "w")[0]) == ["c"]
    advance(redis_server, namespace, UNIT_S)
    assert started(api.claim(10, "w")[0]) == ["d"]


def test_tasks_of_various_costs_start_no_faster_than_the_rate_allows(
    scheduler: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    rnd = random.Random(7)
    rate, per_ms = 20, 60_000
    scheduler.set_key("t", rate=rate, per=per_ms / 1000)
    costs = {f"t{i}": rnd.randint(1, 8) for i in range(40)}
    scheduler.schedule_many([TaskSpec(i, "f", key="t", cost=c) for i, c in costs.items()])
    starts: list[tuple[int, int]] = []
    while len(starts) < len(costs):
        claims, _ = scheduler.claim(10, "w")
        now = round(scheduler.server_time() * 1000)
        starts += [(now, costs[c.task_id]) for c in claims]
        for c in claims:
            scheduler.complete(c)
        advance(redis_server, namespace, rnd.choice([0.5, 1, 2, 7]))
    # From any start to a later one, at most the bucket (20) plus the units refilled in
    # between started, counting each task's cost.
    for i in range(len(starts)):
        used = 0
        for j in range(i, len(starts)):
            used += starts[j][1]
            assert used <= rate + (starts[j][0] - starts[i][0]) * rate / per_ms, (i, j, starts)
    # And no slower than it allows: all ran within the time the units take, plus a step.
    span = starts[-1][0] - starts[0][0]
    assert span <= (sum(costs.values()) - rate) * per_ms / rate + 8_000


def test_a_key_waiting_for_units_does_not_hold_back_another_key(api: Scheduler) -> None:
    api.set_key("big", rate=10, per=HOUR)
    api.set_key("small", rate=10, per=HOUR)
    api.schedule_many(
        [TaskSpec("big-0", "f", key="big", cost=10), TaskSpec("big-1", "f", key="big", cost=5)]
    )
    first, _ = api.claim(1, "w")
    assert started(first) == ["big-0"]
    api.schedule_many(
        [TaskSpec(f"small-{i}", "f", key="small", cost=2) for i in range(5)]
        + [TaskSpec(f"plain-{i}", "f") for i in range(2)]
    )
    rest, _ = api.claim(20, "w")
    # big's head needs 5 units and has none: every other key's task still starts.
    assert sorted(started(rest)) == sorted(
        [f"small-{i}" for i in range(5)] + [f"plain-{i}" for i in range(2)]
    )
    assert api.key_info("big").turn == "waiting"
    assert api.key_info("small").units == 0


def test_a_typed_task_takes_its_cost_from_its_options(scheduler: Scheduler) -> None:
    tasks = Tasks(scheduler)

    @tasks.task(key="llm")
    def summarize(text: str) -> str:
        return text[:10]

    scheduler.set_key("llm", rate=100, per=HOUR)
    summarize.options(cost=70).schedule("s1", "a long text")
    summarize.schedule("s2", "short")
    assert (scheduler.status("s1").cost, scheduler.status("s2").cost) == (70, 1)
    with pytest.raises(InvalidArgument) as err:
        summarize.options(cost=101).schedule("s3", "too long")
    assert err.value.field == "cost"


def commands_per_claim(client: redis.Redis, s: Scheduler, claims: int) -> dict[str, int]:
    """The commands the claim script ran over ``claims`` one-task claims, by name."""
    client.config_resetstat()
    for _ in range(claims):
        assert len(s.claim(1, "w")[0]) == 1
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}


def test_only_a_key_with_a_rate_reads_its_tasks_costs(own_redis: RedisServer) -> None:
    client = own_redis.client()
    s = Scheduler(client, namespace="n")
    s.schedule_many([TaskSpec(f"t{i}", "f", key=f"k{i % 5}") for i in range(40)])
    s.claim(1, "w")
    without = commands_per_claim(client, s, 10)
    for i in range(5):
        s.set_key(f"k{i}", rate=10**6, per=1)
    with_rate = commands_per_claim(client, s, 10)
    # A key with a rate: one HGET of costs (and one HSET of its bucket) more per task.
    assert with_rate.get("hget", 0) - without.get("hget", 0) == 10
    assert {k: v for k, v in with_rate.items() if k not in ("hget", "hset")} == {
        k: v for k, v in without.items() if k not in ("hget", "hset")
    }
    s.close()
    client.close()


def test_a_cost_on_a_task_without_a_key_takes_the_default_keys_units(api: Scheduler) -> None:
    api.schedule_many([TaskSpec("free", "f", cost=50)])
    # No rate anywhere: the cost changes nothing.
    assert started(api.claim(5, "w")[0]) == ["free"]
    api.set_key("", rate=4, per=HOUR)
    api.schedule_many([TaskSpec(f"p{i}", "f", cost=3) for i in range(2)])
    assert started(api.claim(5, "w")[0]) == ["p0"]
    assert api.key_info("").units == 1


def test_a_bad_cost_is_refused_naming_the_field_and_nothing_is_written(
    api: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    api.set_key("k", rate=10, per=HOUR)
    before = namespace_keys(redis_client, namespace)
    for bad in (0, -1, 1.5, True, "2", 10**9 + 1):
        with pytest.raises(InvalidArgument) as err:
            api.schedule("x", fn="f", key="k", cost=bad)  # type: ignore[arg-type]
        assert err.value.field == "cost"
    # Known to the script only: more than the key's whole rate could never start.
    with pytest.raises(InvalidArgument) as err:
        api.schedule_many([TaskSpec("ok", "f", key="k"), TaskSpec("x", "f", key="k", cost=11)])
    assert err.value.field == "cost"
    assert "more than the rate of its key (10 per window)" in str(err.value)
    assert namespace_keys(redis_client, namespace) == before
    assert api.schedule("x", fn="f", key="k", cost=10) == api.status("x").version


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (" cost=0", "BADARG cost of a must be an integer in [1, 1000000000]"),
        (" cost=1000000001", "BADARG cost of a must be an integer in [1, 1000000000]"),
        (" cost=99999999999999999", "BADARG cost of a out of range"),
        (" cost=-3", "BADARG spec of a options must be"),
        (" cost=2 cost=3", "BADARG cost of a given twice"),
        (" key=6b cost=11", "BADARG cost of a is 11 units, more than the rate of its key"),
    ],
)
def test_the_script_refuses_a_bad_cost_and_writes_nothing(
    scheduler: Scheduler, redis_client: redis.Redis, suffix: str, message: str
) -> None:
    scheduler.set_key("k", rate=10, per=HOUR)
    before = namespace_keys(redis_client, scheduler.keys.namespace)
    keys = scheduler.keys.for_script("schedule")
    with pytest.raises(redis.ResponseError) as err:
        redis_client.eval(
            scripts.source("schedule"),
            len(keys),
            *keys,
            1000,
            1,
            "a",
            "in 0 0 1 1000 0 0 0" + suffix,
            b"\x81\xa2fn\xa1f",
        )
    assert str(err.value).startswith(message)
    assert namespace_keys(redis_client, scheduler.keys.namespace) == before


def test_a_cost_is_kept_per_version_and_removed_with_the_task(
    api: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    costs = Keys(namespace).costs
    api.schedule("x", fn="f", key="k", cost=5)
    assert redis_client.hget(costs, "x") == b"5"
    api.schedule("x", fn="f", key="k")  # a new version without a cost costs 1
    assert redis_client.hget(costs, "x") is None
    assert api.status("x").cost == 1
    api.schedule("x", fn="f", key="k", cost=3)
    (claim,), _ = api.claim(1, "w")
    api.complete(claim)
    assert redis_client.hget(costs, "x") == b"3"
    assert api.purge_tasks(["x"]) == 1
    assert redis_client.hget(costs, "x") is None
    # A cost of 1 is stored nowhere.
    api.schedule("y", fn="f", cost=1)
    assert redis_client.hlen(costs) == 0


def test_a_rate_lowered_below_a_queued_cost_starts_it_on_a_full_bucket_and_explain_says_so(
    api: Scheduler, redis_server: RedisServer, namespace: str
) -> None:
    api.set_key("k", rate=10, per=HOUR)
    api.schedule_many([TaskSpec("first", "f", key="k"), TaskSpec("huge", "f", key="k", cost=8)])
    api.set_key("k", rate=4, per=HOUR)
    why = api.explain("huge")
    assert Reason.COST_OVER_RATE in why.reasons
    assert (why.cost, why.key_rate) == (8, 4)
    # first takes 1 of the 4 units; huge waits for a full bucket (4 units), then takes it all.
    assert started(api.claim(5, "w")[0]) == ["first"]
    advance(redis_server, namespace, HOUR / 4 - 10)
    assert started(api.claim(5, "w")[0]) == []
    advance(redis_server, namespace, 10)
    assert started(api.claim(5, "w")[0]) == ["huge"]
    assert api.key_info("k").units == 0


def test_the_cli_schedules_with_a_cost_and_shows_units_and_why(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    limited = invoke(redis_server, namespace, "keys", "set", "tok", "--rate", "100", "--per", "1h")
    assert limited.exit_code == 0, limited.stderr
    assert "rate 100 per 3600 s (100 of 100 units left)" in limited.stdout
    for task, cost in (("t1", "70"), ("t2", "40")):
        done = invoke(
            redis_server, namespace, "schedule", task, "--fn", "f", "--key", "tok", "--cost", cost
        )
        assert done.exit_code == 0, done.stderr
    bad = invoke(
        redis_server, namespace, "schedule", "t3", "--fn", "f", "--key", "tok", "--cost", "101"
    )
    assert bad.exit_code != 0 and "cost" in bad.stderr
    assert started(scheduler.claim(5, "w")[0]) == ["t1"]
    shown = invoke(redis_server, namespace, "keys", "show", "tok").stdout
    assert "(30 of 100 units left)" in shown
    status = invoke(redis_server, namespace, "status", "t2").stdout
    assert any(line.split() == ["cost:", "40"] for line in status.splitlines()), status
    why = invoke(redis_server, namespace, "why", "t2").stdout
    assert (
        "waiting for 40 units of the rate of its fairness key 'tok' (100 per 3600 s, 30 units left)"
        in why
    ), why
    scheduler.set_key("tok", rate=30, per=3600)
    lowered = invoke(redis_server, namespace, "why", "t2").stdout
    assert "its cost of 40 units is more than the whole rate of key 'tok' (30 per 3600 s" in lowered
    assert "it starts only when the key's bucket is full, and takes all of it" in lowered


# ------------------------------------------------------------------------ racing workers

COST_WORKER = textwrap.dedent(
    """
    import sys, time, redis
    from distsched import Scheduler
    port, ns, name, go = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = redis.Redis(port=port)
    s = Scheduler(client, namespace=ns, lease_s=30.0)
    s.server_time()
    time.sleep(max(0.0, go - time.time()))
    deadline = time.time() + 30
    while time.time() < deadline:
        claims, wait = s.claim(3, name)
        if not claims:
            if wait is not None and wait.reason == "empty":
                break
            time.sleep(0.002)
            continue
        for c in claims:
            # The start on the server clock: the lease deadline less the lease.
            leased = client.zscore(f"ds:{{{ns}}}:leases", c.task_id)
            client.rpush(f"probe:{ns}:starts", f"{int(leased) - 30000} {c.task_id}")
            s.complete(c)
    """
)


def test_racing_worker_processes_never_start_more_units_than_the_rate(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    rate, per_ms = 60, 300
    s = Scheduler(redis_client, namespace=namespace)
    s.set_key("r", rate=rate, per=per_ms / 1000)
    rnd = random.Random(11)
    costs = {f"r-{i}": rnd.randint(1, 12) for i in range(30)}
    s.schedule_many(
        [TaskSpec(i, "f", key="r", cost=c) for i, c in costs.items()]
        + [TaskSpec(f"d-{i}", "f") for i in range(20)]
    )
    go = time.time() + 1.0
    procs = [
        subprocess.Popen(
            python_command("-c", COST_WORKER, str(redis_server.port), namespace, f"w{i}", str(go)),
            env=subprocess_env(),
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = [
        line.decode() if isinstance(line, bytes) else line
        for line in redis_client.lrange(f"probe:{namespace}:starts", 0, -1)
    ]
    starts = sorted(
        (int(at), costs[task]) for at, task in (line.split() for line in lines) if task in costs
    )
    assert len(starts) == len(costs)
    assert s.stats()["counts"]["succeeded"] == 50
    for i in range(len(starts)):
        used = 0
        for j in range(i, len(starts)):
            used += starts[j][1]
            assert used <= rate + (starts[j][0] - starts[i][0]) * rate / per_ms, (i, j, starts)
    s.close()
