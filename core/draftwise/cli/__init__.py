"""The ``draftwise`` command line: one click group, one module per command.

Built-in commands are listed in :data:`COMMANDS` (adding one is one line) and imported
only when used, so ``draftwise check-config`` never imports torch (plugin loaders that do
are ``speculator.LazyLoader``s). :func:`main` loads
the plugins first and lets every plugin add commands through ``register_commands(cli)``.
A broken plugin or two distributions claiming one method stop every command that needs
the speculator registry, at startup, with the error; ``--help``, ``--version`` and
``plugins`` still run (``plugins`` shows the conflict).
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from draftwise import __version__
from draftwise.cli.state import EXIT_PLUGIN_ERROR, STARTED, CliState

#: built-in commands: name -> "module:attribute", imported on first use
COMMANDS: dict[str, str] = {
    "bench": "draftwise.cli.bench:bench",
    "doctor": "draftwise.cli.doctor:doctor",
    "check-config": "draftwise.cli.check_config:check_config",
    "generate": "draftwise.cli.generate:generate",
    "plugins": "draftwise.cli.plugins_cmd:plugins",
    "serve": "draftwise.cli.serve:serve",
    "train": "draftwise.cli.train:train",
}


class LazyGroup(click.Group):
    """A group whose built-in commands are imported when first looked up."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands and cmd_name not in self.commands:
            module, _, attr = self.lazy_commands[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


def make_cli() -> LazyGroup:
    """A fresh root group with the built-in commands (no plugin commands yet)."""

    @click.group(
        cls=LazyGroup,
        lazy_commands=COMMANDS,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    @click.version_option(__version__, "--version", "-V", prog_name="draftwise")
    def cli() -> None:
        """draftwise: speculative decoding whose speculators are plugins."""

    return cli  # type: ignore[return-value]


#: the root group (built-in commands only); ``main`` builds its own and adds plugin commands
cli = make_cli()


#: arguments that never need the speculator registry
_SAFE_FLAGS = frozenset({"--help", "-h", "--version", "-V"})
#: commands that run with broken plugins (to show what is wrong)
_SAFE_COMMANDS = frozenset({"plugins"})


def _needs_registry(args: Sequence[str]) -> bool:
    """Whether the command line runs something that needs every plugin to be sound."""
    if _SAFE_FLAGS.intersection(args):
        return False
    command = next((a for a in args if not a.startswith("-")), None)
    return command is not None and command not in _SAFE_COMMANDS


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: load plugins, then run the command line.

    A plugin error refuses (exit 1) only commands that need the registry; ``--help``,
    ``--version`` and ``plugins`` run and show it.
    """
    from draftwise.cli.common import PREFAULT_COMMANDS, prefault_from_argv, startup_gc

    group = make_cli()
    args = list(argv) if argv is not None else sys.argv[1:]
    # the console script calls main() with no argv; a caller passing argv (a test) owns
    # the process, and frozen objects are never collected (startup_gc)
    state = CliState(own_process=argv is None)
    command = next((a for a in args if not a.startswith("-")), None)
    if command in PREFAULT_COMMANDS and not _SAFE_FLAGS.intersection(args):
        # first: the weights' memory faults in on another core while everything imports
        state.prefault = prefault_from_argv(args)
    from draftwise.plugins.errors import PluginError, PluginSelectionError
    from draftwise.plugins.manager import (
        ENV_VAR,
        get_plugin_host,
        load_speculators,
        register_commands,
    )

    builtin = command is None or command in COMMANDS
    # the script's own process running a built-in command keeps the collector paused
    # through the command's imports until its engine is built (startup_gc)
    pause = state.own_process and builtin and gc.isenabled()
    try:
        with startup_gc(freeze=state.own_process, keep_paused=pause):  # the plugins' imports
            state.gc_paused = pause
            state.host = get_plugin_host()
            register_commands(group, state.host)
            load_speculators()
    except PluginError as exc:
        state.startup_error = exc
        hint = None
        if not isinstance(exc, PluginSelectionError):
            hint = f"(set {ENV_VAR} to load only some plugins)"
        if _needs_registry(args):
            click.echo(f"error: {exc}", err=True)
            if hint:
                click.echo(hint, err=True)
            sys.exit(EXIT_PLUGIN_ERROR)
        if "plugins" not in args:  # ``plugins`` shows it itself
            click.echo(f"warning: {exc}", err=True)
    try:
        group.main(args=args, prog_name="draftwise", obj=state)
    except SystemExit as exc:
        if state.own_process and builtin:
            exit_without_teardown(exc.code)
        raise


def exit_without_teardown(code: object) -> NoReturn:
    """End the script's process as ``sys.exit(code)`` would, less the object-by-object
    teardown of the interpreter.

    After the command, Python frees every module and object one by one (torch's
    operator tables, the vocabulary, the weights' wrappers): measured 0.13 s CPU and
    ~0.15 s wall between ``generate``'s last line and the shell prompt on the default
    model, work the OS does at once when the process ends. What an exit must still do
    is done first, in the interpreter's own order: wait for live non-daemon threads
    (when any remain, this falls back to the normal exit), run the ``atexit`` handlers
    (logging's flush among them), flush stdout and stderr. What is lost is what
    teardown alone does: flushing a file object nobody closed, ``__del__`` methods. So
    this is only for the ``draftwise`` script's own process (a caller passing ``argv``,
    a test, keeps its interpreter) and only after a built-in command (each closes what
    it writes); a plugin's command gets the ordinary exit.
    """
    import atexit
    import os
    import threading

    if threading.active_count() > 1:  # a thread still running: let Python join it
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed on stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a closed pipe: nothing left to save
            pass
    os._exit(status & 0xFF)


__all__ = [
    "COMMANDS", "EXIT_PLUGIN_ERROR", "STARTED", "CliState", "LazyGroup", "cli",
    "exit_without_teardown",
    "main", "make_cli",
]
