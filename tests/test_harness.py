"""The test harness itself: subprocesses run this checkout, and CI never skips an extra."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tests.conftest as conftest
from tests.conftest import REPO_ROOT, python_command, require_extra, subprocess_env

WHERE = (
    "import json, distsched, distsched.scripts as s; "
    "print(json.dumps([distsched.__file__, str(s.lua_dir())]))"
)


def test_a_subprocess_started_with_the_helpers_imports_distsched_from_this_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another distsched earlier on the inherited import path must not win.
    decoy = tmp_path / "decoy" / "distsched"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy distsched was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(decoy.parent))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        python_command("-c", WHERE),
        env=subprocess_env(),
        cwd=elsewhere,  # not the checkout: the current directory must not be what finds it
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    package, lua = json.loads(out)
    assert Path(package).resolve() == REPO_ROOT / "distsched" / "__init__.py"
    assert Path(lua).resolve().is_relative_to(REPO_ROOT)


def test_subprocess_env_puts_the_checkout_first_and_drops_variables_set_to_none() -> None:
    env = subprocess_env(
        {"PYTHONPATH": "/somewhere", "KEEP": "1", "DROP": "x"}, DROP=None, ADDED="2"
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/somewhere"]
    assert (env["KEEP"], env["ADDED"]) == ("1", "2")
    assert "DROP" not in env


def test_a_missing_extra_fails_under_ci_instead_of_skipping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_extra("distsched_no_such_extra")


def test_a_missing_extra_skips_with_its_name_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="distsched_no_such_extra"):
        require_extra("distsched_no_such_extra")


def test_an_installed_extra_is_returned_as_its_module() -> None:
    assert require_extra("json") is json


def test_a_server_whose_port_another_takes_first_moves_to_a_port_of_its_own() -> None:
    """Two test runs on one machine: a port found free is taken by the other's server
    before this one binds it. The ping would reach the other server; the process id
    tells them apart, and this one starts again elsewhere."""
    other = conftest.RedisServer()
    ports = iter([other.port, conftest.free_port()])
    server = conftest.RedisServer(pick_port=lambda: next(ports))
    try:
        assert server.port != other.port
        assert server.proc is not None
        with server.client() as client:
            assert int(client.info("server")["process_id"]) == server.proc.pid
        with other.client() as client:
            assert client.ping()
    finally:
        server.close()
        other.close()


def test_a_server_restarted_on_its_own_port_refuses_a_port_another_took() -> None:
    server = conftest.RedisServer()
    server.stop()
    other = conftest.RedisServer(port=server.port)
    try:
        with pytest.raises(RuntimeError, match="taken by another server"):
            server.start()
    finally:
        other.close()
        server.close()
