"""The script registry: every ``lua/*.lua`` transition, loaded once per client.

A script file declares, in its header, the library parts it uses (``--- @include
<part>``, one line each, naming ``lua/lib/<part>.lua``) and the keys it receives
(``--- @keys <name> <name> ...``, in ``KEYS`` order; several lines continue the
list). A library part may declare includes of its own. The text sent to Redis is
a generated prelude that binds the declared keys (:func:`prelude`), then every part
the script needs, dependencies first and each once (:func:`resolve_includes`),
then the script file, joined by newlines. It runs with EVALSHA; redis-py's
``register_script`` reloads it transparently on ``NOSCRIPT`` (after a server
restart or ``SCRIPT FLUSH``). ``lua/README.md`` states the same rules for
producers written in other languages.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from distsched.keys import KEY_NAMES

SCRIPT_NAMES = (
    "schedule",
    "cancel",
    "claim",
    "heartbeat",
    "complete",
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


def resolve_includes(direct: Sequence[str]) -> tuple[str, ...]:
    """Every library part behind ``direct``, in load order.

    Depth first: for each include in the order written, the part's own includes
    (resolved the same way), then the part itself, unless already placed. So each
    part comes once, after every part it includes.
    """
    order: list[str] = []
    visiting: list[str] = []

    def visit(part: str) -> None:
        if part in order:
            return
        if part in visiting:
            raise ValueError(f"library parts include each other: {' -> '.join([*visiting, part])}")
        visiting.append(part)
        for sub in parse_directives(part_text(part)).includes:
            visit(sub)
        visiting.pop()
        order.append(part)

    for part in direct:
        visit(part)
    return tuple(order)


def prelude(keys: Sequence[str]) -> str:
    """The generated first lines of a script: the ``k`` table of its keys, and their count."""
    fields = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(keys, 1))
    return (
        f"local k = {{ {fields} }}\n"
        f"if #KEYS ~= {len(keys)} then return redis.error_reply("
        f"'BADARG KEYS expected {len(keys)}: {' '.join(keys)}') end"
    )


def assemble(text: str) -> str:
    """The full text sent to Redis for a script whose file holds ``text``."""
    directives = parse_directives(text)
    if not directives.keys:
        raise ValueError("a script must declare its keys ('--- @keys <names>')")
    unknown = [name for name in directives.keys if name not in KEY_NAMES]
    if unknown or len(set(directives.keys)) != len(directives.keys):
        raise ValueError(f"bad '--- @keys' names: {' '.join(directives.keys)}")
    parts = [part_text(part) for part in resolve_includes(directives.includes)]
    return "\n".join([prelude(directives.keys), *parts, text])


def _script_text(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return (lua_dir() / f"{name}.lua").read_text("utf-8")


@functools.cache
def source(name: str) -> str:
    """The full text sent to Redis for script ``name``."""
    return assemble(_script_text(name))


@functools.cache
def includes(name: str) -> tuple[str, ...]:
    """The library parts script ``name`` is assembled with, in load order."""
    return resolve_includes(parse_directives(_script_text(name)).includes)


@functools.cache
def script_keys(name: str) -> tuple[str, ...]:
    """The key names (``Keys`` attributes) script ``name`` receives, in ``KEYS`` order."""
    return parse_directives(_script_text(name)).keys


class Registry:
    """The registered scripts of one client (sync or asyncio), by name."""

    def __init__(self, client: Any) -> None:
        self.scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}

    def __getitem__(self, name: str) -> Any:
        return self.scripts[name]
