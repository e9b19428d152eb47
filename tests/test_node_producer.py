"""§9: lua/README.md (with lua/STORAGE.md) is complete, and a Node producer written from it works.

``tests/node/producer.js`` uses npm's ``ioredis`` and ``@msgpack/msgpack``: it assembles and
hashes the scripts itself, loads them on NOSCRIPT, settles on BUSY, and reads records and
results in the documented formats. Its dependencies are installed with ``npm ci`` into
``tests/node/node_modules`` once per session. Without ``node`` or ``npm`` the test is skipped
with the reason, except under ``CI=true``, where that is a failure. The other tests here
check that the document names every key, ``meta`` field, wake-up message and limit the code
uses.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import msgpack
import pytest
import redis

from distsched import Scheduler, State, Worker, scripts, validate
from distsched.keys import KEY_NAMES, MAX_NAMESPACE_BYTES, Keys
from distsched.lua_files import SCRIPT_NAMES, script_keys
from tests.cluster_fixtures import LocalCluster, close_cluster_client
from tests.conftest import IN_CI, RedisServer, free_port, running, stored_payload

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE_TIMEOUT_S = 60
NPM_TIMEOUT_S = 90


def unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def node() -> str:
    """The ``node`` binary, with the producer's npm dependencies installed."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        unavailable("node and npm are not both on PATH (install Node.js 18 or later with npm)")
    proc = subprocess.run(
        [npm_bin, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
    )
    if proc.returncode != 0:
        unavailable(f"npm ci in {NODE_DIR} failed: {proc.stderr.strip()[-2000:]}")
    return node_bin


def run_producer(node: str, url: str, namespace: str, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [node, str(NODE_DIR / "producer.js"), url, namespace, mode],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def wait_until(done: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_node_producer_following_the_document_enqueues_tasks_that_a_worker_runs(
    node: str, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    try:
        check_node_producer(node, own_redis.url, client, "node")
    finally:
        client.close()


def test_the_node_producer_works_against_a_redis_cluster_given_two_seeds_one_of_them_down(
    node: str,
) -> None:
    """Scripts loaded on NOSCRIPT on every master, MOVED followed by the client, and a
    cluster URL of several seeds: the first names no live node."""
    cluster = LocalCluster(masters=3, replicas=0)
    try:
        url = f"redis+cluster://127.0.0.1:{free_port()},{cluster.seed.address}"
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.seed.port)
        try:
            check_node_producer(node, url, client, "node")
        finally:
            close_cluster_client(client)
    finally:
        cluster.close()


def check_node_producer(
    node: str, url: str, client: redis.Redis | redis.RedisCluster, namespace: str
) -> None:
    enqueued = run_producer(node, url, namespace, "enqueue")

    versions = enqueued["versions"]
    assert versions["sum"] < versions["hi"] < versions["bare"] < versions["parent"]
    assert versions["gate_again"] > versions["gate"]
    records = enqueued["records"]
    # The batch of two, read back through the record format and the queue member.
    assert (records["sum"]["state"], records["sum"]["priority"]) == ("r", 5)
    assert records["sum"]["version"] == versions["sum"]
    assert enqueued["sum_queue_score"] == records["sum"]["run_at_ms"]
    assert records["child"]["state"] == "p" and records["child"]["remaining"] == 1
    # Cancelled while queued: it never runs.
    assert enqueued["cancel_reply"] == [0, "cancelled"]
    assert records["doomed"]["state"] == "c"
    # A budget of one edge left two dependents to tell: the re-schedule of the cancelled
    # task met BUSY, settled with propagate.lua, and went through.
    assert enqueued["gate_cancel_reply"] == [1, "cancelled"]
    assert enqueued["blocked_before_settling"] == 1
    assert enqueued["calls"]["busy"] == 1 and enqueued["calls"]["propagate_calls"] >= 1
    assert [records[g]["state"] for g in ("g0", "g1", "g2")] == ["b", "b", "b"]
    assert enqueued["blocked_cause_g0"] == {"root": "gate", "parent": "gate"}
    assert records["gate"]["state"] == "r" and records["gate"]["version"] == versions["gate_again"]
    assert enqueued["propagating"] == 0
    # Each script was loaded on NOSCRIPT from the producer's own text and hash.
    assert enqueued["calls"]["noscript"] == 3
    # Errors as ioredis shows them: the wire error without its '-'.
    assert enqueued["errors"]["notfound"] == {
        "name": "ReplyError",
        "message": "NOTFOUND no-such-task",
    }
    assert enqueued["errors"]["unknown"]["message"] == (
        f"UNKNOWN {b'orphan'.hex()} {b'missing'.hex()}"
    )
    assert enqueued["counts"] == {"ready": 5, "pending": 1, "cancelled": 1, "blocked": 3}
    # What the scripts refuse, whoever sends it: BADARG naming the field, nothing written.
    refusals = enqueued["refusals"]
    assert refusals["non_utf8_id"] == {
        "name": "ReplyError",
        "message": "BADARG task_id must be valid UTF-8",
    }
    assert refusals["priority"]["message"] == "BADARG priority out of range"
    assert refusals["kwargs"]["message"] == "BADARG payload of odd field kwargs must be a map"
    assert enqueued["unchanged_after_refusals"] is True
    # `bare` was sent with kwargs undefined, which the encoder wrote as nil.
    raw: Any = stored_payload(client, Keys(namespace), "bare")
    assert msgpack.unpackb(raw, raw=False) == {"fn": "add", "args": [4, 5], "kwargs": None}

    received: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    lock = threading.Lock()

    def add(*args: Any, **kwargs: Any) -> int:
        with lock:
            received.append(("add", args, kwargs))
        return int(sum(args) * kwargs.get("scale", 1))

    def greet(*args: Any, **kwargs: Any) -> str:
        with lock:
            received.append(("greet", args, kwargs))
        return f"hello {kwargs['name']}"

    ran = ("sum", "hi", "bare", "parent", "child", "gate")
    s = Scheduler.from_url(url, namespace=namespace, lease_s=5.0)
    try:
        worker = Worker(s, {"add": add, "greet": greet}, concurrency=2)
        with running(worker):
            wait_until(lambda: all(s.status(t).state is State.SUCCEEDED for t in ran))
        blocked_by = s.status("g1").blocked_by
        assert blocked_by is not None and blocked_by.root == "gate"
    finally:
        s.close()

    assert sorted(received, key=repr) == sorted(
        [
            ("add", (2, 3), {"scale": 10}),
            ("greet", (), {"name": "wörld"}),
            ("add", (4, 5), {}),  # `bare`: a nil kwargs is none
            ("add", (1,), {"scale": 1}),
            ("add", (7,), {"scale": 1}),
            ("add", (100,), {"scale": 1}),
        ],
        key=repr,
    )
    # The dependency ran first.
    order = [args for _, args, _ in received]
    assert order.index((1,)) < order.index((7,))

    report = run_producer(node, url, namespace, "report")
    states = {task: record["state"] for task, record in report["records"].items()}
    assert states == {
        "sum": "s", "hi": "s", "bare": "s", "parent": "s", "child": "s", "gate": "s",
        "doomed": "c", "g0": "b", "g1": "b", "g2": "b",
    }  # fmt: skip
    assert all(report["records"][task]["attempt"] == 1 for task in ran)
    assert report["records"]["doomed"]["attempt"] == 0
    results = report["results"]
    assert {task: results[task] for task in ran} == {
        "sum": {"result": 50},
        "hi": {"result": "hello wörld"},
        "bare": {"result": 9},
        "parent": {"result": 1},
        "child": {"result": 7},
        "gate": {"result": 100},
    }
    assert results["doomed"] is None and results["g0"] is None


# --------------------------------------------------------------------------- a complete document

LUA = Path(__file__).resolve().parent.parent / "lua"
# The wire protocol, and the storage reference: every key and its layout.
README = (LUA / "README.md").read_text("utf-8")
STORAGE = (LUA / "STORAGE.md").read_text("utf-8")
LUA_FILES = sorted(LUA.rglob("*.lua"))


def doc_section(heading: str, doc: str = README) -> str:
    """The text of ``doc`` under ``heading`` up to the next heading of any level."""
    return doc.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]


def lua_code() -> str:
    """Every script and library part, comments left out."""
    lines = (
        line.split("--", 1)[0] for f in LUA_FILES for line in f.read_text("utf-8").splitlines()
    )
    return "\n".join(lines)


def test_the_document_describes_every_key_of_a_namespace() -> None:
    data = doc_section("## Keys", STORAGE)
    keys = Keys("NS")
    names = [*KEY_NAMES, "served", "workers"]
    for name in names:
        assert f"| `{getattr(keys, name)}` |" in data, name
    described = re.findall(r"^\| `ds:\{NS\}:(\w+)` \|", data, re.M)
    assert sorted(described) == sorted(names)


def test_the_keys_table_and_every_call_example_give_each_script_its_own_keys() -> None:
    """What a producer copies from the page: the KEYS of each script in order, and the
    number of keys of every ``EVALSHA``/``FCALL`` line shown."""
    table = dict(re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| ([a-z ]+) \|$", README, re.M))
    listed: dict[str, tuple[str, ...]] = {}
    for names, keys in table.items():
        for name in re.findall(r"`(\w+)`", names):
            listed[name] = tuple(keys.split())
    assert {n: listed.get(n) for n in SCRIPT_NAMES} == {n: script_keys(n) for n in SCRIPT_NAMES}
    examples = re.findall(r"EVALSHA <(\w+) sha> (\d+) ", README)
    assert examples, "no EVALSHA example found: the pattern no longer matches the page"
    for name, count in examples:
        assert int(count) == len(script_keys(name)), name


def test_the_document_names_every_meta_field_the_scripts_use() -> None:
    code = lua_code()
    fields = set(re.findall(r"k\.meta,\s*'([a-z_]+:?)", code))
    # Fields read through lib/run.lua's meta_fields (one read per call).
    for names in re.findall(r"meta_fields\(([^)]*)\)", code):
        fields |= set(re.findall(r"'([a-z_]+:?)", names))
    assert {"seq", "pseq", "max_running", "count:"} <= fields
    table = doc_section("## Meta fields", STORAGE)
    first_cells = re.findall(r"^\|([^|]*)\|", table, re.M)
    documented = {name for cell in first_cells for name in re.findall(r"`([a-z_]+:?)", cell)}
    assert fields <= documented
    # Fields written outside the scripts, through a scheduler, are listed too.
    assert "max_running" in documented


def test_the_document_lists_every_wake_up_message_the_scripts_publish() -> None:
    published = r"publish\([^,]+,\s*(?:string\.format\()?'(\w+)"
    messages = {m.group(1) for m in re.finditer(published, lua_code())}
    assert {"ready", "cancel"} <= messages
    # Raised capacity is published by the client that raised it (set_max_running).
    messages.add("capacity")
    table = doc_section("## Wake-ups")
    rows = re.findall(r"^\| `[^`]+` \| `([^`]+)` \|", table, re.M)
    documented = {m.split()[0] for m in rows}
    assert messages <= documented


def test_the_documented_limits_are_the_limits_the_python_client_enforces() -> None:
    limits = doc_section("## Limits")
    rows = {
        "task id": f"1 to {validate.MAX_TASK_ID_BYTES} bytes",
        "namespace": f"1 to {MAX_NAMESPACE_BYTES} bytes",
        "priority": f"[{validate.PRIORITY_MIN}, {validate.PRIORITY_MAX}]",
        "`max_attempts`": f"[1, {validate.MAX_ATTEMPTS_LIMIT}]",
        "backoff": f"[0, {int(validate.BACKOFF_MAX_S * 1000)}]",
        "dependencies": f"at most {validate.MAX_DEPS} per task",
        "payload": f"at most {validate.DEFAULT_MAX_PAYLOAD_BYTES} bytes",
    }
    for row, limit in rows.items():
        [line] = [line for line in limits.splitlines() if line.startswith(f"| {row}")]
        assert limit in line, row
    assert validate.MAX_MS == 2**53 - 1 and "2^53 - 1" in limits
    assert validate.MAX_DELAY_MS == 2**52 and "2^52" in limits


def resp_command(*args: bytes | str | int) -> bytes:
    out = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


def first_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    return data.split(b"\r\n", 1)[0] + b"\r\n"


def test_redis_and_script_errors_arrive_on_the_wire_as_the_document_shows(
    own_redis: RedisServer,
) -> None:
    keys = Keys("wire").for_script("cancel")
    cancel = scripts.source("cancel")
    errors = doc_section("### Errors")
    with (
        socket.create_connection(("127.0.0.1", own_redis.port), timeout=10) as sock,
        socket.create_connection(("127.0.0.1", own_redis.port), timeout=10) as other,
    ):

        def send(*args: bytes | str | int) -> bytes:
            sock.sendall(resp_command(*args))
            return first_line(sock)

        def call_cancel(task_id: str) -> bytes:
            return send("EVAL", cancel, len(keys), *keys, 1000, task_id)

        # A key of another type: Redis's own error keeps its code.
        assert send("SET", keys[0], "x") == b"+OK\r\n"
        wrongtype = call_cancel("a")
        assert wrongtype.startswith(b"-WRONGTYPE ")
        assert f"`{wrongtype[:-2].decode()}`" in errors
        assert send("DEL", keys[0]) == b":1\r\n"
        # A stored record that does not parse.
        assert send("HSET", keys[0], "a", "junk") == b":1\r\n"
        assert call_cancel("a").startswith(b"-CORRUPT ")
        # Redis's own BUSY while another script runs past busy-reply-threshold.
        assert send("CONFIG", "SET", "busy-reply-threshold", "100") == b"+OK\r\n"
        spin = (
            "local e = tonumber(redis.call('TIME')[1]) + 2 "
            "while tonumber(redis.call('TIME')[1]) < e do end return 1"
        )
        other.sendall(resp_command("EVAL", spin, 0))
        deadline = time.monotonic() + 10
        while True:
            busy = call_cancel("a")
            if busy.startswith(b"-BUSY ") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert busy == (
            b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or "
            b"SHUTDOWN NOSAVE.\r\n"
        )
        assert first_line(other) == b":1\r\n"
    assert " ".join(busy[:-2].decode().split()) in " ".join(errors.split())
