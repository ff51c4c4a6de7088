"""Reading the speculative config's JSON text, with errors a shell user can act on.

``json.loads`` alone says "Expecting ',' delimiter: line 1 column 19 (char 18)". Here
the message also shows the offending snippet with a caret, refuses duplicate keys
(which ``json.loads`` silently resolves to the last one) and ``NaN``/``Infinity``
(not JSON), and reminds that on a command line the JSON goes inside single quotes.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from draftwise.config.errors import InvalidJSONError

QUOTING_HINT = (
    "JSON needs double quotes around keys and strings; on a shell command line put the "
    "whole object in single quotes, e.g. "
    "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'"
)
_WINDOW = 30


def snippet(text: str, lineno: int, colno: int) -> str:
    """The offending line (windowed around the column) with a caret under the column."""
    lines = text.splitlines() or [""]
    line = lines[min(lineno, len(lines)) - 1]
    col = max(colno - 1, 0)
    start = max(col - _WINDOW, 0)
    end = min(col + _WINDOW, len(line))
    prefix = "…" if start > 0 else ""
    suffix = "…" if end < len(line) else ""
    shown = prefix + line[start:end] + suffix
    caret = " " * (len(prefix) + col - start) + "^"
    return f"    {shown}\n    {caret}"


def _refuse_constant(name: str) -> NoReturn:
    raise InvalidJSONError(
        f"the speculative config is not valid JSON: {name} is not a JSON value. "
        "Use a finite number.",
        value=name, reason=f"{name} is not JSON",
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidJSONError(
                f"the speculative config gives key '{key}' twice; JSON parsers keep only "
                "one of them silently, so draftwise refuses it. Keep one.",
                key=key, value=value, reason="duplicate key",
            )
        out[key] = value
    return out


def load_json(text: str | bytes) -> Any:
    """Parse JSON text strictly; :class:`InvalidJSONError` with position and snippet."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidJSONError(
                f"the speculative config is not UTF-8 text: {exc}", reason="not UTF-8"
            ) from exc
    if not text.strip():
        raise InvalidJSONError(
            f"the speculative config is empty. {QUOTING_HINT}", value=text, reason="empty"
        )
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant
        )
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno} (char {exc.pos})"
        hint = QUOTING_HINT
        if "'" in text:
            hint = "JSON strings use double quotes, not single ones. " + QUOTING_HINT
        elif exc.msg.startswith("Expecting property name") or exc.msg == "Expecting value":
            hint = (
                "The double quotes seem lost: a shell strips them unless the whole object is "
                "inside single quotes. " + QUOTING_HINT
            )
        raise InvalidJSONError(
            f"the speculative config is not valid JSON: {exc.msg} at {where}:\n"
            f"{snippet(text, exc.lineno, exc.colno)}\n{hint}",
            value=text, reason=exc.msg,
        ) from exc
    except RecursionError as exc:
        raise InvalidJSONError(
            "the speculative config is nested too deeply to read", reason="too deep"
        ) from exc


__all__ = ["QUOTING_HINT", "load_json", "snippet"]
