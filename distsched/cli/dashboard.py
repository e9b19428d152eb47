"""``distsched dashboard``: serve the web dashboard of a namespace."""

from __future__ import annotations

import click

from distsched.cli.common import connect


@click.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Allow cancel, retry, purge and lease expiry to a user logged in with --token.",
)
@click.option(
    "--token",
    envvar="DISTSCHED_DASHBOARD_TOKEN",
    default=None,
    metavar="TOKEN",
    help="The login token for actions (32 characters or more, e.g. from "
    "secrets.token_urlsafe(32)). Env: DISTSCHED_DASHBOARD_TOKEN.",
)
@click.option(
    "--also",
    multiple=True,
    metavar="NAMESPACE",
    help="Serve this namespace's dashboard too, with a switcher between them (repeatable).",
)
@click.pass_context
def dashboard(
    ctx: click.Context,
    bind: str,
    port: int,
    allow_actions: bool,
    token: str | None,
    also: tuple[str, ...],
) -> None:
    """Serve a web dashboard of the namespace (needs the 'dashboard' extra).

    Read-only unless --allow-actions: then a user who logs in with the token may
    cancel, retry and remove tasks and expire leases. Serves until Ctrl-C.
    """
    try:
        from distsched.dashboard.auth import check_token
        from distsched.dashboard.serve import serve
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs its extra: pip install 'distsched[dashboard]' ({exc})"
        ) from None
    if allow_actions and not token:
        raise click.ClickException(
            "--allow-actions needs --token TOKEN (or DISTSCHED_DASHBOARD_TOKEN)"
        )
    if allow_actions:
        check_token(token)
    if token and not allow_actions:
        click.echo("note: --token is used only with --allow-actions; serving read-only", err=True)
    scheduler = connect(ctx)
    scheduler.client.ping()
    serve(
        scheduler,
        bind,
        port,
        allow_actions=allow_actions,
        token=token if allow_actions else None,
        echo=click.echo,
        warn=lambda text: click.echo(f"warning: {text}", err=True),
        also=also,
    )
