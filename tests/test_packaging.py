"""The wheel ships every Lua script, and an installed copy loads them from itself.

The package is layered: no module imports a module of a layer above its own,
and importing the CLI loads none of the tools.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

import distsched
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent

CHECK = textwrap.dedent(
    """
    import sys, pathlib, redis
    import distsched
    from distsched import Scheduler, scripts
    here = pathlib.Path(str(scripts.lua_dir())).resolve()
    assert "site-packages" in str(here), here
    assert not str(here).startswith(sys.argv[2]), here
    client = redis.Redis.from_url(sys.argv[1])
    for name in scripts.SCRIPT_NAMES:
        client.script_load(scripts.source(name))
    s = Scheduler(client, namespace="wheel")
    s.schedule("a", fn="f")
    claim = s.next("w")
    assert claim.task_id == "a", claim
    assert s.complete(claim).value == "applied"
    print("ok", len(scripts.SCRIPT_NAMES))
    """
)


@pytest.mark.slow
def test_installed_wheel_loads_every_script_from_the_package(tmp_path: Path) -> None:
    server = RedisServer()
    try:
        wheels = tmp_path / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
            check=True,
        )
        (wheel,) = wheels.glob("distsched-*.whl")
        # The build reads its version from distsched/version.py, the one version source.
        assert wheel.name.startswith(f"distsched-{distsched.__version__}-")
        import zipfile

        names = zipfile.ZipFile(wheel).namelist()
        for module in ("distsched/tools/__init__.py", "distsched/tools/bench/__init__.py",
                       "distsched/text.py", "distsched/views.py",
                       "distsched/dashboard/app.py",
                       "distsched/dashboard/templates/task.html",
                       "distsched/dashboard/static/dashboard.js",
                       "distsched/dashboard/static/dashboard.css"):  # fmt: skip
            assert module in names
        for lua in (ROOT / "lua").rglob("*.lua"):
            assert f"distsched/lua/{lua.relative_to(ROOT / 'lua').as_posix()}" in names

        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
        # A PYTHONPATH naming the checkout would import distsched from there instead.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run(
            [str(py), "-c", CHECK, server.url, str(ROOT)],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        ).stdout
        assert out.split() == ["ok", str(len(list((ROOT / "lua").glob("*.lua"))))]
    finally:
        server.close()


# --------------------------------------------------------------------------- layers

# Bottom up. A module may import its own layer and the layers below, never one above.
LAYERS: list[set[str]] = [
    {
        "distsched.errors",
        "distsched.limits",
        "distsched.retention",
        "distsched.placement",
        "distsched.times",
        "distsched.tracebacks",
        "distsched.version",
        "distsched.lua_files",
        "distsched.keys",
        "distsched.scripts",
        "distsched.library",
        "distsched.schedules",
        "distsched.model",
        "distsched.validate",
        "distsched.wire",
        "distsched.ops",
    },
    {
        "distsched",
        "distsched.client",
        "distsched.aio",
        "distsched.batching",
        "distsched.context",
        "distsched.metrics",
        "distsched.exporter",
        "distsched.hooks",
        "distsched.otel",
        "distsched.subscription",
        "distsched.worker",
        "distsched.text",
        "distsched.views",
        "distsched.tasks",
        "distsched.testing",
    },
    # The dashboard reads through the scheduler and views; the tools may serve it.
    {"distsched.dashboard"},
    {"distsched.tools"},
    # ``python -m distsched`` runs the command line.
    {"distsched.cli", "distsched.__main__"},
]
PACKAGE = ROOT / "distsched"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


# Packages whose modules all share the package's layer.
LAYERED_PACKAGES = (
    "distsched.wire",
    "distsched.ops",
    "distsched.worker",
    "distsched.dashboard",
    "distsched.tools",
    "distsched.cli",
)


def _layer(module: str) -> int:
    for package in LAYERED_PACKAGES:
        if module.startswith(package + "."):
            module = package
    for i, layer in enumerate(LAYERS):
        if module in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # ``from distsched import keys`` imports a module; ``import __version__`` does not.
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [n if n in known else node.module for n in names]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_no_module_imports_a_module_of_a_layer_above_its_own() -> None:
    modules = _modules()
    wrong = [
        f"{module} (layer {_layer(module)}) imports {imported} (layer {_layer(imported)})"
        for module, path in modules.items()
        for imported in sorted(_imports(path, set(modules)))
        if _layer(imported) > _layer(module)
    ]
    assert wrong == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another in a circle (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_modules_import_one_another_in_a_circle() -> None:
    # Imports made only for type checking count too: a circle there is still two modules
    # that cannot be read, or moved, one without the other.
    modules = _modules()
    graph = {m: _imports(path, set(modules)) - {m} for m, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def _loaded_after(statement: str) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; {statement}; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('distsched'))))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return out.split()


def test_importing_the_cli_loads_no_tool_and_no_dashboard() -> None:
    loaded = _loaded_after("import distsched.cli")
    assert "distsched.cli" in loaded
    assert [m for m in loaded if m.startswith(("distsched.tools", "distsched.dashboard"))] == []


@functools.cache
def _loaded_by_the_package() -> frozenset[str]:
    return frozenset(_loaded_after("import distsched"))


# A __main__ module is a program: importing it runs it.
@pytest.mark.parametrize("module", sorted(m for m in _modules() if not m.endswith(".__main__")))
def test_every_module_imports_alone_and_loads_nothing_above_its_layer(module: str) -> None:
    # Importing any module runs the package's __init__ first, and what it loads (the
    # public API) comes with every import.
    package = _loaded_by_the_package()
    loaded = _loaded_after(f"import {module}")
    above = [m for m in loaded if m not in package and _layer(m) > _layer(module)]
    assert module in loaded
    assert above == []


def test_the_bench_command_still_offers_every_size_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "distsched.cli", "bench", "--help"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    options = (
        "--tasks",
        "--claim-sizes",
        "--memory-tasks",
        "--delay-min",
        "--fair-heavy",
        "--json",
    )
    for option in options:
        assert option in out


def test_the_declared_redis_py_bound_is_the_one_distsched_needs() -> None:
    dependencies = _pyproject()["project"]["dependencies"]
    wanted = ".".join(map(str, distsched.REDIS_PY_MIN))
    assert f"redis>={wanted}" in dependencies


def test_an_older_redis_py_fails_at_import_with_the_version_it_needs() -> None:
    # The import must name the cause, where an older redis-py would otherwise fail
    # deep inside the asyncio cluster's imports.
    program = "import redis; redis.__version__ = '7.4.1'; import distsched"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "distsched needs redis-py 8.0 or later, found 7.4.1" in done.stderr


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


def test_the_version_has_one_source_which_the_build_reads() -> None:
    pyproject = _pyproject()
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    source = pyproject["tool"]["hatch"]["version"]["path"]
    assert source == "distsched/version.py"
    # hatchling finds the version by the ``__version__ = "..."`` assignment.
    text = (ROOT / source).read_text("utf-8")
    assert f'__version__ = "{distsched.__version__}"' in text.splitlines()


def _requirements() -> list[str]:
    project = _pyproject()["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return [*project["dependencies"], *(r for group in extras.values() for r in group)]


def test_every_dependency_states_a_lower_bound_and_none_is_pinned() -> None:
    # CI installs exactly the lower bounds to test them (.ci/run), and a pin or an upper
    # bound would keep users from the fixes of the releases after it.
    for line in _requirements():
        requirement = Requirement(line)
        if requirement.name == "distsched":
            continue
        operators = sorted(spec.operator for spec in requirement.specifier)
        assert operators == [">="], line


def test_the_source_distribution_carries_the_license_and_the_changelog() -> None:
    include = _pyproject()["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    assert {"LICENSE", "CHANGELOG.md"} <= set(include)
    assert (ROOT / "LICENSE").read_text("utf-8").startswith("MIT License")
    assert _pyproject()["project"]["license"] == "MIT"
    assert f"## [{distsched.__version__}]" in (ROOT / "CHANGELOG.md").read_text("utf-8")


@pytest.mark.parametrize("module", ["distsched", "distsched.cli"])
def test_python_dash_m_runs_the_command_line(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: ")
    assert "distsched: a Redis-based distributed task scheduler." in done.stdout


def test_python_dash_m_distsched_prints_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "distsched", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"distsched, version {distsched.__version__}\n"
