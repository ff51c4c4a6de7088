"""``draftwise check-config``: check a speculative config without loading anything.

Prints the resolved config as JSON (defaults filled, aliases resolved) and exits 0, or
prints the refusal on stderr and exits 2, exactly as the engine would refuse it before
reading weights. Notices (alias used, method derived from model ...) go to stderr.
"""

from __future__ import annotations

import json
import sys

import click

from draftwise.cli import EXIT_PLUGIN_ERROR, CliState

#: exit status of a refused config (as for every refusal of the command line)
EXIT_REFUSED = 2


@click.command("check-config")
@click.argument("config", metavar="'<json>'")
@click.pass_context
def check_config(ctx: click.Context, config: str) -> None:
    """Check a --speculative-config JSON object ('-' reads it from stdin)."""
    from draftwise.config import ConfigError, parse_speculative_config
    from draftwise.plugins.errors import PluginError

    state = ctx.ensure_object(CliState)
    # stdin is read as bytes: the parser names a non-UTF-8 byte instead of a decode traceback
    text: str | bytes = sys.stdin.buffer.read() if config == "-" else config
    try:
        resolved = parse_speculative_config(text, registry=state.registry())
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_REFUSED)
    except PluginError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_PLUGIN_ERROR)
    if resolved is None:
        click.echo("notice: null means no speculative decoding", err=True)
        click.echo("null")
        return
    for notice in resolved.notices:
        click.echo(f"notice: {notice}", err=True)
    click.echo(json.dumps(resolved.to_json(), indent=2))
