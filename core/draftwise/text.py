"""Which text the engine takes: valid Unicode only, decided here for every surface.

A Python ``str`` can hold lone surrogates (U+D800..U+DFFF) that no UTF-8 encoder
accepts: ``json.loads('"a\\ud800b"')`` makes one, and Python decodes a non-UTF-8 command
line argument into them (``surrogateescape``: byte 0xE9 becomes U+DCE9). A tokenizer
cannot encode such text and a response containing it cannot be sent, so the engine, the
server and the CLI all refuse it with the field's name, through :func:`invalid_text_at`
and :func:`check_text`. Refusing (rather than replacing with U+FFFD) keeps what the model
reads equal to what the client sent; docs/server.md states the choice.
"""

from __future__ import annotations

import re

from draftwise.errors import RequestError

_SURROGATE = re.compile("[\ud800-\udfff]")


def invalid_text_at(text: str) -> int | None:
    """Index of the first lone surrogate in ``text``, or None.

    ASCII text is answered at once (``isascii`` reads a flag); other text costs one
    C-speed scan.
    """
    if text.isascii():
        return None
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def describe_invalid(text: str, index: int) -> str:
    """What is wrong at ``index``, for messages: the code point or the byte it came from."""
    code = ord(text[index])
    escaped = 0xDC80 <= code <= 0xDCFF  # how Python decodes a byte that is not UTF-8
    origin = f" (from the undecodable byte 0x{code - 0xDC00:02X})" if escaped else ""
    return (f"not valid Unicode text: a lone surrogate U+{code:04X} at character {index}"
            f"{origin}; send UTF-8")


def check_text(field: str, text: str) -> None:
    """Raise :class:`RequestError` naming ``field`` if ``text`` is not valid Unicode."""
    index = invalid_text_at(text)
    if index is not None:
        raise RequestError(field, describe_invalid(text, index))


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udcXX`` (safe to put in a message)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
