"""Serving the dashboard with uvicorn (``distsched dashboard``, ``distsched demo --dashboard``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import uvicorn

from distsched.client import Scheduler
from distsched.dashboard.app import create_app

log = logging.getLogger("distsched.dashboard")


def serve(
    scheduler: Scheduler,
    bind: str,
    port: int,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    echo: Callable[[str], Any] = log.info,
) -> None:
    """Serve the dashboard of ``scheduler``'s namespace until interrupted (Ctrl-C, SIGTERM)."""
    app = create_app(scheduler, allow_actions=allow_actions, token=token)
    host = f"[{bind}]" if ":" in bind else bind
    mode = "actions allowed after login" if allow_actions else "read-only"
    echo(f"dashboard of namespace '{scheduler.namespace}' on http://{host}:{port}/ ({mode})")
    config = uvicorn.Config(app, host=bind, port=port, log_level="warning", access_log=False)
    uvicorn.Server(config).run()
