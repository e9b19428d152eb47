"""The dependency graph around a task, drawn as inline SVG.

Dependencies are on the left, dependents on the right, one column per step of
the longest path; each box is coloured by its task's state and links to that
task's page. The edges along which a failure or cancellation blocked a task are
drawn in red: the blocking path. Every text is escaped here, and cut: the graph of
``GRAPH_LIMIT`` tasks is bounded whatever their ids.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from html import escape

from distsched.dashboard.reads import cut, linkable
from distsched.model import State
from distsched.views import Edge, Neighbourhood

STATE_COLOURS: dict[str | None, str] = {
    State.PENDING.value: "#d1d5db",
    State.READY.value: "#93c5fd",
    State.RUNNING.value: "#fcd34d",
    State.SUCCEEDED.value: "#86efac",
    State.FAILED.value: "#fca5a5",
    State.CANCELLED.value: "#c4b5fd",
    State.BLOCKED.value: "#fdba74",
    None: "#ffffff",
}
BOX_W = 180
BOX_H = 38
COL_GAP = 70
ROW_GAP = 16
MARGIN = 12
LABEL_CHARS = 24
# Characters of an id in a box's or an edge's title (a longer one is cut).
TITLE_CHARS = 200


def edges_of(hood: Neighbourhood) -> list[Edge]:
    """Every edge the walk read, once."""
    seen: dict[tuple[str, str], Edge] = {}
    for group in (*hood.up.values(), *hood.down.values()):
        for edge in group:
            seen.setdefault((edge.dependency, edge.dependent), edge)
    return list(seen.values())


def blocking_edges(hood: Neighbourhood) -> set[tuple[str, str]]:
    """The edges along which the blocked tasks shown were blocked."""
    marked: set[tuple[str, str]] = set()
    for info in hood.tasks.values():
        if info is None or info.state is not State.BLOCKED or info.blocked_by is None:
            continue
        path = info.blocked_by.path
        marked.update(itertools.pairwise(path))
    return marked


def layers(nodes: list[str], edges: list[Edge]) -> dict[str, int]:
    """Column of each task: the longest path to it (bounded passes, so a loop in the
    stored lists cannot make it spin)."""
    level = dict.fromkeys(nodes, 0)
    for _ in range(len(nodes)):
        changed = False
        for e in edges:
            if level[e.dependent] < level[e.dependency] + 1:
                level[e.dependent] = level[e.dependency] + 1
                changed = True
        if not changed:
            break
    return level


def _label(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


def render(hood: Neighbourhood, link: Callable[[str], str]) -> str:
    """The SVG document (a string of markup, every text escaped)."""
    nodes = list(hood.tasks)
    edges = [e for e in edges_of(hood) if e.dependency in hood.tasks and e.dependent in hood.tasks]
    level = layers(nodes, edges)
    columns: dict[int, list[str]] = {}
    for node in nodes:
        columns.setdefault(level[node], []).append(node)
    # One ordering sweep: each task near the mean row of its dependencies.
    row: dict[str, float] = {}
    parents: dict[str, list[str]] = {}
    for e in edges:
        parents.setdefault(e.dependent, []).append(e.dependency)
    for col in sorted(columns):
        members = columns[col]
        for i, node in enumerate(members):
            known = [row[p] for p in parents.get(node, []) if p in row]
            row[node] = sum(known) / len(known) if known else float(i)
        members.sort(key=lambda n: row[n])
        for i, node in enumerate(members):
            row[node] = float(i)
    first = min(columns) if columns else 0
    pos: dict[str, tuple[int, int]] = {}
    for col, members in columns.items():
        for i, node in enumerate(members):
            pos[node] = (
                MARGIN + (col - first) * (BOX_W + COL_GAP),
                MARGIN + i * (BOX_H + ROW_GAP),
            )
    width = max((x for x, _ in pos.values()), default=0) + BOX_W + 2 * MARGIN
    height = max((y for _, y in pos.values()), default=0) + BOX_H + 2 * MARGIN
    blocking = blocking_edges(hood)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="dependency graph">',
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#6b7280"/></marker>'
        '<marker id="arrow-block" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="3.5" '
        'markerHeight="3.5" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#dc2626"/></marker>'
        "</defs>",
    ]
    for e in edges:
        x1, y1 = pos[e.dependency]
        x2, y2 = pos[e.dependent]
        x1, y1, x2, y2 = x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2
        bend = max(20, (x2 - x1) // 2)
        blocked = (e.dependency, e.dependent) in blocking
        cls = "edge blocking" if blocked else "edge"
        style = 'stroke="#dc2626" stroke-width="3"' if blocked else 'stroke="#6b7280"'
        dash = ' stroke-dasharray="5,4"' if e.optional else ""
        marker = "arrow-block" if blocked else "arrow"
        title = f"{cut(e.dependent, TITLE_CHARS)} needs {cut(e.dependency, TITLE_CHARS)}" + (
            " (optional)" if e.optional else ""
        )
        out.append(
            f'<path class="{cls}" d="M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}" '
            f'fill="none" {style}{dash} marker-end="url(#{marker})">'
            f"<title>{escape(title)}</title></path>"
        )
    for node in nodes:
        x, y = pos[node]
        info = hood.tasks[node]
        state = None if info is None else info.state.value
        fill = STATE_COLOURS[state]
        here = node == hood.task_id
        stroke = 'stroke="#111827" stroke-width="3"' if here else 'stroke="#4b5563"'
        dash = ' stroke-dasharray="4,3"' if info is None else ""
        shown = state if state is not None else "not submitted"
        more = node in hood.cut_up or node in hood.cut_down
        href = f'href="{escape(link(node))}" ' if linkable(node) else ""
        named = escape(str(cut(node, TITLE_CHARS)))
        out.append(
            f'<a {href}class="node" data-task="{named}" data-state="{escape(shown)}">'
            f"<title>{named}: {escape(shown)}</title>"
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="{fill}" '
            f"{stroke}{dash}/>"
            f'<text x="{x + 8}" y="{y + 15}" font-size="12" font-family="monospace">'
            f"{escape(_label(node))}</text>"
            f'<text x="{x + 8}" y="{y + 30}" font-size="11" fill="#374151">'
            f"{escape(shown)}{' (more not shown)' if more else ''}</text></a>"
        )
    out.append("</svg>")
    return "".join(out)
