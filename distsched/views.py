"""What operators read about a namespace, and how it is shown.

Everything here reads, and only through the :class:`~distsched.client.Scheduler`
API, never Redis keys directly; nothing here writes. The CLI, the demo and the
bench use it.

The graph walks read through :meth:`Scheduler.status`: ancestors follow each
task's ``deps`` and ``optional_deps``, descendants its ``dependents``. Each walk
keeps a visited set (a new version may list, as an already satisfied dependency,
a task that transitively depends on it, so the stored lists can loop) and stops
fetching after ``limit`` tasks, so a huge graph costs a bounded number of reads.
The snapshot is not atomic: tasks may move on while it is taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distsched import text, times
from distsched.client import Scheduler
from distsched.errors import NotFoundError
from distsched.model import State, TaskInfo, TaskRow, Workflow
from distsched.text import CUT_CHARS, error_summary, escape, show

DEFAULT_LIMIT = 200
ERROR_WIDTH = 60


@dataclass(frozen=True)
class Edge:
    """``dependent`` waits on ``dependency``; an optional edge is satisfied by any end."""

    dependency: str
    dependent: str
    optional: bool


@dataclass
class Neighbourhood:
    """A task, its ancestors and descendants, and the edges between them."""

    task_id: str
    limit: int
    # None: named as a dependency but not submitted (yet).
    tasks: dict[str, TaskInfo | None] = field(default_factory=dict)
    ancestors: list[str] = field(default_factory=list)
    descendants: list[str] = field(default_factory=list)
    up: dict[str, list[Edge]] = field(default_factory=dict)  # task -> its dependencies
    down: dict[str, list[Edge]] = field(default_factory=dict)  # task -> its dependents
    # Tasks whose dependencies / dependents were not all fetched: the limit was reached.
    cut_up: set[str] = field(default_factory=set)
    cut_down: set[str] = field(default_factory=set)
    # Dependents read but gone (removed since their edge was read): they count against
    # the limit too, so that a list of dead edges costs a bounded number of reads.
    gone: set[str] = field(default_factory=set)

    @property
    def full(self) -> bool:
        return len(self.tasks) + len(self.gone) >= self.limit

    @property
    def truncated(self) -> bool:
        return bool(self.cut_up or self.cut_down)

    @property
    def root(self) -> TaskInfo:
        info = self.tasks[self.task_id]
        assert info is not None
        return info


def lookup(scheduler: Scheduler, task_id: str) -> TaskInfo | None:
    """The task, or None when there is no such task."""
    try:
        return scheduler.status(task_id)
    except NotFoundError:
        return None


def walk(
    scheduler: Scheduler,
    task_id: str,
    limit: int = DEFAULT_LIMIT,
    ancestors: bool = True,
    descendants: bool = True,
) -> Neighbourhood:
    """Fetch ``task_id`` and up to ``limit - 1`` related tasks (``NotFoundError`` if unknown)."""
    hood = Neighbourhood(task_id=task_id, limit=limit)
    hood.tasks[task_id] = scheduler.status(task_id)
    if ancestors:
        _walk_up(scheduler, hood)
    if descendants:
        _walk_down(scheduler, hood)
    return hood


def _breadth_first(
    hood: Neighbourhood, reached: list[str], step: Callable[[str, TaskInfo], Iterator[str]]
) -> None:
    """Walk from ``hood.task_id`` breadth first, each task once: ``step`` gives the tasks
    next to a task read (recording the edges), each new one is listed in ``reached``."""
    seen = {hood.task_id}
    queue = deque([hood.task_id])
    while queue:
        current = queue.popleft()
        info = hood.tasks[current]
        if info is None:
            continue
        for task_id in step(current, info):
            if task_id not in seen:
                seen.add(task_id)
                reached.append(task_id)
                queue.append(task_id)


def _walk_up(scheduler: Scheduler, hood: Neighbourhood) -> None:
    _breadth_first(hood, hood.ancestors, lambda current, info: _up(scheduler, hood, current, info))


def _up(scheduler: Scheduler, hood: Neighbourhood, current: str, info: TaskInfo) -> Iterator[str]:
    """The dependencies of ``current`` the walk follows, their edges recorded."""
    edges = hood.up.setdefault(current, [])
    named = [(d, False) for d in info.deps] + [(d, True) for d in info.optional_deps]
    for dep, optional in named:
        if dep not in hood.tasks:
            if hood.full:
                hood.cut_up.add(current)
                continue
            hood.tasks[dep] = lookup(scheduler, dep)
        edges.append(Edge(dep, current, optional))
        yield dep


def _read_child(
    scheduler: Scheduler, hood: Neighbourhood, current: str, child: str
) -> TaskInfo | None:
    """The record of ``current``'s dependent ``child``, read once; None when the walk
    does not follow it (gone, or the walk is full)."""
    if child in hood.gone:
        return None
    if child not in hood.tasks:
        if hood.full:
            hood.cut_down.add(current)
            return None
        found = lookup(scheduler, child)
        if found is None:
            hood.gone.add(child)  # removed since the edge was read
            return None
        hood.tasks[child] = found
    return hood.tasks[child]


def _walk_down(scheduler: Scheduler, hood: Neighbourhood) -> None:
    _breadth_first(
        hood, hood.descendants, lambda current, info: _down(scheduler, hood, current, info)
    )


def _down(scheduler: Scheduler, hood: Neighbourhood, current: str, info: TaskInfo) -> Iterator[str]:
    """The dependents of ``current`` the walk follows, their edges recorded."""
    edges = hood.down.setdefault(current, [])
    for child in info.dependents:
        child_info = _read_child(scheduler, hood, current, child)
        # The edge and the child's own list are two reads; trust the child's list.
        if child_info is None or current not in (*child_info.deps, *child_info.optional_deps):
            continue
        edges.append(Edge(current, child, current in child_info.optional_deps))
        yield child


# --------------------------------------------------------------------------- other reads


def blocked_by(scheduler: Scheduler, task_id: str, limit: int = DEFAULT_LIMIT) -> list[str]:
    """The descendants of ``task_id`` that it blocked (among the first ``limit`` tasks
    read): those a retry of it with ``cascade`` gives new versions."""
    hood = walk(scheduler, task_id, limit=limit, ancestors=False)
    return [
        d
        for d in hood.descendants
        if (info := hood.tasks[d]) is not None
        and info.state is State.BLOCKED
        and info.blocked_by is not None
        and info.blocked_by.root == task_id
    ]


def lookup_many(scheduler: Scheduler, task_ids: Iterable[str]) -> list[TaskInfo]:
    """The tasks of ``task_ids`` that exist, in order (one read each)."""
    return [info for task_id in task_ids if (info := lookup(scheduler, task_id)) is not None]


@dataclass(frozen=True)
class Lease:
    """A running task's lease as ``distsched leases list`` shows it."""

    task_id: str
    worker: str
    attempt: int
    max_attempts: int
    seconds_left: float  # negative once expired (server clock)


def leases(scheduler: Scheduler) -> list[Lease]:
    """Every lease of the namespace with its holder and the time left (server clock)."""
    held = scheduler.leases()
    if not held:
        return []
    now = scheduler.server_time()
    rows = []
    for task_id, deadline in held:
        info = lookup(scheduler, task_id)
        if info is None:
            continue  # finished and removed between the two reads
        rows.append(
            Lease(task_id, info.worker or "-", info.attempt, info.max_attempts, deadline - now)
        )
    return rows


def tasks(scheduler: Scheduler, count: int = 1000) -> Iterator[TaskRow]:
    """Every task's record, scanned ``count`` at a time (a task may come twice)."""
    cursor = 0
    while True:
        cursor, rows = scheduler.scan_tasks(cursor, count)
        yield from rows
        if cursor == 0:
            return


# --------------------------------------------------------------------------- output


def show_id(task_id: str, limit: int | None = CUT_CHARS) -> str:
    """An id as printed: bare when that is unambiguous, else quoted with its control
    characters escaped; past ``limit`` characters cut, saying how much more there is."""
    shown = task_id if limit is None else task_id[:limit]
    if not (shown.isprintable() and not any(c.isspace() for c in shown) and "->" not in shown):
        shown = escape(repr(shown))
    if len(shown) != len(task_id) and limit is not None and len(task_id) > limit:
        more = len(task_id[limit:].encode("utf-8", "surrogatepass"))
        shown += f"… ({more} more bytes; --full to see all)"
    return shown


def show_path(path: Iterable[str], limit: int | None = CUT_CHARS) -> str:
    return " -> ".join(show_id(p, limit) for p in path)


def describe(info: TaskInfo | None, limit: int | None = CUT_CHARS) -> str:
    """A task's state with what explains it, on one line, every stored string in it
    escaped and cut to ``limit`` characters (the error to ``ERROR_WIDTH``)."""
    if info is None:
        return "not submitted yet"
    state = info.state
    if info.paused:
        return f"{state.value} (paused)"
    if state is State.PENDING and info.placing:
        return "pending (held while its dependencies are placed in parts)"
    if state is State.PENDING and info.waitpoint is not None and info.waitpoint.waiting:
        return "pending (a waitpoint waiting for an external completion)"
    if state is State.PENDING:
        waits = [f"{info.remaining} required"] if info.remaining else []
        if info.optional_remaining:
            waits.append(f"{info.optional_remaining} optional")
        return f"pending (waiting on {', '.join(waits)})" if waits else "pending"
    if state is State.BLOCKED and info.blocked_by is not None:
        cause = info.blocked_by
        return f"blocked by {show_id(cause.root, limit)} via {show_path(cause.path, limit)}"
    if state is State.RUNNING:
        worker = show_id(info.worker, limit) if info.worker else "?"
        return f"running (attempt {info.attempt}/{info.max_attempts}, {worker})"
    if state is State.FAILED and info.error:
        error = error_summary(info.error)
        if limit is not None and len(error) > ERROR_WIDTH:
            error = error[: ERROR_WIDTH - 3] + "..."
        return f"failed: {escape(error)}"
    if state is State.CANCELLED and info.error:
        # Only an expiry stores an error on a cancelled task.
        return f"cancelled: {show(error_summary(info.error), limit)}"
    return str(state.value)


def _tree(
    hood: Neighbourhood,
    edges_of: Callable[[str], list[Edge]],
    other: Callable[[Edge], str],
    cut: set[str],
    limit: int | None = CUT_CHARS,
) -> list[str]:
    """ASCII tree below the root; a task met again is listed but not expanded again."""
    lines: list[str] = []
    shown = {hood.task_id}
    # Entries: (edge, prefix of its line, prefix of the lines below it), or (None, a note
    # line, ""). Iterative, since a chain may be longer than Python's recursion limit.
    stack: list[tuple[Edge | None, str, str]] = []

    def push(task_id: str, indent: str) -> None:
        if task_id in cut:
            stack.append((None, f"{indent}... (more not shown: limit reached)", ""))
        edges = edges_of(task_id)
        for i, edge in reversed(list(enumerate(edges))):
            last = i == len(edges) - 1
            branch, below = ("`-- ", "    ") if last else ("|-- ", "|   ")
            stack.append((edge, indent + branch, indent + below))

    push(hood.task_id, "  ")
    while stack:
        edge, head, indent = stack.pop()
        if edge is None:
            lines.append(head)
            continue
        task_id = other(edge)
        again = task_id in shown
        marks = " (see above)" if again else ""
        # The edge's mark goes next to the id: it belongs to the edge, not to the state.
        label = f"{show_id(task_id, limit)}{' [optional]' if edge.optional else ''}"
        lines.append(f"{head}{label}: {describe(hood.tasks[task_id], limit)}{marks}")
        if not again:
            shown.add(task_id)
            push(task_id, indent)
    return lines


def render_text(
    hood: Neighbourhood, namespace: str | None = None, limit: int | None = CUT_CHARS
) -> list[str]:
    """The walk as lines for a terminal: stored strings escaped, ids and errors cut to
    ``limit`` characters (None: whole)."""
    root = hood.root
    where = f" in namespace {escape(repr(namespace))}" if namespace is not None else ""
    lines = [
        f"{show_id(hood.task_id, limit)}{where}, version {root.version}: {describe(root, limit)}"
    ]
    up = _tree(hood, lambda t: hood.up.get(t, []), lambda e: e.dependency, hood.cut_up, limit)
    lines.append("depends on:")
    lines += up or ["  (nothing)"]
    down = _tree(hood, lambda t: hood.down.get(t, []), lambda e: e.dependent, hood.cut_down, limit)
    lines.append("needed by:")
    lines += down or ["  (nothing)"]
    if hood.truncated:
        lines.append(f"(stopped after {hood.limit} tasks; raise --limit to see more)")
    return lines


def _task_json(info: TaskInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    blocked = info.blocked_by
    return {
        "state": info.state.value,
        "version": info.version,
        "attempt": info.attempt,
        "max_attempts": info.max_attempts,
        "remaining": info.remaining,
        "optional_remaining": info.optional_remaining,
        "paused": info.paused,
        "error": info.error,
        "blocked_by": None
        if blocked is None
        else {"root": blocked.root, "path": list(blocked.path)},
    }


def render_json(hood: Neighbourhood) -> dict[str, Any]:
    """The walk as plain data; a task that was named but never submitted maps to null."""
    edges: dict[tuple[str, str], Edge] = {}
    for group in (*hood.up.values(), *hood.down.values()):
        for edge in group:
            edges[(edge.dependency, edge.dependent)] = edge
    return {
        "task_id": hood.task_id,
        "tasks": {task_id: _task_json(info) for task_id, info in hood.tasks.items()},
        "ancestors": list(hood.ancestors),
        "descendants": list(hood.descendants),
        "edges": [
            {"dependency": e.dependency, "dependent": e.dependent, "optional": e.optional}
            for e in edges.values()
        ],
        "truncated": hood.truncated,
        "limit": hood.limit,
    }


def waitpoint_text(info: TaskInfo, server_now: float) -> str:
    """What a waitpoint waits for, on one line (``status``, the dashboard's task page)."""
    wp = info.waitpoint
    if wp is None:
        return "-"
    if wp.waiting and wp.times_out_at is not None:
        return (
            f"waiting for an external completion, times out "
            f"{text.relative(wp.times_out_at, server_now)} (timeout {times.span(wp.timeout)})"
        )
    if info.state is State.PENDING:
        return (
            "waiting for its own dependencies first, then "
            f"{times.span(wp.timeout)} for its completion"
        )
    by = f" by {show_id(wp.by, CUT_CHARS)}" if wp.by else ""
    return f"ended {info.state.value}{by} (timeout {times.span(wp.timeout)})"


def workflow_text(workflow: Workflow, limit: int | None = CUT_CHARS) -> str:
    """Where a spawned task stands, on one line: its parent and root, its join, a join's
    rule and progress ("3 of 5 children succeeded"), a windowed child's wait."""
    parts = [f"spawned by {show_id(workflow.parent, limit)}"]
    if workflow.root != workflow.parent:
        parts.append(f"workflow root {show_id(workflow.root, limit)}")
    if workflow.is_join:
        rule = workflow.rule if workflow.rule is not None else "all"
        parts.append(
            f"join ({rule}): {workflow.succeeded} of {workflow.children} children succeeded, "
            f"{workflow.failed} did not"
        )
    elif workflow.join:
        parts.append(f"join {show_id(workflow.join, limit)}")
    if workflow.window_waiting:
        running, window = workflow.window_running, workflow.window
        parts.append(f"waiting for a window slot ({running} running, window {window})")
    elif workflow.window is not None:
        parts.append(f"window {workflow.window}")
    return "; ".join(parts)
