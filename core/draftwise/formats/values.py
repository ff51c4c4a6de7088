"""Typed reads from a model's config: ``config.json`` (and its siblings) or GGUF metadata.

``int(d["hidden_size"])`` turns ``"sixty-four"`` into a ``ValueError`` traceback, ``"64"``
into 64, ``true`` into 1 and ``64.9`` into 64; ``bool("false")`` is ``True``; ``archs[0]``
of a nested list is a list. Every read here checks the JSON (or GGUF) type and the range
and raises :class:`~draftwise.formats.errors.ConfigError` naming the file, the key (dotted
for nested objects: ``rope_scaling.factor``) and what was expected, quoting the value.

Integers are bounded by :data:`MAX_INT` by default: every size the kernels index with is
an int32, and a checked bound here keeps absurd values from reaching an allocation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from draftwise.formats.errors import ConfigError
from draftwise.jsontext import show

#: the largest size or count accepted (int32, what the kernels index with)
MAX_INT = 2**31 - 1


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class ConfigValues:
    """Checked, typed access to one config mapping; ``prefix`` names nested objects."""

    def __init__(self, data: Mapping[str, Any], path: str, prefix: str = "") -> None:
        self.data = data
        self.path = path
        self.prefix = prefix

    def name(self, key: str) -> str:
        """The key as the user would find it (``text_config.hidden_size``)."""
        return f"{self.prefix}{key}"

    def __contains__(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def error(self, key: str, expected: str) -> ConfigError:
        """A refusal quoting the stored value of ``key``."""
        return ConfigError(
            self.path,
            f"{self.name(key)!r} is {show(self.data.get(key))}, expected {expected}",
            key=self.name(key),
        )

    def _present(self, key: str, default: Any) -> bool:
        """Whether ``key`` has a value; absent/null is an error only when required."""
        if self.data.get(key) is not None:
            return True
        if default is REQUIRED:
            raise ConfigError(self.path, f"config has no {self.name(key)!r}", key=self.name(key))
        return False

    def integer(
        self, key: str, default: Any = REQUIRED, *, minimum: int = 1, maximum: int = MAX_INT
    ) -> Any:
        """An integer in ``[minimum, maximum]`` (``null``/absent: ``default``)."""
        if not self._present(key, default):
            return default
        value = self.data[key]
        if not _is_int(value) or not minimum <= value <= maximum:
            raise self.error(key, f"an integer from {minimum:,} to {maximum:,}")
        return int(value)

    def number(self, key: str, default: Any = REQUIRED, *, positive: bool = True) -> Any:
        """A finite number (``> 0`` unless ``positive=False``)."""
        if not self._present(key, default):
            return default
        value = self.data[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or (positive and value <= 0):
            raise self.error(key, "a positive finite number" if positive else "a finite number")
        return float(value)

    def flag(self, key: str, default: Any = REQUIRED) -> Any:
        """``true`` or ``false`` (not ``"false"``, not 0)."""
        if not self._present(key, default):
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise self.error(key, "true or false")
        return value

    def text(self, key: str, default: Any = REQUIRED) -> Any:
        """A string."""
        if not self._present(key, default):
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise self.error(key, "a string")
        return value

    def texts(self, key: str, default: Any = REQUIRED) -> Any:
        """A list of strings."""
        if not self._present(key, default):
            return default
        value = self.data[key]
        # exact str items checked in C first (a vocabulary is 150k strings, on the
        # start-up path); subclasses of str by the loop
        ok = isinstance(value, list) and (
            set(map(type, value)) <= {str} or all(isinstance(v, str) for v in value))
        if not ok:
            raise self.error(key, "a list of strings")
        return value

    def ids(self, key: str, *, below: int | None = None) -> tuple[int, ...]:
        """Token ids: one integer or a list of them (absent/null: none), each ``< below``."""
        if not self._present(key, None):
            return ()
        value = self.data[key]
        items = value if isinstance(value, list) else [value]
        limit = MAX_INT if below is None else below - 1
        if not all(_is_int(v) and 0 <= v <= limit for v in items):
            what = "a token id or a list of them" if isinstance(value, list) else "a token id"
            raise self.error(key, f"{what} from 0 to {limit:,}")
        return tuple(int(v) for v in items)

    def optional_id(self, key: str, *, below: int | None = None) -> int | None:
        """One token id ``< below``, or None when absent/null."""
        if not self._present(key, None):
            return None
        value = self.data[key]
        limit = MAX_INT if below is None else below - 1
        if not _is_int(value) or not 0 <= value <= limit:
            raise self.error(key, f"a token id from 0 to {limit:,}")
        return int(value)

    def mapping(self, key: str) -> ConfigValues | None:
        """A nested object (absent/null: None)."""
        if not self._present(key, None):
            return None
        value = self.data[key]
        if not isinstance(value, Mapping):
            raise self.error(key, "an object")
        return ConfigValues(value, self.path, f"{self.name(key)}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["MAX_INT", "REQUIRED", "ConfigValues"]
