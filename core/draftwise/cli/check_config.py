"""``draftwise check-config``: check a speculative config without loading any weights.

Prints the resolved config as JSON (defaults filled, aliases resolved, k completed from a
draft checkpoint that decides it) and exits 0, or prints the refusal on stderr and exits
2, exactly as ``generate``/``serve`` would refuse it before reading weights. Notices
(alias used, method derived from model ...) go to stderr.

A drafter that reads a checkpoint gets the draft stage's own detection
(:func:`draftwise.spec.draft_stage.detect_member`: the path exists, the format and
architecture from the draft's files, headers only) and, with ``--model``, the loader's
check against the target's header (vocabulary, hidden size: ``ChecksTarget``). Without
``--model`` nothing is compared with a target, since ``generate`` may be given any.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from draftwise.cli import EXIT_PLUGIN_ERROR, CliState

if TYPE_CHECKING:
    from collections.abc import Callable

    from draftwise.config import ResolvedSpeculativeConfig
    from draftwise.plugins.registry import SpeculatorRegistry
    from draftwise.speculator import TargetHeader

#: exit status of a refused config (as for every refusal of the command line)
EXIT_REFUSED = 2


@click.command("check-config")
@click.argument("config", metavar="'<json>'")
@click.option(
    "--model", default=None, metavar="PATH",
    help="the target (.gguf or HF directory): drafts are also checked against its header",
)
@click.pass_context
def check_config(ctx: click.Context, config: str, model: str | None) -> None:
    """Check a --speculative-config JSON object ('-' reads it from stdin)."""
    from draftwise.config import parse_speculative_config
    from draftwise.errors import DraftwiseError
    from draftwise.plugins.errors import PluginError

    state = ctx.ensure_object(CliState)
    # stdin is read as bytes: the parser names a non-UTF-8 byte instead of a decode traceback
    text: str | bytes = sys.stdin.buffer.read() if config == "-" else config
    notices: list[str] = []
    try:
        resolved = parse_speculative_config(text, registry=state.registry())
        if resolved is not None:
            resolved = check_drafts(resolved, state.registry(), model, notices)
    except PluginError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_PLUGIN_ERROR)
    except (DraftwiseError, OSError) as exc:  # ConfigError, ModelFormatError, ...: refusals
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_REFUSED)
    if resolved is None:
        click.echo("notice: null means no speculative decoding", err=True)
        click.echo("null")
        return
    for notice in (*resolved.notices, *notices):
        click.echo(f"notice: {notice}", err=True)
    click.echo(json.dumps(resolved.to_json(), indent=2))


def check_drafts(
    resolved: ResolvedSpeculativeConfig,
    registry: SpeculatorRegistry,
    model: str | None,
    notices: list[str],
) -> ResolvedSpeculativeConfig:
    """Each built member's draft detected (and, with ``model``, checked against the target's
    header) by the draft stage's own code; the config completed from the checkpoints."""
    from draftwise.spec.draft_stage import detect_member
    from draftwise.models.inspect import inspect_model, target_header

    target_path = None
    target: Callable[[], TargetHeader] | None = None
    if model is not None:  # refused here if it is no loadable target: a header read
        header = target_header(inspect_model(model))
        target_path = header.path

        def target() -> TargetHeader:
            return header
    members = []
    for member in resolved.drafters:
        reg = registry.get(member.method or "")
        spec = reg.speculator
        if spec.make_proposer is None:  # declared only: the config is all there is to check
            members.append(member)
            continue
        if spec.capabilities.needs_checkpoint and member.model is None and target is None:
            notices.append(
                f"method '{spec.method}' reads its draft from the target's checkpoint; give "
                "--model to check it"
            )
        member, _ = detect_member(member, reg, target_path, target)
        members.append(member)
    if any(m.num_speculative_tokens is None for m in members):  # k from an unread checkpoint
        return resolved
    return resolved.with_drafters(tuple(members))
