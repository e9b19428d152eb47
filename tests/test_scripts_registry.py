"""§9: every transition is a documented Lua file, loaded by SHA, touching only its KEYS."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Wait, Worker, core
from distsched.keys import Keys
from distsched.scripts import SCRIPT_NAMES, Registry, library_source, lua_dir, source
from tests.conftest import RedisServer

LUA = lua_dir()


def script_files() -> dict[str, str]:
    return {
        p.name[: -len(".lua")]: p.read_text("utf-8")
        for p in LUA.iterdir()
        if p.name.endswith(".lua")
    }


def library_files() -> dict[str, str]:
    lib = LUA / "lib"
    return {p.name: p.read_text("utf-8") for p in lib.iterdir() if p.name.endswith(".lua")}


# --------------------------------------------------------------------------- registry, headers


def test_every_lua_transition_file_is_registered_and_every_name_has_a_file() -> None:
    assert set(script_files()) == set(SCRIPT_NAMES)
    assert len(SCRIPT_NAMES) == len(set(SCRIPT_NAMES))


@dataclass
class Header:
    purpose: str
    keys: list[str]  # KEYS[1..n] names, in order
    has_argv: bool
    has_reply: bool


LAYOUT_LINE = re.compile(r"^-- KEYS\[1\.\.(\d+)\] the namespace layout of lib/keys\.lua")


def documented_keys(lines: list[str]) -> list[str]:
    keys: dict[int, str] = {}
    for line in lines:
        m = re.match(r"^-- KEYS\[(\d+)\]\s+(\w+)\s+\S", line)
        if m:
            keys[int(m.group(1))] = m.group(2)
    assert sorted(keys) == list(range(1, len(keys) + 1)), "KEYS lines not 1..n"
    return [keys[i] for i in sorted(keys)]


def header_lines(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


def layout() -> list[str]:
    """The KEYS layout every script receives, as lib/keys.lua documents it."""
    return documented_keys(header_lines(library_files()["keys.lua"]))


def parse_header(name: str, text: str) -> Header:
    lines = header_lines(text)
    first = re.match(rf"^-- {re.escape(name)}\.lua: (\S.*)$", lines[0]) if lines else None
    keys = documented_keys(lines)
    for line in lines:
        m = LAYOUT_LINE.match(line)
        if m:
            assert not keys, f"{name}: both the layout and its own KEYS lines"
            keys = layout()
            assert int(m.group(1)) == len(keys), f"{name}: layout size"
    return Header(
        purpose=first.group(1) if first else "",
        keys=keys,
        has_argv=any(re.match(r"^-- ARGV\[\d+\]", line) for line in lines),
        has_reply=any(re.match(r"^-- Reply: \S", line) for line in lines),
    )


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_opens_with_purpose_keys_argv_and_reply(name: str) -> None:
    header = parse_header(name, script_files()[name])
    assert header.purpose, f"{name}.lua must open with '-- {name}.lua: <purpose>'"
    assert header.keys, f"{name}.lua documents no KEYS"
    assert header.has_argv, f"{name}.lua documents no ARGV"
    assert header.has_reply, f"{name}.lua documents no Reply"


def sample_calls() -> dict[str, core.Call]:
    keys = Keys("ns")
    claim = Claim("a", 1, 1, "f", (), {}, 0, 0.0)
    return {
        "schedule": core.schedule_call(keys, [TaskSpec("a", "f")], 1000),
        "cancel": core.cancel_call(keys, "a"),
        "claim": core.claim_call(keys, "w", 1, 1000),
        "heartbeat": core.heartbeat_call(keys, [claim], 1000),
        "complete": core.complete_call(keys, [(claim, None)]),
        "fail": core.fail_call(keys, [(claim, "x")]),
        "confirm_cancel": core.confirm_cancel_call(keys, claim),
        "release": core.release_call(keys, [claim]),
        "reap": core.reap_call(keys),
        "propagate": core.propagate_call(keys),
        "retry": core.retry_call(keys, "a", True),
        "add_deps": core.add_deps_call(keys, "a", ["b"], False),
        "purge": core.purge_call(keys),
        "compact": core.compact_call(keys),
    }


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_keys_a_script_documents_are_the_keys_the_client_sends(name: str) -> None:
    """The header is the wire protocol: ``KEYS[i] <name>`` is ``Keys.<name>``, in order."""
    header = parse_header(name, script_files()[name])
    keys = Keys("ns")
    call = sample_calls()[name]
    assert call.script == name
    assert call.keys == [getattr(keys, key_name) for key_name in header.keys]


# --------------------------------------------------------------------------- static key check


def split_args(text: str, open_paren: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' is at ``open_paren``."""
    depth, quote, args, current = 0, "", [], []
    for ch in text[open_paren + 1 :]:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            if depth == 0:
                args.append("".join(current).strip())
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    raise AssertionError("unbalanced call")


def strip_comments(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


KEYLESS_COMMANDS = {"TIME"}
KEY_ARG = re.compile(r"^(KEYS\[\d+\]|k\.\w+)$")
FUNCTION = re.compile(r"local function (\w+)\(([^)]*)\)")


def key_violations(text: str) -> list[str]:
    """Places where a key or channel name may not come from KEYS.

    Allowed key arguments: ``KEYS[i]``, a field of the ``k`` table (itself checked to be
    built from KEYS only), or a parameter of the enclosing function whose callers are
    held to the same rule.
    """
    code = strip_comments(text)
    problems: list[str] = []
    functions: dict[str, list[str]] = {}
    spans: list[tuple[int, list[str]]] = []
    for m in FUNCTION.finditer(code):
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
        functions[m.group(1)] = params
        spans.append((m.start(), params))

    def params_at(pos: int) -> list[str]:
        current: list[str] = []
        for start, params in spans:
            if start <= pos:
                current = params
        return current

    def allowed(arg: str, pos: int) -> bool:
        return bool(KEY_ARG.match(arg)) or arg in params_at(pos)

    for m in re.finditer(r"redis\.call\(", code):
        args = split_args(code, m.end() - 1)
        command = args[0].strip("'\"").upper()
        if command in KEYLESS_COMMANDS:
            continue
        if len(args) < 2 or not allowed(args[1], m.start()):
            problems.append(f"redis.call({', '.join(args[:2])}) at offset {m.start()}")
    # Callers of helpers must pass key names from KEYS too.
    for fname, params in functions.items():
        key_params = [
            i for i, p in enumerate(params) if p == "k" or p.endswith(("_key", "_channel"))
        ]
        for m in re.finditer(rf"(?<![\w.]){fname}\(", code):
            if code[max(0, m.start() - 15) : m.start()].rstrip().endswith("function"):
                continue
            args = split_args(code, m.end() - 1)
            for i in key_params:
                arg = args[i] if i < len(args) else ""
                # The k table is passed on as a whole; a key name must pass the key rule.
                ok = arg == "k" if params[i] == "k" else allowed(arg, m.start())
                if not ok:
                    problems.append(f"{fname}(...) argument {params[i]} = {arg!r}")
    # The k table is built from KEYS only.
    for m in re.finditer(r"local k = \{(.*?)\}", code, re.S):
        body = m.group(1)
        rest = re.sub(r"\w+\s*=\s*KEYS\[\d+\]", "", body)
        if rest.replace(",", "").strip():
            problems.append(f"k table holds more than KEYS: {body!r}")
    if re.search(r"\bk\s*=", re.sub(r"local k = \{.*?\}", "", code, flags=re.S)):
        problems.append("k is reassigned")
    return problems


def test_the_key_checker_flags_keys_that_do_not_come_from_keys() -> None:
    """The static check itself can fail."""
    bad = (
        "local function helper(tasks_key, id)\n  return redis.call('HGET', tasks_key, id)\nend\n"
        "local k = { tasks = KEYS[1] }\n"
        "redis.call('GET', 'ds:{other}:x')\n"
        "redis.call('PUBLISH', 'elsewhere', 'x')\n"
        "helper('literal', 'a')\n"
        "helper(k.tasks, 'a')\n"
    )
    problems = key_violations(bad)
    assert len(problems) == 3, problems
    assert key_violations("local k = { a = KEYS[1], b = 'x' }\n") != []


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_only_touches_keys_passed_in_keys(name: str) -> None:
    text = source(name)
    assert key_violations(text) == []
    # Scripts reach keys only through the k table of lib/keys.lua, never KEYS directly.
    assert "KEYS[" not in strip_comments(script_files()[name])


def test_the_keys_layout_builds_k_from_every_documented_key_in_order() -> None:
    code = strip_comments(library_files()["keys.lua"])
    table = {int(i): field for field, i in re.findall(r"(\w+)\s*=\s*KEYS\[(\d+)\]", code)}
    assert [table[i] for i in sorted(table)] == layout()
    keys = Keys("ns")
    assert [getattr(keys, name) for name in layout()] == keys.script_keys()


def test_the_shared_library_touches_no_key_of_its_own() -> None:
    for name, text in library_files().items():
        assert key_violations(text) == []
        if name != "keys.lua":
            assert "KEYS[" not in strip_comments(text)


# --------------------------------------------------------------------------- on a server


def lifecycle(s: Scheduler) -> None:
    """Run every script (and every pub/sub publish path) once, checking each answer."""
    s.set_max_running(5)
    s.schedule_many(
        [
            TaskSpec("a", "f", max_attempts=2, backoff=0),
            TaskSpec("b", "f"),
            TaskSpec("c", "f"),
            TaskSpec("d", "f"),
        ]
    )
    s.schedule("d", fn="f", delay=3600)  # replaced: the old entry is stale
    assert s.cancel("c") is State.CANCELLED
    a, b = s.ready(2, "w")
    assert (a.task_id, b.task_id) == ("a", "b")
    assert s.heartbeat(a) is False
    assert s.fail(a, "first try") is Outcome.APPLIED
    a2 = s.next("w")
    assert isinstance(a2, Claim) and a2.attempt == 2
    assert s.complete(a2, {"ok": True}) is Outcome.APPLIED
    assert s.complete(a2) is Outcome.DUPLICATE
    assert s.cancel("b") is State.RUNNING
    assert s.heartbeat(b) is True
    assert s.confirm_cancel(b) is Outcome.APPLIED
    s.schedule("e", fn="f")
    e = s.next("w")
    assert isinstance(e, Claim) and e.task_id == "e"
    assert s.release([e]) == 1
    e = s.next("w")
    assert isinstance(e, Claim) and e.task_id == "e"
    assert s.expire_lease("e") == 1
    assert s.reap() == 0
    wait = s.next("w")
    assert isinstance(wait, Wait) and wait.reason == "not_due"
    states = {task_id: s.status(task_id).state for task_id in "abcde"}
    assert states == {
        "a": State.SUCCEEDED,
        "b": State.CANCELLED,
        "c": State.CANCELLED,
        "d": State.READY,
        "e": State.FAILED,
    }
    assert s.status("a").result == {"ok": True}
    stats = s.stats()
    assert stats["counts"]["ready"] == 1 and stats["stale_entries"] == 0
    assert s.leases() == []
    # Dependencies: a pending task, more dependencies, a retry, and settling.
    s.submit("g", fn="f", deps=["d"])
    s.add_deps("g", ["c"])  # c is cancelled: g is blocked at once
    assert s.status("g").state is State.BLOCKED
    assert s.retry("c", cascade=True) > 0
    assert s.status("g").state is State.PENDING
    assert s.settle() == 0
    # Housekeeping: compaction (nothing to do here) and retention.
    assert s.compact() == 0
    s.set_retention(3600)
    assert s.purge() == 0 and s.stats()["retention_s"] == 3600


@pytest.fixture
def own_client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    c = own_redis.client()
    yield c
    c.close()


def test_every_script_loads_by_sha_on_a_real_server(own_client: redis.Redis) -> None:
    registry = Registry(own_client)
    for name in SCRIPT_NAMES:
        text = source(name)
        assert text.startswith(library_source())
        sha = own_client.script_load(text)
        assert sha == hashlib.sha1(text.encode("utf-8")).hexdigest() == registry[name].sha
    assert all(own_client.script_exists(*(registry[n].sha for n in SCRIPT_NAMES)))


def test_scripts_reload_transparently_after_script_flush(own_client: redis.Redis) -> None:
    s = Scheduler(own_client, namespace="flush")
    warm = Scheduler(own_client, namespace="warm")
    try:
        warm.schedule("warm", fn="f")  # the server knows one script
        own_client.script_flush()
        shas = [s._scripts[name].sha for name in SCRIPT_NAMES]
        assert not any(own_client.script_exists(*shas))
        lifecycle(s)  # every call meets NOSCRIPT first and reloads
        assert all(own_client.script_exists(*shas))
        own_client.script_flush()
        assert s.cancel("d") is State.CANCELLED
    finally:
        s.close()
        warm.close()


def run_worker_until(s: Scheduler, worker: Worker, done: Callable[[], bool]) -> None:
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, "the worker did not finish its tasks"
            time.sleep(0.01)
    finally:
        worker.stop(grace=5)
        thread.join(30)
    assert not thread.is_alive()


def test_a_user_limited_to_the_namespace_prefix_can_run_everything(
    own_redis: RedisServer, own_client: redis.Redis
) -> None:
    ns = "acl-ns"
    prefix = f"ds:{{{ns}}}:*"
    own_client.execute_command(
        "ACL", "SETUSER", "app", "reset", "on", ">secret", f"~{prefix}", f"&{prefix}", "+@all"
    )
    app = own_redis.client(username="app", password="secret")
    s = Scheduler(app, namespace=ns, max_running=10)
    try:
        # The limit is real: anything outside the prefix is refused.
        with pytest.raises(redis.exceptions.NoPermissionError):
            app.set("outside", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            app.publish("outside", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            Scheduler(app, namespace="other").schedule("x", fn="f")
        lifecycle(s)
        # A worker's wake-up subscription and its reports stay inside the prefix too.
        ran: list[int] = []
        s.schedule_many([TaskSpec(f"w{i}", "f", args=(i,)) for i in range(3)])
        worker = Worker(s, {"f": ran.append}, concurrency=2)
        run_worker_until(
            s, worker, lambda: all(s.status(f"w{i}").state is State.SUCCEEDED for i in range(3))
        )
        assert sorted(ran) == [0, 1, 2]
    finally:
        s.close()
        app.close()
    assert all(key.startswith(f"ds:{{{ns}}}:".encode()) for key in own_client.keys("*"))
