"""(i) ``dashboard``: Redis commands per dashboard page, and a worker's drain rate
while the dashboard is polled."""

from __future__ import annotations

import threading
import urllib.request

import redis

from distsched import model
from distsched.client import Scheduler
from distsched.model import TaskSpec
from distsched.tools.bench.harness import Bench
from distsched.tools.bench.procs import NOOP, BenchError

# The dashboard pages the bench counts Redis commands for.
DASHBOARD_PAGES = (
    "/", "/api/overview", "/tasks?state=ready", "/tasks?state=failed", "/task?id=extract",
    "/leases", "/workers",
)  # fmt: skip
# Tasks of the small namespace the dashboard's costs are compared with.
DASHBOARD_FEW = 100
DASHBOARD_POLL_S = 1.0


def run(bench: Bench) -> None:
    cfg = bench.config
    bench.phase(
        "dashboard",
        f"dashboard: Redis commands per page with {DASHBOARD_FEW:,} and "
        f"{cfg.dashboard_tasks:,} tasks; {cfg.dashboard_drain:,} tasks drained while polled",
    )
    try:
        from distsched.dashboard import create_app
        from distsched.dashboard.serve import Served
    except ImportError as exc:
        bench.step(f"skipped: pip install 'distsched[dashboard]' ({exc})")
        bench.sections["dashboard"] = {"skipped": str(exc)}
        bench.row("dashboard", "skipped: the dashboard extra is not installed", None, "")
        return
    costs: dict[int, dict[str, int | None]] = {}
    for size in (DASHBOARD_FEW, cfg.dashboard_tasks):
        namespace = bench.namespace(f"dash{size}")
        with bench.scheduler(namespace) as s, Served(create_app(s)) as served:
            _dashboard_story(bench, s, size)
            costs[size] = {page: _page_cost(bench, served.url + page) for page in DASHBOARD_PAGES}
        bench.clean(namespace)
        bench.step(f"{size:,} tasks: {costs[size]}")
    few, many = costs[DASHBOARD_FEW], costs[cfg.dashboard_tasks]
    for page in DASHBOARD_PAGES:
        value, base = many[page], few[page]
        bench.row(
            "dashboard",
            f"Redis commands for {page} with {cfg.dashboard_tasks:,} tasks",
            value,
            "commands",
            ratio=None if value is None or not base else value / base,
            ratio_to=f"at {DASHBOARD_FEW:,}",
            target=f"= at {DASHBOARD_FEW:,} tasks",
            met=None if value is None else value == base,
        )
    runs = []
    for polled in (False, True):
        namespace = bench.namespace("dashdrain" + ("-polled" if polled else ""))
        with bench.scheduler(namespace) as s:
            bench.fill(s, "t", cfg.dashboard_drain)
            ids = [f"t{i}" for i in range(cfg.dashboard_drain)]
            if polled:
                with Served(create_app(s)) as served, _Poller(served.url) as poller:
                    result = bench.drain("dashboard", namespace, s, ids, 1)
                result["polls"] = poller.polls
                result["poll_errors"] = poller.errors
            else:
                result = bench.drain("dashboard", namespace, s, ids, 1)
        result["polled"] = polled
        bench.clean(namespace)
        runs.append(result)
        bench.step(f"{'polled' if polled else 'alone'}: {result['tasks_per_s'] or 0:,.0f} tasks/s")
    alone, polled_rate = runs[0]["tasks_per_s"], runs[1]["tasks_per_s"]
    ratio = polled_rate / alone if alone and polled_rate else None
    bench.row("dashboard", "drain, 1 worker process, no dashboard", alone, "tasks/s")
    bench.row(
        "dashboard",
        f"drain, 1 worker process, overview polled every {DASHBOARD_POLL_S:g} s",
        polled_rate,
        "tasks/s",
        ratio=ratio,
        ratio_to="no dashboard",
        target=">= 0.9x no dashboard",
        met=None if ratio is None else ratio >= 0.9,
    )
    bench.sections["dashboard"] = {
        "tasks": cfg.dashboard_tasks,
        "few": DASHBOARD_FEW,
        "commands": {str(size): pages for size, pages in costs.items()},
        "drain": runs,
    }


def _dashboard_story(bench: Bench, s: Scheduler, size: int) -> None:
    """``size`` tasks queued for later, a failed task with a dependent, three leases."""
    bench.fill(s, "t", size, delay=3600)
    s.submit_graph([TaskSpec("extract", NOOP), TaskSpec("load", NOOP, deps=["extract"])])
    claim = s.next("bench-dashboard")
    if not isinstance(claim, model.Claim) or claim.task_id != "extract":
        raise BenchError(f"the dashboard's failed task was not claimed first: {claim}")
    s.fail(claim, "RuntimeError: the bench's failed task")
    for i in range(3):
        s.schedule(f"running{i}", fn=NOOP)
    s.ready(3, "bench-dashboard")


def _commands_sent(bench: Bench) -> int | None:
    try:
        stats = bench.client.info("commandstats")
    except redis.ResponseError:
        return None
    if not stats:
        return None
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _page_cost(bench: Bench, url: str) -> int | None:
    """Redis commands one GET of ``url`` sends (after a first GET that warms up)."""
    _get(url)
    before = _commands_sent(bench)
    _get(url)
    after = _commands_sent(bench)
    return None if before is None or after is None else after - before


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:
        body: bytes = reply.read()
        return body


class _Poller:
    """A dashboard left open: the overview and its JSON fetched every second."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-dashboard-poller")

    def _run(self) -> None:
        while not self._stop.is_set():
            for page in ("/", "/api/overview"):
                try:
                    _get(self.base + page)
                    self.polls += 1
                except OSError:
                    self.errors += 1
            self._stop.wait(DASHBOARD_POLL_S)

    def __enter__(self) -> _Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
