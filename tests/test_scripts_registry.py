"""§9: every transition is a documented Lua file, loaded by SHA, touching only its KEYS."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from distsched import (
    Claim,
    Outcome,
    Scheduler,
    State,
    TaskSpec,
    Wait,
    Worker,
    lua_files,
    model,
    schedules,
    scripts,
    validate,
)
from distsched.errors import InvalidArgument, ScriptError
from distsched.keys import KEY_NAMES, Keys
from distsched.ops import protocol
from distsched.ops.base import once
from distsched.scripts import SCRIPT_NAMES, Registry, lua_dir, source
from distsched.wire.calls import (
    DEFAULT_RETENTION_S,
    PROPAGATE_BUDGET,
    Call,
    add_deps_call,
    amend_call,
    cancel_call,
    claim_call,
    compact_call,
    complete_call,
    confirm_cancel_call,
    dep_results_call,
    enqueue_call,
    expire_call,
    fail_call,
    fairness_call,
    finish_call,
    fire_call,
    forget_call,
    heartbeat_call,
    leave_call,
    order_call,
    pause_call,
    progress_call,
    propagate_call,
    purge_call,
    reap_call,
    recur_remove_call,
    release_call,
    retry_call,
    schedule_call,
    spawn_call,
    waitpoint_call,
)
from distsched.wire.records import (
    _STATE_BY_CODE,
    Record,
    decode_cause,
    decode_dependents,
    decode_deps_list,
    decode_record,
    edge_range,
    id_prefix,
    parse_queue_member,
)
from distsched.wire.replies import decode_id_list, translate_error
from distsched.worker.link import WorkerLink
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
    includes: list[str]
    has_argv: bool
    has_reply: bool


def header_lines(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


def parse_header(name: str, text: str) -> Header:
    lines = header_lines(text)
    first = re.match(rf"^-- {re.escape(name)}\.lua: (\S.*)$", lines[0]) if lines else None
    keys = [n for line in lines if line.startswith("--- @keys ") for n in line.split()[2:]]
    return Header(
        purpose=first.group(1) if first else "",
        keys=keys,
        includes=[line.split()[2] for line in lines if line.startswith("--- @include ")],
        has_argv=any(re.match(r"^-- ARGV\[\d+\]", line) for line in lines),
        has_reply=any(re.match(r"^-- Reply: \S", line) for line in lines),
    )


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_opens_with_purpose_includes_keys_argv_and_reply(name: str) -> None:
    text = script_files()[name]
    header = parse_header(name, text)
    assert header.purpose, f"{name}.lua must open with '-- {name}.lua: <purpose>'"
    assert header.keys, f"{name}.lua declares no keys"
    assert header.includes, f"{name}.lua includes no library part"
    assert header.has_argv, f"{name}.lua documents no ARGV"
    assert header.has_reply, f"{name}.lua documents no Reply"
    # Directives below the header would be read by the registry but missed by a reader.
    assert text.count("\n--- @") == sum(line.startswith("--- @") for line in header_lines(text))
    assert scripts.script_keys(name) == tuple(header.keys)
    assert set(header.keys) <= set(KEY_NAMES)


def sample_calls() -> dict[str, Call]:
    keys = Keys("ns")
    claim = Claim("a", 1, 1, "f", (), {}, 0, 0.0)
    every_second = schedules.definition("s", "f", 0, {"interval": 1.0})
    return {
        "schedule": schedule_call(keys, [TaskSpec("a", "f")], 1000),
        "enqueue": enqueue_call(keys, [TaskSpec("a", "f")], 1000),
        "cancel": cancel_call(keys, "a"),
        "claim": claim_call(keys, "w", 1, 1000),
        "heartbeat": heartbeat_call(keys, [claim], 1000),
        "complete": complete_call(keys, [(claim, None)]),
        "finish": finish_call(keys, [(claim, None)], claim_call(keys, "w", 1, 1000)),
        "fail": fail_call(keys, [(claim, "x")]),
        "confirm_cancel": confirm_cancel_call(keys, claim),
        "release": release_call(keys, [claim]),
        "reap": reap_call(keys),
        "propagate": propagate_call(keys),
        "retry": retry_call(keys, "a", True),
        "add_deps": add_deps_call(keys, "a", ["b"], False),
        "purge": purge_call(keys),
        "forget": forget_call(keys, ["a"]),
        "compact": compact_call(keys),
        "leave": leave_call(keys, "w"),
        "recur": recur_remove_call(keys, "s"),
        "fire": fire_call(keys, every_second, "rev", "trigger", [("now", "now")], 1000),
        "order": order_call(keys, model.Order.PRIORITY, 1000),
        "fairness": fairness_call(keys, "key", "tenant", 3, 2),
        "expire": expire_call(keys),
        "amend": amend_call(keys, "a", priority=1),
        "pause": pause_call(keys, "pause", "a"),
        "progress": progress_call(keys, claim, 0.5, "half", b"\x01"),
        "dep_results": dep_results_call(keys, "a"),
        "waitpoint": waitpoint_call(keys, "complete", "a", None, {"ok": True}),
        "spawn": spawn_call(keys, claim, model.Spawn([TaskSpec("b", "f")]), 1000),
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


# Each local function of a script: where it starts, and its parameters.
Spans = list[tuple[int, list[str]]]


def _local_functions(code: str) -> tuple[dict[str, list[str]], Spans]:
    functions: dict[str, list[str]] = {}
    spans: Spans = []
    for m in FUNCTION.finditer(code):
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
        functions[m.group(1)] = params
        spans.append((m.start(), params))
    return functions, spans


def _params_at(spans: Spans, pos: int) -> list[str]:
    """The parameters of the function enclosing ``pos`` (the last one started before it)."""
    current: list[str] = []
    for start, params in spans:
        if start <= pos:
            current = params
    return current


def _key_allowed(spans: Spans, arg: str, pos: int) -> bool:
    return bool(KEY_ARG.match(arg)) or arg in _params_at(spans, pos)


def _redis_call_violations(code: str, spans: Spans) -> list[str]:
    problems = []
    for m in re.finditer(r"redis\.call\(", code):
        args = split_args(code, m.end() - 1)
        command = args[0].strip("'\"").upper()
        if command in KEYLESS_COMMANDS:
            continue
        if len(args) < 2 or not _key_allowed(spans, args[1], m.start()):
            problems.append(f"redis.call({', '.join(args[:2])}) at offset {m.start()}")
    return problems


def _helper_call_violations(code: str, fname: str, params: list[str], spans: Spans) -> list[str]:
    """Callers of a helper must pass key names from KEYS too."""
    problems = []
    key_params = [i for i, p in enumerate(params) if p == "k" or p.endswith(("_key", "_channel"))]
    for m in re.finditer(rf"(?<![\w.]){fname}\(", code):
        if code[max(0, m.start() - 15) : m.start()].rstrip().endswith("function"):
            continue
        args = split_args(code, m.end() - 1)
        for i in key_params:
            arg = args[i] if i < len(args) else ""
            # The k table is passed on as a whole; a key name must pass the key rule.
            ok = arg == "k" if params[i] == "k" else _key_allowed(spans, arg, m.start())
            if not ok:
                problems.append(f"{fname}(...) argument {params[i]} = {arg!r}")
    return problems


def _k_table_violations(code: str) -> list[str]:
    """The k table is built from KEYS only, and never reassigned."""
    problems = []
    for m in re.finditer(r"local k = \{(.*?)\}", code, re.S):
        body = m.group(1)
        rest = re.sub(r"\w+\s*=\s*KEYS\[\d+\]", "", body)
        if rest.replace(",", "").strip():
            problems.append(f"k table holds more than KEYS: {body!r}")
    if re.search(r"\bk\s*=", re.sub(r"local k = \{.*?\}", "", code, flags=re.S)):
        problems.append("k is reassigned")
    return problems


def key_violations(text: str) -> list[str]:
    """Places where a key or channel name may not come from KEYS.

    Allowed key arguments: ``KEYS[i]``, a field of the ``k`` table (itself checked to be
    built from KEYS only), or a parameter of the enclosing function whose callers are
    held to the same rule.
    """
    code = strip_comments(text)
    functions, spans = _local_functions(code)
    problems = _redis_call_violations(code, spans)
    for fname, params in functions.items():
        problems += _helper_call_violations(code, fname, params, spans)
    return problems + _k_table_violations(code)


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
    # Scripts reach keys only through the k table of the generated prelude, never KEYS.
    assert "KEYS[" not in strip_comments(script_files()[name])


def test_the_prelude_builds_k_from_the_declared_keys_in_order() -> None:
    for name in SCRIPT_NAMES:
        code = strip_comments(source(name))
        table = {int(i): field for field, i in re.findall(r"(\w+)\s*=\s*KEYS\[(\d+)\]", code)}
        assert [table[i] for i in sorted(table)] == list(scripts.script_keys(name))
        assert f"if #KEYS ~= {len(table)} then" in code


def test_the_library_touches_no_key_of_its_own() -> None:
    for text in library_files().values():
        assert key_violations(text) == []
        assert "KEYS[" not in strip_comments(text)
        assert "@keys" not in text


# --------------------------------------------------------------------------- static reach

LUA_TOKEN = re.compile(
    r"--[^\n]*|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|[A-Za-z_]\w*|\d+|==|~=|<=|>=|\.\.|\S"
)
LUA_KEYWORDS = {
    *("and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in"),
    *("local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"),
}
# The globals Redis gives a script that distsched uses.
LUA_GLOBALS = {
    *("KEYS", "ARGV", "redis", "string", "table", "math", "tonumber", "tostring", "type"),
    *("pairs", "ipairs", "next", "select", "unpack", "error", "pcall", "cmsgpack"),
}
TOP_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end$", re.M | re.S)


def tokens(code: str) -> list[str]:
    """Lua tokens, comments dropped, each string literal as one token."""
    return [t for t in LUA_TOKEN.findall(code) if not t.startswith("--")]


def undefined_names(code: str) -> list[str]:
    """Names used in ``code`` that nothing in it defines and that are not Lua's own.

    Defined: ``local`` names, function names and parameters, loop variables. A name
    after ``.`` or ``:`` is a field; ``name =`` after ``{`` or ``,`` a table field.
    """
    toks = tokens(code)
    defined: set[str] = set()
    for i, t in enumerate(toks):
        if t == "local" or t == "for":
            j = i + 1
            if toks[j] == "function":
                j += 1
            while re.match(r"^[A-Za-z_]\w*$", toks[j]):
                defined.add(toks[j])
                if toks[j + 1] != ",":
                    break
                j += 2
        if t == "function":
            j = toks.index("(", i)
            while toks[j] != ")":
                defined.add(toks[j])
                j += 1
    used = []
    for i, t in enumerate(toks):
        if not re.match(r"^[A-Za-z_]\w*$", t) or t in LUA_KEYWORDS | LUA_GLOBALS | defined:
            continue
        if i and toks[i - 1] in (".", ":"):
            continue
        if i + 1 < len(toks) and toks[i + 1] == "=" and toks[i - 1] in ("{", ","):
            continue
        used.append(t)
    return sorted(set(used))


def test_the_name_checker_flags_a_name_nothing_defines() -> None:
    """The static check itself can fail."""
    code = (
        "local function f(a, b) return helper(a) .. b end\n"
        "local t = { x = 1, y = f(1, 2) }\n"
        "for i, v in ipairs(t) do g(v, i, t.missing, string.len('z')) end\n"
    )
    assert undefined_names(code) == ["g", "helper"]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_name_a_script_uses_is_defined_by_itself_or_its_includes(name: str) -> None:
    assert undefined_names(source(name)) == []


def test_every_library_part_uses_only_what_it_includes() -> None:
    for file_name in library_files():
        part = file_name[: -len(".lua")]
        assembled = (
            scripts.prelude(KEY_NAMES)
            + "\n"
            + "\n".join(scripts.part_text(p) for p in scripts.resolve_includes([part]))
        )
        assert undefined_names(assembled) == [], part


def reachable_code(code: str) -> tuple[set[str], str]:
    """The top-level functions that code can reach from its top level (the body and the
    library's top-level statements), following their calls, and the code they and the
    top level hold (comments left out)."""
    code = strip_comments(code)
    bodies = {m.group(1): m.group(0) for m in TOP_FUNCTION.finditer(code)}
    pending = [TOP_FUNCTION.sub("", code)]
    seen: set[str] = set()
    chunks: list[str] = []
    while pending:
        chunk = pending.pop()
        chunks.append(chunk)
        for word in set(re.findall(r"(?<![\w.:])([A-Za-z_]\w*)\b", chunk)):
            if word in bodies and word not in seen:
                seen.add(word)
                pending.append(bodies[word])
    return seen, "\n".join(chunks)


def reachable_keys(code: str) -> set[str]:
    """The ``k.<name>`` keys that code can reach from its top level."""
    return set(re.findall(r"(?<![\w.])k\.(\w+)", reachable_code(code)[1]))


def test_the_reach_checker_follows_calls_and_skips_unreachable_functions() -> None:
    code = (
        "local function a()\n  redis.call('GET', k.one)\nend\n"
        "local function b()\n  a()\nend\n"
        "local function c()\n  redis.call('GET', k.three)\nend\n"
        "after(function() redis.call('GET', k.two) end)\n"
        "return b()\n"
    )
    assert reachable_keys(code) == {"one", "two"}


# Keys a script still receives, for a wire protocol that does not change, but no longer
# touches: fairness forgets no task, so it removes no fairness key of one;
# fairness, purge and forget end no running task, so they give no fairness slot back.
UNTOUCHED_SLOT_KEYS = {"idle", "fair", "fairready", "fairfull", "fairrun"}
KEPT_FOR_THE_PROTOCOL = {
    "fairness": {"fairkeys", "fairrun"},
    "purge": UNTOUCHED_SLOT_KEYS,
    "forget": UNTOUCHED_SLOT_KEYS,
}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_declares_exactly_the_keys_it_can_reach(name: str) -> None:
    kept = KEPT_FOR_THE_PROTOCOL.get(name, set())
    assert reachable_keys(source(name)) == set(scripts.script_keys(name)) - kept
    assert kept <= set(scripts.script_keys(name))


# What a header says a script publishes: the kinds of message, each by the words that
# name it in the header's "-- Publishes:" paragraph.
PUBLISHED_WORDS = {
    "ready": "'ready' on the channel",
    "cancel": "'cancel <version> <id>' on wake",
    "ended": "'<state> <id>' on ended",
    "progress": "'progress <id>' on ended",
}


def can_publish(code: str) -> set[str]:
    """The kinds of message code can publish, found from the publish calls it can reach:
    on ended, a cancel notice on wake, or 'ready' on a worker's channel."""
    calls = re.findall(r"(?<!function )\bpublish\(([^,]+),\s*([^)]*)", reachable_code(code)[1])
    kinds = set()
    for channel, message in calls:
        if channel.strip() == "k.ended" and message.strip().startswith("'progress "):
            kinds.add("progress")
        elif channel.strip() == "k.ended":
            kinds.add("ended")
        elif channel.strip() == "k.wake" and "'cancel" in message:
            kinds.add("cancel")
        elif message.strip().startswith("'ready'"):
            kinds.add("ready")
        else:
            raise AssertionError(f"a publish the header check does not know: {channel}, {message}")
    return kinds


def header_publishes(name: str) -> set[str]:
    lines = header_lines(script_files()[name])
    starts = [i for i, line in enumerate(lines) if line.startswith("-- Publishes: ")]
    assert len(starts) == 1, f"{name}.lua has no one '-- Publishes:' paragraph"
    paragraph = []
    for line in lines[starts[0] :]:
        if line == "--":
            break
        paragraph.append(line[3:])
    text = " ".join(paragraph)
    if text == "Publishes: nothing.":
        return set()
    kinds = {kind for kind, words in PUBLISHED_WORDS.items() if words in text}
    assert kinds, f"{name}.lua: {text!r} names no message"
    return kinds


def test_the_publish_checker_follows_calls_to_the_publish() -> None:
    code = (
        "local function publish(channel, message)\n"
        "  redis.pcall('SPUBLISH', channel, message)\nend\n"
        "local function wake(r)\n  publish(popped[1], 'ready')\nend\n"
        "local function tell(c)\n  publish(k.ended, c.state .. ' x')\nend\n"
        "local function unused()\n  publish(k.wake, string.format('cancel %d ', 1))\nend\n"
        "return run(function(c) wake(1); tell(c) end)\n"
    )
    assert can_publish(code) == {"ready", "ended"}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_says_what_its_script_publishes(name: str) -> None:
    assert header_publishes(name) == can_publish(source(name))


# --------------------------------------------------------------------------- assembly


def test_includes_come_dependencies_first_each_once_in_the_order_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    parts = {
        "a": "--- @include c\n--- @include b\nlocal A = 1\n",
        "b": "--- @include c\nlocal B = 1\n",
        "c": "local C = 1\n",
        "d": "--- @include a\nlocal D = 1\n",
        "loop1": "--- @include loop2\n",
        "loop2": "--- @include loop1\n",
        "keyed": "--- @keys tasks\n",
    }
    for name, text in parts.items():
        (lib / f"{name}.lua").write_text(text)
    monkeypatch.setattr(lua_files, "lua_dir", lambda: tmp_path)
    scripts.part_text.cache_clear()
    try:
        assert scripts.resolve_includes(["d", "b"]) == ("c", "b", "a", "d")
        assert scripts.resolve_includes(["b", "a"]) == ("c", "b", "a")
        text = "--- @include a\n--- @keys tasks meta\nreturn run(function(c) end)\n"
        assembled = scripts.assemble(text)
        assert assembled == "\n".join(
            [scripts.prelude(["tasks", "meta"]), parts["c"], parts["b"], parts["a"], text]
        )
        assert assembled.startswith("local k = { tasks = KEYS[1], meta = KEYS[2] }\n")
        with pytest.raises(ValueError, match="include each other"):
            scripts.resolve_includes(["loop1"])
        with pytest.raises(ValueError, match="no library part"):
            scripts.resolve_includes(["nothere"])
        with pytest.raises(ValueError, match="declares keys"):
            scripts.resolve_includes(["keyed"])
        with pytest.raises(ValueError, match="declare its keys"):
            scripts.assemble("--- @include c\n")
        with pytest.raises(ValueError, match="keys"):
            scripts.assemble("--- @keys tasks nokey\n")
        with pytest.raises(ValueError, match="neither"):
            scripts.assemble("--- @keys tasks\n--- @inclde c\n")
    finally:
        scripts.part_text.cache_clear()


def test_keys_for_a_script_are_the_namespace_keys_it_declares() -> None:
    keys = Keys("ns")
    for name in SCRIPT_NAMES:
        assert keys.for_script(name) == [getattr(keys, n) for n in scripts.script_keys(name)]
        assert all(key.startswith("ds:{ns}:") for key in keys.for_script(name))
    assert len(scripts.script_keys("heartbeat")) < len(KEY_NAMES)


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
    assert s.report_progress(a, 0.5, "half") is Outcome.APPLIED
    assert s.fail(a, "first try") is Outcome.APPLIED
    a2 = s.next("w")
    assert isinstance(a2, Claim) and a2.attempt == 2
    assert s.complete(a2, {"ok": True}) is Outcome.APPLIED
    assert s.complete(a2) is Outcome.DUPLICATE
    # A report with the next claim in the same call (the worker's way): nothing is due.
    outcomes, got, _ = WorkerLink(s).complete_and_claim([(a2, b"")], 1, "w")
    assert (outcomes, got) == ([Outcome.DUPLICATE], [])
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
    assert s.expire() == 0
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
    assert list(s.dependency_results("g")) == ["d", "c"]
    assert s.retry("c", cascade=True) > 0
    assert s.status("g").state is State.PENDING
    assert s.settle() == 0
    # Housekeeping: compaction (nothing to do here) and retention.
    assert s.compact() == 0
    s.set_retention(3600)
    assert s.purge() == 0 and s.stats()["retention_s"] == 3600
    # Removing given tasks now: e (failed) goes, d (ready) is refused, x is unknown.
    assert s.purge_tasks(["e", "d", "x"]) == 1
    assert s.status("d").state is State.READY
    # A worker that stops leaves the idle set ("w" waits for d, due in an hour).
    assert s.leave("w") is False
    # Schedules: stored, fired (a trigger), removed.
    s.add_schedule("hourly", "f", interval=3600)
    assert s.trigger("hourly") is not None
    assert s.fire_due() == 0
    assert s.remove_schedule("hourly") is True
    # The claim order: priority first, then back to the default.
    assert s.set_order("priority", aging=1.0).order is model.Order.PRIORITY
    assert s.set_order("default").order is model.Order.DEFAULT
    # Fairness keys: a cap and weight set (the namespace turns fair).
    assert s.set_key("tenant", cap=2, weight=3).weight == 3
    # In place: d (ready, due in an hour) amended, paused and resumed.
    assert s.amend("d", priority=5).change is model.Change.APPLIED
    assert s.pause_task("d").change is model.Change.APPLIED
    assert s.resume_task("d").change is model.Change.APPLIED
    # A spawn: the parent succeeds, adding a child and a join in the same call.
    s.schedule("p", fn="f", run_at=1.0)  # due before c, which the retry made ready
    parent = s.next("w")
    assert isinstance(parent, Claim) and parent.task_id == "p"
    spawn = model.Spawn([TaskSpec("p:0", "f")], join=TaskSpec("p:join", "f"))
    assert s.spawn(parent, spawn) is Outcome.APPLIED
    assert s.status("p:join").state is State.PENDING


@pytest.fixture
def own_client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    c = own_redis.client()
    yield c
    c.close()


def test_every_script_loads_by_sha_on_a_real_server(own_client: redis.Redis) -> None:
    registry = Registry(own_client)
    for name in SCRIPT_NAMES:
        text = source(name)
        assert text.startswith(scripts.prelude(scripts.script_keys(name)) + "\n")
        assert text.endswith(script_files()[name])
        sha = own_client.script_load(text)
        assert sha == hashlib.sha1(text.encode("utf-8")).hexdigest() == registry[name].sha
    assert all(own_client.script_exists(*(registry[n].sha for n in SCRIPT_NAMES)))


def functions_loaded(client: redis.Redis) -> dict[str, set[str]]:
    """FUNCTION LIST as library name -> its function names (RESP2 flat pairs)."""
    listed = cast(list[list[Any]], client.function_list())
    libraries = [dict(zip(entry[::2], entry[1::2], strict=True)) for entry in listed]
    return {
        lib[b"library_name"].decode(): {
            dict(zip(f[::2], f[1::2], strict=True))[b"name"].decode() for f in lib[b"functions"]
        }
        for lib in libraries
    }


def library_loaded(client: redis.Redis) -> bool:
    return scripts.library_name() in functions_loaded(client)


def test_every_script_is_a_function_of_one_library_that_runs_it_like_evalsha(
    own_client: redis.Redis,
) -> None:
    text = scripts.library()
    assert text.startswith(f"#!lua name={scripts.library_name()}\n")
    assert own_client.function_load(text) == scripts.library_name().encode()
    assert functions_loaded(own_client) == {
        scripts.library_name(): {scripts.function_name(name) for name in SCRIPT_NAMES}
    }
    # The same call gets the same reply either way (one namespace each, same state).
    for ns, via in (("by-fcall", "fcall"), ("by-evalsha", "evalsha")):
        call = schedule_call(Keys(ns), [TaskSpec("a", "f", priority=3)], 1 << 20)
        if via == "fcall":
            name = scripts.function_name("schedule")
            reply = own_client.fcall(name, len(call.keys), *call.keys, *call.args)
        else:
            sha = own_client.script_load(source("schedule"))
            reply = own_client.evalsha(sha, len(call.keys), *call.keys, *call.args)
        assert reply == [0, 1]
    # The same record but for the clock: run_at and the time of the last transition.
    records = [
        dataclasses.replace(
            decode_record(cast(bytes, own_client.hget(Keys(ns).tasks, "a"))),
            run_at_ms=0,
            updated_ms=0,
        )
        for ns in ("by-fcall", "by-evalsha")
    ]
    assert records[0] == records[1]


def test_the_library_check_reads_both_reply_shapes_and_counts_only_the_exact_name() -> None:
    name, code = scripts.library_name(), scripts.library()
    resp2 = [
        [b"library_name", name.encode(), b"engine", b"LUA", b"functions", [],
         b"library_code", code.encode()],
        [b"library_name", (name + "x").encode(), b"library_code", b"other"],
    ]  # fmt: skip
    resp3 = [{"library_name": name, "engine": "LUA", "library_code": code}]
    assert scripts.judge(resp2) is scripts.judge(resp3) is scripts.Check.SAME
    assert scripts.judge([]) is scripts.judge(resp2[1:]) is scripts.Check.MISSING
    changed = [{"library_name": name, "library_code": code.replace("return run(body)", "")}]
    assert scripts.judge(changed) is scripts.Check.DIFFERENT
    assert scripts.judge([{"library_name": name, "library_code": code + " "}]) is (
        scripts.Check.DIFFERENT
    )
    assert scripts.check_command() == ["FUNCTION", "LIST", "LIBRARYNAME", name, "WITHCODE"]
    refused = redis.exceptions.NoPermissionError("User x has no permissions to run 'function|list'")
    assert scripts.judge_error(refused) is scripts.Check.REFUSED
    unknown = redis.ResponseError("unknown command 'FUNCTION', with args beginning with: 'LIST'")
    assert scripts.judge_error(unknown) is scripts.Check.UNAVAILABLE
    assert scripts.judge_error(redis.ResponseError("LOADING")) is None


def test_a_client_checks_the_library_once_then_calls_it_without_asking_again(
    own_client: redis.Redis,
) -> None:
    own_client.config_resetstat()
    s = Scheduler(own_client, namespace="once")
    try:
        for i in range(10):
            s.schedule(f"a{i}", fn="f")
    finally:
        s.close()
    stats = own_client.info("commandstats")
    # Missing at first: checked, loaded, checked again; then only FCALL.
    assert stats["cmdstat_function|list"]["calls"] == 2
    assert stats["cmdstat_function|load"]["calls"] == 1
    assert stats["cmdstat_fcall"]["calls"] == 10


def test_scripts_reload_transparently_after_function_flush(own_client: redis.Redis) -> None:
    s = Scheduler(own_client, namespace="flush")
    warm = Scheduler(own_client, namespace="warm")
    try:
        warm.schedule("warm", fn="f")  # the server has the library
        assert library_loaded(own_client)
        own_client.function_flush()
        assert not library_loaded(own_client)
        lifecycle(s)  # the first call meets "Function not found" and loads the library
        assert library_loaded(own_client)
        own_client.function_flush()
        assert s.cancel("d") is State.CANCELLED
        # Each client reloads on its own.
        own_client.function_flush()
        version = warm.schedule("warm", fn="f", priority=7)
        assert (warm.status("warm").version, warm.status("warm").priority) == (version, 7)
        assert library_loaded(own_client)
    finally:
        s.close()
        warm.close()
    # EVALSHA was never needed.
    assert own_client.script_exists(*(Registry(own_client)[n].sha for n in SCRIPT_NAMES)) == [
        False
    ] * len(SCRIPT_NAMES)


def test_a_user_refused_functions_runs_the_scripts_by_sha_and_reloads_them_after_script_flush(
    own_redis: RedisServer, own_client: redis.Redis
) -> None:
    own_client.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "nofn", "reset", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function"
    )
    client = own_redis.client(username="nofn", password="pw")
    s = Scheduler(client, namespace="flush")
    try:
        shas = [s._scripts[name].sha for name in SCRIPT_NAMES]
        lifecycle(s)
        assert not library_loaded(own_client)
        assert all(own_client.script_exists(*shas))
        own_client.script_flush()
        assert not any(own_client.script_exists(*shas))
        assert s.cancel("d") is State.CANCELLED  # meets NOSCRIPT first and reloads
        assert own_client.script_exists(s._scripts["cancel"].sha) == [True]
    finally:
        s.close()
        client.close()


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
    own_client.execute_command(  # type: ignore[no-untyped-call]
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
    assert all(
        key.startswith(f"ds:{{{ns}}}:".encode()) for key in cast(list[bytes], own_client.keys("*"))
    )


def raw(s: Scheduler, call: Call) -> tuple[int, list[Any]]:
    """One script call as it is, without settling what it leaves: (jobs left, values)."""
    return s._drive(once(call))


class RecordingScheduler(Scheduler):
    """Keeps every script reply: (script name, reply)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies: list[tuple[str, Any]] = []

    def _request(self, request: protocol.Request) -> Any:
        reply = super()._request(request)
        if isinstance(request, Call):
            self.replies.append((request.script, reply))
        return reply


NEVER_PROPAGATE = {
    "enqueue",
    "heartbeat",
    "purge",
    "forget",
    "compact",
    "leave",
    "recur",
    "order",
    "fairness",
    "amend",
    "pause",
    "progress",
    "dep_results",
}


def test_every_reply_opens_with_the_number_of_propagation_jobs_left(
    own_client: redis.Redis,
) -> None:
    s = RecordingScheduler(own_client, namespace="replies")
    try:
        lifecycle(s)
    finally:
        s.close()
    d = RecordingScheduler(own_client, namespace="replies-dependents")
    try:
        # A fail that leaves dependents to settle, seen in its raw reply.
        d.schedule_many(
            [TaskSpec("root", "f")] + [TaskSpec(f"c{i}", "f", deps=["root"]) for i in range(3)]
        )
        [claim] = d.ready(1, "w")
        call = fail_call(d.keys, [(claim, "x")])
        assert call.args[0] == PROPAGATE_BUDGET
        # A budget of one edge: two of the three dependents are left to settle.
        left, [outcome] = raw(d, dataclasses.replace(call, args=[1, *call.args[1:]]))
        assert (int(left), outcome) == (1, b"applied")
        left, [used] = raw(d, propagate_call(d.keys, 1))
        assert (int(left), int(used)) == (1, 1)
        left, [used] = raw(d, propagate_call(d.keys, 5))
        assert (int(left), int(used)) == (0, 1)
        assert d.status("c2").state is State.BLOCKED
    finally:
        d.close()
    assert {name for name, _ in s.replies} == set(SCRIPT_NAMES)
    for name, reply in s.replies + d.replies:
        assert isinstance(reply, list) and isinstance(reply[0], int) and reply[0] >= 0, name
        if name in NEVER_PROPAGATE:
            assert reply[0] == 0, name


def test_a_script_sent_the_wrong_number_of_keys_is_refused_before_it_runs(
    own_client: redis.Redis,
) -> None:
    keys = Keys("wrong").for_script("cancel")
    sha = own_client.script_load(source("cancel"))
    expected = rf"^BADARG KEYS expected {len(keys)}: tasks results"
    with pytest.raises(redis.ResponseError, match=expected):
        own_client.evalsha(sha, len(keys) - 1, *keys[:-1], PROPAGATE_BUDGET, "a")
    assert own_client.keys("*") == []


def test_each_script_runs_as_a_user_allowed_only_its_declared_keys(
    own_redis: RedisServer, own_client: redis.Redis
) -> None:
    """Redis checks every key a script touches against the user's ACL: each script here
    runs as its own user, whose key (and channel) patterns are exactly its declared keys."""
    ns = "per-script"
    keys = Keys(ns)
    clients = []
    s = Scheduler(own_client, namespace=ns, max_running=10)
    try:
        for name in SCRIPT_NAMES:
            declared = keys.for_script(name)
            # The channel travels in KEYS too, so Redis checks it as a key and a channel.
            rules = [f"~{key}" for key in declared]
            rules += [f"&{channel}" for channel in (keys.wake, keys.ended) if channel in declared]
            own_client.execute_command(  # type: ignore[no-untyped-call]
                "ACL",
                "SETUSER",
                f"s-{name}",
                "reset",
                "on",
                ">pw",
                "resetchannels",
                *rules,
                "+@all",
            )
            client = own_redis.client(username=f"s-{name}", password="pw")
            clients.append(client)
            s._scripts.scripts[name] = scripts.Script(client, name)
        # The limit is real: heartbeat's user cannot even read the queue.
        with pytest.raises(redis.exceptions.NoPermissionError):
            clients[SCRIPT_NAMES.index("heartbeat")].zcard(keys.queue)
        lifecycle(s)
        s.schedule_many(
            [TaskSpec("r", "f")] + [TaskSpec(f"c{i}", "f", deps=["r"]) for i in range(3)]
        )
        claims = {claim.task_id: claim for claim in s.ready(10, "w")}
        assert s.fail(claims.pop("r"), "x") is Outcome.APPLIED
        assert s.complete_many([(claim, None) for claim in claims.values()])
        assert s.status("c0").state is State.BLOCKED
        s.retry("r", cascade=True)
        assert s.status("c0").state is State.PENDING
        ran: list[int] = []
        s.schedule_many([TaskSpec(f"w{i}", "f", args=(i,)) for i in range(3)])
        worker = Worker(s, {"f": ran.append}, concurrency=2)
        run_worker_until(
            s, worker, lambda: all(s.status(f"w{i}").state is State.SUCCEEDED for i in range(3))
        )
        assert sorted(ran) == [0, 1, 2]
    finally:
        s.close()
        for client in clients:
            client.close()


# --------------------------------------------------------------------------- Lua and Python twins


def lua_eval(client: redis.Redis, body: str, *args: Any) -> Any:
    """Run ``body`` with the whole library included (keys of namespace 'twins'), ``c`` the
    state of the call as ``run`` hands it to a script's body."""
    text = (
        "--- @include settle\n--- @include tokens\n--- @include attempt\n"
        f"--- @keys {' '.join(KEY_NAMES)}\nlocal c = {{}}\n" + body
    )
    return client.eval(scripts.assemble(text), len(KEY_NAMES), *Keys("twins").script_keys(), *args)


def test_lua_and_python_store_the_same_state_letters(own_client: redis.Redis) -> None:
    pairs = lua_eval(
        own_client,
        "local out = {}\n"
        "for name, code in pairs(STATE_CODE) do\n"
        "  assert(STATE_NAME[code] == name)\n"
        "  out[#out + 1] = code .. '=' .. name .. '=' .. (TERMINAL[name] and 't' or '-')\n"
        "end\n"
        "for code, name in pairs(STATE_NAME) do assert(STATE_CODE[name] == code) end\n"
        "return out\n",
    )
    lua = {p.decode().split("=")[0]: p.decode().split("=")[1:] for p in pairs}
    python = {code: [state.value, "t" if state.terminal else "-"] for code, state in
              _STATE_BY_CODE.items()}  # fmt: skip
    assert lua == python
    assert {state for state, _ in python.values()} == {s.value for s in State}


def test_a_record_the_lua_side_writes_is_the_record_the_python_side_reads(
    own_client: redis.Redis,
) -> None:
    worker = "host|42|w\u00e9"
    raw, loaded = lua_eval(
        own_client,
        "local t = { state = 'running', version = 2^53 - 1, attempt = 3, max_attempts = 1000000,\n"
        "  backoff_ms = 3600000, run_at = 1700000000123, priority = -2147483648, cancel = 1,\n"
        "  updated = 1700000000100, remaining = 7, optional_remaining = 0, optional = 2,\n"
        "  worker = ARGV[1] }\n"
        "local raw = encode_task(t)\n"
        "local back = load_task('x', raw)\n"
        "return { raw, encode_task(back) }\n",
        worker,
    )
    assert raw == loaded
    assert decode_record(raw) == Record(
        state=State.RUNNING,
        version=2**53 - 1,
        attempt=3,
        max_attempts=1_000_000,
        backoff_ms=3_600_000,
        run_at_ms=1_700_000_000_123,
        priority=validate.PRIORITY_MIN,
        cancel_requested=True,
        updated_ms=1_700_000_000_100,
        remaining=7,
        optional_remaining=2,
        worker=worker,
    )


def test_queue_members_built_in_lua_parse_in_python_and_sort_by_priority_then_version(
    own_client: redis.Redis,
) -> None:
    cases = [
        (validate.PRIORITY_MAX, 1),
        (0, 2**53 - 1),
        (0, 5),
        (validate.PRIORITY_MIN, 1),
        (-1, 3),
    ]
    args = [str(v) for case in cases for v in case]
    members = lua_eval(
        own_client,
        "local out = {}\n"
        "for i = 1, #ARGV, 2 do\n"
        "  local t = { priority = tonumber(ARGV[i]), version = tonumber(ARGV[i + 1]) }\n"
        "  out[#out + 1] = queue_member(t, 'id' .. i)\n"
        "end\n"
        "return out\n",
        *args,
    )
    parsed = [parse_queue_member(m) for m in members]
    assert parsed == [(version, f"id{2 * i + 1}") for i, (_, version) in enumerate(cases)]
    by_bytes = sorted(range(len(cases)), key=lambda i: members[i])
    by_rule = sorted(range(len(cases)), key=lambda i: (-cases[i][0], cases[i][1]))
    assert by_bytes == by_rule


def test_ids_edges_dependency_lists_and_causes_have_one_format_on_both_sides(
    own_client: redis.Redis,
) -> None:
    longest = "\u00e9" * (validate.MAX_TASK_ID_BYTES // 2)
    assert len(longest.encode()) == validate.MAX_TASK_ID_BYTES < 16**3  # hex3 holds every length
    ids = ["a", "b|c", "new\nline", longest]
    prefixes, hexes, deps, edge, cause = lua_eval(
        own_client,
        "local prefixes, hexes, list = {}, {}, {}\n"
        "for i, id in ipairs(ARGV) do\n"
        "  prefixes[i] = id_prefix(id)\n"
        "  hexes[i] = hex_id(id)\n"
        "  list[i] = { kind = (i % 2 == 1) and 'r' or 'o', id = id }\n"
        "end\n"
        "return { prefixes, table.concat(hexes, ' '), encode_deps(list),\n"
        "         edge_member(ARGV[1], 'w', 'r', ARGV[2]), id_prefix(ARGV[3]) .. ARGV[4] }\n",
        *ids,
    )
    assert prefixes == [id_prefix(i) for i in ids]
    assert decode_id_list(hexes.decode()) == ids
    assert decode_deps_list(deps) == [("r", "a"), ("o", "b|c"), ("r", ids[2]), ("o", longest)]
    low, high = edge_range("a")
    assert low[1:] <= edge < high[1:]
    assert decode_dependents("a", [edge]) == ("b|c",)
    assert decode_cause(cause) == (ids[2], longest)


def test_the_limits_checked_in_python_are_the_limits_the_scripts_check(
    own_client: redis.Redis,
) -> None:
    s = Scheduler(own_client, namespace="limits")
    try:

        def raw_schedule(priority: int, max_attempts: int) -> Any:
            call = schedule_call(s.keys, [TaskSpec("t", "f")], s.max_payload_bytes)
            spec = f"in 0 {priority} {max_attempts} 0 0 0 0"
            return raw(s, dataclasses.replace(call, args=[*call.args[:3], spec, call.args[4]]))

        for priority in (validate.PRIORITY_MIN, validate.PRIORITY_MAX):
            assert raw_schedule(priority, 1)[0] == 0
        for priority in (validate.PRIORITY_MIN - 1, validate.PRIORITY_MAX + 1):
            with pytest.raises(InvalidArgument, match="priority"):
                raw_schedule(priority, 1)
        with pytest.raises(InvalidArgument, match="max_attempts"):
            raw_schedule(0, 0)
        # The calls send the Python constants the scripts no longer hold.
        assert purge_call(s.keys).args[2] == DEFAULT_RETENTION_S * 1000
        assert reap_call(s.keys).args[:2] == [PROPAGATE_BUDGET, validate.BACKOFF_CAP_MS]
        assert validate.BACKOFF_CAP_MS == validate.BACKOFF_MAX_S * 1000
    finally:
        s.close()
    for name in SCRIPT_NAMES:
        code = strip_comments(source(name))
        assert "86400000" not in code and "3600000" not in code, name
        assert not re.search(r"\bPROPAGATE_BUDGET\b", code), name


def test_every_error_code_a_script_raises_is_one_the_client_translates() -> None:
    codes = set()
    for text in [*script_files().values(), *library_files().values()]:
        codes.update(re.findall(r"err = '([A-Z]+) ", strip_comments(text)))
    assert codes == {
        "BADARG",
        "BUSY",
        "CONFLICT",
        "CORRUPT",
        "CYCLE",
        "NOTDEP",
        "NOTFOUND",
        "TOOBIG",
        "UNKNOWN",
    }
    samples = {
        "NOTDEP": "NOTDEP 61 62",
        "TOOBIG": "TOOBIG deps 1001 61",
        "BADARG": "BADARG n must be an integer",
        "BUSY": "BUSY a",
        "CONFLICT": "CONFLICT running a",
        "CYCLE": "CYCLE 61 62 61",
        "NOTFOUND": "NOTFOUND a",
        "UNKNOWN": "UNKNOWN 61 62",
    }
    for code, message in samples.items():
        assert not isinstance(translate_error(message), ScriptError), code
    # A corrupt record is a server-side fault, not an API error.
    assert isinstance(translate_error("CORRUPT task record of a"), ScriptError)


def readme_table(heading: str) -> dict[str, list[str]]:
    """Script name -> the words of the second column, from the table under ``heading``."""
    text = (LUA / "README.md").read_text("utf-8")
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1].split()
    return rows


def test_the_readme_lists_each_scripts_includes_and_keys_as_its_header_declares() -> None:
    assert readme_table("### Assembly") == {n: list(scripts.includes(n)) for n in SCRIPT_NAMES}
    assert readme_table("### Keys") == {n: list(scripts.script_keys(n)) for n in SCRIPT_NAMES}
    replies = readme_table("### Replies")
    assert set(replies) == set(SCRIPT_NAMES)
    for name, words in replies.items():
        first = "`[0," if name in NEVER_PROPAGATE else "`[left,"
        assert words[0] == first, name


def test_the_function_library_is_built_as_the_wire_protocol_document_says() -> None:
    """lua/README.md, "As Redis Functions": rebuilt here from the files and that page."""
    listed = (
        "schedule enqueue cancel claim heartbeat complete finish fail confirm_cancel release reap "
        "propagate retry add_deps purge forget compact leave recur fire order expire fairness "
        "amend pause progress dep_results waitpoint spawn"
    )
    order = listed.split(" ")
    assert tuple(order) == SCRIPT_NAMES
    digest = hashlib.sha1(usedforsecurity=False)
    for name in order:
        digest.update(name.encode() + b"\0" + source(name).encode() + b"\0")
    h = digest.hexdigest()[:16]

    def declared(part: str) -> list[str]:
        # The page's rule: every name of a line starting "local " (column 0).
        names = []
        for line in library_files()[f"{part}.lua"].splitlines():
            if line.startswith("local function "):
                names.append(line.split()[2].split("(")[0])
            elif line.startswith("local "):
                names += [n.strip() for n in line[6:].split("=")[0].split(",")]
        return names

    def direct(name: str) -> list[str]:
        return re.findall(r"(?m)^--- @include (\w+)$", script_files()[name])

    blocks: list[list[str]] = []
    for name in order:
        if blocks:
            joined = {part for member in [*blocks[-1], name] for part in scripts.includes(member)}
            if sum(len(declared(part)) for part in joined) <= 180:
                blocks[-1].append(name)
                continue
        blocks.append([name])
    assert len(blocks) < len(order) / 3  # the point of blocks: each part once per block
    lines = [f"#!lua name=distsched_{h}"]
    for members in blocks:
        parts = scripts.resolve_includes([part for name in members for part in direct(name)])
        names = [n for part in parts for n in declared(part)]
        assert len(names) == len(set(names)), "two parts of a block declare one name"
        lines += ["do", "local KEYS, ARGV, k = nil, nil, {}"]
        lines += [library_files()[f"{part}.lua"] for part in parts]
        for name in members:
            text = script_files()[name]
            keys = scripts.script_keys(name)
            head, body = text.split("\nreturn run(function(c)\n")
            assert body.endswith("\nend)\n")
            targets = ", ".join(f"k.{key}" for key in keys)
            values = ", ".join(f"keys[{i}]" for i in range(1, len(keys) + 1))
            lines += [
                "do",
                head,
                "local function body(c)",
                body[: -len("end)\n")] + "end",
                "local its_keys = {}",
                f"redis.register_function{{function_name = 'distsched_{h}_{name}', "
                "callback = function(keys, args)",
                f"  if #keys ~= {len(keys)} then return redis.error_reply("
                f"'BADARG KEYS expected {len(keys)}: {' '.join(keys)}') end",
                "  KEYS, ARGV, k = keys, args, its_keys",
                f"  {targets} = {values}",
                "  return run(body)",
                "end}",
                "end",
            ]
            assert scripts.function_name(name) == f"distsched_{h}_{name}"
        lines.append("end")
    assert scripts.library() == "\n".join(lines) + "\n"
    readme = (LUA / "README.md").read_text("utf-8")
    assert listed in " ".join(readme.split())


def test_the_key_names_and_the_registry_read_the_headers_from_one_module_below_both() -> None:
    """keys.py and scripts.py import lua_files, never each other (no import circle)."""
    package = Path(lua_files.__file__).parent
    imports = re.compile(
        r"^\s*(?:from distsched(?:\.(\w+))? import (\w+)|import distsched\.(\w+))", re.M
    )

    def imported(module: str) -> set[str]:
        text = (package / f"{module}.py").read_text("utf-8")
        return {a or b or c for a, b, c in imports.findall(text)}

    assert "scripts" not in imported("keys")
    assert "keys" not in imported("scripts")
    assert not imported("lua_files")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        words = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        anchors.add(words.replace(" ", "-"))
    return anchors


def test_the_protocol_and_the_storage_reference_link_to_sections_that_exist() -> None:
    """lua/README.md (the wire protocol) and lua/STORAGE.md (every key and its layout)."""
    docs = {name: (LUA / name).read_text("utf-8") for name in ("README.md", "STORAGE.md")}
    for name, text in docs.items():
        links = re.findall(r"\]\(((?:README|STORAGE)\.md)?#([a-z0-9-]+)\)", text)
        assert links, name
        for target, anchor in links:
            assert anchor in heading_anchors(docs[target or name]), f"{name}: {target}#{anchor}"


def test_library_parts_only_define_and_register_nothing() -> None:
    """A part's top level is local definitions only: no call and no assignment that makes
    including it change what another part does (hooks filled in at include time)."""
    for file_name, text in library_files().items():
        for line in strip_comments(text).splitlines():
            if line and not line[0].isspace():
                assert re.match(r"^(local |end\b|\})", line), f"{file_name}: {line}"
        # Nothing a part defines is assigned to by another part.
        code = strip_comments(text)
        for other_name, other in library_files().items():
            if other_name == file_name:
                continue
            for name in re.findall(r"^local (?:function )?(\w+)", code, re.M):
                assert not re.search(rf"^\s*{name}\s*=[^=]", strip_comments(other), re.M), (
                    f"{other_name} assigns {name} of {file_name}"
                )


def test_the_call_examples_of_the_wire_protocol_name_the_keys_each_script_declares() -> None:
    text = (LUA / "README.md").read_text("utf-8")
    examples = re.findall(
        r"```\n(EVALSHA <sha of the assembled (\w+)\.lua> (\d+)\n.*?)```", text, re.S
    )
    assert {name for _, name, _ in examples} >= {"schedule", "enqueue"}
    for block, name, count in examples:
        named = re.findall(r"ds:\{NS\}:(\w+)", block)
        assert int(count) == len(named), name
        assert tuple(named) == scripts.script_keys(name), name


# An error a script raises: a code in capitals, then for BADARG the field (a word, no
# punctuation of its own) and the reason, the one shape every client reads.
_RAISED = re.compile(r"err = '(BADARG) ([^' ]*)")


def test_every_bad_argument_a_script_raises_names_its_field_in_one_shape() -> None:
    """``-BADARG <field> <why>``: a field followed by a colon (``deps:``) would be read as
    another field by a client that splits on the first space."""
    shapes = []
    for path in sorted(Path(str(lua_dir())).rglob("*.lua")):
        for code, field in _RAISED.findall(path.read_text("utf-8")):
            shapes.append((path.name, code, field))
    assert shapes, "no BADARG found: the pattern no longer matches the scripts"
    odd = [s for s in shapes if s[2] and not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9.]*", s[2])]
    assert odd == []
