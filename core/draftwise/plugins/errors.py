"""Errors of plugin discovery and registration: startup errors, never silent skips."""

from __future__ import annotations

from draftwise.errors import DraftwiseError


class PluginError(DraftwiseError, RuntimeError):
    """Something is wrong with the installed plugins (not with the user's config)."""


class PluginImportError(PluginError):
    """A plugin's entry point failed to import; names the distribution and entry point."""


class PluginRegistrationError(PluginError):
    """A plugin registered something malformed, or its hookimpls match no hookspec."""


class DuplicateMethodError(PluginRegistrationError):
    """Two registrations claim one method or alias; names both distributions."""


class PluginSelectionError(PluginError):
    """``DRAFTWISE_PLUGINS`` names a plugin that no installed distribution provides."""


class MethodNotInstalledError(PluginError, KeyError):
    """A method no installed plugin registers (configs refuse these earlier, with hints)."""

    def __init__(self, method: str, installed: tuple[str, ...] = ()) -> None:
        shown = ", ".join(installed) or "none"
        super().__init__(f"no installed plugin provides method '{method}'; installed: {shown}")
        self.method = method
        self.installed = installed

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type, tuple[str, tuple[str, ...]]]:
        return (type(self), (self.method, self.installed))


class ProposerNotBuiltError(PluginError, NotImplementedError):
    """The method is declared (its config checks run) but it ships no proposer yet."""

    def __init__(self, method: str, provider: str | None = None) -> None:
        where = f" (declared by {provider})" if provider else ""
        super().__init__(
            f"method {method} is registered but its proposer is not built yet{where}"
        )
        self.method = method
        self.provider = provider

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return (type(self), (self.method, self.provider))


__all__ = [
    "DuplicateMethodError",
    "MethodNotInstalledError",
    "PluginError",
    "PluginImportError",
    "PluginRegistrationError",
    "PluginSelectionError",
    "ProposerNotBuiltError",
]
