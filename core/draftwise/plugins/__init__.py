"""draftwise's plugin system: hookspecs, entry-point discovery, the speculator registry.

The engine calls :func:`load_speculators` (cached) and then
``registry.build_proposer(config, ctx)``; plugins use ``from draftwise import hookimpl``.
"""

from __future__ import annotations

from draftwise.plugins.errors import (
    DuplicateMethodError,
    MethodNotInstalledError,
    PluginError,
    PluginImportError,
    PluginRegistrationError,
    PluginSelectionError,
    ProposerNotBuiltError,
)
from draftwise.plugins.manager import (
    ENV_VAR,
    GROUP,
    PluginHost,
    PluginSummary,
    get_plugin_host,
    load_entry_point_plugins,
    load_speculators,
    new_plugin_manager,
    register_commands,
    reset_plugin_cache,
    summarize,
)
from draftwise.plugins.registry import DistInfo, Registration, SpeculatorRegistry

__all__ = [
    "ENV_VAR",
    "GROUP",
    "DistInfo",
    "DuplicateMethodError",
    "MethodNotInstalledError",
    "PluginError",
    "PluginHost",
    "PluginImportError",
    "PluginRegistrationError",
    "PluginSelectionError",
    "PluginSummary",
    "ProposerNotBuiltError",
    "Registration",
    "SpeculatorRegistry",
    "get_plugin_host",
    "load_entry_point_plugins",
    "load_speculators",
    "new_plugin_manager",
    "register_commands",
    "reset_plugin_cache",
    "summarize",
]
