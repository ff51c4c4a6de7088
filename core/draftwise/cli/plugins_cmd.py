"""``draftwise plugins``: which plugins are loaded, from which distributions, with what."""

from __future__ import annotations

import json
import sys

import click

from draftwise.cli import EXIT_PLUGIN_ERROR, CliState


def _short(aliases: tuple[str, ...], shown: int = 2) -> str:
    """A long alias list (mtp has 26) as its first few and a count; --json has them all."""
    if len(aliases) <= shown + 1:
        return ", ".join(aliases) or "-"
    return f"{', '.join(aliases[:shown])}, … ({len(aliases)} in all, see --json)"


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def plugins(ctx: click.Context, as_json: bool) -> None:
    """List installed plugins: distribution, version, hooks, methods, aliases, whether each
    method runs (declared-only methods and methods two distributions claim cannot)."""
    from draftwise.plugins.errors import PluginError
    from draftwise.plugins.manager import summarize

    state = ctx.ensure_object(CliState)
    try:
        rows = summarize(state.plugin_host())
    except PluginError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_PLUGIN_ERROR)
    if state.startup_error is not None:  # e.g. a method claimed twice: shown, not fatal here
        click.echo(f"warning: {state.startup_error}", err=True)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="draftwise plugins", title_justify="left")
    columns = ("Distribution", "Version", "Entry point", "Methods", "Aliases", "Registers")
    for column in columns:
        table.add_column(column, no_wrap=column not in ("Aliases", "Registers"), overflow="fold")
    table.add_column("Status", overflow="fold")
    for row in rows:
        status = "\n".join(f"{m}: {s}" for m, s in row.status) or "-"
        table.add_row(
            row.dist.name, row.dist.version, row.dist.entry_point, ", ".join(row.methods),
            _short(row.aliases), ", ".join(h.removeprefix("register_") for h in row.hooks),
            status,
        )
    # one row per method: what it is and which checkpoint formats it reads (its description)
    methods = Table(title="methods", title_justify="left")
    for column in ("Method", "Status", "What it runs (formats)"):
        methods.add_column(column, no_wrap=column == "Method", overflow="fold")
    for row in rows:
        described = dict(row.descriptions)
        for method, status in row.status:
            methods.add_row(method, status, described.get(method) or "-")
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    if rows:
        console.print(table)
        console.print(methods)
    else:
        console.print("no plugins loaded (install one, e.g. pip install draftwise-ngram)")
