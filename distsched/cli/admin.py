"""``distsched library``: install and check the Redis Functions library (admin)."""

from __future__ import annotations

import click
import redis

from distsched import library, scripts
from distsched.cli.common import Exit, connect, leave
from distsched.scripts import Check
from distsched.tracebacks import one_line


@click.group("library")
def library_group() -> None:
    """The Redis Functions library the scripts run from: install it (admin), check it.

    Tenants need no right to load functions: an admin installs the library once per
    version, and clients check it byte for byte before they call it (README, Security).
    """


def _library_lines(report: library.NodeLibrary) -> list[str]:
    name = scripts.library_name()
    found = {
        Check.SAME: f"{name} is the exact library",
        Check.MISSING: f"{name} is missing",
        Check.DIFFERENT: f"{name} holds OTHER code than this version ships",
    }[report.found]
    done = {
        None: found,
        library.Action.UNCHANGED: f"{name} already installed, byte for byte: unchanged",
        library.Action.INSTALLED: f"installed {name}",
        library.Action.REPLACED: f"replaced {name}, which held other code",
    }[report.action]
    lines = [f"{report.node}: {done}"]
    if report.pruned:
        lines.append(f"  deleted other versions: {', '.join(report.pruned)}")
    if report.others:
        lines.append(f"  other versions left: {', '.join(report.others)} (--prune deletes them)")
    return lines


@library_group.command("install")
@click.option(
    "--prune",
    is_flag=True,
    help="Also delete the libraries of other distsched versions (once none of their clients runs).",
)
@click.pass_context
def library_install(ctx: click.Context, prune: bool) -> None:
    """Load this version's library on every master (or the one server); idempotent.

    Needs the admin ACL (FUNCTION LOAD): a node that holds it byte for byte is left as
    it is, a missing one is loaded, one with other code under its name is replaced.
    """
    client = connect(ctx).client
    try:
        reports = library.install(client, prune=prune)
    except redis.exceptions.NoPermissionError as exc:
        raise click.ClickException(
            f"{one_line(exc)}: installing the library needs the admin ACL (README, Security)"
        ) from None
    for report in reports:
        for line in _library_lines(report):
            click.echo(line)


@library_group.command("check")
@click.pass_context
def library_check(ctx: click.Context) -> None:
    """Say whether each master holds this version's exact library; exit 1 if one does not."""
    reports = library.check(connect(ctx).client)
    for report in reports:
        for line in _library_lines(report):
            click.echo(line)
    if any(report.found is not Check.SAME for report in reports):
        leave(ctx, Exit.FAILED)
