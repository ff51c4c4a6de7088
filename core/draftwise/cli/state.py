"""What the command line's commands share: the start time, the exit status for broken
plugins, and ``CliState`` (``ctx.obj``).

Its own module so that ``cli/__init__.py`` (the group and ``main``) and ``cli/common.py``
(the helpers every command uses) both read it without importing each other. It is
imported by ``cli/__init__.py`` before anything else of the command line, so
:data:`STARTED` is still the moment the CLI began.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftwise.models.prefault import Ahead
    from draftwise.plugins.errors import PluginError
    from draftwise.plugins.manager import PluginHost
    from draftwise.plugins.registry import SpeculatorRegistry

#: a prefault as started: the options it was started for, and its arena (None: none)
Prefault = tuple["str | None", str, "Ahead | None"]

#: exit status when the installed plugins themselves are broken (refusals exit 2)
EXIT_PLUGIN_ERROR = 1
#: time.monotonic() when the CLI started (the first module the ``draftwise`` script loads),
#: so a command can report what a user waits for: start-up plus the first token
STARTED = time.monotonic()


@dataclass
class CliState:
    """What commands share through ``ctx.obj``: the plugin host (a test injects its own)."""

    host: PluginHost | None = None
    #: set by :func:`main`: the process is the ``draftwise`` script's (``startup_gc`` freezes)
    own_process: bool = False
    #: set by :func:`main`: the collector is paused until the command's engine is built
    #: (``cli.common.startup_gc`` resumes it)
    gc_paused: bool = False
    #: what loading the plugins raised at startup (commands needing the registry refuse)
    startup_error: PluginError | None = None
    #: set by :func:`main` for generate and serve: the weights' arena faulting in since
    #: before the plugins' imports (``cli.common.prefault_from_argv``, claimed by the
    #: command with ``claim_prefault``)
    prefault: Prefault | None = None
    _registry: SpeculatorRegistry | None = field(default=None, init=False, repr=False)

    def plugin_host(self) -> PluginHost:
        """The injected host, or the process's plugins."""
        if self.host is None and self.startup_error is not None:
            raise self.startup_error
        if self.host is None:
            from draftwise.plugins.manager import get_plugin_host

            self.host = get_plugin_host()
        return self.host

    def registry(self) -> SpeculatorRegistry:
        """The speculators of :meth:`plugin_host`, built once."""
        if self.startup_error is not None:
            raise self.startup_error
        if self._registry is None:
            from draftwise.plugins.manager import load_speculators

            self._registry = load_speculators(self.plugin_host())
        return self._registry



__all__ = ["EXIT_PLUGIN_ERROR", "STARTED", "CliState", "Prefault"]
