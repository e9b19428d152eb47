"""§9: a producer written in another language, from lua/README.md and the script headers alone.

Nothing here comes from distsched except the worker that runs the tasks: the script texts are
assembled, hashed and sent, the payloads packed, and the records read as the document says.
"""

from __future__ import annotations

import hashlib
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
import redis

from distsched import Scheduler, Worker
from tests.conftest import RedisServer, running

LUA = Path(__file__).resolve().parent.parent / "lua"
BUDGET = 1000


# --------------------------------------------------------------------------- assembly, per the doc


def directives(text: str) -> tuple[list[str], list[str]]:
    """(includes, keys) of a file's '--- @include <part>' and '--- @keys <names>' lines."""
    includes, keys = [], []
    for line in text.split("\n"):
        if line.startswith("--- @include "):
            includes.append(line[len("--- @include ") :].strip())
        elif line.startswith("--- @keys "):
            keys.extend(line[len("--- @keys ") :].split())
    return includes, keys


def part(name: str) -> str:
    return (LUA / "lib" / f"{name}.lua").read_bytes().decode("utf-8")


def include_order(includes: list[str]) -> list[str]:
    """For each include in file order: its own includes first (recursively), then itself,
    skipping a part already placed."""
    placed: list[str] = []

    def place(name: str) -> None:
        if name in placed:
            return
        for sub in directives(part(name))[0]:
            place(sub)
        placed.append(name)

    for name in includes:
        place(name)
    return placed


def prelude(keys: list[str]) -> str:
    fields = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(keys, 1))
    n = len(keys)
    return (
        f"local k = {{ {fields} }}\n"
        f"if #KEYS ~= {n} then return redis.error_reply('BADARG KEYS expected {n}: "
        f"{' '.join(keys)}') end"
    )


class Script:
    def __init__(self, name: str, namespace: str) -> None:
        text = (LUA / f"{name}.lua").read_bytes().decode("utf-8")
        includes, key_names = directives(text)
        self.key_names = key_names
        self.keys = [f"ds:{{{namespace}}}:{key}" for key in key_names]
        body = [prelude(key_names), *(part(p) for p in include_order(includes)), text]
        self.text = "\n".join(body)
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()


class Producer:
    """Sends the scripts with EVALSHA over a bare client and settles what a reply leaves."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.scripts: dict[str, Script] = {}
        self.propagate_calls = 0

    def script(self, name: str) -> Script:
        if name not in self.scripts:
            script = Script(name, self.namespace)
            assert self.client.execute_command("SCRIPT", "LOAD", script.text).decode() == script.sha  # type: ignore[no-untyped-call]
            self.scripts[name] = script
        return self.scripts[name]

    def raw(self, name: str, *args: Any) -> list[Any]:
        script = self.script(name)
        try:
            reply = self.client.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", script.sha, len(script.keys), *script.keys, *args
            )
        except redis.exceptions.NoScriptError:
            reply = self.client.execute_command(  # type: ignore[no-untyped-call]
                "EVAL", script.text, len(script.keys), *script.keys, *args
            )
        assert isinstance(reply, list)
        return reply

    def settle(self) -> None:
        while True:
            left, _used = self.raw("propagate", BUDGET)
            self.propagate_calls += 1
            if left == 0:
                return

    def call(self, name: str, *args: Any) -> list[Any]:
        """One transition: on BUSY settle and send again; settle what the reply leaves."""
        while True:
            try:
                reply = self.raw(name, *args)
            except redis.ResponseError as exc:
                if not str(exc).startswith("BUSY "):
                    raise
                self.settle()
                continue
            if reply[0] > 0:
                self.settle()
            return reply

    def key(self, name: str) -> str:
        return f"ds:{{{self.namespace}}}:{name}"

    def record(self, task_id: str) -> dict[str, Any]:
        raw = self.client.hget(self.key("tasks"), task_id)
        assert isinstance(raw, bytes)
        # Twelve msgpack values one after the other, the worker id last, then the payload
        # when the record holds it.
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(raw)
        names = [
            "state", "version", "attempt", "max_attempts", "backoff_ms", "run_at_ms",
            "priority", "cancel_requested", "updated_delta_ms", "remaining",
            "optional_remaining", "worker",
        ]  # fmt: skip
        out = {name: next(unpacker) for name in names}
        out["payload"] = raw[unpacker.tell() :] or None
        return out

    def payload(self, task_id: str) -> bytes | None:
        """The payload: in the record when it holds one, else in the payloads hash."""
        inline = self.record(task_id)["payload"]
        if inline is not None:
            return cast(bytes, inline)
        return cast(bytes | None, self.client.hget(self.key("payloads"), task_id))


def spec(mode: str = "in", time_ms: int = 0, priority: int = 0, required: int = 0) -> str:
    return f"{mode} {time_ms} {priority} 1 1000 0 {required} 0"


def payload(fn: str, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> bytes:
    data: dict[str, Any] = {"fn": fn}
    if args:
        data["args"] = args
    if kwargs:
        data["kwargs"] = kwargs
    return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]


def wait_until(done: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --------------------------------------------------------------------------- the producer


def test_a_foreign_producer_enqueues_follows_and_cancels_tasks_a_distsched_worker_runs(
    own_redis: RedisServer,
) -> None:
    client = own_redis.client()
    p = Producer(client, "wire")
    received: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def add(*args: Any, **kwargs: Any) -> int:
        received.append(("add", args, kwargs))
        return int(sum(args) * kwargs.get("scale", 1))

    def greet(*args: Any, **kwargs: Any) -> str:
        received.append(("greet", args, kwargs))
        return f"hello {kwargs['name']}"

    # One call, two tasks: a reply of [left, version, version].
    reply = p.call(
        "schedule", BUDGET, 2,
        "sum", spec(priority=5), payload("add", [2, 3], {"scale": 10}),
        "hi", spec(), payload("greet", kwargs={"name": "wörld"}),
    )  # fmt: skip
    assert reply[0] == 0 and reply[1] < reply[2]
    sum_version = reply[1]
    [_left, parent_version] = p.call("schedule", BUDGET, 1, "parent", spec(), payload("add", [1]))
    [_left, child_version] = p.call(
        "schedule", BUDGET, 1, "child", spec(required=1), payload("add", [7]), "parent"
    )
    # An hour from now: it stays queued until it is cancelled.
    [_left, _] = p.call("schedule", BUDGET, 1, "doomed", spec(time_ms=3_600_000), payload("add"))

    # Status through the documented keys and formats.
    child = p.record("child")
    assert (child["state"], child["version"], child["remaining"]) == ("p", child_version, 1)
    total = p.record("sum")
    assert (total["state"], total["priority"], total["attempt"]) == ("r", 5, 0)
    member = f"{2147483647 - 5:08x}{sum_version:014x}sum"
    assert client.zscore(p.key("queue"), member) == total["run_at_ms"]
    assert p.payload("hi") == payload("greet", kwargs={"name": "wörld"})
    assert int(cast(bytes, client.hget(p.key("meta"), "count:ready"))) == 4
    assert int(cast(bytes, client.hget(p.key("meta"), "count:pending"))) == 1

    assert p.call("cancel", BUDGET, "doomed") == [0, b"cancelled"]
    assert p.record("doomed")["state"] == "c"
    assert client.zscore(p.key("finished"), "doomed") is not None

    s = Scheduler(own_redis.client(), namespace="wire", lease_s=5.0)
    worker = Worker(s, {"add": add, "greet": greet}, concurrency=2)
    try:
        with running(worker):
            wait_until(lambda: all(p.record(t)["state"] == "s" for t in ("sum", "hi", "child")))
    finally:
        s.close()
        s.client.close()  # given to the scheduler, which leaves it open

    assert sorted(received, key=lambda r: (r[0], r[1])) == [
        ("add", (1,), {}),
        ("add", (2, 3), {"scale": 10}),
        ("add", (7,), {}),
        ("greet", (), {"name": "wörld"}),
    ]
    # The dependency ran first.
    assert [r[1] for r in received].index((1,)) < [r[1] for r in received].index((7,))
    assert [p.record(t)["state"] for t in ("sum", "hi", "parent", "child", "doomed")] == [
        "s", "s", "s", "s", "c",
    ]  # fmt: skip
    assert p.record("child")["attempt"] == 1 and p.record("parent")["version"] == parent_version
    results = cast(list[bytes], client.hmget(p.key("results"), ["sum", "hi", "child"]))
    assert [r[:1] for r in results] == [b"R", b"R", b"R"]
    unpacked = [msgpack.unpackb(r[1:], raw=False) for r in results]
    assert unpacked == [50, "hello wörld", 7]
    assert client.zcard(p.key("leases")) == 0
    assert client.zcard(p.key("propagating")) == 0
    client.close()


def test_a_foreign_producer_settles_when_a_reply_leaves_dependents_and_on_busy(
    own_redis: RedisServer,
) -> None:
    client = own_redis.client()
    p = Producer(client, "wire-settle")
    ids = [f"d{i}" for i in range(5)]
    p.call("schedule", BUDGET, 1, "root", spec(), payload("f"))
    for task_id in ids:
        p.call("schedule", BUDGET, 1, task_id, spec(required=1), payload("f"), "root")
    # A budget of one edge: the cancellation leaves dependents to settle ...
    left, state = p.raw("cancel", 1, "root")
    assert (left, state) == (1, b"cancelled")
    assert sum(p.record(t)["state"] == "b" for t in ids) == 1
    # ... and a new version of root is refused until they are.
    with pytest.raises(redis.ResponseError, match=r"^BUSY root$"):
        p.raw("schedule", BUDGET, 1, "root", spec(), payload("f"))
    reply = p.call("schedule", BUDGET, 1, "root", spec(), payload("f"))
    assert reply[0] == 0 and p.propagate_calls == 1
    assert all(p.record(t)["state"] == "b" for t in ids)
    assert p.record("root")["state"] == "r"
    client.close()


# --------------------------------------------------------------------------- errors on the wire


def resp_command(*args: bytes | str | int) -> bytes:
    out = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


def raw_reply(sock: socket.socket, *args: bytes | str | int) -> bytes:
    """The first line of the server's answer, exactly as it travels."""
    sock.sendall(resp_command(*args))
    data = b""
    while not data.endswith(b"\r\n"):
        data += sock.recv(65536)
    return data.split(b"\r\n", 1)[0] + b"\r\n"


def test_script_errors_arrive_on_the_wire_as_the_document_says(own_redis: RedisServer) -> None:
    schedule = Script("schedule", "wire-errors")
    cancel = Script("cancel", "wire-errors")
    with socket.create_connection(("127.0.0.1", own_redis.port), timeout=10) as sock:

        def evalsha(script: Script, *args: bytes | str | int, keys: int | None = None) -> bytes:
            n = len(script.keys) if keys is None else keys
            return raw_reply(sock, "EVALSHA", script.sha, n, *script.keys[:n], *args)

        assert raw_reply(sock, "EVALSHA", schedule.sha, 0).startswith(b"-NOSCRIPT ")
        assert raw_reply(sock, "SCRIPT", "LOAD", schedule.text) == b"$40\r\n"
        assert raw_reply(sock, "SCRIPT", "LOAD", cancel.text) == b"$40\r\n"
        names = " ".join(schedule.key_names).encode()
        expected = f"-BADARG KEYS expected {len(schedule.keys)}: ".encode() + names + b"\r\n"
        assert evalsha(schedule, BUDGET, 0, keys=3) == expected
        bad = spec(priority=2**31)
        assert evalsha(schedule, BUDGET, 1, "t", bad, payload("f")) == (
            b"-BADARG priority out of range\r\n"
        )
        assert evalsha(schedule, "x", 0) == b"-BADARG budget must be an integer\r\n"
        assert evalsha(cancel, BUDGET, "nope") == b"-NOTFOUND nope\r\n"
        orphan = "o\n1"
        reply = evalsha(schedule, BUDGET, 1, orphan, spec(required=1), payload("f"), "gone\x00")
        assert reply == b"-UNKNOWN " + orphan.encode().hex().encode() + b" 676f6e6500\r\n"
        one = evalsha(schedule, BUDGET, 1, "a", spec(), payload("f"))
        assert one.startswith(b"*2")
    client = own_redis.client()
    p = Producer(client, "wire-errors")
    p.call("schedule", BUDGET, 1, "b", spec(required=1), payload("f"), "a")
    with pytest.raises(redis.ResponseError) as info:
        p.raw("schedule", BUDGET, 1, "a", spec(required=1), payload("f"), "b")
    cycle = re.fullmatch(r"CYCLE ((?:[0-9a-f]+ ?)+)", str(info.value))
    assert cycle is not None
    assert [bytes.fromhex(h).decode() for h in cycle.group(1).split()] in (
        ["a", "b", "a"],
        ["b", "a", "b"],
    )
    client.close()
