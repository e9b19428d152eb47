"""The package's code keeps a shape a maintainer can change in one place.

- ``# fmt: skip`` only on table literals, where a hand layout reads better than the
  formatter's; everything else is formatted by ``ruff format``.
- ``type: ignore`` only where a library's own typing is missing or differs between its
  supported versions (each kind allowed below says why); elsewhere the types hold.

Function complexity is bounded by ruff (``C901`` in pyproject.toml).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "distsched"

# A table is an assignment of a container literal, maybe wrapped in one plain constructor.
TABLE_WRAPPERS = frozenset({"frozenset", "set", "tuple", "dict", "list"})
CONTAINERS = (ast.Dict, ast.List, ast.Tuple, ast.Set)

# Every kind of ``type: ignore`` the package may carry, and why it cannot be avoided.
ALLOWED_IGNORES = {
    "no-untyped-call": "redis-py leaves some client methods (pubsub, get_primaries, keyslot, "
    "execute_command on a pipeline) untyped",
    "type-arg": "click.ParamType is generic only from click 8.2; we support 8.1",
    "attr-defined": "click stores a decorated function's options in __click_params__, untyped",
    "misc": "click.ClickException.message is declared read-only but is the documented "
    "place to rewrite the message",
    "unused-ignore": "goes with another code that only some supported versions need",
    "overload-overlap": "a typed task's decorator tells an async def function from a def one "
    "by overloads, which mypy deems overlapping (a def may return a coroutine too)",
}
# A ceiling on the count too, so one allowed kind does not spread.
MAX_IGNORES = 9


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _comments(text: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def is_table(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
        return False
    value = node.value
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in TABLE_WRAPPERS
        and len(value.args) == 1
        and not value.keywords
    ):
        value = value.args[0]
    return isinstance(value, CONTAINERS)


def format_skips_off_tables(text: str) -> list[int]:
    """The lines of ``text`` whose ``# fmt: skip`` is on anything but a table literal."""
    statements = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt)]
    wrong = []
    for line, comment in _comments(text):
        if comment.replace(" ", "") != "#fmt:skip":
            continue
        holders = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
        innermost = min(holders, key=lambda s: (s.end_lineno or s.lineno) - s.lineno, default=None)
        if innermost is None or not is_table(innermost):
            wrong.append(line)
    return wrong


def test_format_skips_stand_only_on_table_literals() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _package_files()
        for line in format_skips_off_tables(path.read_text("utf-8"))
    ]
    assert wrong == []


def test_the_format_skip_check_tells_a_table_from_a_call() -> None:
    table = "RANKS = {\n    'a': 1,  'b': 2,\n}  # fmt: skip\n"
    wrapped = "CODES = frozenset({1,  2})  # fmt: skip\n"
    call = "x = f(\n    1,  2,\n)  # fmt: skip\n"
    signature = "def f(\n    a: int,  b: int,\n) -> None:  # fmt: skip\n    pass\n"
    assert format_skips_off_tables(table) == []
    assert format_skips_off_tables(wrapped) == []
    assert format_skips_off_tables(call) == [3]
    assert format_skips_off_tables(signature) == [3]


IGNORE = re.compile(r"type:\s*ignore(?:\[([^\]]*)\])?")


def _ignores() -> list[tuple[str, list[str]]]:
    found = []
    for path in _package_files():
        for line, comment in _comments(path.read_text("utf-8")):
            match = IGNORE.search(comment)
            if match:
                codes = [c.strip() for c in (match.group(1) or "").split(",") if c.strip()]
                found.append((f"{path.relative_to(ROOT)}:{line}", codes))
    return found


def test_type_ignores_name_only_allowed_kinds_and_stay_few() -> None:
    ignores = _ignores()
    unexplained = [
        (where, codes) for where, codes in ignores if not codes or set(codes) - set(ALLOWED_IGNORES)
    ]
    assert unexplained == []
    assert len(ignores) <= MAX_IGNORES, [where for where, _ in ignores]
