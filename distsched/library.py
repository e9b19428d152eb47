"""The admin step: install the Functions library on every master, and check it there.

Tenants need no right to load functions (README, "Security"): an admin installs this
version's library once per server (every master of a cluster) with :func:`install`
(``distsched library install``), and every client checks it byte for byte before it
calls it (:mod:`distsched.scripts`). :func:`check` only reads. Both work with a sync
redis-py client, plain or cluster, and report per node.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from distsched import scripts
from distsched.scripts import Check

# The libraries of every distsched version: ``distsched_`` and 16 hex digits.
_VERSION_LIBRARY = re.compile(r"^distsched_[0-9a-f]{16}$")


class Action(enum.Enum):
    """What :func:`install` did on one node."""

    UNCHANGED = "unchanged"  # this version's library was there, byte for byte
    INSTALLED = "installed"  # it was missing: loaded
    REPLACED = "replaced"  # this name held other code: replaced by the shipped code


@dataclass(frozen=True)
class NodeLibrary:
    """This version's library on one node: what was found, and what was done there.

    ``found`` is the state before (:class:`~distsched.scripts.Check`: ``same``,
    ``missing`` or ``different``); ``action`` None for a check; ``others`` the libraries
    of other distsched versions left on the node, ``pruned`` those deleted.
    """

    node: str
    found: Check
    action: Action | None
    others: tuple[str, ...]
    pruned: tuple[str, ...] = ()


def _send(client: Any, route: dict[str, Any], *command: Any) -> Any:
    return client.execute_command(*command, **route)


def _found(client: Any, route: dict[str, Any]) -> Check:
    return scripts.judge(_send(client, route, *scripts.check_command()))


def _other_versions(client: Any, route: dict[str, Any]) -> tuple[str, ...]:
    listed = scripts.listed_libraries(
        _send(client, route, "FUNCTION", "LIST", "LIBRARYNAME", "distsched_*")
    )
    return tuple(
        sorted(
            name
            for name in listed
            if _VERSION_LIBRARY.match(name) and name != scripts.library_name()
        )
    )


def check(client: Any) -> list[NodeLibrary]:
    """Whether each master (or the one server) holds this version's library, byte for
    byte, and which libraries of other versions it holds. Reads only."""
    out = []
    for route in scripts._load_targets(client):
        out.append(
            NodeLibrary(
                node=scripts.server_name(client, route),
                found=_found(client, route),
                action=None,
                others=_other_versions(client, route),
            )
        )
    return out


def install(client: Any, prune: bool = False) -> list[NodeLibrary]:
    """Load this version's library on every master (or the one server), idempotently.

    A node that holds it byte for byte is left as it is; a missing one is loaded; one of
    this name with other code is replaced with ``FUNCTION LOAD REPLACE``. Libraries of
    other distsched versions (``distsched_<hash>``) are listed and left alone, unless
    ``prune``: then they are deleted (only once no client of that version runs). Raises
    ``NoPermissionError`` for a user without the admin rights, and ``RuntimeError`` if a
    node does not hold the exact library afterwards.
    """
    out = []
    text = scripts.library()
    for route in scripts._load_targets(client):
        found = _found(client, route)
        action = Action.UNCHANGED
        if found is Check.MISSING:
            try:
                _send(client, route, "FUNCTION", "LOAD", text)
            except ResponseError as exc:
                # Loaded meanwhile by another client: what it holds is checked below.
                if scripts.recovery(exc) is not scripts.Recovery.LOAD:
                    raise
            action = Action.INSTALLED
        elif found is Check.DIFFERENT:
            _send(client, route, "FUNCTION", "LOAD", "REPLACE", text)
            action = Action.REPLACED
        node = scripts.server_name(client, route)
        if action is not Action.UNCHANGED and _found(client, route) is not Check.SAME:
            raise RuntimeError(f"{node} does not hold {scripts.library_name()} as shipped")
        others = _other_versions(client, route)
        pruned: tuple[str, ...] = ()
        if prune:
            for name in others:
                _send(client, route, "FUNCTION", "DELETE", name)
            others, pruned = (), others
        out.append(NodeLibrary(node, found, action, others, pruned))
    return out
