"""The wheel ships every Lua script, and an installed copy loads them from itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
        import zipfile

        names = zipfile.ZipFile(wheel).namelist()
        for lua in (ROOT / "lua").rglob("*.lua"):
            assert f"distsched/lua/{lua.relative_to(ROOT / 'lua').as_posix()}" in names

        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
        out = subprocess.run(
            [str(py), "-c", CHECK, server.url, str(ROOT)],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        ).stdout
        assert out.split() == ["ok", str(len(list((ROOT / "lua").glob("*.lua"))))]
    finally:
        server.close()
