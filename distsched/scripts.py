"""The script registry: every ``lua/*.lua`` transition, loaded once per client.

Each script is sent as the shared library (``lua/lib/*.lua``) followed by the
transition file, and run with EVALSHA; redis-py's ``register_script`` reloads it
transparently on ``NOSCRIPT`` (after a server restart or ``SCRIPT FLUSH``).
"""

from __future__ import annotations

import functools
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

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
    "compact",
)

# The shared library, in load order: each file may use what the earlier ones define.
LIBRARY = ("keys", "record", "graph")


def lua_dir() -> Traversable:
    """Where the scripts are: inside the installed package, or the source checkout."""
    packaged = resources.files("distsched") / "lua"
    if packaged.is_dir():
        return packaged
    # A source checkout (editable install): the scripts stay at the repository top.
    return Path(__file__).resolve().parent.parent / "lua"


@functools.cache
def library_source() -> str:
    lib = lua_dir() / "lib"
    return "\n".join((lib / f"{name}.lua").read_text("utf-8") for name in LIBRARY)


@functools.cache
def source(name: str) -> str:
    """The full text sent to Redis for script ``name``."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    body = (lua_dir() / f"{name}.lua").read_text("utf-8")
    return library_source() + "\n" + body


class Registry:
    """The registered scripts of one client (sync or asyncio), by name."""

    def __init__(self, client: Any) -> None:
        self.scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}

    def __getitem__(self, name: str) -> Any:
        return self.scripts[name]
