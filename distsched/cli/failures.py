"""``failures``: the failed tasks grouped by error, read in bounded batches."""

from __future__ import annotations

import dataclasses

import click

from distsched import views
from distsched.cli.common import connect
from distsched.model import FailureGroup
from distsched.ops.failures import FAILURES_BATCH_DEFAULT, merge_groups
from distsched.text import escape, json_line, table


@click.command("failures")
@click.option(
    "--count",
    type=int,
    default=FAILURES_BATCH_DEFAULT,
    show_default=True,
    help="Failed tasks read per Redis round trip (1-500).",
)
@click.option(
    "--max",
    "most",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Failed tasks read in all (newest first); the command to go on goes to stderr.",
)
@click.option("--cursor", default=None, help="Go on where a previous run stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: groups, examined, cursor.")
@click.pass_context
def failures(ctx: click.Context, count: int, most: int, cursor: str | None, as_json: bool) -> None:
    """The failed tasks grouped by error, largest group first, with examples.

    A group is the error's last line (``Type: message``) with every number and hex
    id replaced by #, so ids in messages do not split groups. Retry or remove a
    group with `distsched retry --error GROUP` / `distsched purge --error GROUP`.
    """
    scheduler = connect(ctx)
    groups: list[FailureGroup] = []
    examined = 0
    while True:
        page = scheduler.failures(cursor=cursor, count=min(count, most - examined))
        groups.extend(page.groups)
        examined += page.examined
        cursor = page.cursor
        if cursor is None or examined >= most:
            break
    merged = merge_groups(groups)
    if as_json:
        data = {
            "groups": [dataclasses.asdict(g) for g in merged],
            "examined": examined,
            "cursor": cursor,
        }
        click.echo(json_line(data))
        return
    rows = [
        [f"{g.count:,}", escape(g.error), ", ".join(views.show_id(t, 40) for t in g.examples)]
        for g in merged
    ]
    for line in table([["COUNT", "ERROR", "EXAMPLES"], *rows], right=frozenset({0})):
        click.echo(line)
    if not merged:
        click.echo("no failed tasks", err=True)
    click.echo(f"grouped {examined:,} failed tasks", err=True)
    if cursor is not None:
        click.echo(f"more: distsched failures --cursor {escape(repr(cursor))}", err=True)
    if merged:
        group = escape(repr(merged[0].error))
        click.echo(f"retry a group: distsched retry --error {group}", err=True)
