"""``distsched exporter``: serve the depth of namespaces for autoscalers, with no worker."""

from __future__ import annotations

import threading

import click

from distsched.cli.common import connect
from distsched.client import Scheduler
from distsched.exporter import DEFAULT_INTERVAL_S, serve_depth


@click.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=9108, show_default=True, help="Port to listen on.")
@click.option(
    "--also",
    multiple=True,
    metavar="NAMESPACE",
    help="Serve this namespace's depth too (repeatable).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.0),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds one read of the namespaces serves every request.",
)
@click.pass_context
def exporter(
    ctx: click.Context, bind: str, port: int, also: tuple[str, ...], interval: float
) -> None:
    """Serve each namespace's backlog at /depth (JSON) and /metrics (Prometheus).

    Reads Redis itself, so it works with no worker running: point KEDA's metrics-api
    scaler at /depth (valueLocation namespaces.NAME.busy) to scale workers from zero.
    Serves until Ctrl-C or SIGTERM.
    """
    first = connect(ctx)
    first.client.ping()
    names = [first.namespace, *(n for n in dict.fromkeys(also) if n != first.namespace)]
    schedulers = [first, *(Scheduler(first.client, namespace=n) for n in names[1:])]
    server = serve_depth(schedulers, port, bind, interval)
    host = f"[{bind}]" if ":" in bind else bind
    click.echo(
        f"depth of namespace{'s' if len(names) > 1 else ''} {', '.join(names)} "
        f"on http://{host}:{server.port}/depth and /metrics"
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        for scheduler in schedulers[1:]:
            scheduler.close()
