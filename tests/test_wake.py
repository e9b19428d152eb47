"""§3 wake-ups: a new task wakes at most as many idle workers as there are tasks to claim.

Idle workers register in the namespace's idle set from the claim script; a script that
makes tasks due pops one idle worker per task and publishes on its own channel (sharded
pub/sub). One idle worker holds the timer for a head that is not due yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from distsched import Scheduler, State, TaskInfo, Wait, Worker, current_task
from distsched.model import WaitReason
from distsched.wire.calls import IDLE_RECHECK_S
from distsched.worker.link import WorkerLink
from tests.conftest import RedisServer, python_command, running, subprocess_env
from tests.test_cluster import cluster, three_masters  # noqa: F401  (the fixtures)


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def wait_state(s: Scheduler, task_id: str, *states: State, timeout: float = 10.0) -> TaskInfo:
    info = s.status(task_id)
    deadline = time.monotonic() + timeout
    while info.state not in states:
        assert time.monotonic() < deadline, f"{task_id} stayed {info.state}"
        time.sleep(0.01)
        info = s.status(task_id)
    return info


# Every command that runs a script: the client calls by FCALL, by EVALSHA where functions
# are refused, and reads may go by the read-only variants.
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")


def script_calls(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS)


def new_namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


@contextmanager
def worker_processes(url: str, namespace: str, count: int) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` worker processes (tests/worker_procs.py, concurrency 1, 30 s leases)."""
    procs = [
        subprocess.Popen(
            python_command(
                "tests/worker_procs.py",
                "worker",
                url,
                namespace,
                "--concurrency",
                "1",
                "--lease",
                "30",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=subprocess_env(),
        )
        for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def trickle(producer: Scheduler, prefix: str, count: int) -> None:
    """Tasks one at a time, each finished before the next is scheduled."""
    for i in range(count):
        producer.schedule(f"{prefix}{i}", fn="sleep", args=(0,))
        wait_state(producer, f"{prefix}{i}", State.SUCCEEDED)


def script_calls_per_task(server: RedisServer, idle_workers: int, tasks: int) -> float:
    namespace = new_namespace()
    admin = server.client()
    producer = Scheduler(server.client(), namespace=namespace, lease_s=30.0)
    try:
        with worker_processes(server.url, namespace, idle_workers):
            idle = producer.keys.idle
            wait_until(lambda: admin.zcard(idle) == idle_workers, 30, "every worker to go idle")
            trickle(producer, "warm", 3)
            wait_until(lambda: admin.zcard(idle) == idle_workers, 10, "every worker idle again")
            before = script_calls(admin)
            trickle(producer, "t", tasks)
            return (script_calls(admin) - before) / tasks
    finally:
        producer.close()
        producer.client.close()  # given to the scheduler, which leaves it open
        admin.close()


def test_script_calls_per_task_do_not_grow_with_the_number_of_idle_worker_processes(
    own_redis: RedisServer,
) -> None:
    one = script_calls_per_task(own_redis, 1, 20)
    six = script_calls_per_task(own_redis, 6, 20)
    # schedule, claim, complete, and the claim that finds the queue empty again (one slot
    # per worker); before, each other idle worker ran one more claim per task.
    # Counted at all: a count that misses the command the scripts run by reads 0.
    assert 3.5 <= one <= 4.5, f"{one} script calls per task with one worker"
    assert six <= one + 0.5, f"{six} script calls per task with six idle workers, {one} with one"


def test_a_killed_idle_worker_does_not_lose_a_task(own_redis: RedisServer) -> None:
    namespace = new_namespace()
    admin = own_redis.client()
    producer = Scheduler(own_redis.client(), namespace=namespace, lease_s=30.0)
    try:
        with worker_processes(own_redis.url, namespace, 2) as procs:
            idle = producer.keys.idle
            wait_until(lambda: admin.zcard(idle) == 2, 30, "both workers to go idle")
            # The entry a new task would wake first: kill its process, so that the wake-up
            # goes to a dead worker (the default worker id holds the process id).
            (first,) = cast(list[bytes], admin.zrange(idle, 0, 0))
            pid = int(first.decode().split(":w:", 1)[1].split(":")[1])
            (victim,) = [p for p in procs if p.pid == pid]
            os.kill(pid, signal.SIGKILL)
            victim.wait(10)
            producer.schedule("t", fn="sleep", args=(0,))
            # The live worker finds it on its re-check, at the latest.
            wait_state(producer, "t", State.SUCCEEDED, timeout=IDLE_RECHECK_S + 3.0)
            # The dead worker's entry took one wake-up and is gone.
            assert admin.zcard(idle) == 1
    finally:
        producer.close()
        producer.client.close()
        admin.close()


def test_a_task_scheduled_while_every_worker_is_idle_starts_within_milliseconds(
    redis_server: RedisServer,
) -> None:
    namespace = new_namespace()
    s = Scheduler(redis_server.client(), namespace=namespace, lease_s=30.0)
    producer = Scheduler(redis_server.client(), namespace=namespace, lease_s=30.0)
    starts: dict[str, float] = {}

    def mark() -> None:
        starts[current_task().task_id] = s.server_time()

    workers = [Worker(s, {"mark": mark}, concurrency=2) for _ in range(3)]
    try:
        with running(workers[0]), running(workers[1]), running(workers[2]):
            wait_until(lambda: producer.client.zcard(s.keys.idle) == 3, 10, "idle workers")
            for i in range(5):
                producer.schedule(f"now-{i}", fn="mark")
                wait_state(producer, f"now-{i}", State.SUCCEEDED)
                time.sleep(0.05 + 0.07 * i)
        for i in range(5):
            latency = starts[f"now-{i}"] - producer.status(f"now-{i}").run_at
            # Far below the re-check interval: a wake-up, not a re-check, started it.
            assert latency < 0.5, f"task now-{i} started {latency:.3f}s after it was due"
    finally:
        s.close()
        producer.close()
        # The schedulers were given their clients: they leave them open.
        s.client.close()
        producer.client.close()


def test_only_one_idle_worker_gets_the_delay_hint_for_a_head_not_due_yet(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule("later", fn="f", delay=30)
    first = scheduler.claim(4, "w1", listening=True)
    second = scheduler.claim(4, "w2", listening=True)
    assert first[0] == [] and first[1] is not None
    assert first[1].reason is WaitReason.NOT_DUE and first[1].delay is not None
    assert 29 < first[1].delay <= 30
    assert second == ([], Wait(WaitReason.NOT_DUE, None))
    # The holder claiming again keeps the timer; a caller that does not listen always
    # gets the hint.
    again = scheduler.claim(4, "w1", listening=True)[1]
    assert again is not None and again.delay is not None
    plain = scheduler.claim(4, "w3")[1]
    assert plain is not None and plain.delay is not None
    # An earlier head moves the timer to whoever claims first.
    scheduler.schedule("sooner", fn="f", delay=10)
    moved = scheduler.claim(4, "w2", listening=True)[1]
    assert moved is not None and moved.delay is not None and moved.delay <= 10


def test_a_new_task_wakes_one_idle_worker_on_its_own_channel(scheduler: Scheduler) -> None:
    client = scheduler.client
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        channels = [scheduler.keys.worker_channel(w) for w in ("w1", "w2")]
        pubsub.ssubscribe(*channels)
        for worker_id in ("w1", "w2"):
            assert scheduler.claim(1, worker_id, listening=True)[0] == []
        scheduler.schedule("a", fn="f")
        messages = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=0.1)
            if msg is not None:
                messages.append((msg["channel"], msg["data"]))
        # The longest waiting one, and only it.
        assert messages == [(channels[0].encode(), b"ready")]
        assert client.zrange(scheduler.keys.idle, 0, -1) == [channels[1].encode()]
    finally:
        pubsub.close()


def test_a_stale_idle_entry_takes_no_wake_up(scheduler: Scheduler) -> None:
    client = scheduler.client
    dead, live = (scheduler.keys.worker_channel(w) for w in ("dead", "live"))
    now_ms = int(scheduler.server_time() * 1000)
    client.zadd(scheduler.keys.idle, {dead: now_ms - 1000, live: now_ms + 60_000})
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.ssubscribe(live)
        scheduler.schedule("a", fn="f")
        msg = None
        deadline = time.monotonic() + 2.0
        while msg is None and time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=0.1)
        assert msg is not None and msg["channel"] == live.encode()
        assert client.zcard(scheduler.keys.idle) == 0
    finally:
        pubsub.close()


def test_an_idle_worker_survives_a_task_due_in_the_far_future(redis_server: RedisServer) -> None:
    s = Scheduler(redis_server.client(), namespace=new_namespace(), lease_s=30.0)
    ran: list[str] = []
    try:
        s.schedule("far", fn="rec", args=("far",), delay=1e10)
        worker = Worker(s, {"rec": ran.append}, concurrency=1)
        with running(worker):
            wait_until(lambda: s.client.zcard(s.keys.idle) == 1, 10, "the worker to go idle")
            s.schedule("now", fn="rec", args=("now",))
            wait_state(s, "now", State.SUCCEEDED)
        assert ran == ["now"]
    finally:
        s.close()
        s.client.close()


def test_a_worker_refused_its_subscription_still_runs_new_tasks(own_redis: RedisServer) -> None:
    namespace = new_namespace()
    user, password = f"nosub-{namespace}", uuid.uuid4().hex
    admin = own_redis.client()
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", f">{password}",
        "resetkeys", "~ds:*", "resetchannels",
        "-@all", "+@read", "+@write", "+@scripting", "+@connection", "+@pubsub", "+time",
    )  # fmt: skip
    s = Scheduler(own_redis.client(username=user, password=password), namespace=namespace)
    producer = Scheduler(admin, namespace=namespace)
    ran: list[str] = []
    try:
        worker = Worker(s, {"rec": ran.append}, concurrency=1)
        with running(worker):
            wait_until(lambda: admin.zcard(s.keys.idle) == 1, 10, "the worker to go idle")
            time.sleep(0.3)  # the listener has been refused at least once by now
            listeners = [t for t in threading.enumerate() if t.name == "distsched-listener"]
            assert listeners and all(t.is_alive() for t in listeners)
            producer.schedule("t", fn="rec", args=("t",))
            wait_state(producer, "t", State.SUCCEEDED, timeout=IDLE_RECHECK_S + 3.0)
        assert ran == ["t"]
    finally:
        s.close()
        producer.close()
        # The schedulers were given their clients: they leave them open.
        s.client.close()
        producer.client.close()


def test_a_cancel_notice_reaches_a_subscriber_of_the_sharded_wake_channel(
    scheduler: Scheduler,
) -> None:
    pubsub = scheduler.client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.ssubscribe(scheduler.keys.wake)
        scheduler.schedule("a", fn="f")
        claim = scheduler.next("w")
        assert not isinstance(claim, Wait)
        assert scheduler.cancel("a") is State.RUNNING
        msg = None
        deadline = time.monotonic() + 2.0
        while msg is None and time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=0.1)
        assert msg is not None and msg["type"] == "smessage"
        assert msg["data"] == f"cancel {claim.version} a".encode()
    finally:
        pubsub.close()


# --------------------------------------------------------------------------- lost claim replies


@contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """SIGSTOP the server for the block: a command sent meanwhile sits in its socket, the
    client times out and gives up, and the server runs the command once it is resumed."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.proc.send_signal(signal.SIGCONT)


def no_retries_client(server: RedisServer) -> redis.Redis:
    # The call is sent once, and times out (redis-py would otherwise send it again).
    return server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))


def test_a_claim_sent_again_with_its_request_id_gets_the_same_tasks(scheduler: Scheduler) -> None:
    scheduler.schedule("a", fn="f")
    scheduler.schedule("b", fn="f")
    first, _ = scheduler.claim(1, "w", request_id="r1")
    again, wait = scheduler.claim(1, "w", request_id="r1")
    assert [c.token for c in again] == [c.token for c in first] and wait is None
    assert scheduler.status("b").state is State.READY
    # A new request claims anew.
    (other,), _ = scheduler.claim(1, "w", request_id="r2")
    assert other.task_id == "b"


def test_what_a_claim_whose_reply_was_lost_claimed_goes_back_without_spending_an_attempt(
    own_redis: RedisServer,
) -> None:
    admin = own_redis.client()
    s = Scheduler(no_retries_client(own_redis), namespace=new_namespace(), lease_s=60.0)
    try:
        assert s.claim(1, "warm-up")[0] == []  # the claim script is loaded
        s.schedule("a", fn="f")
        s.schedule("b", fn="f")
        with frozen(own_redis), pytest.raises(redis.ConnectionError):
            s.claim(2, "w", request_id="lost")
        # The script ran once the server was resumed.
        wait_until(lambda: s.status("a").state is State.RUNNING, 5, "the held claim to run")
        assert WorkerLink(s).hand_back_lost_claim("w", "other") == 0
        assert WorkerLink(s).hand_back_lost_claim("w", "lost") == 2
        for task_id in ("a", "b"):
            info = s.status(task_id)
            assert (info.state, info.attempt) == (State.READY, 0)
        assert WorkerLink(s).hand_back_lost_claim("w", "lost") == 0
    finally:
        s.close()
        s.client.close()
        admin.close()


def test_a_worker_whose_claim_reply_was_lost_runs_the_task_on_its_first_attempt(
    own_redis: RedisServer,
) -> None:
    admin = own_redis.client()
    namespace = new_namespace()
    # A lease far longer than the test: only the hand-back can free the task.
    s = Scheduler(no_retries_client(own_redis), namespace=namespace, lease_s=120.0)
    producer = Scheduler(admin, namespace=namespace, lease_s=120.0)
    attempts: list[int] = []
    try:
        worker = Worker(s, {"f": lambda: attempts.append(current_task().attempt)}, concurrency=1)
        with running(worker):
            wait_until(lambda: admin.zcard(s.keys.idle) == 1, 10, "the worker to go idle")
            # The worker waits for t by its timer; its claim at t's run_at reaches a frozen
            # server, times out, and runs on the server after the worker gave up on it.
            producer.schedule("t", fn="f", delay=0.5)
            time.sleep(0.4)
            with frozen(own_redis):
                time.sleep(1.0)
            wait_state(producer, "t", State.SUCCEEDED, timeout=15.0)
        assert attempts == [1]
    finally:
        s.close()
        producer.close()
        # The schedulers were given their clients: they leave them open.
        s.client.close()
        producer.client.close()


# --------------------------------------------------------------------------- cluster


def test_a_worker_on_a_cluster_is_woken_over_sharded_pub_sub(
    cluster: RedisCluster,  # noqa: F811  (the fixture imported above)
) -> None:
    s = Scheduler(cluster, namespace=new_namespace(), lease_s=30.0)
    starts: dict[str, float] = {}

    def mark() -> None:
        starts[current_task().task_id] = s.server_time()

    try:
        worker = Worker(s, {"mark": mark}, concurrency=2)
        with running(worker):
            wait_until(lambda: cluster.zcard(s.keys.idle) == 1, 10, "the worker to go idle")
            for i in range(3):
                s.schedule(f"t{i}", fn="mark")
                wait_state(s, f"t{i}", State.SUCCEEDED)
                time.sleep(0.1)
        for i in range(3):
            latency = starts[f"t{i}"] - s.status(f"t{i}").run_at
            # A wake-up, not the re-check, started it.
            assert latency < 0.5, f"t{i} started {latency:.3f}s after it was due"
    finally:
        s.close()


def test_the_worker_waiting_for_the_next_entry_passes_its_timer_on_when_it_stops(
    redis_server: RedisServer,
) -> None:
    s = Scheduler(redis_server.client(), namespace=new_namespace(), lease_s=30.0)
    starts: dict[str, float] = {}

    def mark() -> None:
        starts[current_task().task_id] = s.server_time()

    workers = {name: Worker(s, {"mark": mark}, concurrency=1, worker_id=name) for name in "ab"}
    try:
        with running(workers["a"]), running(workers["b"]):
            wait_until(lambda: s.client.zcard(s.keys.idle) == 2, 10, "both workers idle")
            s.schedule("later", fn="mark", delay=1.0)
            wait_until(lambda: s.client.hget(s.keys.meta, "timer"), 5, "a timer holder")
            holder = s.client.hget(s.keys.meta, "timer")
            assert isinstance(holder, bytes)
            name = holder.decode().rsplit(":", 1)[1]
            workers[name].stop()
            assert workers[name].wait_stopped(10)
            wait_state(s, "later", State.SUCCEEDED, timeout=10.0)
        latency = starts["later"] - s.status("later").run_at
        # The other worker took the timer over at once rather than at its re-check.
        assert latency < 0.5, f"started {latency:.3f}s after it was due"
    finally:
        s.close()
        s.client.close()  # given to the scheduler, which leaves it open


def move_slot(client: RedisCluster, key: str) -> None:
    """Migrate the slot of ``key``, with its keys, to another master (a resharding step)."""
    slot = client.keyslot(key)  # type: ignore[no-untyped-call]
    source_node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
    nodes = {n.name: redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()}  # type: ignore[no-untyped-call]
    try:
        ids = {name: node.execute_command("CLUSTER", "MYID") for name, node in nodes.items()}  # type: ignore[no-untyped-call]
        ids = {name: i.decode() if isinstance(i, bytes) else i for name, i in ids.items()}
        source = nodes[source_node.name]
        target_name = next(name for name in nodes if name != source_node.name)
        target = nodes[target_name]
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source_node.name])  # type: ignore[no-untyped-call]
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target_name])  # type: ignore[no-untyped-call]
        while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):  # type: ignore[no-untyped-call]
            host, port = (
                target.connection_pool.connection_kwargs["host"],
                target.connection_pool.connection_kwargs["port"],
            )
            source.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)  # type: ignore[no-untyped-call]
        for node in nodes.values():
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target_name])  # type: ignore[no-untyped-call]
    finally:
        for node in nodes.values():
            node.close()


def test_a_worker_on_a_cluster_is_still_woken_after_its_slot_moves(
    cluster: RedisCluster,  # noqa: F811  (the fixture imported above)
) -> None:
    s = Scheduler(cluster, namespace=new_namespace(), lease_s=30.0)
    starts: dict[str, float] = {}

    def mark() -> None:
        starts[current_task().task_id] = s.server_time()

    try:
        s.schedule("before", fn="mark")
        worker = Worker(s, {"mark": mark}, concurrency=2)
        with running(worker):
            wait_state(s, "before", State.SUCCEEDED)
            wait_until(lambda: cluster.zcard(s.keys.idle) == 1, 10, "the worker to go idle")
            move_slot(cluster, s.keys.idle)
            # The worker subscribes again on the new owner and claims once it has.
            time.sleep(1.0)
            wait_until(lambda: cluster.zcard(s.keys.idle) == 1, 10, "the worker idle again")
            for i in range(3):
                s.schedule(f"t{i}", fn="mark")
                wait_state(s, f"t{i}", State.SUCCEEDED)
                time.sleep(0.1)
        for i in range(3):
            latency = starts[f"t{i}"] - s.status(f"t{i}").run_at
            assert latency < 0.5, f"t{i} started {latency:.3f}s after it was due"
    finally:
        s.close()


def test_a_worker_whose_claims_are_refused_stays_up_and_claims_once_allowed(
    own_redis: RedisServer,
) -> None:
    namespace = new_namespace()
    user, password = f"noscript-{namespace}", uuid.uuid4().hex
    admin = own_redis.client()
    rules = ["resetkeys", "~ds:*", "resetchannels", "&ds:*", "+@all", "-evalsha", "-fcall"]
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)  # type: ignore[no-untyped-call]
    s = Scheduler(own_redis.client(username=user, password=password), namespace=namespace)
    producer = Scheduler(admin, namespace=namespace)
    ran: list[str] = []
    try:
        worker = Worker(s, {"rec": ran.append}, concurrency=1)
        producer.schedule("t", fn="rec", args=("t",))
        with running(worker) as thread:
            time.sleep(0.5)  # claims refused (NOPERM), again and again
            assert thread.is_alive() and ran == []
            # FCALL was refused: the client runs the scripts by EVALSHA from now on.
            admin.execute_command("ACL", "SETUSER", user, "+evalsha")  # type: ignore[no-untyped-call]
            wait_state(producer, "t", State.SUCCEEDED, timeout=10.0)
        assert ran == ["t"]
    finally:
        s.close()
        producer.close()
        # The schedulers were given their clients: they leave them open.
        s.client.close()
        producer.client.close()


def test_wait_for_wake_returns_when_a_task_is_scheduled(redis_server: RedisServer) -> None:
    s = Scheduler(redis_server.client(), namespace=new_namespace(), lease_s=30.0)
    woken: list[bool] = []
    try:
        waiter = threading.Thread(target=lambda: woken.append(WorkerLink(s).wait_for_wake(10.0)))
        waiter.start()
        time.sleep(0.2)
        s.schedule("now", fn="f")
        waiter.join(5.0)
        assert woken == [True]
    finally:
        s.close()
        s.client.close()
