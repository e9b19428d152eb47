"""The harness under a Ctrl-C and under a leak: a pytest run of a small test file, in a
process of its own, with this suite's fixtures (``-p tests.conftest``).

A Ctrl-C at the terminal (SIGINT to the whole process group) stops the run at once and
leaves no redis-server behind; a test that leaves a thread, a process or a socket
behind fails by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, require_redis_server, subprocess_env

pytestmark = pytest.mark.slow


def pytest_run(tmp_path: Path, source: str) -> subprocess.Popen[str]:
    """pytest on ``source`` as a test file, in a session of its own (as at a terminal)."""
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(textwrap.dedent(source))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "--rootdir", str(REPO_ROOT), str(test_file)],
        cwd=REPO_ROOT, env=subprocess_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
        # Whatever this run ignores, the run under test takes Ctrl-C as a terminal does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_ctrl_c_stops_the_run_at_once_and_leaves_no_redis_server(tmp_path: Path) -> None:
    require_redis_server()
    pids, teardown = tmp_path / "pids", tmp_path / "teardown"
    run = pytest_run(
        tmp_path,
        f"""
        import time
        from pathlib import Path

        import pytest
        import redis

        @pytest.fixture
        def watched(own_redis):
            yield own_redis
            time.sleep(0.5)  # a server that was sent the SIGINT too has shut down by now
            with own_redis.client() as client:
                try:
                    seen = repr(client.ping())
                except redis.ConnectionError as exc:
                    seen = repr(exc)
            Path({str(teardown)!r}).write_text(seen)

        def test_first(watched):
            Path({str(pids)!r}).write_text(str(watched.proc.pid))
            time.sleep(60)

        def test_second(own_redis):
            time.sleep(60)
        """,
    )
    try:
        deadline = time.monotonic() + 30
        while not pids.exists() or not pids.read_text():
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline, "the first test did not start"
            time.sleep(0.05)
        server = int(pids.read_text())
        os.killpg(run.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, _ = run.communicate(timeout=20)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "test_second" not in out, out
    # The Ctrl-C reached pytest alone: the test's server served it to its teardown.
    assert teardown.read_text() == "True", out
    deadline = time.monotonic() + 10
    while alive(server):
        assert time.monotonic() < deadline, f"redis-server {server} outlived the run"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("what", "source"),
    [
        ("threads still running", """
            import threading, time

            def test_leaks():
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
            """),
        ("child processes still running", """
            import subprocess, sys

            def test_leaks():
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            """),
        ("sockets still open", """
            LEFT = []

            def test_leaks(redis_server):
                client = redis_server.client()
                client.ping()
                LEFT.append(client)
            """),
    ],
    ids=["thread", "process", "socket"],
)  # fmt: skip
def test_a_test_that_leaves_something_running_fails_by_name(
    tmp_path: Path, what: str, source: str
) -> None:
    run = pytest_run(tmp_path, source)
    try:
        out, _ = run.communicate(timeout=60)
    finally:
        # What the sample test left behind (its process group) goes with the run.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, out
    # The file is outside the rootdir: its node id starts at "::".
    assert f"::test_leaks left behind:\n  {what}" in out, out
