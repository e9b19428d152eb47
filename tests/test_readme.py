"""The examples of the README and of the docs pages run as written against a real Redis
and print what they say.

Each page (README.md, then every page under docs/pages/) runs on a Redis of its own, its
blocks in page order in one shell state (directory, environment, workers), so a block may
use a file an earlier block of the same page wrote. Every ```python block runs as a
script (saved under the name its first line gives, so ``app.py`` can be imported by the
worker); a line ``print(...)  # -> TEXT``
states what it prints, and the script must print exactly those lines. Every
``distsched`` command of the ```bash blocks runs too (``export`` lines set the
environment of the later ones; other commands, such as ``pip``, are left out),
and a ```text block right after a bash block lists ``key: value`` lines that its
last command must print. A ``worker`` command runs in the background until the
end, and must then stop cleanly on SIGTERM; a ``dashboard`` command serves on a free
port until the end, and must answer its overview. The pages' Redis URL is replaced
by the test server's, so nothing here touches a Redis the test did not start.

The docs site's navigation (docs/mkdocs.yml) lists every page, and the README's links
reach pages and headings that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = DOCS / "pages"
README_URL = "redis://127.0.0.1:6379/0"
DISTSCHED = [sys.executable, "-m", "distsched.cli"]
# The bench as shown takes over a minute; these sizes make it a few seconds.
TINY_BENCH = [
    "--evalsha-calls", "200", "--pipeline", "20", "--schedule-calls", "50",
    "--enqueue-tasks", "300", "--batch", "100", "--tasks", "200", "--concurrency", "4",
    "--delayed", "40", "--delay-min", "100ms", "--delay-max", "400ms", "--slots", "10",
    "--claim-sizes", "60,120", "--claims", "20", "--chain", "30", "--fanout", "30",
    "--dependents", "1500", "--memory-tasks", "200", "--dashboard-tasks", "300",
    "--dashboard-drain", "200", "--fair-heavy", "300", "--fair-rounds", "3",
    "--fair-claims", "320",
]  # fmt: skip
EXPECTED = re.compile(r"^\s*print\(.*\)\s*# -> (.*)$")
# Output shown in a text block may appear a moment later (a worker runs in the background).
SETTLE_S = 20.0


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    start: int  # offset in its page
    end: int


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text("utf-8")
    return [
        Block(m.group(1), m.group(2), m.start(), m.end())
        for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)
    ]


def readme_blocks() -> list[Block]:
    return blocks_of(README)


def docs_pages() -> list[Path]:
    return sorted(PAGES.rglob("*.md"))


def expected_prints(code: str) -> list[str]:
    return [m.group(1).strip() for line in code.splitlines() if (m := EXPECTED.match(line))]


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, ``a && b`` as two, comments dropped."""
    found: list[list[str]] = []
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if command:
                    found.append(command)
                command = []
            else:
                command.append(word)
    return found


def fields(output: str) -> dict[str, str]:
    pairs = [re.split(r":\s+", line.rstrip(), maxsplit=1) for line in output.splitlines()]
    return {p[0]: p[1] for p in pairs if len(p) == 2}


class Session:
    """A shell's state between the blocks of one page: directory, environment, workers."""

    def __init__(self, server: RedisServer, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.env = dict(os.environ)
        # Commands before an ``export`` use the test server too, never a default Redis.
        self.env["DISTSCHED_REDIS_URL"] = server.url
        self.env.pop("DISTSCHED_NAMESPACE", None)
        self.workers: list[subprocess.Popen[str]] = []
        self.dashboards: list[subprocess.Popen[str]] = []

    def text(self, raw: str) -> str:
        text = raw.replace(README_URL, self.server.url)
        assert "6379" not in text, text
        return text

    def python(self, block: Block) -> None:
        code = self.text(block.text)
        first = code.splitlines()[0]
        name = first[2:].strip() if re.fullmatch(r"# \w+\.py", first) else f"block{block.start}.py"
        (self.workdir / name).write_text(code, "utf-8")
        done = subprocess.run(
            [sys.executable, name], cwd=self.workdir, env=self.env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, f"{name}:\n{done.stderr}"
        assert done.stdout.splitlines() == expected_prints(code), name

    def shell(self, block: Block, shown: Block | None) -> None:
        runnable = [c for c in commands(block) if c[0] in ("export", "distsched")]
        for i, command in enumerate(runnable):
            if command[0] == "export":
                for assignment in command[1:]:
                    name, _, value = assignment.partition("=")
                    self.env[name] = self.text(value)
                continue
            args = [self.text(word) for word in command[1:]]
            if "worker" in args:
                self.start_worker(args)
                continue
            if "dashboard" in args:
                self.start_dashboard(args)
                continue
            if "bench" in args:
                args += TINY_BENCH
            if "bench-stripes" in args:
                args += ["--tasks", "300", "--processes", "1", "--concurrency", "4"]
            last = i == len(runnable) - 1
            self.run(args, shown if last else None)

    def run(self, args: list[str], shown: Block | None) -> None:
        deadline = time.monotonic() + SETTLE_S
        while True:
            done = subprocess.run(
                [*DISTSCHED, *args], cwd=self.workdir, env=self.env,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, f"distsched {shlex.join(args)}:\n{done.stderr}"
            assert "Traceback" not in done.stderr
            if shown is None:
                return
            want = fields(shown.text)
            got = fields(done.stdout)
            if all(got.get(key) == value for key, value in want.items()):
                return
            assert time.monotonic() < deadline, (
                f"distsched {shlex.join(args)} printed\n{done.stdout}\nnot\n{shown.text}"
            )
            time.sleep(0.2)

    def start_worker(self, args: list[str]) -> None:
        proc = subprocess.Popen(
            [*DISTSCHED, *args], cwd=self.workdir, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.workers.append(proc)

    def start_dashboard(self, args: list[str]) -> None:
        port = str(free_port())
        if "--port" in args:
            args[args.index("--port") + 1] = port
        else:
            args += ["--port", port]
        proc = subprocess.Popen(
            [*DISTSCHED, *args], cwd=self.workdir, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.dashboards.append(proc)
        deadline = time.monotonic() + SETTLE_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
                    assert reply.status == 200
                    assert b'id="count-ready"' in reply.read()
                return
            except OSError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the page's dashboard did not start"
                time.sleep(0.1)

    def stop_dashboards(self) -> None:
        for proc in self.dashboards:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
            assert "Traceback" not in err, err

    def stop_workers(self) -> list[tuple[int | None, str]]:
        results = []
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            results.append((proc.returncode, err))
        return results


def runs_anything(page: Path) -> bool:
    return any(
        b.lang == "python" or (b.lang == "bash" and any(c[0] == "distsched" for c in commands(b)))
        for b in blocks_of(page)
    )


# Every page with an example, the README first; each is a test of its own.
EXAMPLE_PAGES = [page for page in [README, *docs_pages()] if runs_anything(page)]


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_a_page_runs_as_written_and_prints_what_it_says(
    page: Path, own_redis: RedisServer, tmp_path: Path
) -> None:
    blocks = blocks_of(page)
    text = page.read_text("utf-8")
    session = Session(own_redis, tmp_path)
    ran = 0
    try:
        for i, block in enumerate(blocks):
            if block.lang == "python":
                session.python(block)
                ran += 1
            elif block.lang == "bash":
                after = blocks[i + 1] if i + 1 < len(blocks) else None
                shown = None
                if (
                    after is not None
                    and after.lang == "text"
                    and not text[block.end : after.start].strip()
                ):
                    shown = after
                session.shell(block, shown)
                ran += 1
    finally:
        session.stop_dashboards()
        stopped = session.stop_workers()
    assert ran >= 1
    for code, err in stopped:
        assert code == 0, err
        assert "Traceback" not in err
        # The worker ran the page's tasks and none of them failed.
        summary = re.search(r" stopped \((.*)\)", err)
        assert summary is not None, err
        assert "succeeded" in summary.group(1), err
        assert "failed" not in summary.group(1), err


def test_the_examples_run_the_readme_and_the_guides_with_their_workers() -> None:
    runs = {str(p.relative_to(ROOT)) for p in EXAMPLE_PAGES}
    assert {"README.md", "docs/pages/producer-worker.md", "docs/pages/dependencies.md"} <= runs
    python = [b for p in EXAMPLE_PAGES for b in blocks_of(p) if b.lang == "python"]
    assert len(python) >= 15
    workers = [
        p for p in EXAMPLE_PAGES
        for b in blocks_of(p) if b.lang == "bash"
        for c in commands(b) if c[0] == "distsched" and "worker" in c
    ]  # fmt: skip
    assert README in workers, "the README starts a worker"


def test_the_readme_keeps_its_two_set_up_commands_and_a_layout_section() -> None:
    bash = [commands(b) for b in readme_blocks() if b.lang == "bash"]
    flat = [shlex.join(c) for block in bash for c in block]
    assert "distsched demo" in flat
    assert "pip install -e '.[test]'" in flat
    assert "pytest" in flat
    text = README.read_text("utf-8")
    assert "\n## Layout\n" in text
    for module in ("tools/demo", "tools/bench", "tools/embedded", "views", "text", "cli"):
        assert f"`{module}`" in text
    assert len(text.splitlines()) <= 400, "the README stays short: the guides are in docs/"


def nav_pages(entries: object) -> list[str]:
    """The page paths of a mkdocs nav (nested lists of ``title: path`` maps)."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {entries!r}")


def test_the_docs_site_lists_every_page_once_in_its_navigation() -> None:
    config = yaml.safe_load((DOCS / "mkdocs.yml").read_text("utf-8"))
    assert (DOCS / config["docs_dir"]).resolve() == PAGES
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), listed
    present = {str(p.relative_to(PAGES)) for p in docs_pages()}
    assert set(listed) == present


def slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text("utf-8"), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_the_readme_links_to_pages_and_headings_that_exist() -> None:
    text = README.read_text("utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/pages/") for link in links)
    for link in links:
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        target = README if not path else (ROOT / path).resolve()
        assert target.is_file(), link
        if anchor:
            assert anchor in anchors(target), link
