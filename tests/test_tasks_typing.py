"""mypy checks calls through a task handle against the function's own signature, and
types its result: the point of typed tasks."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

from tests.conftest import python_command, subprocess_env

PROGRAM = textwrap.dedent(
    """
    from distsched.tasks import Tasks

    tasks = Tasks()

    @tasks.task(max_attempts=3)
    def send_welcome(user_id: int, *, greeting: str = "hi") -> str:
        return f"{greeting} {user_id}"

    @tasks.task
    async def add(a: int, b: int) -> int:
        return a + b

    send_welcome.schedule("ok", 42, greeting="hello")
    send_welcome.options(delay=60).schedule("ok", 42)
    reveal_type(send_welcome.result("ok"))
    reveal_type(add.result("sum"))
    reveal_type(send_welcome(1))
    send_welcome.schedule("bad", "42")  # line 19
    send_welcome.schedule("bad", 42, greting="x")  # line 20
    add.schedule("bad", 1)  # line 21
    send_welcome.options(dela=60)  # line 22
    send_welcome.schedule(42, 42)  # line 23
    """
)


def test_mypy_checks_handle_calls_against_the_function_and_types_results(
    tmp_path: Path,
) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    # In a process of its own: mypy in this one would leave millions of objects behind,
    # and every later test's garbage collection would walk them.
    done = subprocess.run(
        python_command(
            "-m", "mypy", "--strict", "--no-incremental", "--cache-dir=/dev/null", str(program)
        ),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    lines = [line.split(":", 2) for line in out.splitlines() if line.startswith(str(program))]
    by_line: dict[int, list[str]] = {}
    for _path, number, message in lines:
        by_line.setdefault(int(number), []).append(message)
    revealed = {
        n: re.findall(r'Revealed type is "(?:builtins\.)?(\w+)"', " ".join(by_line[n]))
        for n in (16, 17, 18)
    }
    assert revealed == {16: ["str"], 17: ["int"], 18: ["str"]}
    # Every wrong call is an error, on its own line, and nothing else is.
    errors = {n for n, messages in by_line.items() if any(" error: " in m for m in messages)}
    assert errors == {19, 20, 21, 22, 23}, out
