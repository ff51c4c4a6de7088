"""Every JSON text the engine reads, parsed strictly and within limits.

The speculative config, ``config.json`` and its siblings, and safetensors headers all
come from outside: a shell, a download, a hostile client. ``json.loads`` alone lets
through what later fails far from its cause, or as a traceback:

- bytes that are not UTF-8 (a latin-1 ``config.json``), and ``str`` holding lone
  surrogates (``sys.argv`` decodes undecodable bytes to ``\\udcXX``): refused here, naming
  the byte and its offset;
- integers longer than :data:`MAX_INT_DIGITS` (Python refuses to convert past 4,300
  digits with a bare ``ValueError``; far fewer digits already overflow every field);
- ``NaN``/``Infinity`` (not JSON) and numbers such as ``1e999`` that become infinite;
- duplicate keys, which ``json.loads`` silently resolves to the last one;
- nesting deeper than :data:`MAX_DEPTH`: checked on the text before parsing, so neither
  the parser nor any later recursive walk (pydantic, ``json.dumps`` in an error message,
  ``repr``) can hit Python's recursion limit;
- text longer than the caller's ``max_chars``.

Each refusal is a :class:`JSONTextError` carrying a short ``reason`` and, where there is
one, the position; callers wrap it in their own named error (a
:class:`~draftwise.config.errors.InvalidJSONError`, a
:class:`~draftwise.formats.errors.ModelFormatError`) so the message names what was read.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any, NoReturn

from draftwise.errors import DraftwiseError

#: deepest nesting of arrays/objects accepted; real configs stay under 6 levels
MAX_DEPTH = 64
#: longest integer literal accepted (a 64-bit value has at most 20 digits)
MAX_INT_DIGITS = 100
#: default cap on the text's length, in characters (bytes before decoding)
MAX_CHARS = 64 * 1024 * 1024

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]|[\]}]', re.DOTALL)
_LONG_INT = re.compile(rf"-?\d{{{MAX_INT_DIGITS + 1},}}")


class JSONTextError(DraftwiseError, ValueError):
    """JSON text refused; ``reason`` says why, ``lineno``/``colno``/``pos`` where (if known).

    ``kind`` is one of ``syntax``, ``encoding``, ``size``, ``depth``, ``integer``,
    ``number``, ``constant``, ``duplicate`` (``key`` is then the repeated key), so callers
    can word their own message without matching text.
    """

    def __init__(
        self,
        kind: str,
        reason: str,
        *,
        text: str | None = None,
        pos: int | None = None,
        key: str | None = None,
        decode_error: json.JSONDecodeError | None = None,
    ) -> None:
        self.kind = kind
        self.reason = reason
        self.key = key
        self.pos = pos
        self.lineno: int | None = None
        self.colno: int | None = None
        self.decode_error = decode_error
        if text is not None and pos is not None:
            self.lineno = text.count("\n", 0, pos) + 1
            self.colno = pos - (text.rfind("\n", 0, pos) + 1) + 1
        super().__init__(f"{reason}{self.where}")

    @property
    def where(self) -> str:
        """`` at line L, column C (char P)`` or ``""``."""
        if self.lineno is None:
            return ""
        return f" at line {self.lineno}, column {self.colno} (char {self.pos})"


def decode_text(data: bytes | str) -> str:
    """UTF-8 text from bytes, or a ``str`` checked to be encodable (no lone surrogates)."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = data[exc.start]
            byte = f" (byte 0x{ord(bad) - 0xDC00:02x} as decoded from the command line)" if (
                0xDC80 <= ord(bad) <= 0xDCFF
            ) else ""
            raise JSONTextError(
                "encoding",
                f"not valid Unicode text: a lone surrogate U+{ord(bad):04X}{byte} at "
                f"character {exc.start}; the text must be UTF-8"
            ) from None
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONTextError(
            "encoding",
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"({exc.reason}); save it as UTF-8"
        ) from None


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than ``max_depth``, without recursion (strings are skipped)."""
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                raise JSONTextError(
                    "depth", f"nested deeper than {max_depth} levels", text=text, pos=match.start()
                )
        elif token in "]}":
            depth -= 1


def _refuse_constant(name: str) -> NoReturn:
    raise JSONTextError("constant", f"{name} is not a JSON value; use a finite number")


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONTextError(
            "integer",
            f"an integer of {len(literal.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})"
        )
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JSONTextError("number", f"the number {literal[:40]} is too large for a float")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONTextError(
                "duplicate",
                f"key {json.dumps(key)[:80]} is given twice (parsers keep only one silently)",
                key=key,
            )
        out[key] = value
    return out


def loads(data: bytes | str, *, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text strictly (see the module docstring); raises :class:`JSONTextError`."""
    if len(data) > max_chars:
        unit = "bytes" if isinstance(data, bytes) else "characters"
        raise JSONTextError("size", f"{len(data):,} {unit} long, over the limit of {max_chars:,}")
    text = decode_text(data)
    check_depth(text, max_depth)
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except JSONTextError as exc:
        if exc.pos is None and exc.kind == "integer":
            long_int = _LONG_INT.search(text)
            if long_int is not None:
                raise JSONTextError(
                    exc.kind, exc.reason, text=text, pos=long_int.start()
                ) from None
        raise
    except json.JSONDecodeError as exc:
        raise JSONTextError("syntax", exc.msg, text=text, pos=exc.pos, decode_error=exc) from None
    except RecursionError:  # pragma: no cover - check_depth keeps far below the limit
        raise JSONTextError("depth", f"nested deeper than {max_depth} levels") from None


def depth_of(value: Any, max_depth: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed value (dicts, lists, tuples), iteratively, capped.

    For objects that arrive already parsed (``EngineArgs(speculative_config={...})``):
    the same :data:`MAX_DEPTH` the text path enforces. Stops counting past ``max_depth``.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


class _BoundedRepr(reprlib.Repr):
    """``repr`` that stays short and never raises: deep values are cut, huge ints summarised."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 3000:  # str() refuses past 4,300 digits
            return f"<an integer of about {int(x.bit_length() * math.log10(2)) + 1:,} digits>"
        return super().repr_int(x, level)


_REPR = _BoundedRepr()
_REPR.maxlevel = 4
_REPR.maxstring = _REPR.maxother = 80


def show(value: Any, limit: int = 80) -> str:
    """Quote a user's value as they wrote it: JSON where possible, else a bounded ``repr``.

    Never raises: a value too deep for ``json.dumps`` or an integer too long for ``str``
    (both reachable from the Python API, where no JSON text was parsed) is shown cut short.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "JSONTextError",
    "check_depth",
    "decode_text",
    "depth_of",
    "loads",
    "show",
]
