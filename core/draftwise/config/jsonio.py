"""Reading the speculative config's JSON text, with errors a shell user can act on.

``json.loads`` alone says "Expecting ',' delimiter: line 1 column 19 (char 18)". Here
the message also shows the offending snippet with a caret, refuses duplicate keys
(which ``json.loads`` silently resolves to the last one) and ``NaN``/``Infinity``
(not JSON), and reminds that on a command line the JSON goes inside single quotes.
Size, depth, integer-length and encoding limits are :mod:`draftwise.jsontext`'s, the
same for every JSON text the engine reads.
"""

from __future__ import annotations

from typing import Any

from draftwise import jsontext
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


#: longest speculative config text accepted (a real one is well under 1 KiB)
MAX_CONFIG_CHARS = 1024 * 1024


def load_json(text: str | bytes) -> Any:
    """Parse JSON text strictly; :class:`InvalidJSONError` with position and snippet.

    The limits of :mod:`draftwise.jsontext` apply (UTF-8, depth, integer length, finite
    numbers, no duplicate keys), plus :data:`MAX_CONFIG_CHARS`.
    """
    try:
        return jsontext.loads(text, max_chars=MAX_CONFIG_CHARS)
    except jsontext.JSONTextError as exc:
        raise _refusal(exc, text) from exc


def _refusal(exc: jsontext.JSONTextError, raw: str | bytes) -> InvalidJSONError:
    """The user-facing wording of one :class:`~draftwise.jsontext.JSONTextError`."""
    text = raw if isinstance(raw, str) else ""
    if exc.kind == "duplicate":
        return InvalidJSONError(
            f"the speculative config gives key '{exc.key}' twice; JSON parsers keep only "
            "one of them silently, so draftwise refuses it. Keep one.",
            key=exc.key, reason="duplicate key",
        )
    if exc.kind == "constant":
        name = exc.reason.split(" ", 1)[0]
        return InvalidJSONError(
            f"the speculative config is not valid JSON: {name} is not a JSON value. "
            "Use a finite number.",
            value=name, reason=f"{name} is not JSON",
        )
    if exc.kind == "encoding":
        return InvalidJSONError(
            f"the speculative config is {exc.reason}", reason="not UTF-8"
        )
    if exc.kind == "syntax" and exc.decode_error is not None:
        err = exc.decode_error
        if not err.doc.strip():
            return InvalidJSONError(
                f"the speculative config is empty. {QUOTING_HINT}", value=text, reason="empty"
            )
        where = f"line {err.lineno}, column {err.colno} (char {err.pos})"
        hint = QUOTING_HINT
        if "'" in err.doc:
            hint = "JSON strings use double quotes, not single ones. " + QUOTING_HINT
        elif err.msg.startswith("Expecting property name") or err.msg == "Expecting value":
            hint = (
                "The double quotes seem lost: a shell strips them unless the whole object is "
                "inside single quotes. " + QUOTING_HINT
            )
        return InvalidJSONError(
            f"the speculative config is not valid JSON: {err.msg} at {where}:\n"
            f"{snippet(err.doc, err.lineno, err.colno)}\n{hint}",
            value=text, reason=err.msg,
        )
    # size, depth, integer, number: no snippet (the text may be megabytes on one line)
    return InvalidJSONError(
        f"the speculative config is refused: {exc}", reason=exc.reason
    )


__all__ = ["MAX_CONFIG_CHARS", "QUOTING_HINT", "load_json", "snippet"]
