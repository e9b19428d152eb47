"""Every Redis key name distsched uses, built in this one place.

All keys of a namespace share the hash tag ``{namespace}``, so every script
touches a single Redis Cluster slot. A striped namespace has more slots: stripe
``s`` > 0 has the tag ``{namespace{s}`` (``Keys(namespace, s)``), or
``{namespace{s.SALT}`` when the namespace placed its stripes on distinct cluster
masters (:mod:`distsched.placement`), and a task id maps to its stripe by
:func:`stripe_of`. Per-task data lives in fields of a few
namespace-wide hashes (the field is the task id) rather than in one key per
task: the scripts then only ever touch keys they were given in ``KEYS``, and a
queued task costs no key of its own.
"""

from __future__ import annotations

import binascii
import functools
from dataclasses import dataclass

from distsched.errors import InvalidArgument
from distsched.lua_files import KEY_NAMES as KEY_NAMES
from distsched.lua_files import SCRIPT_NAMES, script_keys

PREFIX = "ds"
MAX_NAMESPACE_BYTES = 128
# The most stripes a namespace may be spread over (README, "Scaling out").
MAX_STRIPES = 1024
# Stripe s > 0 of namespace ``ns`` is the hash tag ``ns{s``: a namespace cannot contain a
# brace, so no namespace's tag is ever a stripe's, and Redis Cluster hashes the text up
# to the first ``}``, the whole ``ns{s``.
STRIPE_MARK = "{"
# The largest salt a stripe's tag may carry (``ns{s.SALT``).
MAX_SALT = 65535


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` if it can be used inside a hash tag, else raise."""
    if not isinstance(namespace, str):
        raise InvalidArgument("namespace", f"must be a str, got {type(namespace).__name__}")
    if not namespace:
        raise InvalidArgument("namespace", "must not be empty")
    if any(c in namespace for c in "{}") or any(ord(c) < 0x21 for c in namespace):
        raise InvalidArgument("namespace", "must not contain braces, spaces or control characters")
    if len(namespace.encode("utf-8")) > MAX_NAMESPACE_BYTES:
        raise InvalidArgument("namespace", f"must be at most {MAX_NAMESPACE_BYTES} bytes")
    return namespace


def hash_tag(task_id: str) -> bytes:
    """The part of ``task_id`` that decides its stripe, as Redis Cluster decides a key's
    slot: the text between the first ``{`` and the first ``}`` after it when that is not
    empty, else the whole id (UTF-8 bytes)."""
    raw = task_id.encode("utf-8", "surrogatepass")
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            return raw[start + 1 : end]
    return raw


def stripe_of(task_id: str, stripes: int) -> int:
    """The stripe of ``task_id`` in a namespace of ``stripes`` stripes: the CRC16 of its
    hash tag (XMODEM, the checksum Redis Cluster hashes keys with) modulo ``stripes``."""
    if stripes == 1:
        return 0
    return binascii.crc_hqx(hash_tag(task_id), 0) % stripes


@dataclass(frozen=True)
class Keys:
    """The key names of one namespace (``ds:{namespace}:...``), or of one of its stripes
    (stripe ``s`` > 0: ``ds:{namespace{s}:...``, a hash slot of its own)."""

    namespace: str
    stripe: int = 0
    # The salt of each stripe (stripe 0's is always 0): chosen so that the stripes'
    # slots land on distinct cluster masters; () or 0: the plain tag.
    salts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        if any(not isinstance(x, int) or not 0 <= x <= MAX_SALT for x in self.salts):
            raise InvalidArgument("salts", f"must be ints in [0, {MAX_SALT}]")
        if (
            not isinstance(self.stripe, int)
            or isinstance(self.stripe, bool)
            or not 0 <= self.stripe < MAX_STRIPES
        ):
            raise InvalidArgument("stripe", f"must be an int in [0, {MAX_STRIPES})")

    @property
    def tag(self) -> str:
        """The hash tag of the namespace's (or stripe's) keys."""
        if self.stripe == 0:
            return self.namespace
        salt = self.salts[self.stripe] if self.stripe < len(self.salts) else 0
        tag = f"{self.namespace}{STRIPE_MARK}{self.stripe}"
        return f"{tag}.{salt}" if salt else tag

    def of_stripe(self, stripe: int) -> Keys:
        """The keys of stripe ``stripe`` of this namespace (0: the namespace's own)."""
        return Keys(self.namespace, stripe, self.salts)

    @property
    def prefix(self) -> str:
        return f"{PREFIX}:{{{self.tag}}}:"

    @property
    def tasks(self) -> str:
        """Hash: task id -> task record (state, version, attempt, ...)."""
        return self.prefix + "tasks"

    @property
    def payloads(self) -> str:
        """Hash: task id -> msgpack payload ``{"fn", "args", "kwargs"}``."""
        return self.prefix + "payloads"

    @property
    def results(self) -> str:
        """Hash: task id -> last outcome detail (error text or msgpack result)."""
        return self.prefix + "results"

    @property
    def done(self) -> str:
        """Hash: task id -> recent tokens ``version.attempt`` whose report was applied."""
        return self.prefix + "done"

    @property
    def queue(self) -> str:
        """Sorted set: the time-indexed ready queue (score run_at ms, member key+id)."""
        return self.prefix + "queue"

    @property
    def leases(self) -> str:
        """Sorted set: running task id -> lease deadline (ms, server clock)."""
        return self.prefix + "leases"

    @property
    def finished(self) -> str:
        """Sorted set: terminal task id -> time it became terminal (ms)."""
        return self.prefix + "finished"

    @property
    def meta(self) -> str:
        """Hash: namespace counters and settings (seq, max_running, count:<state>)."""
        return self.prefix + "meta"

    @property
    def wake(self) -> str:
        """Pub/sub channel (sharded where the server has it): cancel notices
        (``cancel <version> <id>``) and raised capacity, for every worker."""
        return self.prefix + "wake"

    @property
    def idle(self) -> str:
        """Sorted set: idle workers' wake channels -> until when they wait (ms, server clock)."""
        return self.prefix + "idle"

    @property
    def claims(self) -> str:
        """Hash: worker id -> the tokens of its last claim call that claimed any, after
        that call's request id (``request\\n`` then ``version attempt len id`` each)."""
        return self.prefix + "claims"

    def worker_channel(self, worker_id: str) -> str:
        """Pub/sub channel of one worker: ``ready`` when it has work to claim.

        It shares the namespace's hash tag, so it lives on the namespace's shard.
        """
        return self.prefix + "w:" + worker_id

    @property
    def edges(self) -> str:
        """Sorted set (scores 0): dependency edges, ``hex3(len(parent)) parent flag kind child``."""
        return self.prefix + "edges"

    @property
    def deps(self) -> str:
        """Hash: task id -> the current version's dependency list."""
        return self.prefix + "deps"

    @property
    def blocked(self) -> str:
        """Hash: blocked task id -> its first cause (root task and the parent it came through)."""
        return self.prefix + "blocked"

    @property
    def blockedby(self) -> str:
        """Sorted set (scores 0): ``hex3(len(root)) root child`` for each task a root blocked."""
        return self.prefix + "blockedby"

    @property
    def propagating(self) -> str:
        """Sorted set: terminal task ids whose waiting dependents are still to be told."""
        return self.prefix + "propagating"

    @property
    def states(self) -> str:
        """Sorted set (scores 0): pending and terminal tasks by state, newest first:
        ``<state letter> hex14(2^53 - 1 - updated ms) id`` (``lua/lib/record.lua``)."""
        return self.prefix + "states"

    @property
    def history(self) -> str:
        """Hash: task id -> its last attempts (``lua/lib/history.lua``)."""
        return self.prefix + "history"

    @property
    def minutes(self) -> str:
        """Hash: ``<minute>:<s|f>`` -> attempts that succeeded / failed in that minute."""
        return self.prefix + "minutes"

    @property
    def schedules(self) -> str:
        """Hash: schedule name -> its definition (msgpack map, read by the clients only)."""
        return self.prefix + "schedules"

    @property
    def fires(self) -> str:
        """Sorted set: schedule name -> the time (ms) of its next slot, absent while paused
        or ended; workers fire the due ones (``fire.lua``)."""
        return self.prefix + "fires"

    @property
    def firing(self) -> str:
        """Hash: schedule name -> its firing state ``rev|fired|skipped|missed|last task id``."""
        return self.prefix + "firing"

    @property
    def waits(self) -> str:
        """Sorted set: task id -> the time (ms, server clock) until which a client waits
        for it to end (``Scheduler.wait``)."""
        return self.prefix + "waits"

    @property
    def ended(self) -> str:
        """Pub/sub channel (sharded where the server has it): ``<state> <id>`` when a
        task that someone waits for ends."""
        return self.prefix + "ended"

    @property
    def ranked(self) -> str:
        """Sorted set: the due tasks of a namespace of the priority order, by rank
        (``due ms - priority * aging_ms``; members as in ``queue``, ``lua/lib/ranked.lua``)."""
        return self.prefix + "ranked"

    @property
    def debounce(self) -> str:
        """Hash: task id scheduled with debounce -> ``<version> <first submission ms>`` of
        its burst (``lua/lib/admit.lua``)."""
        return self.prefix + "debounce"

    @property
    def deadlines(self) -> str:
        """Sorted set: ``hex14(version) id`` of a queued version with a deadline -> the
        deadline (ms, server clock) (``lua/lib/deadline.lua``)."""
        return self.prefix + "deadlines"

    @property
    def fair(self) -> str:
        """Hash of a fair namespace: ``vt`` (virtual time of the last key served), ``cap``
        (default per-key cap), ``cap:<key>``, ``w:<key>`` (weight), ``run:<key>`` (running
        count), ``rate:<key>`` and ``tb:<key>`` (rate limit and token bucket)
        (``lua/lib/fair.lua``)."""
        return self.prefix + "fair"

    @property
    def fairq(self) -> str:
        """Sorted set (scores 0, lexicographic): the ready tasks of every non-default
        fairness key, ``hex3(len key) key hex13(due ms) <queue member>``."""
        return self.prefix + "fairq"

    @property
    def fairready(self) -> str:
        """Sorted set: fairness keys with work to serve now -> their virtual time."""
        return self.prefix + "fairready"

    @property
    def fairwait(self) -> str:
        """Sorted set: fairness keys whose head is not due yet -> its due time (ms)."""
        return self.prefix + "fairwait"

    @property
    def fairfull(self) -> str:
        """Sorted set: fairness keys at their concurrency cap -> their virtual time."""
        return self.prefix + "fairfull"

    @property
    def fairkeys(self) -> str:
        """Hash: task id -> its fairness key (tasks scheduled with one)."""
        return self.prefix + "fairkeys"

    @property
    def fairrun(self) -> str:
        """Hash: task id -> fairness key, for the running tasks a fair claim started."""
        return self.prefix + "fairrun"

    @property
    def paused(self) -> str:
        """Hash: paused task id -> ``<version> <paused at ms>`` (``lua/lib/inplace.lua``);
        an entry counts only while that version is the task's current, queued one."""
        return self.prefix + "paused"

    @property
    def progress(self) -> str:
        """Hash: task id -> the last progress report of its running version,
        ``<version> <attempt> <updated ms> <fraction|-> <checkpoint bytes|-> <note>``
        (``lua/progress.lua``)."""
        return self.prefix + "progress"

    @property
    def checkpoints(self) -> str:
        """Hash: task id -> its last checkpoint, ``hex14(version)`` then the msgpack value
        (empty: none), kept across the attempts of that version (``lua/progress.lua``)."""
        return self.prefix + "checkpoints"

    @property
    def costs(self) -> str:
        """Hash: task id -> its cost (units of its fairness key's rate), only for a cost
        other than 1 (``lua/lib/fair.lua``)."""
        return self.prefix + "costs"

    @property
    def parents(self) -> str:
        """Hash: spawned task id -> its parent, workflow root, join, kind and order
        (``lua/lib/workflow.lua``)."""
        return self.prefix + "parents"

    @property
    def spawned(self) -> str:
        """Sorted set (scores 0): ``hex3(len(root)) root id`` for each task spawned in the
        workflow of ``root``."""
        return self.prefix + "spawned"

    @property
    def joins(self) -> str:
        """Hash: join task id -> ``<rule> <k> <children> <succeeded> <failed> <cursor>``."""
        return self.prefix + "joins"

    @property
    def window(self) -> str:
        """Sorted set (scores 0): ``hex3(len(parent)) parent hex8(order) child`` for each
        spawned child waiting for a slot of its parent's window."""
        return self.prefix + "window"

    @property
    def windows(self) -> str:
        """Hash: parent id -> ``<window> <children holding a slot>``."""
        return self.prefix + "windows"

    @property
    def served(self) -> str:
        """Hash: function name -> last time (ms, server clock) a live worker said it serves it."""
        return self.prefix + "served"

    @property
    def workers(self) -> str:
        """Hash: worker id -> its registry entry (msgpack map), rewritten every heartbeat."""
        return self.prefix + "workers"

    @property
    def stripelock(self) -> str:
        """String (stripe 0 of a striped namespace): held for a moment by whoever moves
        the per-stripe shares of ``max_running`` (README, "Scaling out")."""
        return self.prefix + "stripelock"

    def script_keys(self) -> list[str]:
        """Every key of the namespace and its channels, in ``KEY_NAMES`` order."""
        return [getattr(self, name) for name in KEY_NAMES]

    def for_script(self, script: str) -> list[str]:
        """The KEYS sent with ``script``: those its ``--- @keys`` line declares, in order.

        Built once per namespace: every script call sends it (do not modify it).
        """
        return self._by_script[script]

    @functools.cached_property
    def _by_script(self) -> dict[str, list[str]]:
        return {name: [getattr(self, key) for key in script_keys(name)] for name in SCRIPT_NAMES}

    def all_keys(self) -> list[str]:
        """Every data key of the namespace (not the channels)."""
        channels = (self.wake, self.ended)
        return [key for key in self.script_keys() if key not in channels] + [
            self.served,
            self.workers,
            self.stripelock,
        ]
