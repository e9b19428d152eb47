"""Readers that stored data cannot break (README "Bad data").

Every value here is written into Redis raw, as a producer in another language or junk
would leave it, not through the client's checks: a msgpack timestamp ext (how a
JavaScript encoder packs a ``Date``), arguments nested ~900 deep (which msgpack still
decodes) and 2,000 deep (which it does not), terminal escape sequences in every stored
string, and strings and lists far larger than a screen. The command line, the views and
the Python API read them all; a worker fails a task it cannot decode with a reason.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import ssl
from collections.abc import Iterator
from typing import Any, cast

import msgpack
import pytest
import redis
from click.testing import CliRunner, Result

from distsched import Scheduler, State, Worker, views
from distsched.cli import cli
from distsched.keys import Keys
from distsched.model import WorkerInfo
from distsched.text import (
    cut,
    escape,
    json_line,
    jsonable,
    redact,
    redact_text,
    show,
)
from distsched.wire import records
from distsched.wire.payload import (
    CUT_MARK,
    READ_DEPTH,
    cut_deep,
    cut_packed,
    decode_payload,
    decode_payload_trace,
    decode_value,
    unpack_error,
)
from distsched.worker.link import WorkerLink
from distsched.worker.logs import redis_location
from tests.conftest import RedisServer, free_port, put_payload, running

# Sequences a terminal acts on: clear the screen and home the cursor, set the window
# title (OSC 0), a hyperlink whose text hides its target (OSC 8), a one-byte CSI (C1
# 0x9b) that colours what follows, a C1 string start (DCS), and a right-to-left override.
CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
C1 = "\x9b31m\x90q\x9c"
BIDI = "\u202egnp.exe"
HOSTILE = CLEAR + TITLE + LINK + C1 + BIDI

# What must never reach a terminal from stored data: C0 controls but the newlines the
# CLI writes itself, DEL, C1 controls and bidirectional overrides.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def packed_nested(depth: int) -> bytes:
    """``{"fn": "f", "args": [[[...1...]]]}``: ``depth`` arrays in all, packed by hand
    (msgpack-python refuses to pack past 511)."""
    return b"\x82\xa2fn\xa1f\xa4args" + b"\x91" * depth + b"\x01"


def timestamp_payload(fn: str = "f") -> bytes:
    # What @msgpack/msgpack (JavaScript) writes for {fn, args: [new Date(...)]}.
    when = msgpack.Timestamp.from_datetime(dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    return cast(bytes, msgpack.packb({"fn": fn, "args": [when], "kwargs": None}))


def rewrite_record(
    client: redis.Redis, keys: Keys, task_id: str, state: str | None = None, **ints: Any
) -> None:
    """Rewrite fields of a stored record as a script in another language could: the
    state letter, ``worker`` (a string), and others by position name."""
    raw = cast(bytes, client.hget(keys.tasks, task_id))
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    values = list(itertools.islice(unpacker, 12))
    payload = raw[unpacker.tell() :]
    if state is not None:
        values[0] = state
    if "worker" in ints:
        values[11] = ints["worker"]
    record = b"".join(cast(bytes, msgpack.packb(v, use_bin_type=True)) for v in values)
    client.hset(keys.tasks, task_id, record + payload)


def store_error(client: redis.Redis, keys: Keys, task_id: str, error: str) -> None:
    """A failed task with ``error`` as its stored error (and one history entry)."""
    rewrite_record(client, keys, task_id, state="f")
    client.hset(keys.results, task_id, b"E" + error.encode("utf-8"))
    summary = error.replace("\n", " ")[:300]
    worker = "w" + HOSTILE
    entry = f"1|1|1000|2000|failed|{len(worker.encode())}|{worker}|{summary}\n"
    client.hset(keys.history, task_id, entry.encode())


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()


def invoke(url: str, namespace: str, *args: str) -> Result:
    return _runner().invoke(
        cli,
        ["--redis", url, "--namespace", namespace, *args],
        catch_exceptions=False,
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
    )


def run(server: RedisServer, namespace: str, *args: str) -> Result:
    result = invoke(server.url, namespace, *args)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result


# --------------------------------------------------------------------------- payloads


def test_a_timestamp_ext_reads_as_a_msgpack_timestamp_and_prints_as_its_repr(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    scheduler.schedule("ts", fn="f")
    put_payload(redis_client, scheduler.keys, "ts", timestamp_payload())
    info = scheduler.status("ts")
    assert info.fn == "f"
    assert isinstance(info.args[0], msgpack.Timestamp)
    for args in (["status", "ts"], ["status", "ts", "--full"]):
        out = run(redis_server, scheduler.namespace, *args).stdout
        assert "Timestamp(seconds=1893553445, nanoseconds=0)" in out
    data = json.loads(run(redis_server, scheduler.namespace, "status", "ts", "--json").stdout)
    assert data["args"] == ["Timestamp(seconds=1893553445, nanoseconds=0)"]
    assert data["kwargs"] == {}
    assert "fn f" in run(redis_server, scheduler.namespace, "why", "ts").stdout
    run(redis_server, scheduler.namespace, "graph", "ts")


def test_another_ext_type_prints_as_its_repr() -> None:
    assert jsonable([msgpack.ExtType(42, b"\x00\x01")]) == ["ExtType(code=42, data=b'\\x00\\x01')"]


def test_a_payload_nested_900_deep_is_shown_cut_with_an_ellipsis(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    scheduler.schedule("deep", fn="f")
    put_payload(redis_client, scheduler.keys, "deep", packed_nested(900))
    info = scheduler.status("deep")
    assert info.fn == "f"
    repr(info)  # no RecursionError: the API cuts at wire.payload.READ_DEPTH
    assert str(info.args).count("[") <= READ_DEPTH + 1
    assert CUT_MARK in str(info.args)
    out = run(redis_server, scheduler.namespace, "status", "deep").stdout
    assert "args:" in out
    data = json.loads(run(redis_server, scheduler.namespace, "status", "deep", "--json").stdout)
    assert CUT_MARK in json.dumps(data["args"], ensure_ascii=False)
    assert "fn f" in run(redis_server, scheduler.namespace, "why", "deep").stdout
    run(redis_server, scheduler.namespace, "graph", "deep", "--json")


def test_a_payload_nested_2000_deep_still_reads_its_function_and_cut_arguments(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    scheduler.schedule("deeper", fn="f")
    put_payload(redis_client, scheduler.keys, "deeper", packed_nested(2000))
    info = scheduler.status("deeper")
    assert info.fn == "f"
    assert CUT_MARK in str(info.args)
    assert "fn f" in run(redis_server, scheduler.namespace, "why", "deeper").stdout
    out = run(redis_server, scheduler.namespace, "status", "deeper").stdout
    assert re.search(r"^fn: +f$", out, re.M), out


def test_a_result_nested_2000_deep_reads_as_a_cut_value(
    scheduler: Scheduler, redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    scheduler.schedule("r", fn="f")
    rewrite_record(redis_client, scheduler.keys, "r", state="s")
    redis_client.hset(scheduler.keys.results, "r", b"R" + b"\x91" * 2000 + b"\x01")
    info = scheduler.status("r")
    assert CUT_MARK in str(info.result)
    assert CUT_MARK in str(scheduler.result("r", timeout=1))
    assert "result:" in run(redis_server, scheduler.namespace, "status", "r").stdout


def test_the_byte_level_cut_keeps_everything_within_the_depth() -> None:
    value = {"fn": "f", "args": [1, "x", [2.5, None, {"k": [True]}]], "b": b"\x00" * 300}
    raw = cast(bytes, msgpack.packb(value, use_bin_type=True))
    assert cut_packed(raw, 64) == raw
    assert msgpack.unpackb(cut_packed(raw, 2)) == {
        "fn": "f",
        "args": [1, "x", CUT_MARK],
        "b": b"\x00" * 300,
    }
    assert cut_packed(packed_nested(5000), 3) == msgpack.packb({"fn": "f", "args": [[CUT_MARK]]})
    with pytest.raises(ValueError):
        cut_packed(packed_nested(5000)[:-1], 3)


def test_cut_deep_returns_a_shallow_value_itself_and_cuts_a_deep_one() -> None:
    shallow = {"a": [1, (2, 3)]}
    assert cut_deep(shallow, 3) is shallow
    assert cut_deep(nested(5000), 2) == [[CUT_MARK]]


def _worker_error(scheduler: Scheduler, task_id: str) -> tuple[State, str | None, Any]:
    seen: list[Any] = []

    def f(*args: Any) -> str:
        seen.append(args)
        return "ran"

    worker = Worker(scheduler, {"f": f}, concurrency=1)
    with running(worker):
        info = scheduler.wait(task_id, timeout=20)
    return info.state, info.error, seen


def test_a_worker_runs_a_task_whose_argument_is_a_timestamp_ext(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("ts", fn="f")
    put_payload(redis_client, scheduler.keys, "ts", timestamp_payload())
    state, error, seen = _worker_error(scheduler, "ts")
    assert (state, error) == (State.SUCCEEDED, None)
    assert isinstance(seen[0][0], msgpack.Timestamp)


def test_a_worker_fails_a_payload_nested_2000_deep_saying_why(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("deeper", fn="f")
    put_payload(redis_client, scheduler.keys, "deeper", packed_nested(2000))
    state, error, seen = _worker_error(scheduler, "deeper")
    assert state is State.FAILED and not seen
    assert error is not None and "nested deeper than msgpack decodes" in error, error
    assert not error.rstrip().endswith(":")


def test_an_undecodable_payload_names_the_exception_even_when_its_message_is_empty() -> None:
    with pytest.raises(ValueError, match="StackError"):
        decode_payload(packed_nested(2000))
    assert unpack_error(ValueError()) == "ValueError"


# --------------------------------------------------------------------------- escapes


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (CLEAR, "\\x1b[2J\\x1b[H"),
        (TITLE, "\\x1b]0;pwned\\x07"),
        (LINK, "\\x1b]8;;https://evil.example/\\x1b\\click me\\x1b]8;;\\x1b\\"),
        (C1, "\\x9b31m\\x90q\\x9c"),
        (BIDI, "\\u202egnp.exe"),
        ("a\nb\r\tc\x7f", "a\\nb\\r\\tc\\x7f"),
    ],
)
def test_escape_shows_every_control_character_as_an_escape(stored: str, shown: str) -> None:
    assert escape(stored) == shown
    assert not CONTROL.search(escape(stored))


def test_escape_can_keep_newlines_and_leaves_other_text_as_it_is() -> None:
    assert escape("line 1\nline\x1b 2", keep_newlines=True) == "line 1\nline\\x1b 2"
    assert escape("naïve 名前 ✓") == "naïve 名前 ✓"


def test_json_output_escapes_c1_controls_and_stays_valid_json() -> None:
    line = json_line({"id": HOSTILE})
    assert not CONTROL.search(line)
    assert json.loads(line) == {"id": HOSTILE}


@pytest.fixture
def hostile(
    scheduler: Scheduler, redis_client: redis.Redis, namespace: str
) -> Iterator[dict[str, str]]:
    """A namespace where every stored string holds escape sequences: ids, function
    names, errors, worker ids, a schedule's name and function, a fairness key, args."""
    failed, running_id, pending = "failed" + HOSTILE, "running" + HOSTILE, "pending" + HOSTILE
    scheduler.schedule(failed, fn="fn" + HOSTILE, args=[HOSTILE], kwargs={HOSTILE: HOSTILE})
    scheduler.schedule(running_id, fn="fn" + HOSTILE, priority=-1)
    scheduler.schedule(pending, fn="fn" + HOSTILE, deps=[running_id])
    # Through the scripts, as a worker in another language with such a worker id would.
    claims, _ = scheduler.claim(2, "w" + HOSTILE)
    assert {c.task_id for c in claims} == {failed, running_id}
    claim = next(c for c in claims if c.task_id == failed)
    scheduler.fail(claim, f"Traceback:\n  {HOSTILE}\nValueError: {HOSTILE}")
    scheduler.add_schedule("every" + HOSTILE, fn="fn" + HOSTILE, interval=3600)
    WorkerLink(scheduler).register_worker(
        WorkerInfo(
            "w" + HOSTILE, "host" + HOSTILE, 1, "1.0" + HOSTILE, 1, ("fn" + HOSTILE,), 0.0, 0.0,
            1, {"claimed" + HOSTILE: 1}, 1.0, 5.0,
        )
    )  # fmt: skip
    yield {"failed": failed, "running": running_id, "pending": pending}


def _commands(ids: dict[str, str]) -> list[list[str]]:
    out: list[list[str]] = []
    for task_id in ids.values():
        for extra in ([], ["--full"], ["--json"]):
            out += [
                ["status", task_id, *extra],
                ["why", task_id, *extra],
                ["graph", task_id, *extra],
            ]
    for state in ("failed", "running", "pending"):
        out += [["tasks", "--state", state], ["tasks", "--state", state, "--json"]]
        out += [["tasks", "--state", state, "--full"]]
    out += [["leases", "list"], ["schedules", "list"], ["schedules", "list", "--json"]]
    out += [["workers"], ["workers", "--json"], ["stats"], ["stats", "--json"]]
    out += [["status", "missing" + HOSTILE], ["why", "missing" + HOSTILE]]
    out += [["graph", "missing" + HOSTILE], ["cancel", "missing" + HOSTILE]]
    return out


def test_no_command_prints_a_control_character_from_stored_data(
    hostile: dict[str, str], redis_server: RedisServer, namespace: str
) -> None:
    for args in _commands(hostile):
        result = invoke(redis_server.url, namespace, *args)
        assert result.exit_code in (0, 1), (args, result.stdout, result.stderr)
        for stream in (result.stdout, result.stderr):
            found = CONTROL.search(stream)
            assert found is None, (args, found, stream)
        # Each listing of stored strings shows them, escaped (stats shows none).
        shows = args[0] not in ("cancel", "stats") and "--json" not in args
        if shows and "missing" not in " ".join(args):
            assert "\\x1b" in result.stdout, (args, result.stdout)


def test_status_shows_the_escaped_error_traceback_line_by_line_with_full(
    hostile: dict[str, str], redis_server: RedisServer, namespace: str
) -> None:
    out = run(redis_server, namespace, "status", hostile["failed"], "--full").stdout
    assert "\n  \\x1b[2J\\x1b[H" in out  # the traceback's own line, escaped
    assert f"ValueError: {escape(HOSTILE)}" in out


# --------------------------------------------------------------------------- bounds


BIG_ERROR_BYTES = 20 << 20
BIG_WORKER_BYTES = 8 << 20
DEPENDENTS = 100_000
# A screenful and then some: every bounded output is far below what it would be whole.
SHORT = 64 * 1024


@pytest.fixture
def huge(scheduler: Scheduler, redis_client: redis.Redis) -> dict[str, str]:
    """A failed task with a 20 MiB error, a running one with an 8 MiB worker id, and one
    with 100k dependents (edges left by tasks since removed)."""
    keys = scheduler.keys
    long_id = "L" * 500
    scheduler.schedule(long_id, fn="f")
    store_error(redis_client, keys, long_id, "E" * BIG_ERROR_BYTES)
    scheduler.schedule("held", fn="f" * 400)
    rewrite_record(redis_client, keys, "held", state="x", worker="W" * BIG_WORKER_BYTES)
    redis_client.zadd(keys.leases, {"held": 9_999_999_999_999})
    scheduler.schedule("root", fn="f")
    prefix = records.id_prefix("root") + b"0r"
    for start in range(0, DEPENDENTS, 10_000):
        members = {prefix + b"child-%06d" % i: 0 for i in range(start, start + 10_000)}
        redis_client.zadd(keys.edges, members)
    return {"failed": long_id, "running": "held", "root": "root"}


def test_every_command_prints_a_bounded_output_for_huge_stored_values(
    huge: dict[str, str], redis_server: RedisServer, namespace: str
) -> None:
    for task_id in huge.values():
        for command in ("status", "why", "graph"):
            result = run(redis_server, namespace, command, task_id)
            assert len(result.stdout) < SHORT, (command, task_id, len(result.stdout))
    for state in ("failed", "running", "pending", "ready"):
        result = run(redis_server, namespace, "tasks", "--state", state)
        assert len(result.stdout) < SHORT, (state, len(result.stdout))
    result = run(redis_server, namespace, "leases", "list")
    assert len(result.stdout) < SHORT


def test_a_cut_says_how_much_more_there_is_and_full_shows_it_all(
    huge: dict[str, str], redis_server: RedisServer, namespace: str
) -> None:
    out = run(redis_server, namespace, "status", "held").stdout
    assert f"… ({BIG_WORKER_BYTES - 200} more bytes; --full to see all)" in out
    out = run(redis_server, namespace, "status", "root").stdout
    assert f"… ({DEPENDENTS - 20} more; --full to see all)" in out
    out = run(redis_server, namespace, "why", huge["failed"]).stdout
    assert "more bytes; --full to see all" in out
    full = run(redis_server, namespace, "status", "held", "--full").stdout
    assert "W" * BIG_WORKER_BYTES in full
    full = run(redis_server, namespace, "status", "root", "--full").stdout
    assert "child-099999" in full
    full = run(redis_server, namespace, "why", huge["failed"], "--full").stdout
    assert "E" * BIG_ERROR_BYTES in full


def test_graph_reads_a_bounded_number_of_dependents_however_many_edges_there_are(
    huge: dict[str, str], scheduler: Scheduler
) -> None:
    reads = 0
    status = scheduler.status

    def counted(task_id: str) -> Any:
        nonlocal reads
        reads += 1
        return status(task_id)

    scheduler.status = counted  # type: ignore[method-assign]
    hood = views.walk(scheduler, "root", limit=50)
    assert reads <= 50
    assert hood.truncated


def test_cut_and_show_bound_a_string_and_say_so() -> None:
    assert cut("x" * 10, 10) == "x" * 10
    assert cut("é" * 12, 10) == "é" * 10 + "… (4 more bytes; --full to see all)"
    assert cut("x" * 300, None) == "x" * 300
    assert show("\x1b" * 300, 3) == "\\x1b" * 3 + "… (297 more bytes; --full to see all)"
    assert views.show_id("a" * 300) == "a" * 200 + "… (100 more bytes; --full to see all)"


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://alice:s3cret@h:6379/0", "redis://alice:***@h:6379/0"),
        ("redis://:s3cret@h/0", "redis://:***@h/0"),
        ("rediss://h:6380/0?password=s3cret", "rediss://h:6380/0?password=***"),
        (
            "redis://bob:s3cret@h/0?ssl_cert_reqs=none&password=s3cret&db=1",
            "redis://bob:***@h/0?ssl_cert_reqs=none&password=***&db=1",
        ),
        ("redis+cluster://u:p@ss:s3cret@h:7000", "redis+cluster://u:***@h:7000"),
        ("redis://u:s3cret@[bad:port/0", "redis://u:***@[bad:port/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redact_hides_the_password_of_a_url_in_every_form(url: str, shown: str) -> None:
    assert redact(url) == shown
    said = redact_text(f"cannot connect to {url}: refused")
    assert "s3cret" not in said and said.endswith(f"{shown}: refused")


def test_the_worker_log_names_its_redis_without_a_password_given_in_the_query() -> None:
    client = redis.Redis.from_url("redis://h:6379/0?password=s3cret")
    assert redis_location(client) == "redis://:***@h:6379/0"


def _assert_redacted(result: Result, *secrets: str) -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    for secret in secrets:
        assert secret not in result.stdout + result.stderr, result.stderr
    assert "***" in result.stderr, result.stderr


def test_a_cli_error_on_a_host_that_does_not_resolve_hides_the_passwords(
    namespace: str,
) -> None:
    url = "redis://alice:s3cret-a@no-such-host.invalid:6379/0?password=s3cret-b"
    _assert_redacted(invoke(url, namespace, "status", "x"), "s3cret-a", "s3cret-b")


def test_a_cli_error_on_a_refused_connection_hides_the_passwords(namespace: str) -> None:
    url = f"redis://alice:s3cret-a@127.0.0.1:{free_port()}/0?password=s3cret-b"
    _assert_redacted(invoke(url, namespace, "tasks", "--state", "failed"), "s3cret-a", "s3cret-b")


def test_a_cli_error_on_refused_authentication_hides_the_password(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str
) -> None:
    user = f"user-{namespace}"
    redis_client.acl_setuser(user, enabled=True, passwords=["+right-password"])
    try:
        port = redis_server.port
        for url in (
            f"redis://127.0.0.1:{port}/0?username={user}&password=s3cret-wrong",
            f"redis://{user}:s3cret-wrong@127.0.0.1:{port}/0",
        ):
            for args in (["status", "x"], ["stats"], ["graph", "x", "--json"]):
                result = invoke(url, namespace, *args)
                _assert_redacted(result, "s3cret-wrong")
                assert "password" in result.stderr.lower() or "auth" in result.stderr.lower()
    finally:
        redis_client.acl_deluser(user)


def test_a_cli_error_on_a_tls_failure_hides_the_password(
    redis_server: RedisServer, namespace: str
) -> None:
    # TLS to a server that speaks plain text: the handshake fails.
    url = f"rediss://alice:s3cret-a@127.0.0.1:{redis_server.port}/0?password=s3cret-b&ssl_cert_reqs=none"
    result = invoke(url, namespace, "why", "x")
    _assert_redacted(result, "s3cret-a", "s3cret-b")
    assert ssl.OPENSSL_VERSION  # the client has TLS: the error is the handshake's


def test_every_error_message_is_escaped_and_redacted_whoever_raised_it(
    redis_server: RedisServer, namespace: str
) -> None:
    # click's own usage error quotes what was typed as it is.
    result = invoke(redis_server.url, namespace, "redis://alice:s3cret@host" + HOSTILE)
    assert result.exit_code == 2
    assert "s3cret" not in result.stderr and "alice:***@host" in result.stderr
    assert not CONTROL.search(result.stderr) and "\\x1b]0;pwned" in result.stderr


def test_jsonable_cuts_any_nesting_with_an_ellipsis_without_a_recursion_error() -> None:
    data = jsonable({"args": nested(5000)})
    text = json.dumps(data)
    assert text.count("[") == 63 and json.loads(text) is not None
    assert CUT_MARK in json.dumps(data, ensure_ascii=False)
    assert jsonable(nested(64)) == nested(64)  # whatever the scripts accept shows whole


def test_a_reader_cuts_exactly_what_nests_past_its_depth() -> None:
    depth = READ_DEPTH
    # The payload's map is the first level, its args array the second.
    _, whole, _, _ = decode_payload_trace(packed_nested(depth - 1), depth)
    assert CUT_MARK not in str(whole) and str(whole).count("[") == depth - 2  # args: a tuple
    _, cut_args, _, _ = decode_payload_trace(packed_nested(depth), depth)
    assert CUT_MARK in str(cut_args)
    value = decode_value(cast(bytes, msgpack.packb(nested(depth + 1))), depth)
    assert str(value).count("[") == depth and CUT_MARK in str(value)
    assert decode_value(cast(bytes, msgpack.packb(nested(depth))), depth) == nested(depth)
