"""Every hook a draftwise plugin may implement.

Hooks are for discovery at startup only; the per-step path calls
:class:`~draftwise.speculator.Proposer` methods directly. Plugins implement them with
``from draftwise import hookimpl``. The core calls each plugin's implementation on its
own, with keyword arguments, so every registration is attributed to its distribution.

Hooks grow by adding arguments (pluggy lets an implementation take fewer arguments than
the spec); they are never renamed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pluggy

if TYPE_CHECKING:
    import click

    from draftwise.speculator import Speculator

hookspec = pluggy.HookspecMarker("draftwise")

class RegisterSpeculator(Protocol):
    """The callback core hands to ``register_speculators``: ``register(speculator)``.

    A Protocol rather than a ``Callable`` alias so that ``help()`` shows this. Call it
    once per method with a frozen :class:`~draftwise.speculator.Speculator`. It only
    records the registration, tagged with your distribution: malformed values (a bad
    method name, options without ``extra="forbid"``, contradictory capabilities) and a
    method or alias another distribution also claims are refused by name when the
    registry is built, right after the hook returns.
    """

    def __call__(self, speculator: Speculator, /) -> None:
        """Register one method."""
        ...


@hookspec
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare the speculative-decoding methods this plugin provides.

    Called when the core first needs the speculator registry (the CLI at startup,
    ``LLMEngine`` at construction), and again, for every plugin, if a later config names
    a method or key that registry lacks and the installed entry points changed since. Call ``register(speculator)`` once
    per method, with a frozen :class:`~draftwise.speculator.Speculator` carrying its
    method name, aliases, options model, refusals, capabilities and proposer factory.
    Keep it cheap: build no weights or torch modules here.

    :param register: ``register(speculator: Speculator) -> None``. Raises
        :class:`~draftwise.plugins.DuplicateMethodError` later, at registry build
        time, if another distribution claims the same method or alias.
    :returns: nothing; return values are ignored.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``draftwise`` command line.

    Called by ``draftwise`` (the console script) after plugins are loaded and before the
    command line is parsed, so plugin commands show in ``draftwise --help``.

    :param cli: the root click group; use ``@cli.command()`` or ``cli.add_command(...)``.
    :returns: nothing.
    """


__all__ = ["RegisterSpeculator", "hookspec", "register_commands", "register_speculators"]
