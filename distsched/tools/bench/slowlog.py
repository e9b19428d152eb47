"""Reading SLOWLOG: which script an entry called, and where Redis time went."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from distsched import scripts
from distsched.wire import calls

# Script calls as SLOWLOG names them (argv[0], upper case).
_FUNCTION_CALLS = (b"FCALL", b"FCALL_RO")
_EVALSHA_CALLS = (b"EVALSHA", b"EVALSHA_RO")
_EVAL_CALLS = (b"EVAL", b"EVAL_RO")


def argv_head(command: Any) -> tuple[bytes, bytes]:
    """argv[0] (upper case) and argv[1] of a SLOWLOG entry's command: a list of
    arguments, or the one string redis-py joins them into (neither a command name, a
    function name nor a SHA1 holds a space, so the first two words are exact)."""
    words: list[bytes] = []
    items = command if isinstance(command, (list, tuple)) else [command]
    for item in items:
        if isinstance(item, str):
            item = item.encode()
        if not isinstance(item, bytes):
            break
        words.extend(item.split(b" ", 2 - len(words))[: 2 - len(words)])
        if len(words) >= 2:
            break
    words += [b""] * (2 - len(words))
    return words[0].upper(), words[1]


def text_of(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def script_of(command: Any, shas: dict[str, str]) -> str | None:
    """The distsched script a SLOWLOG entry called, None when it is no script call.

    An FCALL names the function ``distsched_<hash>_<script>`` (scripts.function_name; the
    hash is ignored, so an older library's calls count too: script names may hold
    ``_``, hence the split after the hash rather than at the last ``_``); an EVALSHA
    names the SHA1 of the script's text (``shas``: SHA1 to script name). Any other
    script call is named ``other ...`` with its function or the start of its SHA1."""
    name, first = argv_head(command)
    if name in _FUNCTION_CALLS:
        parts = first.decode("utf-8", "replace").split("_", 2)
        if len(parts) == 3 and parts[0] == "distsched" and parts[2] in scripts.SCRIPT_NAMES:
            return parts[2]
        return f"other function {'_'.join(parts)}"
    if name in _EVALSHA_CALLS:
        sha = first.decode("ascii", "replace").lower()
        return shas.get(sha, f"other script {sha[:12]}")
    if name in _EVAL_CALLS:
        # The one script distsched sends as text: the server clock (wire.calls.SERVER_TIME_LUA).
        text = command if isinstance(command, bytes) else b" ".join(_words(command))
        return "server clock (EVAL)" if _SERVER_TIME in text else "other script (EVAL)"
    return None


# SLOWLOG keeps the first 128 bytes of a long argument: its first line is enough.
_SERVER_TIME = calls.SERVER_TIME_LUA.encode().split(b"\n", 1)[0]


def _words(command: Any) -> list[bytes]:
    items = command if isinstance(command, (list, tuple)) else [command]
    return [
        item.encode() if isinstance(item, str) else item
        for item in items
        if isinstance(item, (str, bytes))
    ]


def is_script_client(address: Any) -> bool:
    """Whether a SLOWLOG entry's client is a script's own (its commands are a script's
    inner commands): Redis names that client's address ``?:0``."""
    return text_of(address).startswith("?")


def profile_slowlog(
    entries: Iterable[dict[str, Any]],
    shas: dict[str, str],
    skip_clients: Iterable[str] = (),
) -> dict[str, Any]:
    """Where Redis time went, from SLOWLOG entries logged with ``slowlog-log-slower-than 0``.

    Each script call is counted under its script (calls, microseconds: its inner commands
    included); the commands a script runs are logged too, just before the script call
    itself (Redis logs a command when it ends), and are summed by command name under
    ``inner``. Calls from ``skip_clients`` (client names: the bench's own polling) are
    left out with their inner commands; other top-level commands go under ``other``."""
    skip = set(skip_clients)
    by_script: dict[str, dict[str, int]] = {}
    inner: dict[str, dict[str, int]] = {}
    other: dict[str, dict[str, int]] = {}
    pending: list[tuple[str, int]] = []
    count = 0

    def add(table_: dict[str, dict[str, int]], key: str, usec: int) -> None:
        slot = table_.setdefault(key, {"calls": 0, "us": 0})
        slot["calls"] += 1
        slot["us"] += usec

    # SLOWLOG GET lists the newest first; the inner commands must come before their call.
    for entry in sorted(entries, key=lambda e: int(e["id"])):
        count += 1
        usec = int(entry["duration"])
        command = entry.get("command")
        if is_script_client(entry.get("client_address")):
            pending.append((argv_head(command)[0].decode("utf-8", "replace"), usec))
            continue
        skipped = text_of(entry.get("client_name")) in skip
        script = script_of(command, shas)
        if not skipped:
            if script is not None:
                add(by_script, script, usec)
            else:
                add(other, argv_head(command)[0].decode("utf-8", "replace"), usec)
        if script is not None:
            if not skipped:
                for name, inner_us in pending:
                    add(inner, name, inner_us)
            pending = []
    # Inner commands with no script call after them (none, unless the log was cut).
    for name, inner_us in pending:
        add(inner, name, inner_us)
    return {
        "entries": count,
        "scripts": by_script,
        "script_us": sum(s["us"] for s in by_script.values()),
        "script_calls": sum(s["calls"] for s in by_script.values()),
        "inner": inner,
        "inner_us": sum(s["us"] for s in inner.values()),
        "other": other,
    }


def command_name(command: Any) -> bytes:
    if isinstance(command, (list, tuple)):
        command = command[0] if command else b""
    if isinstance(command, str):
        command = command.encode()
    if not isinstance(command, bytes):
        return b""
    return command.split(b" ", 1)[0].upper()
