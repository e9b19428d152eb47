"""Serving the dashboard with uvicorn (``distsched dashboard``, ``distsched demo --dashboard``)."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from distsched.client import Scheduler
from distsched.dashboard.app import create_app
from distsched.dashboard.namespaces import create_multi_app

log = logging.getLogger("distsched.dashboard")

START_TIMEOUT_S = 30.0


def exposed_warning(bind: str, allow_actions: bool) -> str | None:
    """The warning to give when actions are allowed on an address other machines reach
    (None: read-only, or loopback only)."""
    if not allow_actions or _loopback(bind):
        return None
    return (
        f"actions are allowed and the dashboard listens on {bind}, reachable from other "
        "machines: anyone who can reach it may try the token; serve it on 127.0.0.1 behind "
        "an HTTPS proxy, or read-only"
    )


def _loopback(bind: str) -> bool:
    if bind.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def serve(
    scheduler: Scheduler,
    bind: str,
    port: int,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    echo: Callable[[str], Any] = log.info,
    warn: Callable[[str], Any] = log.warning,
    also: Sequence[str] = (),
) -> None:
    """Serve the dashboard of ``scheduler``'s namespace until interrupted (Ctrl-C, SIGTERM),
    and of the namespaces ``also`` names beside it (with a switcher between them).

    Warns (``warn``: a WARNING of ``distsched.dashboard`` unless given) when actions are
    allowed and ``bind`` is not a loopback address."""
    warning = exposed_warning(bind, allow_actions)
    if warning is not None:
        warn(warning)
    names = [scheduler.namespace, *(n for n in also if n != scheduler.namespace)]
    app: Any
    if len(names) > 1:
        app = create_multi_app(scheduler, names, allow_actions=allow_actions, token=token)
    else:
        app = create_app(scheduler, allow_actions=allow_actions, token=token)
    host = f"[{bind}]" if ":" in bind else bind
    mode = "actions allowed after login" if allow_actions else "read-only"
    which = ", ".join(f"'{n}'" for n in names)
    echo(
        f"dashboard of namespace{'s' if len(names) > 1 else ''} {which} "
        f"on http://{host}:{port}/ ({mode})"
    )
    config = uvicorn.Config(app, host=bind, port=port, log_level="warning", access_log=False)
    uvicorn.Server(config).run()


class Served:
    """The dashboard served by uvicorn on a thread of this process, until :meth:`close`
    (the demo and the bench use it). ``port`` 0 picks a free port; :attr:`url` says which."""

    def __init__(self, app: Any, bind: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(app, host=bind, port=port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        # uvicorn installs signal handlers only on the main thread; here it runs on another.
        self.thread = threading.Thread(target=self.server.run, name="distsched-dashboard")
        self.thread.daemon = True
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"could not listen on {bind}:{port}")
            time.sleep(0.01)
        sockets = [s for server in self.server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        host = f"[{bind}]" if ":" in bind else bind
        self.url = f"http://{host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(START_TIMEOUT_S)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
