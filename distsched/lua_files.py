"""The Lua files and what their headers declare: the one place both the key names
(:mod:`distsched.keys`) and the script registry (:mod:`distsched.scripts`) read them from.

A script file declares, in its header, the library parts it uses (``--- @include
<part>``, one line each, naming ``lua/lib/<part>.lua``) and the keys it receives
(``--- @keys <name> <name> ...``, in ``KEYS`` order; several lines continue the
list). A library part may declare includes of its own, never keys.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

# Every script, in the order the Functions library holds them (lua/README.md).
SCRIPT_NAMES = (
    "schedule",
    "enqueue",
    "cancel",
    "claim",
    "heartbeat",
    "complete",
    "finish",
    "fail",
    "confirm_cancel",
    "release",
    "reap",
    "propagate",
    "retry",
    "add_deps",
    "purge",
    "forget",
    "compact",
    "leave",
    "recur",
    "fire",
    "order",
    "expire",
    "fairness",
    "amend",
    "pause",
    "progress",
    "dep_results",
    "waitpoint",
    "spawn",
)

# Every key (and the wake and ended channels) of a namespace, by the name scripts declare
# it with in their ``--- @keys`` lines (lua/STORAGE.md describes each).
KEY_NAMES = (
    "tasks",
    "payloads",
    "results",
    "done",
    "queue",
    "leases",
    "finished",
    "meta",
    "wake",
    "idle",
    "claims",
    "edges",
    "deps",
    "blocked",
    "blockedby",
    "propagating",
    "states",
    "history",
    "minutes",
    "schedules",
    "fires",
    "firing",
    "waits",
    "ended",
    "ranked",
    "debounce",
    "deadlines",
    "fair",
    "fairq",
    "fairready",
    "fairwait",
    "fairfull",
    "fairkeys",
    "fairrun",
    "paused",
    "progress",
    "checkpoints",
    "costs",
    "parents",
    "spawned",
    "joins",
    "window",
    "windows",
)

_INCLUDE = re.compile(r"^--- @include (\S+)\s*$", re.M)
_KEYS = re.compile(r"^--- @keys((?: \S+)+)\s*$", re.M)
_DIRECTIVE = re.compile(r"^--- @", re.M)
_PART_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Directives:
    """What a file's ``--- @`` lines declare: its direct includes and its keys, in order."""

    includes: tuple[str, ...]
    keys: tuple[str, ...]


def parse_directives(text: str) -> Directives:
    """Read the ``--- @include`` and ``--- @keys`` lines of a script or library part."""
    includes = tuple(_INCLUDE.findall(text))
    keys = tuple(name for line in _KEYS.findall(text) for name in line.split())
    if len(_DIRECTIVE.findall(text)) != len(_INCLUDE.findall(text)) + len(_KEYS.findall(text)):
        raise ValueError("a '--- @' line is neither '--- @include <part>' nor '--- @keys <names>'")
    return Directives(includes, keys)


def lua_dir() -> Traversable:
    """Where the scripts are: inside the installed package, or the source checkout."""
    packaged = resources.files("distsched") / "lua"
    if packaged.is_dir():
        return packaged
    # A source checkout (editable install): the scripts stay at the repository top.
    return Path(__file__).resolve().parent.parent / "lua"


@functools.cache
def part_text(part: str) -> str:
    """The text of library part ``part`` (``lua/lib/<part>.lua``)."""
    if not _PART_NAME.match(part):
        raise ValueError(f"bad library part name {part!r}")
    path = lua_dir() / "lib" / f"{part}.lua"
    if not path.is_file():
        raise ValueError(f"no library part {part!r} (lua/lib/{part}.lua)")
    text = path.read_text("utf-8")
    if parse_directives(text).keys:
        raise ValueError(f"library part {part!r} declares keys: only scripts do")
    return text


def script_text(name: str) -> str:
    """The text of script ``name`` (``lua/<name>.lua``)."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return (lua_dir() / f"{name}.lua").read_text("utf-8")


@functools.cache
def script_keys(name: str) -> tuple[str, ...]:
    """The key names (``Keys`` attributes) script ``name`` receives, in ``KEYS`` order."""
    return parse_directives(script_text(name)).keys
