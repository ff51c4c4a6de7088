"""One typed hierarchy for every refusal of a speculative config.

Every error is a ``ValueError`` (a config is a value) and a
:class:`~draftwise.errors.DraftwiseError`, and carries the offending
``key`` (a dotted path such as ``draftwise.drafter_chain[1].model``), the user's
``value`` quoted back, the ``reason`` and what would work ``instead``. Subclasses say
*which kind* of refusal it is, so callers (the CLI, the server, tests) can branch on
the class rather than on message text.
"""

from __future__ import annotations

import copy
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.jsontext import show


class _Unset:
    """Marker for "no value involved" (the error is about a missing key, say)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class ConfigError(DraftwiseError, ValueError):
    """A speculative config was refused; ``str(err)`` is the full user-facing message."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        value: Any = UNSET,
        reason: str = "",
        instead: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.value = value
        self.reason = reason
        self.instead = instead

    def __str__(self) -> str:
        return self.message

    def within(self, prefix: str) -> ConfigError:
        """The same error, re-addressed inside ``prefix`` (a drafter_chain member, say)."""
        new = copy.copy(self)
        new.key = f"{prefix}.{self.key}" if self.key else prefix
        new.message = f"{prefix}: {self.message}"
        new.args = (new.message,)
        return new


class InvalidJSONError(ConfigError):
    """The text is not JSON, or not a JSON object."""


class UnknownKeyError(ConfigError):
    """A key that neither vLLM's SpeculativeConfig nor any installed method declares."""


class UnimplementedFieldError(ConfigError):
    """A real vLLM SpeculativeConfig field this engine does not implement."""


class InternalFieldError(UnimplementedFieldError):
    """A vLLM field its engine injects itself (``target_model_config`` ...): not a user setting."""


class NotForMethodError(ConfigError):
    """A key that belongs to another method's options (``prompt_lookup_min`` with ``mtp``)."""


class RefusedValueError(ConfigError):
    """A known key whose value this engine (or the chosen method) refuses, with the reason."""


class InvalidValueError(ConfigError):
    """A value of the wrong type or out of range (translated from pydantic)."""


class MissingKeyError(ConfigError):
    """A key the chosen method needs (``num_speculative_tokens``, ``model``) is absent."""


class UnknownMethodError(ConfigError):
    """A method no installed plugin provides; says which distribution would."""


__all__ = [
    "UNSET",
    "ConfigError",
    "InternalFieldError",
    "InvalidJSONError",
    "InvalidValueError",
    "MissingKeyError",
    "NotForMethodError",
    "RefusedValueError",
    "UnimplementedFieldError",
    "UnknownKeyError",
    "UnknownMethodError",
    "show",
]
