"""The worst inputs of the ``worst`` section: one case per kind of call, each the
most its caps accept."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from distsched import limits, scripts, validate
from distsched.client import Scheduler
from distsched.errors import DistschedError
from distsched.keys import Keys
from distsched.model import Claim, JoinRule, Spawn, TaskSpec
from distsched.schedules import MAX_BACKFILL_SLOTS
from distsched.tools.bench.slowlog import argv_head, is_script_client, text_of
from distsched.wire import payload, records, replies
from distsched.wire.calls import (
    EXPIRE_BATCH,
    ORDER_REWRITE_MAX,
    REAP_BATCH,
    Call,
    add_deps_call,
    claim_call,
    compact_call,
    complete_call,
    confirm_cancel_call,
    enqueue_call,
    expire_call,
    fail_call,
    finish_call,
    forget_call,
    heartbeat_call,
    leave_call,
    propagate_call,
    purge_call,
    reap_call,
    release_call,
    schedule_call,
)

# SLOWLOG logs the calls measured slower than this. Not 0: Redis logs the commands a
# script runs too, and logging each of them would add to the call being measured; none
# of those commands comes near this, and no script call this short matters here.
SLOWER_THAN_US = 100
SLOWLOG_MAX_LEN = 10_000
# The task function of every task created (never run: no worker takes part).
FN = "noop"
# The payload at the default limit: one bytes argument filling it but for the map's
# own few bytes.
PAYLOAD_ROOM = 64
# Dependencies of each task of the batch that carries MAX_EDGES_PER_CALL edges.
EDGES_PER_TASK = 10
LEASE_MS = 300_000
FAR_DELAY_S = 86_400.0
WORKER = "bench-worst"
# The longest an input's description is kept in the report.
OUTCOME_CHARS = 160


@dataclass
class Measured:
    """One measured call (or API operation: every script call it made counts)."""

    case: str
    script: str
    input: str
    outcome: str = "ok"
    entries: list[dict[str, Any]] = field(default_factory=list)


def describe(exc: BaseException) -> str:
    text = " ".join(text_of(str(exc)).split())
    return text[:OUTCOME_CHARS] + ("..." if len(text) > OUTCOME_CHARS else "")


class Probe:
    """One case's namespace: setup calls (not logged) and measured ones (logged)."""

    def __init__(
        self, client: redis.Redis, namespace: str, scale: float, case: str, out: list[Measured]
    ) -> None:
        self.client = client
        self.scale = scale
        self.case = case
        self.out = out
        self.keys = Keys(namespace)
        self.registry = scripts.Registry(client)
        self.s = Scheduler(client, namespace=namespace, lease_s=LEASE_MS / 1000)

    def n(self, cap: int) -> int:
        """``cap`` at this run's scale (at least 1)."""
        return max(1, math.floor(cap * self.scale))

    def run(self, call: Call) -> Any:
        """Send one script call as built."""
        return self.registry[call.script](call.keys, call.args)

    def measure_call(self, what: str, call: Call) -> Any:
        """Send one script call with SLOWLOG on (see :meth:`measure`)."""
        return self.measure(call.script, what, lambda: self.run(call))

    def measure(self, script: str, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (calls of ``script``, by the API or as built) with SLOWLOG on and
        keep the script calls it logged."""
        item = Measured(self.case, script, what)
        self.out.append(item)
        reply = None
        self.client.config_set("slowlog-log-slower-than", SLOWER_THAN_US)
        self.client.slowlog_reset()
        try:
            reply = fn()
        except (redis.ResponseError, DistschedError) as exc:
            item.outcome = f"refused: {describe(exc)}"
        except redis.RedisError as exc:
            item.outcome = f"failed: {type(exc).__name__}: {describe(exc)}"
        finally:
            self.client.config_set("slowlog-log-slower-than", -1)
        got: list[dict[str, Any]] = self.client.slowlog_get(SLOWLOG_MAX_LEN)
        item.entries = [
            {k: v for k, v in entry.items() if k != "command"}
            | {"command": list(argv_head(entry.get("command")))}
            for entry in got
            if not is_script_client(entry.get("client_address"))
        ]
        return reply

    def fill(self, prefix: str, count: int, **spec: Any) -> list[str]:
        """Queue ``count`` tasks ``<prefix><i>`` in calls of MAX_TASKS_PER_CALL (not logged)."""
        ids = [f"{prefix}{i}" for i in range(count)]
        per = limits.MAX_TASKS_PER_CALL
        for start in range(0, count, per):
            specs = [TaskSpec(task_id, FN, **spec) for task_id in ids[start : start + per]]
            self.run(schedule_call(self.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES))
        return ids

    def one_dependent_each(self, ids: Sequence[str]) -> None:
        """Queue a task ``<id>-next`` depending on each of ``ids`` (not logged)."""
        per = limits.MAX_TASKS_PER_CALL
        for start in range(0, len(ids), per):
            specs = [TaskSpec(f"{t}-next", FN, deps=[t]) for t in ids[start : start + per]]
            self.run(schedule_call(self.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES))

    def claim_all(self, count: int, lease_ms: int = LEASE_MS) -> list[Claim]:
        """Claim ``count`` due tasks in calls of at most MAX_CLAIM (not logged)."""
        claims: list[Claim] = []
        while len(claims) < count:
            n = min(limits.MAX_CLAIM, count - len(claims))
            reply = self.run(claim_call(self.keys, WORKER, n, lease_ms))
            got, _ = replies.decode_claim_reply(replies.split_reply("claim", reply)[1])
            if not got:
                break
            claims += got
        return claims

    def settle_all(self, what: str, most: int) -> None:
        """Measure propagate calls at MAX_PROPAGATE_BUDGET until nothing is left."""
        call = propagate_call(self.keys, limits.MAX_PROPAGATE_BUDGET)
        for i in range(most):
            reply = self.measure_call(f"{what}, call {i + 1}", call)
            if reply is None or int(reply[0]) == 0:
                return

    def close(self) -> None:
        try:
            self.s.clear()
        finally:
            self.s.close()


def case_batch(p: Probe) -> None:
    """schedule: a full batch with a full load of edges, then again (replacing each
    task, so its old edges go too); payloads at the value and byte caps (schedule and
    enqueue)."""
    tasks = p.n(limits.MAX_TASKS_PER_CALL)
    per = min(EDGES_PER_TASK, tasks, max(1, limits.MAX_EDGES_PER_CALL // tasks))
    targets = p.fill("t", tasks, delay=FAR_DELAY_S)
    specs = [
        TaskSpec(f"b{i}", FN, deps=[targets[(i * per + j) % tasks] for j in range(per)])
        for i in range(tasks)
    ]
    call = schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    edges = tasks * per
    p.measure_call(f"{tasks:,} tasks, {edges:,} dependencies on queued tasks", call)
    p.measure_call(f"{tasks:,} tasks replacing pending ones, {edges:,} dependencies", call)
    # A check reads every value of every payload: one payload of MAX_PAYLOAD_VALUES
    # one-byte values; then a full batch whose payloads carry, together, the most values
    # and the most bytes (ASCII strings: each is searched for bytes outside ASCII) a call
    # may; then payloads of one long string each, as many bytes as a call may.
    most = limits.MAX_PAYLOAD_VALUES
    specs = [TaskSpec("v0", FN, args=[1] * (most - 5), delay=FAR_DELAY_S)]
    call = schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    p.measure_call(f"1 task, a payload of {most:,} one-byte values", call)
    values = limits.MAX_PAYLOAD_VALUES_PER_CALL // tasks
    size = min(limits.MAX_PAYLOAD_BYTES_PER_CALL // tasks, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    args = text_args(size, values)
    specs = [TaskSpec(f"m{i}", FN, args=args, delay=FAR_DELAY_S) for i in range(tasks)]
    call = schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    p.measure_call(f"{tasks:,} tasks, payloads of {values:,} values and {size:,} bytes each", call)
    # The short way for plain tasks checks the same payloads: its costliest inputs.
    specs = [TaskSpec(f"e{i}", FN, args=args, delay=FAR_DELAY_S) for i in range(tasks)]
    call = enqueue_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    p.measure_call(
        f"{tasks:,} plain tasks, payloads of {values:,} values and {size:,} bytes each", call
    )
    specs = [TaskSpec("ev0", FN, args=[1] * (most - 5), delay=FAR_DELAY_S)]
    call = enqueue_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    p.measure_call(f"1 plain task, a payload of {most:,} one-byte values", call)
    size = limits.DEFAULT_MAX_PAYLOAD_BYTES
    big = max(1, limits.MAX_PAYLOAD_BYTES_PER_CALL // size)
    specs = [TaskSpec(f"p{i}", FN, args=text_args(size, 6), delay=FAR_DELAY_S) for i in range(big)]
    call = schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES)
    p.measure_call(f"a {size >> 10:,} KiB string payload in each of {big:,} tasks", call)


def text_args(size: int, values: int) -> list[Any]:
    """The args of a payload of ``size`` bytes (at most) and ``values`` msgpack values (at
    least 6): one ASCII string filling the bytes, then one-byte integers."""
    ones = [1] * (values - 6)
    base = len(payload.encode_payload(FN, ["x" * 70_000, *ones], None, 1 << 30)) - 70_000
    return ["x" * max(0, size - base), *ones]


def case_claim(p: Probe) -> None:
    """claim: MAX_CLAIM small due tasks; due tasks with payloads at the default limit,
    enough to fill MAX_CLAIM_REPLY_BYTES."""
    count = p.n(limits.MAX_CLAIM)
    p.fill("c", count)
    call = claim_call(p.keys, WORKER, limits.MAX_CLAIM, LEASE_MS)
    p.measure_call(f"n={limits.MAX_CLAIM:,}, {count:,} due tasks", call)
    size = limits.DEFAULT_MAX_PAYLOAD_BYTES - PAYLOAD_ROOM
    big = p.n(limits.MAX_CLAIM_REPLY_BYTES // size + 1)
    for i in range(big):  # one a call: MAX_PAYLOAD_BYTES_PER_CALL
        p.fill(f"p{i}-", 1, args=[b"x" * size])
    p.measure_call(f"n={limits.MAX_CLAIM:,}, {big:,} due tasks with 1 MiB payloads", call)


def case_reports(p: Probe) -> None:
    """heartbeat, release, complete, fail: MAX_REPORTS_PER_CALL claims in one call, each
    task with a dependent (settled by the call) and errors of MAX_ERROR_BYTES; then
    forget and purge of as many terminal tasks as they take; finish with both halves at
    their caps."""
    count = p.n(limits.MAX_REPORTS_PER_CALL)
    ids = p.fill("r", count)
    p.one_dependent_each(ids)
    claims = p.claim_all(count)
    n = len(claims)
    beat = heartbeat_call(p.keys, claims, LEASE_MS)
    p.measure_call(f"{n:,} leases", beat)
    back = release_call(p.keys, claims)
    p.measure_call(f"{n:,} leases", back)
    claims = p.claim_all(count)
    done = complete_call(p.keys, [(c, None) for c in claims])
    p.measure_call(f"{len(claims):,} tasks, each releasing a dependent", done)
    forget = forget_call(p.keys, ids[: validate.PURGE_TASKS_MAX])
    p.measure_call(f"{min(count, validate.PURGE_TASKS_MAX):,} succeeded tasks", forget)
    ids = p.fill("f", count)
    p.one_dependent_each(ids)
    claims = p.claim_all(count)
    error = "E" * limits.MAX_ERROR_BYTES
    fail = fail_call(p.keys, [(c, error) for c in claims])
    kib = limits.MAX_ERROR_BYTES // 1024
    p.measure_call(
        f"{len(claims):,} last attempts, {kib} KiB errors, each blocking a dependent", fail
    )
    purge = purge_call(p.keys, validate.PURGE_TASKS_MAX, retention_s=0)
    p.measure_call(f"limit {validate.PURGE_TASKS_MAX:,}, {2 * count:,} ended tasks", purge)
    # Both halves at their caps in one call: as many reports, each releasing a dependent,
    # then a claim of MAX_CLAIM with that many due tasks behind them.
    ids = p.fill("g", count)
    p.one_dependent_each(ids)
    claims = p.claim_all(count)
    due = p.n(limits.MAX_CLAIM)
    p.fill("h", due)
    claim = claim_call(p.keys, WORKER, limits.MAX_CLAIM, LEASE_MS)
    both = finish_call(p.keys, [(c, None) for c in claims], claim)
    p.measure_call(
        f"{len(claims):,} reports each releasing a dependent, then n={limits.MAX_CLAIM:,}", both
    )


def case_fanout(p: Probe) -> None:
    """cancel, propagate, retry: a task with many dependents cancelled at
    MAX_PROPAGATE_BUDGET, settled, then retried with its cascade, settled again."""
    dependents = p.n(100_000)
    p.fill("root", 1, delay=FAR_DELAY_S)
    p.fill("d", dependents, deps=["root0"])
    calls = math.ceil(dependents / limits.MAX_PROPAGATE_BUDGET) + 3
    cancel = Call("cancel", p.keys.for_script("cancel"), [limits.MAX_PROPAGATE_BUDGET, "root0"])
    p.measure_call(f"a task with {dependents:,} dependents", cancel)
    p.settle_all(f"{dependents:,} dependents of a cancelled task", calls)
    retry = Call("retry", p.keys.for_script("retry"), [limits.MAX_PROPAGATE_BUDGET, "root0", "1"])
    p.measure_call(f"cascade over {dependents:,} blocked dependents", retry)
    p.settle_all(f"{dependents:,} dependents of a retried task", calls)


def case_deps(p: Probe) -> None:
    """add_deps, fail, propagate: a task's MAX_DEPS_PER_TASK dependencies placed in parts
    of MAX_EDGES_PER_CALL, then one of them fails, so the task is blocked and its
    edges unlinked."""
    total = p.n(limits.MAX_DEPS_PER_TASK)
    part = min(limits.MAX_EDGES_PER_CALL, validate.MAX_DEPS)
    p.fill("first", 1)
    deps = ["first0", *p.fill("d", total - 1, delay=FAR_DELAY_S)]
    p.fill("t", 1, deps=deps[:1], max_attempts=1)
    for i, start in enumerate(range(1, total, part)):
        call = add_deps_call(p.keys, "t0", deps[start : start + part], False)
        held = start + min(part, total - start)
        p.measure_call(f"part {i + 1} of {total:,} dependencies ({held:,} held after it)", call)
    claims = p.claim_all(1)
    fail = fail_call(p.keys, [(c, "E") for c in claims])
    p.measure_call(f"the dependency of a task with {total:,} dependencies", fail)
    p.settle_all(f"a blocked task with {total:,} dependencies", total // part + 3)


def case_cycle(p: Probe) -> None:
    """schedule, add_deps: closing a cycle through a pending chain of MAX_CYCLE_VISITS
    tasks (refused with the cycle, or past the visit bound)."""
    length = p.n(limits.MAX_CYCLE_VISITS - 1)
    p.fill("root", 1, delay=FAR_DELAY_S)
    per = limits.MAX_TASKS_PER_CALL
    for start in range(0, length, per):
        specs = [
            TaskSpec(f"c{i}", FN, deps=[f"c{i - 1}" if i else "root0"])
            for i in range(start, min(length, start + per))
        ]
        p.run(schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES))
    last = f"c{length - 1}"
    replace = schedule_call(
        p.keys, [TaskSpec("c0", FN, deps=[last])], limits.DEFAULT_MAX_PAYLOAD_BYTES
    )
    p.measure_call(f"a task closing a cycle through {length:,} pending tasks", replace)
    add = add_deps_call(p.keys, "c0", [last], False)
    p.measure_call(f"a dependency closing a cycle through {length:,} pending tasks", add)


def case_compact(p: Probe) -> None:
    """compact: MAX_COMPACT_BUDGET per call over a queue of stale entries only."""
    budget = p.n(limits.MAX_COMPACT_BUDGET)
    stale = 2 * budget
    # Entries of tasks whose records are gone: each examined entry is removed.
    members = [records.queue_member(0, 1, f"gone{i}") for i in range(stale)]
    for chunk in chunks(members, 10_000):
        p.client.zadd(p.keys.queue, {m: 0 for m in chunk})
    call = compact_call(p.keys, budget, 0)
    for i in range(2):
        p.measure_call(f"budget {budget:,}, {stale:,} stale queue entries, call {i + 1}", call)


def case_order(p: Probe) -> None:
    """order: a change of order rewriting the ready set at its most; claim in the
    priority order."""
    count = p.n(ORDER_REWRITE_MAX)
    ids = [f"o{i}" for i in range(count)]
    per = limits.MAX_TASKS_PER_CALL
    for start in range(0, count, per):
        specs = [
            TaskSpec(task_id, FN, priority=i % 10)
            for i, task_id in enumerate(ids[start : start + per], start)
        ]
        p.run(schedule_call(p.keys, specs, limits.DEFAULT_MAX_PAYLOAD_BYTES))
    p.measure(
        "order", f"to priority, {count:,} ready tasks", lambda: p.s.set_order("priority", 60.0)
    )
    call = claim_call(p.keys, WORKER, limits.MAX_CLAIM, LEASE_MS)
    p.measure_call(f"n={limits.MAX_CLAIM:,} in priority order, {count:,} ready", call)
    p.measure("order", f"to default, {count:,} ready tasks", lambda: p.s.set_order("default"))


def case_leases(p: Probe) -> None:
    """confirm_cancel, leave, reap, expire: confirming the cancel of a running task with
    dependents; a worker leaving; a batch of expired leases and of expired deadlines."""
    dependents = p.n(2 * limits.MAX_PROPAGATE_BUDGET)
    p.fill("x", 1)
    p.fill("xd", dependents, deps=["x0"])
    claims = p.claim_all(1)
    p.s.cancel("x0")
    confirm = confirm_cancel_call(p.keys, claims[0])
    p.measure_call(f"a running task with {dependents:,} dependents", confirm)
    worker = "w" * limits.MAX_WORKER_ID_BYTES
    leave = leave_call(p.keys, worker)
    p.measure_call(f"a worker id of {limits.MAX_WORKER_ID_BYTES} bytes", leave)
    count = p.n(REAP_BATCH)
    p.fill("l", count, max_attempts=2)
    p.claim_all(count, lease_ms=1)
    expiring = p.n(EXPIRE_BATCH)
    p.fill("e", expiring, ttl=0.001)
    time.sleep(0.05)
    reap = reap_call(p.keys)
    p.measure_call(f"limit {REAP_BATCH:,}, {count:,} expired leases", reap)
    expire = expire_call(p.keys)
    p.measure_call(f"limit {EXPIRE_BATCH:,}, {expiring:,} expired deadlines", expire)


def case_schedules(p: Probe) -> None:
    """recur, fire, fairness: a schedule put, a backfill of its most slots, a key set."""
    now = p.s.server_time()
    slots = MAX_BACKFILL_SLOTS
    p.measure(
        "recur",
        "a new interval schedule",
        lambda: p.s.add_schedule(
            "every", FN, interval=1.0, start=now - slots - 60, overlap="allow"
        ),
    )
    p.measure(
        "fire",
        f"a backfill of {slots:,} slots",
        lambda: p.s.backfill("every", now - slots - 30, now - 1, limit=slots),
    )
    p.measure(
        "fairness", "a key's cap, weight and rate", lambda: p.s.set_key("tenant", 10, 2, 100, 1.0)
    )


def case_workflows(p: Probe) -> None:
    """amend, pause, progress, dep_results, waitpoint, spawn: a task moved and paused in a
    full queue, a checkpoint at its cap, a join reading MAX_DEP_RESULTS results at the
    byte cap, a waitpoint completed with a payload, a spawn of MAX_SPAWN_CHILDREN children
    with a window and a counting join."""
    queued = p.fill("q", p.n(limits.MAX_TASKS_PER_CALL * 4))
    p.measure(
        "amend",
        f"a task moved in a queue of {len(queued):,}",
        lambda: p.s.amend(queued[-1], priority=9),
    )
    p.measure("pause", "a queued task paused", lambda: p.s.pause_task(queued[-1]))
    p.measure("pause", "a queued task resumed", lambda: p.s.resume_task(queued[-1]))
    p.s.clear()
    n = p.n(limits.MAX_DEP_RESULTS)
    size = limits.MAX_DEP_RESULT_BYTES // n - 4
    parents = p.fill("p", n)
    done = 0
    while done < n:
        claims = p.claim_all(min(limits.MAX_REPORTS_PER_CALL, n - done))
        if not claims:
            break
        p.run(complete_call(p.keys, [(c, "x" * size) for c in claims]))
        done += len(claims)
    p.s.submit("join", fn=FN, deps=parents)
    p.measure(
        "dep_results",
        f"a join over {n:,} results at the byte cap",
        lambda: p.s.dependency_results("join"),
    )
    p.s.clear()
    (running,) = p.claim_all(len(p.fill("run", 1)))
    checkpoint = "c" * (limits.MAX_CHECKPOINT_BYTES - 8)
    p.measure(
        "progress", "a checkpoint at its cap", lambda: p.s.save_checkpoint(running, checkpoint)
    )
    p.s.create_waitpoint("approve", 3600, deps=[])
    p.fill("after", 1, deps=["approve"])
    p.measure(
        "waitpoint",
        "a completion with a payload, releasing a dependent",
        lambda: p.s.complete_waitpoint("approve", {"ok": True}),
    )
    children = [TaskSpec(f"spawned:{i}", FN) for i in range(p.n(limits.MAX_SPAWN_CHILDREN))]
    spawn = Spawn(children, join=TaskSpec("spawned:join", FN), rule=JoinRule.at_least(1), window=10)
    p.measure(
        "spawn",
        f"{len(children):,} children with a window and a join",
        lambda: p.s.spawn(running, spawn),
    )


CASES: dict[str, Callable[[Probe], None]] = {
    "batch": case_batch,
    "claim": case_claim,
    "reports": case_reports,
    "fanout": case_fanout,
    "deps": case_deps,
    "cycle": case_cycle,
    "compact": case_compact,
    "order": case_order,
    "leases": case_leases,
    "workflows": case_workflows,
    "schedules": case_schedules,
}


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
