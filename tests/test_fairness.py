"""Fairness keys (README, "Tenants and fairness"): keys take turns at the claims.

A stateful test drives the real scripts against a reference model of the rule (weighted
virtual time, caps, the order inside a key); the others check shares over many claims,
that light keys are not starved behind a heavy backlog, caps under racing worker
processes, and that the slots of killed workers come back once their leases are reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from distsched import Claim, Scheduler, TaskSpec
from distsched.errors import InvalidArgument
from distsched.ops.namespace import Ops
from tests.conftest import RedisServer, python_command, require_extra, subprocess_env

KEYS = ["", "a", "b", "bb"]
# Long enough that no token comes back while a model test runs.
RATE_PER_S = 3600.0


def spec_key(key: str) -> str | None:
    return key or None


def run_count(client: redis.Redis, namespace: str, key: str) -> int:
    raw = client.hget(f"ds:{{{namespace}}}:fair", f"run:{key}")
    return int(raw) if raw is not None else 0


# ------------------------------------------------------------------------ the model


@dataclass
class Model:
    """The claim rule of lib/fair.lua, for tasks due at fixed past times."""

    queued: dict[str, list[tuple[int, int, int, str]]] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    full: dict[str, float] = field(default_factory=dict)
    vt: float = 0.0
    running: dict[str, int] = field(default_factory=dict)
    caps: dict[str, int | None] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)
    default_cap: int | None = None
    # Rate limits of RATE_PER_S: no token comes back within a test, so each key starts at
    # most its rate (tokens left; absent: a full bucket), and a key without a token waits.
    rates: dict[str, int | None] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)
    # The namespace's order inside each key: None for the default order, else the ms of
    # aging one point of priority is worth (lib/ranked.lua).
    aging_ms: int | None = None

    def order_key(self, entry: tuple[int, int, int, str]) -> tuple[int, int, int]:
        due_ms, neg_priority, seq, _ = entry
        if self.aging_ms is None:
            return (due_ms, neg_priority, seq)
        return (due_ms + neg_priority * self.aging_ms, neg_priority, seq)

    def set_order(self, aging_ms: int | None) -> None:
        self.aging_ms = aging_ms
        for entries in self.queued.values():
            entries.sort(key=self.order_key)

    def cap(self, key: str) -> int | None:
        own = self.caps.get(key)
        return own if own is not None else self.default_cap

    def schedule(self, key: str, due_ms: int, priority: int, seq: int, task_id: str) -> None:
        self.queued.setdefault(key, []).append((due_ms, -priority, seq, task_id))
        self.queued[key].sort(key=self.order_key)
        # A key waiting for its token is looked at again (its new task is due).
        self.waiting.discard(key)
        if key not in self.ready and key not in self.full:
            self.ready[key] = self.vt

    def claim(self, n: int) -> list[str]:
        out: list[str] = []
        served = None
        while len(out) < n and self.ready:
            key = min(self.ready, key=lambda k: (self.ready[k], k.encode()))
            vt = self.ready[key]
            if not self.queued.get(key):
                del self.ready[key]
                continue
            cap, busy = self.cap(key), self.running.get(key, 0)
            if cap is not None and busy >= cap:
                del self.ready[key]
                self.full[key] = vt
                continue
            rate = self.rates.get(key)
            tokens = None if rate is None else min(rate, self.tokens.get(key, rate))
            if tokens is not None and tokens < 1:
                del self.ready[key]
                self.waiting.add(key)
                continue
            if tokens is not None:
                self.tokens[key] = tokens - 1
            out.append(self.queued[key].pop(0)[3])
            self.running[key] = busy + 1
            served = vt
            new_vt = vt + 1 / self.weights.get(key, 1)
            if cap is not None and busy + 1 >= cap:
                del self.ready[key]
                self.full[key] = new_vt
            else:
                self.ready[key] = new_vt
        if served is not None:
            self.vt = served
        return out

    def finish(self, key: str) -> None:
        self.running[key] -= 1
        cap = self.cap(key)
        if key in self.full and (cap is None or self.running[key] < cap):
            del self.full[key]
            self.ready[key] = self.vt

    def set_key(self, key: str, cap: int | None, weight: int, rate: int | None) -> None:
        self.caps[key] = cap
        self.weights[key] = weight
        self.rates[key] = rate
        if rate is None:
            self.tokens.pop(key, None)
        if key in self.waiting:
            self.waiting.discard(key)
            self.ready[key] = self.vt
        self.settings_changed()

    def settings_changed(self) -> None:
        for key in list(self.full):
            del self.full[key]
            self.ready[key] = self.vt


class FairMachine(RuleBasedStateMachine):
    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.ns = "fm" + uuid.uuid4().hex[:10]
        self.s = Scheduler(self.client, namespace=self.ns, lease_s=60.0)
        self.model = Model()
        self.s.set_key("", cap=None)  # fair from the start, so every task is modelled
        self.seq = 0
        self.running: dict[str, tuple[Claim, str]] = {}
        self.keys_of: dict[str, str] = {}

    def teardown(self) -> None:
        self.s.close()

    @rule(
        key=st.sampled_from(KEYS),
        due=st.integers(0, 3),
        priority=st.integers(0, 2),
        count=st.integers(1, 3),
    )
    def schedule(self, key: str, due: int, priority: int, count: int) -> None:
        specs = []
        for _ in range(count):
            self.seq += 1
            task_id = f"t{self.seq}"
            # Due in the past, at fixed times: the order inside a key is fully known.
            due_ms = 1_000_000 + due
            specs.append(
                TaskSpec(task_id, "f", run_at=due_ms / 1000, priority=priority, key=spec_key(key))
            )
            self.keys_of[task_id] = key
        versions = self.s.schedule_many(specs)
        for spec, version in zip(specs, versions, strict=True):
            run_at = spec.run_at
            assert isinstance(run_at, float)
            self.model.schedule(key, round(run_at * 1000), spec.priority, version, spec.task_id)

    @rule(count=st.integers(1, 4), priority=st.integers(0, 2))
    def schedule_every_key(self, count: int, priority: int) -> None:
        for key in KEYS:
            self.schedule(key, 0, priority, count)

    @rule(n=st.integers(1, 5))
    def claim(self, n: int) -> None:
        claims, _ = self.s.claim(n, "w")
        expected = self.model.claim(n)
        assert [c.task_id for c in claims] == expected
        for c in claims:
            self.running[c.task_id] = (c, self.keys_of[c.task_id])

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if not self.running:
            return
        task_id = data.draw(st.sampled_from(sorted(self.running)))
        c, key = self.running.pop(task_id)
        if data.draw(st.booleans()):
            self.s.complete(c)
        else:
            self.s.fail(c, "boom")  # one attempt: ends failed
        self.model.finish(key)

    @rule(
        key=st.sampled_from(KEYS),
        cap=st.none() | st.integers(0, 3),
        weight=st.integers(1, 4),
        rate=st.none() | st.none() | st.integers(1, 3),
    )
    def set_key(self, key: str, cap: int | None, weight: int, rate: int | None) -> None:
        self.s.set_key(key, cap=cap, weight=weight, rate=rate, per=RATE_PER_S)
        self.model.set_key(key, cap, weight, rate)

    @rule(aging_ms=st.none() | st.sampled_from([0, 1, 2, 1000]))
    def set_order(self, aging_ms: int | None) -> None:
        # Inside each key the order is the namespace's, with tasks queued meanwhile.
        if aging_ms is None:
            self.s.set_order("default", aging=0)
        else:
            self.s.set_order("priority", aging=aging_ms / 1000)
        self.model.set_order(aging_ms)

    @rule(cap=st.none() | st.integers(0, 3))
    def set_default_cap(self, cap: int | None) -> None:
        self.s.set_default_key_cap(cap)
        self.model.default_cap = cap
        self.model.settings_changed()

    @invariant()
    def running_counts_match(self) -> None:
        for key in KEYS:
            assert run_count(self.client, self.ns, key) == self.model.running.get(key, 0)


def test_claims_follow_the_fair_rule_of_the_model_in_either_order(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    FairMachine.client = client
    try:
        run_state_machine_as_test(
            FairMachine,
            settings=settings(
                max_examples=60,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        client.close()


# ------------------------------------------------------------------------ shares


@pytest.mark.parametrize("order", ["default", "priority"])
def test_backlogged_keys_get_claim_shares_within_five_percent_of_their_weights(
    scheduler: Scheduler, order: str
) -> None:
    weights = {"k1": 1, "k2": 1, "k3": 2, "k4": 4, "k5": 8}
    total_claims = 20_000
    # In the priority order each key's tasks carry mixed priorities: the shares hold.
    scheduler.set_order(order, aging=1.0)
    for key, weight in weights.items():
        scheduler.set_key(key, weight=weight)
        # More than the key's share, so that every key stays backlogged.
        want = total_claims * weight // 16 + 500
        for first in range(0, want, 2000):
            scheduler.schedule_many(
                [
                    TaskSpec(f"{key}-{i}", "f", key=key, priority=(i * 7) % 5)
                    for i in range(first, min(first + 2000, want))
                ]
            )
    got: Counter[str] = Counter()
    claimed = 0
    while claimed < total_claims:
        claims, _ = scheduler.claim(200, "w")
        assert claims
        for c in claims:
            got[c.task_id.split("-")[0]] += 1
        claimed += len(claims)
    for key, weight in weights.items():
        expected = claimed * weight / 16
        assert abs(got[key] - expected) <= 0.05 * expected, (key, got[key], expected)


# ------------------------------------------------------------------------ starvation


def test_a_light_key_never_waits_behind_more_than_one_claim_of_a_heavy_backlog(
    scheduler: Scheduler,
) -> None:
    heavy = 100_000
    for first in range(0, heavy, 10_000):
        scheduler.schedule_many(
            [TaskSpec(f"h{i}", "f", key="heavy") for i in range(first, first + 10_000)]
        )
    light_keys = [f"light{j}" for j in range(10)]
    submitted: dict[str, int] = {}  # light task -> heavy claims seen when it was submitted
    heavy_seen = 0
    worst = 0
    for round_ in range(60):
        # Light keys submit regularly: a few of them each round.
        for j, key in enumerate(light_keys):
            if (round_ + j) % 3 == 0:
                task_id = f"{key}-{round_}"
                scheduler.schedule(task_id, fn="f", key=key)
                submitted[task_id] = heavy_seen
        claims, _ = scheduler.claim(4, "pool")
        for c in claims:
            if c.task_id.startswith("h"):
                heavy_seen += 1
            else:
                worst = max(worst, heavy_seen - submitted.pop(c.task_id))
    # Drain what the light keys still have queued.
    while submitted:
        claims, _ = scheduler.claim(4, "pool")
        for c in claims:
            if c.task_id.startswith("h"):
                heavy_seen += 1
            else:
                worst = max(worst, heavy_seen - submitted.pop(c.task_id))
    assert heavy_seen > 0
    # The rule's bound: a key that gets work joins at the virtual time of the last key
    # served, so at most one claim of the heavy key (a tie) precedes it.
    assert worst <= 1


# ------------------------------------------------------------------------ caps under races

WORKER_CODE = textwrap.dedent(
    """
    import sys, time, redis
    from distsched import Scheduler
    port, ns, name, until = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = redis.Redis(port=port)
    s = Scheduler(client, namespace=ns, lease_s=30.0)
    while time.time() < until:
        claims, wait = s.claim(2, name)
        if not claims:
            if wait is not None and wait.reason == "empty":
                break
            time.sleep(0.002)
            continue
        for c in claims:
            key = c.task_id.split("-")[0]
            now = client.incr(f"probe:{ns}:{key}")
            client.zadd(f"probe:{ns}:peak", {key: now}, gt=True)
            if key == "r":
                # The start on the server clock: the lease deadline less the lease.
                leased = client.zscore(f"ds:{{{ns}}}:leases", c.task_id)
                client.rpush(f"probe:{ns}:starts", int(leased) - 30000)
        time.sleep(0.005)
        for c in claims:
            client.decr(f"probe:{ns}:{c.task_id.split('-')[0]}")
            s.complete(c)
    """
)


def test_caps_and_rates_hold_under_four_racing_worker_processes(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace)
    caps = {"a": 2, "b": 3, "c": 1}
    for key, cap in caps.items():
        s.set_key(key, cap=cap)
    # Key r: at most 5 tasks started per 500 ms (a token bucket of 5).
    s.set_key("r", rate=5, per=0.5)
    s.schedule_many(
        [TaskSpec(f"{key}-{i}", "f", key=key) for key in caps for i in range(60)]
        + [TaskSpec(f"d-{i}", "f") for i in range(60)]
        + [TaskSpec(f"r-{i}", "f", key="r") for i in range(25)]
    )
    until = time.time() + 60
    procs = [
        subprocess.Popen(
            python_command(
                "-c", WORKER_CODE, str(redis_server.port), namespace, f"w{i}", str(until)
            ),
            env=subprocess_env(),
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.wait(timeout=90) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    peak_set: Any = redis_client.zrange(f"probe:{namespace}:peak", 0, -1, withscores=True)
    peaks = {k.decode(): int(v) for k, v in peak_set}
    for key, cap in caps.items():
        assert 1 <= peaks[key] <= cap, (key, peaks)
    # The uncapped default key ran several at once: the processes did race.
    assert peaks["d"] >= 2
    for key in [*caps, "", "r"]:
        assert run_count(redis_client, namespace, key) == 0
    assert s.stats()["counts"]["succeeded"] == 265
    # The token bucket's bound: from any start to a later one, at most 5 plus the tokens
    # refilled in between (5 per 500 ms) started.
    starts = sorted(int(x) for x in redis_client.lrange(f"probe:{namespace}:starts", 0, -1))
    assert len(starts) == 25
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 5 + (starts[j] - starts[i]) * 5 / 500, (i, j, starts)
    s.close()


# ------------------------------------------------------------------------ kill -9

HOLDER_CODE = textwrap.dedent(
    """
    import sys, time, redis
    from distsched import Scheduler
    s = Scheduler(redis.Redis(port=int(sys.argv[1])), namespace=sys.argv[2], lease_s=1.0)
    claims, _ = s.claim(5, sys.argv[3])
    print(len(claims), flush=True)
    time.sleep(600)
    """
)


def test_slots_of_killed_workers_come_back_once_when_their_leases_are_reaped(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    s = Scheduler(redis_client, namespace=namespace)
    s.set_key("t", cap=2)
    s.schedule_many([TaskSpec(f"t-{i}", "f", key="t") for i in range(6)])
    procs = []
    for i in range(2):
        p = subprocess.Popen(
            python_command("-c", HOLDER_CODE, str(redis_server.port), namespace, f"h{i}"),
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        procs.append((p, int(p.stdout.readline())))
    # Together they hold the key's two slots, no more.
    assert sorted(n for _, n in procs) == [0, 2]
    assert run_count(redis_client, namespace, "t") == 2
    for p, _ in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert p.stdout is not None
        p.stdout.close()
    claims, wait = s.claim(5, "other")
    assert claims == [] and wait is not None and wait.reason == "capacity"
    # The leases (1 s) run out; the reaper ends the tasks (no attempt left) and frees the slots.
    deadline = max(until for _, until in s.leases())
    while s.server_time() <= deadline:
        time.sleep(0.05)
    assert run_count(redis_client, namespace, "t") == 2  # nothing before the reap
    assert s.reap() == 2
    assert run_count(redis_client, namespace, "t") == 0
    # Reaping twice gives nothing back twice: the key gets exactly its cap again.
    s.reap()
    claims, wait = s.claim(5, "other")
    assert len(claims) == 2 and wait is not None and wait.reason == "capacity"
    assert run_count(redis_client, namespace, "t") == 2
    for c in claims:
        s.complete(c)
    assert run_count(redis_client, namespace, "t") == 0
    s.close()


# ------------------------------------------------------------------------ edges


# ------------------------------------------------------------------------ priority order

# One op of a run compared between a namespace without keys and one whose tasks all
# share one key: ("schedule", due offset ms, priority, count), ("claim", n), or
# ("order", aging ms or None for the default order).
ORDER_OPS = st.one_of(
    st.tuples(st.just("schedule"), st.integers(-3000, 3000), st.integers(-3, 3), st.integers(1, 4)),
    st.tuples(st.just("claim"), st.integers(1, 6)),
    st.tuples(st.just("order"), st.none() | st.sampled_from([0, 1, 500, 1000, 5000])),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(ORDER_OPS, min_size=1, max_size=25))
def test_inside_a_key_claims_follow_the_namespace_order_as_without_keys(
    redis_server: RedisServer, ops: list[tuple[Any, ...]]
) -> None:
    """Inside one key the order (either one, switched while tasks are queued, with
    tasks due at mixed past times and priorities) is the one a namespace without keys
    follows: the same claims in the same order, nothing lost."""
    client = redis_server.client()
    suffix = uuid.uuid4().hex[:10]
    plain = Scheduler(client, namespace="op" + suffix, lease_s=60.0)
    keyed = Scheduler(client, namespace="ok" + suffix, lease_s=60.0)
    base = 1_000_000.0  # seconds: every task is due, at times a few seconds apart
    seq = 0
    scheduled = 0
    try:
        for op in [*ops, ("claim", 1000)]:
            if op[0] == "schedule":
                _, offset, priority, count = op
                specs = []
                for _ in range(count):
                    seq += 1
                    specs.append((f"t{seq}", base + offset / 1000, priority))
                plain.schedule_many([TaskSpec(i, "f", run_at=at, priority=p) for i, at, p in specs])
                keyed.schedule_many(
                    [TaskSpec(i, "f", run_at=at, priority=p, key="t") for i, at, p in specs]
                )
                scheduled += count
            elif op[0] == "claim":
                want = [c.task_id for c in plain.claim(op[1], "w")[0]]
                got = [c.task_id for c in keyed.claim(op[1], "w")[0]]
                assert got == want
                scheduled -= len(got)
            else:
                for s in (plain, keyed):
                    if op[1] is None:
                        s.set_order("default", aging=0)
                    else:
                        s.set_order("priority", aging=op[1] / 1000)
        assert scheduled == 0
        assert keyed.stats()["counts"]["ready"] == 0
    finally:
        plain.close()
        keyed.close()
        client.close()


def test_a_keyed_task_and_the_priority_order_combine_either_way_round(
    scheduler: Scheduler,
) -> None:
    scheduler.set_order("priority", aging=1.0)
    scheduler.schedule("low", fn="f", key="t", run_at=1000.0, priority=0)
    scheduler.schedule("high", fn="f", key="t", run_at=1000.5, priority=5)
    scheduler.schedule("plain", fn="f", run_at=999.0, priority=1)
    claims, _ = scheduler.claim(3, "w")
    # Keys take turns (the default key first: it was served first); inside key t the
    # higher priority goes first although it became due later.
    assert [c.task_id for c in claims] == ["plain", "high", "low"]


def test_switching_order_with_ranked_keyed_tasks_queued_loses_none_and_keeps_the_order(
    scheduler: Scheduler,
) -> None:
    scheduler.set_key("t")
    scheduler.set_order("priority", aging=10.0)
    scheduler.schedule_many(
        [TaskSpec(f"a{i}", "f", key="t", run_at=1000.0 + 100 * i, priority=i) for i in range(5)]
    )
    scheduler.schedule_many(
        [
            TaskSpec(f"b{i}", "f", key="t", run_at=1000.0 + 100 * i, priority=20 * i)
            for i in range(5)
        ]
    )
    first, _ = scheduler.claim(1, "w")  # ranks the key's due entries
    assert [c.task_id for c in first] == ["b4"]
    scheduler.set_order("default", aging=0)
    rest, _ = scheduler.claim(100, "w")
    # Due time first, then the higher priority, then the earlier submitted.
    assert [c.task_id for c in rest] == ["a0", "b0", "b1", "a1", "b2", "a2", "b3", "a3", "a4"]
    assert scheduler.stats()["counts"]["ready"] == 0


def test_a_new_aging_ranks_the_queued_keyed_tasks_again(scheduler: Scheduler) -> None:
    scheduler.set_key("t")
    scheduler.set_order("priority", aging=1000.0)
    scheduler.schedule_many(
        [
            TaskSpec("old", "f", key="t", run_at=1000.0, priority=0),
            TaskSpec("mid", "f", key="t", run_at=1500.0, priority=1),
            TaskSpec("new", "f", key="t", run_at=2000.0, priority=2),
            TaskSpec("x", "f", key="t", run_at=2000.0, priority=3),
        ]
    )
    (first,), _ = scheduler.claim(1, "w")
    assert first.task_id == "x"
    # With no credit for priority the earliest due goes first.
    scheduler.set_order("priority", aging=0.0)
    claims, _ = scheduler.claim(3, "w")
    assert [c.task_id for c in claims] == ["old", "mid", "new"]


def test_tasks_queued_before_fairness_join_the_turns_as_the_default_key(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many([TaskSpec(f"d{i}", "f") for i in range(3)])
    scheduler.schedule_many([TaskSpec(f"k{i}", "f", key="t") for i in range(3)])
    claims, _ = scheduler.claim(6, "w")
    assert [c.task_id for c in claims] == ["d0", "k0", "d1", "k1", "d2", "k2"]


def test_a_bad_key_is_refused(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidArgument):
        scheduler.schedule("x", fn="f", key="")
    with pytest.raises(InvalidArgument):
        scheduler.schedule("x", fn="f", key="k" * 257)
    with pytest.raises(InvalidArgument):
        scheduler.set_key("t", cap=-1)
    with pytest.raises(InvalidArgument):
        scheduler.set_key("t", weight=0)


def test_a_delayed_key_joins_the_wait_hint(scheduler: Scheduler) -> None:
    scheduler.schedule("later", fn="f", key="t", delay=30)
    claims, wait = scheduler.claim(1, "w")
    assert claims == []
    assert wait is not None and wait.reason == "not_due"
    assert wait.delay is not None and 25 < wait.delay <= 30
    assert scheduler.key_info("t").turn == "waiting"


# ------------------------------------------------------------------------ the command line


def test_the_cli_schedules_keyed_tasks_and_sets_shows_and_lists_keys(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    from tests.test_cli import invoke

    assert (
        invoke(redis_server, namespace, "schedule", "t1", "--fn", "f", "--key", "acme").exit_code
        == 0
    )
    assert invoke(redis_server, namespace, "schedule", "t2", "--fn", "f").exit_code == 0
    result = invoke(redis_server, namespace, "keys", "set", "acme", "--cap", "2", "--weight", "3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "'acme': cap 2, weight 3, running 0, queued 1, ready"
    assert invoke(redis_server, namespace, "keys", "default", "5").exit_code == 0
    shown = invoke(redis_server, namespace, "keys", "show", "")
    assert (
        shown.stdout.strip()
        == "'' (default key): cap 5 (default), weight 1, running 0, queued 1, ready"
    )
    listed = invoke(redis_server, namespace, "keys", "list").stdout.splitlines()
    assert sorted(line.split(":")[0] for line in listed) == ["'' (default key)", "'acme'"]
    info = scheduler.key_info("acme")
    assert (info.cap, info.weight, info.default_cap) == (2, 3, 5)
    limited = invoke(redis_server, namespace, "keys", "set", "b", "--rate", "10", "--per", "2s")
    assert (
        limited.stdout.strip()
        == "'b': cap 5 (default), weight 1, rate 10 per 2 s (10 of 10 units left), running 0, "
        "queued 0, idle"
    )
    assert (scheduler.key_info("b").rate, scheduler.key_info("b").per_s) == (10, 2.0)
    bad = invoke(redis_server, namespace, "keys", "set", "acme", "--cap", "-1")
    assert bad.exit_code != 0
    assert scheduler.key_info("acme").cap == 2


# ------------------------------------------------------------------------ explain


@pytest.mark.parametrize("order", ["default", "priority"])
def test_explain_names_the_key_cap_or_rate_window_a_due_task_waits_for(
    scheduler: Scheduler, order: str
) -> None:
    from distsched.model import Reason

    scheduler.set_order(order, aging=1.0)

    scheduler.set_key("capped", cap=1)
    scheduler.set_key("limited", rate=1, per=60)
    scheduler.schedule_many(
        [TaskSpec(f"c{i}", "f", key="capped") for i in range(2)]
        + [TaskSpec(f"l{i}", "f", key="limited") for i in range(2)]
    )
    claims, _ = scheduler.claim(10, "w")
    assert sorted(c.task_id for c in claims) == ["c0", "l0"]
    capped = scheduler.explain("c1")
    assert Reason.KEY_CAPPED in capped.reasons and Reason.NEXT not in capped.reasons
    assert (capped.fair_key, capped.key_running, capped.key_cap) == ("capped", 1, 1)
    assert capped.ahead == 0
    limited = scheduler.explain("l1")
    assert Reason.KEY_RATE in limited.reasons
    assert limited.key_next_at is not None
    assert 50 < limited.key_next_at - limited.server_time <= 60
    assert (limited.key_rate, limited.key_per_s) == (1, 60.0)


# ------------------------------------------------------------------------ stats and metrics


def test_stats_and_metrics_show_the_top_keys_running_queued_and_ready_wait(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    from tests.test_cli import invoke

    prometheus_client = require_extra("prometheus_client")
    from distsched.metrics import PrometheusMetrics

    assert scheduler.stats()["keys"] == []  # not fair yet: nothing read
    scheduler.set_key("a", cap=1)
    scheduler.schedule_many([TaskSpec(f"a{i}", "f", key="a") for i in range(3)])
    scheduler.schedule_many([TaskSpec(f"b{i}", "f", key="b") for i in range(2)])
    claims, _ = scheduler.claim(2, "w")
    assert sorted(c.task_id for c in claims) == ["a0", "b0"]
    loads = {load["key"]: load for load in scheduler.stats()["keys"]}
    assert (loads["a"]["running"], loads["a"]["queued"], loads["a"]["cap"]) == (1, 2, 1)
    assert (loads["b"]["running"], loads["b"]["queued"]) == (1, 1)
    wait_a = loads["a"]["ready_wait_s"]
    assert wait_a is not None and wait_a >= 0
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    metrics.on_stats(scheduler.stats())
    assert registry.get_sample_value("distsched_key_running", {"key": "a"}) == 1
    assert registry.get_sample_value("distsched_key_queued", {"key": "b"}) == 1
    text = invoke(redis_server, namespace, "stats").stdout
    assert "key 'a'" in text and "1 running (cap 1), 2 queued" in text


def test_a_namespace_without_keys_never_writes_a_fairness_structure(
    redis_client: redis.Redis, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule_many([TaskSpec(f"t{i}", "f", max_attempts=2, backoff=0) for i in range(4)])
    claims, _ = scheduler.claim(4, "w")
    scheduler.complete(claims[0])
    scheduler.fail(claims[1], "again")
    scheduler.release([claims[2]])
    scheduler.expire_lease(claims[3].task_id)
    scheduler.claim(4, "w")
    names = {key.decode() for key in redis_client.scan_iter(match=f"ds:{{{namespace}}}:*")}
    assert not {name for name in names if name.split(":")[-1].startswith("fair")}
    assert redis_client.hget(f"ds:{{{namespace}}}:meta", "fair") is None
    assert scheduler.stats()["keys"] == []


def test_a_retried_task_keeps_its_key_and_a_new_version_takes_the_one_given(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("t", fn="f", key="acme", max_attempts=2, backoff=0)
    (claim,), _ = scheduler.claim(1, "w")
    scheduler.fail(claim, "once")
    assert scheduler.key_info("acme").queued == 1
    (claim,), _ = scheduler.claim(1, "w")
    assert claim.task_id == "t" and scheduler.key_info("acme").running == 1
    scheduler.complete(claim)
    scheduler.schedule("t", fn="f")  # a new version without a key: the default key
    assert scheduler.key_info("acme").queued == 0
    assert scheduler.key_info("").queued == 1


def test_a_key_over_its_rate_gives_the_time_of_its_next_token_as_the_wait_hint(
    scheduler: Scheduler,
) -> None:
    scheduler.set_key("t", rate=2, per=10)
    scheduler.schedule_many([TaskSpec(f"t{i}", "f", key="t") for i in range(3)])
    claims, wait = scheduler.claim(3, "w")
    assert [c.task_id for c in claims] == ["t0", "t1"]
    # One token per 5 s comes back: the next start is about 5 s away, not polled for.
    assert wait is not None and wait.reason == "not_due"
    assert wait.delay is not None and 4 < wait.delay <= 5
    assert scheduler.key_info("t").turn == "waiting"


def test_a_slot_freed_at_a_capped_key_wakes_one_idle_worker(scheduler: Scheduler) -> None:
    client = scheduler.client
    scheduler.set_key("t", cap=1)
    scheduler.schedule_many([TaskSpec(f"t{i}", "f", key="t") for i in range(2)])
    (running,), _ = scheduler.claim(1, "holder")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        channel = scheduler.keys.worker_channel("idle")
        pubsub.ssubscribe(channel)
        claims, wait = scheduler.claim(1, "idle", listening=True)
        assert claims == [] and wait is not None and wait.reason == "capacity"
        scheduler.complete(running)
        messages: list[tuple[Any, Any]] = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not messages:
            msg = pubsub.get_message(timeout=0.1)
            if msg is not None:
                messages.append((msg["channel"], msg["data"]))
        assert messages == [(channel.encode(), b"ready")]
        assert [c.task_id for c in scheduler.claim(1, "idle")[0]] == ["t1"]
    finally:
        pubsub.close()


def test_a_corrupt_record_of_a_keyed_task_is_handed_out_to_fail_within_its_key(
    redis_client: redis.Redis, namespace: str, scheduler: Scheduler
) -> None:
    scheduler.schedule_many([TaskSpec(f"t{i}", "f", key="t") for i in range(2)])
    redis_client.hset(f"ds:{{{namespace}}}:tasks", "t0", "junk")
    claims, _ = scheduler.claim(2, "w")
    assert [c.task_id for c in claims] == ["t0", "t1"]
    assert scheduler.key_info("t").running == 2
    scheduler.fail(claims[0], "corrupt")
    assert scheduler.status("t0").state.value == "failed"
    assert scheduler.key_info("t").running == 1


@pytest.mark.parametrize("order", ["default", "priority"])
def test_explain_finds_a_keyed_task_handed_back_with_a_delay(
    scheduler: Scheduler, order: str
) -> None:
    from distsched.model import Reason

    scheduler.set_order(order, aging=1.0)

    scheduler.schedule("t", fn="f", key="acme")
    (claim,), _ = scheduler.claim(1, "w")
    assert scheduler.release([claim], delay=30) == 1
    exp = scheduler.explain("t")
    assert exp.reasons[0] is Reason.NOT_DUE
    assert exp.due_at is not None and 25 < exp.due_at - exp.server_time <= 30


def test_explain_places_a_keyed_task_in_its_keys_priority_order(scheduler: Scheduler) -> None:
    from distsched.model import Reason

    scheduler.set_order("priority", aging=1.0)
    scheduler.schedule_many(
        [
            TaskSpec("low", "f", key="t", run_at=1000.0, priority=0),
            TaskSpec("high", "f", key="t", run_at=1000.5, priority=5),
            TaskSpec("later", "f", key="t", delay=60, priority=9),
        ]
    )
    high, low, later = (scheduler.explain(i) for i in ("high", "low", "later"))
    assert (high.ahead, high.due_at, high.fair_key) == (0, 1000.5, "t")
    assert (low.ahead, low.due_at) == (1, 1000.0)
    assert later.reasons[0] is Reason.NOT_DUE
    info = {i.key: i for i in scheduler.fair_keys()}["t"]
    assert (info.queued, info.head_due_at) == (3, 1000.5)


def test_the_default_keys_ready_wait_in_the_priority_order_is_its_next_claims(
    scheduler: Scheduler,
) -> None:
    scheduler.set_key("", cap=None)
    scheduler.set_order("priority", aging=1.0)
    scheduler.schedule_many(
        [
            TaskSpec("low", "f", run_at=1000.0, priority=0),
            TaskSpec("high", "f", run_at=1000.5, priority=5),
        ]
    )
    info = {i.key: i for i in scheduler.fair_keys()}[""]
    assert (info.queued, info.head_due_at) == (2, 1000.5)


# ------------------------------------------------------------------------ compaction


@pytest.mark.parametrize("order", ["default", "priority"])
def test_stale_keyed_entries_are_compacted_and_do_not_grow_without_bound(
    redis_client: redis.Redis, scheduler: Scheduler, order: str
) -> None:
    """A keyed task replaced while queued leaves its old entry in fairq, behind its key's
    live head, where no claim reaches it: housekeeping's compaction removes them, so
    round after round of replacements keeps fairq bounded."""
    from distsched.wire import calls

    scheduler.set_order(order, aging=1.0)
    live = 300
    specs = [TaskSpec(f"t{i}", "f", key="t", run_at=1000.0 + i) for i in range(live)]
    scheduler.schedule_many(specs)
    (head,), _ = scheduler.claim(1, "w")  # ranks the key's entries in the priority order
    assert head.task_id == "t0"
    sizes = []
    for _ in range(10):
        scheduler.schedule_many(specs[1:])  # new versions: the old entries go stale
        scheduler.housekeeping()
        sizes.append(int(redis_client.zcard(scheduler.keys.fairq)))
    # Each round adds live - 1 stale entries: without compaction 10 rounds would leave
    # 10 * (live - 1) of them; compaction walks once they are at least COMPACT_MINIMUM
    # and the majority, so they stay below that bound plus a round or two.
    assert max(sizes) <= live + calls.COMPACT_MINIMUM + 2 * live
    while scheduler._drive(
        scheduler._ops.call(Ops.run, calls.compact_call(scheduler.keys, 10_000, 0))
    )[0]:
        pass
    assert redis_client.zcard(scheduler.keys.fairq) == live - 1
    claims, _ = scheduler.claim(live, "w")
    assert [c.task_id for c in claims] == [f"t{i}" for i in range(1, live)]


def test_compaction_removes_every_stale_keyed_entry_once_they_are_the_majority(
    redis_client: redis.Redis, scheduler: Scheduler
) -> None:
    from distsched.wire import calls

    scheduler.schedule_many([TaskSpec(f"c{i}", "f", key="k") for i in range(50)])
    scheduler.schedule_many([TaskSpec("live", "f", key="k")])
    for i in range(50):
        scheduler.cancel(f"c{i}")
    assert redis_client.zcard(scheduler.keys.fairq) == 51
    removed = 0
    for _ in range(20):
        removed += scheduler._drive(
            scheduler._ops.call(Ops.run, calls.compact_call(scheduler.keys, 7, 0))
        )[0]
    assert removed == 50
    assert redis_client.zcard(scheduler.keys.fairq) == 1
    claims, _ = scheduler.claim(5, "w")
    assert [c.task_id for c in claims] == ["live"]


def test_claims_carry_their_key_only_in_a_fair_namespace(scheduler: Scheduler) -> None:
    scheduler.schedule("plain", fn="f")
    (claim,), _ = scheduler.claim(1, "w")
    assert claim.key is None
    scheduler.schedule_many([TaskSpec("k", "f", key="tenant:1"), TaskSpec("d", "f")])
    claims, _ = scheduler.claim(2, "w")
    assert {c.task_id: c.key for c in claims} == {"k": "tenant:1", "d": ""}


def test_per_key_ready_waits_are_a_histogram_of_at_most_the_top_keys_and_other(
    scheduler: Scheduler,
) -> None:
    prometheus_client = require_extra("prometheus_client")
    from distsched.metrics import OTHER_KEYS_LABEL, PrometheusMetrics
    from distsched.model import STATS_TOP_KEYS

    # 30 keys, key i with i + 1 queued tasks; stats shows STATS_TOP_KEYS of them.
    scheduler.schedule_many(
        [TaskSpec(f"t{i}-{j}", "f", key=f"k{i}") for i in range(30) for j in range(i + 1)]
    )
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    shown = {load["key"] for load in scheduler.stats()["keys"]}
    assert len(shown) == STATS_TOP_KEYS
    metrics.on_stats(scheduler.stats())
    claims, _ = scheduler.claim(60, "w")
    assert len({c.key for c in claims}) == 30
    for c in claims:
        metrics.on_started(c, 0.02)
    counts = {
        sample.labels["key"]: sample.value
        for metric in registry.collect()
        if metric.name == "distsched_key_task_ready_wait_seconds"
        for sample in metric.samples
        if sample.name.endswith("_count")
    }
    top = shown
    assert set(counts) == top | {OTHER_KEYS_LABEL}
    per_key = Counter(c.key for c in claims)
    assert counts[OTHER_KEYS_LABEL] == sum(n for key, n in per_key.items() if key not in top)
    assert all(counts[key] == per_key[key] for key in top)
    # A key no longer shown loses its series: the label set stays bounded.
    gone = next(iter(top))
    metrics.on_stats({**scheduler.stats(), "keys": []})
    assert (
        registry.get_sample_value("distsched_key_task_ready_wait_seconds_count", {"key": gone})
        is None
    )
    assert registry.get_sample_value(
        "distsched_key_task_ready_wait_seconds_count", {"key": OTHER_KEYS_LABEL}
    ) == float(len(claims) - sum(per_key[key] for key in top))


@pytest.mark.parametrize("key", ["t", None])
def test_a_key_with_more_due_tasks_than_one_claim_ranks_is_served_in_exact_rank_order(
    scheduler: Scheduler, key: str | None
) -> None:
    """More due tasks than a claim call ranks (1,000): the calls rank them in steps and
    serve the key only once all are ranked, so its highest priority still goes first."""
    from distsched.model import WaitReason

    scheduler.set_key("t")
    total = 1500
    for first in range(0, total, 500):
        scheduler.schedule_many(
            [
                # Due 1 ms apart; the last one due has the highest priority by far.
                TaskSpec(
                    f"x{i}",
                    "f",
                    key=key,
                    run_at=1000.0 + i / 1000,
                    priority=10**6 * (i == total - 1),
                )
                for i in range(first, first + 500)
            ]
        )
    # Queued in the default order, so that none is ranked yet when the order changes.
    scheduler.set_order("priority", aging=0.001)
    got = None
    for _ in range(5):
        claims, wait = scheduler.claim(1, "w")
        if claims:
            got = claims[0].task_id
            break
        assert wait is not None and wait.reason is WaitReason.NOT_DUE and wait.delay == 0
    assert got == f"x{total - 1}"
    claims, _ = scheduler.claim(3, "w")
    assert [c.task_id for c in claims] == ["x0", "x1", "x2"]


@pytest.mark.parametrize(
    ("priority", "aging_s"),
    [(0, 1.0), (5, 1.0), (-7, 3.0), (2_000_000, 1_000_000.0), (-(2**31), 1_000_000.0)],
)
def test_a_ranked_keyed_entry_is_the_member_python_builds_for_explain(
    redis_client: redis.Redis, scheduler: Scheduler, priority: int, aging_s: float
) -> None:
    """Negative ranks and ranks beyond 2^53 included: the scripts and the Python side
    encode a key's ranked entry alike, so explain finds it."""
    from distsched.wire.records import fair_ranked_member, queue_member

    scheduler.set_order("priority", aging=aging_s)
    version = scheduler.schedule("x", fn="f", key="t", run_at=1000.0, priority=priority)
    member = queue_member(priority, version, "x")
    expected = fair_ranked_member("t", 1_000_000, member, priority, round(aging_s * 1000))
    assert redis_client.zrange(scheduler.keys.fairq, 0, -1) == [expected]
    assert scheduler.explain("x").ahead == 0


def test_ranked_keyed_entries_sort_as_their_ranks_across_the_sign() -> None:
    from distsched.wire.records import fair_ranked_member

    ranks = [-(2**61), -(2**53) - 2, -5000, -1, 0, 1, 5000, 2**53 + 2, 2**61]
    # Due 0 and priority -rank at one ms of aging: the rank is the given one.
    members = [fair_ranked_member("t", 0, b"m", -rank, 1) for rank in ranks]
    assert sorted(members) == members
