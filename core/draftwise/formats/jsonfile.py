"""The JSON and text files around a checkpoint, read with errors that name the file.

``config.json``, ``generation_config.json``, ``tokenizer_config.json``,
``chat_template.json``, the shard index: all go through :func:`read_json`, so each gets
the limits of :mod:`draftwise.jsontext` (UTF-8, depth, integer length, finite numbers,
duplicate keys, size). A latin-1 ``config.json`` or a 5,000-digit integer is then a
:class:`~draftwise.formats.errors.ModelFormatError`, not a traceback.
"""

from __future__ import annotations

from typing import Any

from draftwise import jsontext
from draftwise.formats.errors import ModelFormatError


def read_bytes(path: str, limit: int = jsontext.MAX_CHARS) -> bytes:
    """A file's bytes, refusing more than ``limit``; errors name the file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        raise ModelFormatError(path, "file not found") from None
    except OSError as exc:
        raise ModelFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise ModelFormatError(path, f"larger than the {limit:,}-byte limit for this file")
    return raw


def read_text(path: str) -> str:
    """A UTF-8 text file (a chat template), errors naming the file and the bad byte."""
    try:
        return jsontext.decode_text(read_bytes(path))
    except jsontext.JSONTextError as exc:
        raise ModelFormatError(path, str(exc)) from None


def read_json(path: str) -> dict[str, Any]:
    """A JSON object file, strictly parsed (:mod:`draftwise.jsontext`)."""
    try:
        data = jsontext.loads(read_bytes(path))
    except jsontext.JSONTextError as exc:
        raise ModelFormatError(path, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(path, f"expected a JSON object, got {jsontext.show(data)}")
    return data


__all__ = ["read_bytes", "read_json", "read_text"]
