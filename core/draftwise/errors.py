"""Errors the engine raises for bad requests and unusable settings."""

from __future__ import annotations


class DraftwiseError(Exception):
    """Base of every error the engine raises on purpose."""


class RequestError(DraftwiseError, ValueError):
    """A request the engine cannot take; names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class EngineConfigError(DraftwiseError, ValueError):
    """An engine setting that cannot be honoured (refused at startup, before weights)."""


class EngineBusyError(DraftwiseError, RuntimeError):
    """``step()`` called while another thread is inside it: an engine has one driver, and a
    second one would interleave two steps' scheduling and commits (refused, not serialized,
    because two drivers also race on adding requests and reading outputs)."""
