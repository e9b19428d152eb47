"""The script registry: every ``lua/*.lua`` transition, loaded once per client.

Each file's header declares the library parts it includes and the keys it receives
(read by :mod:`distsched.lua_files`). The text sent to Redis is
a generated prelude that binds the declared keys (:func:`prelude`), then every part
the script needs, dependencies first and each once (:func:`resolve_includes`),
then the script file, joined by newlines.

Clients run the scripts as Redis Functions: :func:`library` puts every script into
one library, each in a block of its own with its parts, registered as
:func:`function_name`; the library loads once per server and each call is an
``FCALL``, so the parts are not rebuilt per call. Functions are global to a server: before
a client's first ``FCALL`` on a server (each master of a cluster), and after every load
it makes, it checks that the library there is byte for byte :func:`library`
(:func:`check_command`, :func:`judge`), once per client and node. A library of that name
with other code is refused (an error in the log) and the client runs every script by
EVALSHA from then on, as it does where the check is refused (a warning). A missing
library ("Function not found": a restart, ``FUNCTION FLUSH``, a new cluster master) is
loaded (on every master of a cluster) and the call sent again; where Functions are
unavailable (Redis < 7, an ACL without ``FCALL`` or ``FUNCTION LOAD``: a tenant, where no
admin installed the library, :mod:`distsched.library`) the assembled text runs with
EVALSHA, which redis-py's ``register_script`` reloads on ``NOSCRIPT``: content-addressed,
so no one can substitute it. ``lua/README.md`` states the same rules for producers
written in other languages.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import logging
import re
import threading
from collections.abc import Generator, Sequence
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

# Read from the headers by distsched.lua_files, and named here too (``as``: re-exported).
from distsched.lua_files import KEY_NAMES, script_text
from distsched.lua_files import SCRIPT_NAMES as SCRIPT_NAMES
from distsched.lua_files import Directives as Directives
from distsched.lua_files import lua_dir as lua_dir
from distsched.lua_files import parse_directives as parse_directives
from distsched.lua_files import part_text as part_text
from distsched.lua_files import script_keys as script_keys

log = logging.getLogger("distsched.scripts")


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


@functools.cache
def source(name: str) -> str:
    """The full text sent to Redis for script ``name``."""
    return assemble(script_text(name))


@functools.cache
def includes(name: str) -> tuple[str, ...]:
    """The library parts script ``name`` is assembled with, in load order."""
    return resolve_includes(parse_directives(script_text(name)).includes)


# --------------------------------------------------------------------------- Redis Functions

_BODY_START = "\nreturn run(function(c)\n"
_BODY_END = "end)\n"


@functools.cache
def library_hash() -> str:
    """16 hex digits naming this version of the scripts (a SHA1 of their full texts)."""
    digest = hashlib.sha1(usedforsecurity=False)
    for name in SCRIPT_NAMES:
        digest.update(name.encode() + b"\0" + source(name).encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]


def library_name() -> str:
    """The name of the Redis Functions library of this version: ``distsched_<hash>``."""
    return f"distsched_{library_hash()}"


def function_name(name: str) -> str:
    """The Redis Function that runs script ``name``: ``distsched_<hash>_<name>``."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return f"{library_name()}_{name}"


# The most top-level names the library parts of one block may declare together: Lua
# allows 200 locals per function, and a block adds three of its own and the script's.
BLOCK_LOCALS = 180

_TOP_LEVEL_LOCAL = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*(?:=|$))", re.M)


def top_level_names(text: str) -> tuple[str, ...]:
    """The names a library part declares at its top level (``local`` at column 0)."""
    names: list[str] = []
    for match in _TOP_LEVEL_LOCAL.finditer(text):
        function, variables = match.groups()
        names += [function] if function else [v.strip() for v in variables.split(",") if v.strip()]
    return tuple(names)


@functools.cache
def library_blocks() -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """The library's blocks in order, each as (its parts in load order, its scripts).

    Scripts go in :data:`SCRIPT_NAMES` order; one joins the block before it when that
    block's parts and its own declare at most :data:`BLOCK_LOCALS` top-level names
    together, and starts a block of its own otherwise. A block's parts are those of its
    scripts, resolved as for one script from their ``@include`` lines taken script by
    script. Every part is defined once per block rather than once per script: the
    library is about a fifth of the size, and loads that much faster.
    """
    grouped: list[list[str]] = []
    for name in SCRIPT_NAMES:
        if grouped:
            joined = {part for member in [*grouped[-1], name] for part in includes(member)}
            if sum(len(top_level_names(part_text(part))) for part in joined) <= BLOCK_LOCALS:
                grouped[-1].append(name)
                continue
        grouped.append([name])
    blocks = []
    for members in grouped:
        direct = [part for name in members for part in parse_directives(script_text(name)).includes]
        parts = resolve_includes(direct)
        declared = [name for part in parts for name in top_level_names(part_text(part))]
        twice = sorted({name for name in declared if declared.count(name) > 1})
        if twice:
            # Sharing a block, a later part would change what an earlier one's name means.
            raise ValueError(f"library parts declare the same names: {' '.join(twice)}")
        blocks.append((parts, tuple(members)))
    return tuple(blocks)


def _function_block(name: str) -> str:
    """Script ``name`` inside its library block: its definitions, then its registration.

    The script's body becomes a local function, and the registered callback binds the
    call's keys and arguments to the block's ``KEYS``, ``ARGV`` and ``k``, then runs the
    body as EVALSHA would. ``k`` is the script's own table, whose fields each call sets:
    building a table of some 25 keys on every call cost more than the smallest
    transitions do.
    """
    text = script_text(name)
    keys = script_keys(name)
    head, found, tail = text.partition(_BODY_START)
    if not found or not tail.endswith(_BODY_END) or _BODY_START in tail:
        raise ValueError(f"{name}.lua must end with one 'return run(function(c) ... end)'")
    targets = ", ".join(f"k.{key}" for key in keys)
    values = ", ".join(f"keys[{i}]" for i in range(1, len(keys) + 1))
    return "\n".join(
        [
            "do",
            head,
            "local function body(c)",
            tail[: -len(_BODY_END)] + "end",
            "local its_keys = {}",
            f"redis.register_function{{function_name = '{function_name(name)}', "
            "callback = function(keys, args)",
            f"  if #keys ~= {len(keys)} then return redis.error_reply("
            f"'BADARG KEYS expected {len(keys)}: {' '.join(keys)}') end",
            "  KEYS, ARGV, k = keys, args, its_keys",
            f"  {targets} = {values}",
            "  return run(body)",
            "end}",
            "end",
        ]
    )


@functools.cache
def library() -> str:
    """The text of the Redis Functions library (``FUNCTION LOAD``) holding every script."""
    lines = [f"#!lua name={library_name()}"]
    for parts, members in library_blocks():
        lines += ["do", "local KEYS, ARGV, k = nil, nil, {}"]
        lines += [part_text(part) for part in parts]
        lines += [_function_block(name) for name in members]
        lines.append("end")
    return "\n".join(lines) + "\n"


class Recovery(enum.Enum):
    """What a script call does after an error from ``FCALL`` or ``FUNCTION LOAD``."""

    LOAD = "load"  # the server lacks the library: load it, then call once more
    EVALSHA = "evalsha"  # the server (or the user's ACL) has no Functions: use EVALSHA
    RAISE = "raise"  # the script's own error, or any other: the caller gets it


def recovery(exc: BaseException) -> Recovery:
    """How to go on after ``exc``, raised by ``FCALL`` or by ``FUNCTION LOAD``.

    "Function not found": a server that restarted, ran ``FUNCTION FLUSH``, or a
    cluster master that never loaded the library (a new one, a promoted replica).
    "unknown command" (Redis < 7) or an ACL refusing the command itself: Functions are
    unavailable, and EVALSHA runs the same scripts. A library loaded meanwhile by
    another client ("already exists") is loaded.
    """
    if not isinstance(exc, ResponseError):
        return Recovery.RAISE
    message = str(exc)
    if message.startswith("Function not found"):
        return Recovery.LOAD
    if "already exists" in message and "Library" in message:
        return Recovery.LOAD
    lowered = message.lower()
    if lowered.startswith("unknown command") or lowered.startswith("unknown subcommand"):
        return Recovery.EVALSHA
    if isinstance(exc, NoPermissionError) and (
        "'fcall'" in lowered or "'function|load'" in lowered
    ):
        return Recovery.EVALSHA
    return Recovery.RAISE


class Check(enum.Enum):
    """What ``FUNCTION LIST LIBRARYNAME <name> WITHCODE`` says of a server's library."""

    SAME = "same"  # this version's library, byte for byte: FCALL may run it
    MISSING = "missing"  # no library of this name: load it
    DIFFERENT = "different"  # this name with other code (replaced by someone): refuse it
    REFUSED = "refused"  # the user may not list functions (an ACL): use EVALSHA
    UNAVAILABLE = "unavailable"  # a server without Functions (Redis < 7): use EVALSHA


def check_command() -> list[str]:
    """The command that reads the code of this version's library on one server."""
    return ["FUNCTION", "LIST", "LIBRARYNAME", library_name(), "WITHCODE"]


def _text_of(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(entry: Any) -> dict[str, Any]:
    """One entry of a ``FUNCTION LIST`` reply as a dict with text keys (RESP2 lists its
    fields as flat pairs, RESP3 as a map)."""
    if isinstance(entry, dict):
        return {_text_of(name): value for name, value in entry.items()}
    items = list(entry)
    return {_text_of(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def listed_libraries(reply: Any) -> dict[str, str | None]:
    """A ``FUNCTION LIST`` reply as library name -> its code (None without ``WITHCODE``)."""
    out: dict[str, str | None] = {}
    for entry in reply or []:
        fields = _fields(entry)
        code = fields.get("library_code")
        out[_text_of(fields.get("library_name", ""))] = None if code is None else _text_of(code)
    return out


def judge(reply: Any) -> Check:
    """Whether the library a server lists under this version's name is the one shipped.

    ``LIBRARYNAME`` is a pattern, so only the entry of exactly this name counts."""
    listed = listed_libraries(reply)
    if library_name() not in listed:
        return Check.MISSING
    return Check.SAME if listed[library_name()] == library() else Check.DIFFERENT


def judge_error(exc: BaseException) -> Check | None:
    """What an error from :func:`check_command` means; None for any other error (raised)."""
    if isinstance(exc, NoPermissionError):
        return Check.REFUSED
    if isinstance(exc, ResponseError):
        lowered = str(exc).lower()
        if lowered.startswith("unknown command") or lowered.startswith("unknown subcommand"):
            return Check.UNAVAILABLE
    return None


def _node_name(route: dict[str, Any]) -> str:
    """The node a call's route (:func:`_route`, :func:`_load_targets`) names; "" for the
    one server of a plain client."""
    node = route.get("target_nodes")
    return "" if node is None else str(node.name)


def server_name(client: Any, route: dict[str, Any]) -> str:
    """The server a route leads to, as ``host:port`` (or the socket path), for messages."""
    name = _node_name(route)
    if name:
        return name
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


# One command to send, where (a route), in a plan; the reply, or the ResponseError
# raised, is sent back into the plan.
Send = tuple[list[Any], dict[str, Any]]
Plan = Generator[Send, Any, bool]


class _Mode:
    """How a client's scripts run, shared by its scripts: by ``FCALL`` of a library checked
    on each server before the first call there, or by EVALSHA for the rest of its life.

    The decisions live in the plans (:meth:`prepare`, :meth:`reload`), generators that yield
    the commands to send and receive their replies: the sync and asyncio scripts only send.
    """

    __slots__ = ("_lock", "_told", "functions", "verified")

    def __init__(self) -> None:
        self.functions = True
        # The nodes (:func:`_node_name`) whose library was found to be this version's.
        self.verified: set[str] = set()
        self._lock = threading.Lock()
        self._told = False

    def ready(self, route: dict[str, Any]) -> bool:
        """Whether a call on ``route`` may be sent as an ``FCALL`` now, without a check."""
        return _node_name(route) in self.verified

    def prepare(self, client: Any, route: dict[str, Any]) -> Plan:
        """Check the library on the node of ``route`` (loading it where it is missing);
        True when ``FCALL`` may run there."""
        reply = yield check_command(), route
        check = self._checked(client, route, reply)
        if check is Check.MISSING:
            return (yield from self.reload(client))
        return check is Check.SAME

    def reload(self, client: Any) -> Plan:
        """Load the library on every target (:func:`_load_targets`), then check it there:
        True when ``FCALL`` may run on every one."""
        self.verified.clear()
        targets = _load_targets(client)
        for target in targets:
            reply = yield ["FUNCTION", "LOAD", library()], target
            if isinstance(reply, BaseException):
                step = recovery(reply)
                if step is Recovery.RAISE:
                    raise reply
                if step is Recovery.EVALSHA:
                    self.functions = False
                    log.info(
                        "the Functions library %s is not installed on %s and this user may "
                        "not load it: running every script by EVALSHA ('distsched library "
                        "install' installs it)",
                        library_name(),
                        server_name(client, target),
                    )
                    return False
        for target in targets:
            reply = yield check_command(), target
            # One deleted again meanwhile (MISSING) stays unverified: checked before a call.
            self._checked(client, target, reply)
            if not self.functions:
                return False
        return True

    def _checked(self, client: Any, route: dict[str, Any], reply: Any) -> Check:
        """Act on one check's reply (or error): note a verified node, or turn to EVALSHA."""
        if isinstance(reply, BaseException):
            check = judge_error(reply)
            if check is None:
                raise reply
        else:
            check = judge(reply)
        if check is Check.SAME:
            self.verified.add(_node_name(route))
        elif check is not Check.MISSING:
            self._use_evalsha(client, route, check)
        return check

    def _use_evalsha(self, client: Any, route: dict[str, Any], check: Check) -> None:
        self.functions = False
        with self._lock:
            told, self._told = self._told, True
        if told:
            return
        server, name = server_name(client, route), library_name()
        if check is Check.DIFFERENT:
            log.error(
                "refusing the Functions library %s on %s: its code is not the code this "
                "distsched ships (someone replaced it); running every script by EVALSHA "
                "instead. An admin reinstalls it with 'distsched library install'.",
                name,
                server,
            )
        elif check is Check.REFUSED:
            log.warning(
                "cannot check the Functions library %s on %s (FUNCTION LIST is refused to "
                "this user): running every script by EVALSHA instead",
                name,
                server,
            )


def _drive(client: Any, plan: Plan) -> bool:
    """Run a plan with a sync client: send each command, hand back its reply or error."""
    try:
        command, route = next(plan)
        while True:
            try:
                reply = client.execute_command(*command, **route)
            except ResponseError as exc:
                reply = exc
            command, route = plan.send(reply)
    except StopIteration as done:
        return bool(done.value)


async def _drive_async(client: Any, plan: Plan) -> bool:
    """:func:`_drive` with an asyncio client."""
    try:
        command, route = next(plan)
        while True:
            try:
                reply = await client.execute_command(*command, **route)
            except ResponseError as exc:
                reply = exc
            command, route = plan.send(reply)
    except StopIteration as done:
        return bool(done.value)


def _route(client: Any, key: str) -> dict[str, Any]:
    """Where a call for ``key`` goes: in a cluster, the node owning its slot, named
    explicitly. redis-py finds the keys of an FCALL by asking a node (``COMMAND GETKEYS``,
    a round trip more per call, sent to a default node that may be the one that died),
    where it reads those of an EVALSHA from its arguments."""
    if isinstance(client, (RedisCluster, AsyncRedisCluster)):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}


def _fcall(
    client: Any, function: str, keys: Sequence[str], args: Sequence[Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The ``FCALL`` command of one call, and where it goes (:func:`_route`): built once,
    sent again as it is after the library is loaded."""
    return ["FCALL", function, len(keys), *keys, *args], _route(client, keys[0])


def _load_targets(client: Any) -> list[dict[str, Any]]:
    """Where a missing library is loaded: every master of a cluster, one at a time (the
    node that answered "Function not found" may be one a redirect led to, which redis-py
    does not name), else the one server."""
    if isinstance(client, (RedisCluster, AsyncRedisCluster)):
        return [{"target_nodes": node} for node in client.get_primaries()]
    return [{}]


class _ScriptBase:
    """What a script of either client holds: its function and its EVALSHA fallback."""

    def __init__(self, client: Any, name: str, mode: _Mode | None = None) -> None:
        self.client = client
        self.name = name
        self.function = function_name(name)
        self.mode = mode or _Mode()
        # The EVALSHA path: redis-py reloads the script on NOSCRIPT.
        self.fallback = client.register_script(source(name))

    @property
    def sha(self) -> str:
        """The SHA1 of the text EVALSHA runs."""
        return str(self.fallback.sha)


class Script(_ScriptBase):
    """One script of a sync redis-py client (plain or cluster)."""

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        mode = self.mode
        if mode.functions:
            command, route = _fcall(self.client, self.function, keys, args)
            if mode.ready(route) or _drive(self.client, mode.prepare(self.client, route)):
                try:
                    return self.client.execute_command(*command, **route)
                except ResponseError as exc:
                    step = recovery(exc)
                    if step is Recovery.RAISE:
                        raise
                    if step is Recovery.LOAD and _drive(self.client, mode.reload(self.client)):
                        return self.client.execute_command(*command, **route)
                    mode.functions = False
        return self.fallback(keys=keys, args=args)


class AsyncScript(_ScriptBase):
    """One script of an asyncio redis-py client (plain or cluster); see :class:`Script`."""

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if isinstance(self.client, AsyncRedisCluster):
            # Its slot map is read on the first command; routing needs it before that.
            await self.client.initialize()
        mode = self.mode
        if mode.functions:
            command, route = _fcall(self.client, self.function, keys, args)
            if mode.ready(route) or await _drive_async(
                self.client, mode.prepare(self.client, route)
            ):
                try:
                    return await self.client.execute_command(*command, **route)
                except ResponseError as exc:
                    step = recovery(exc)
                    if step is Recovery.RAISE:
                        raise
                    if step is Recovery.LOAD and await _drive_async(
                        self.client, mode.reload(self.client)
                    ):
                        return await self.client.execute_command(*command, **route)
                    mode.functions = False
        return await self.fallback(keys=keys, args=args)


class Registry:
    """The scripts of one client (sync or asyncio), by name.

    Each call is an ``FCALL`` of the script's function in the library, checked byte for
    byte on each server before the first call there; the library is loaded where it is
    missing (and again after a restart or a flush; in a cluster, on every master), and
    checked again. Where the library differs, cannot be checked, or Functions are
    unavailable, the scripts run with ``EVALSHA`` instead, for the rest of the client's life.
    """

    def __init__(self, client: Any) -> None:
        mode = _Mode()
        kind = AsyncScript if _is_async(client) else Script
        self.scripts: dict[str, Any] = {name: kind(client, name, mode) for name in SCRIPT_NAMES}

    def __getitem__(self, name: str) -> Any:
        return self.scripts[name]


def _is_async(client: Any) -> bool:
    return isinstance(client, (AsyncRedis, AsyncRedisCluster))
