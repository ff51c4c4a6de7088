"""The request body, read within its limits and vetted before FastAPI parses it.

:class:`BodyGuard` is pure ASGI middleware, inside the auth gate (an unauthenticated
client never gets its body read). For every HTTP request it:

1. refuses a ``Content-Length`` over ``max_request_bytes`` with a 413 before reading a
   byte (a 100 MB body in an ignored field costs nothing), and stops a chunked body the
   moment it passes the limit;
2. gives the client ``body_timeout`` seconds for the whole body (a trickling client gets
   a 408 and the connection is closed);
3. vets a JSON route's body with :func:`vet_json`: UTF-8 only, no lone surrogates
   (``"a\\ud800b"``, CESU-8), at most :data:`MAX_JSON_DEPTH` levels, each refusal a 400
   naming the field;
4. replays the body to the app, then hands later ``receive`` calls (disconnects) through.

FastAPI then parses the same bytes again; vetting first means its parse can no longer
hit a RecursionError or produce text the tokenizer cannot encode.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Collection
from typing import Any

import numpy as np
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from draftwise.server.errors import APIError
from draftwise.server.limits import MAX_JSON_DEPTH, VET_IN_THREAD_BYTES, ServerLimits
from draftwise.text import describe_invalid, invalid_text_at, printable

#: a JSON ``\\uXXXX`` escape of a surrogate (pairs are fine, lone ones are not)
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")
_BOM = b"\xef\xbb\xbf"


class BodyGuard:
    """Size and time limits on every body; text and depth checks on JSON routes."""

    def __init__(self, app: ASGIApp, limits: ServerLimits, json_paths: Collection[str]) -> None:
        self.app = app
        self.limits = limits
        self.json_paths = frozenset(json_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            if body is None:
                return  # the client left while sending
            if body and scope["method"] == "POST" and scope["path"] in self.json_paths:
                if len(body) > VET_IN_THREAD_BYTES:  # keep other streams flowing meanwhile
                    await asyncio.to_thread(vet_json, body)
                else:
                    vet_json(body)
        except APIError as err:
            await err.response(close=err.status in (408, 413))(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body within the limits; None if the client disconnected."""
        limit = self.limits.max_request_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise _too_large(limit, f"Content-Length is {declared}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise APIError(
                    f"the request body did not arrive within {self.limits.body_timeout:g} "
                    "seconds (--body-timeout)", status=408, code="request_timeout") from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, "the body grew past it")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses a malformed one before the app runs
    return None


def _too_large(limit: int, why: str) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes ({why}); the limit is "
                    "set by --max-request-bytes", status=413, code="request_too_large")


def vet_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise a 400 :class:`APIError` unless ``raw`` is UTF-8 JSON of valid text, not too deep.

    Bytes that are not UTF-8 are decoded to lone surrogates (``surrogateescape``), the
    same thing a ``\\ud800`` escape or CESU-8 gives, so one check finds all three and
    names the field holding them. Depth is measured on the text before parsing (so the
    parser can never recurse too far) and only when the body has more brackets than
    ``max_depth``; the text walk runs only when a scan finds a surrogate at all.
    """
    text = raw.removeprefix(_BOM).decode("utf-8", "surrogateescape")
    if text.count("[") + text.count("{") > max_depth and _max_depth(text) > max_depth:
        _name_too_deep(text, max_depth)
    try:
        obj = json.loads(text)
    except RecursionError:  # pragma: no cover - _check_depth bounds the nesting first
        raise _too_deep(None, max_depth) from None
    except json.JSONDecodeError as exc:
        raise APIError(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except ValueError:  # Python's int-string limit
        raise APIError(f"the request body has a number of more than "
                       f"{sys.get_int_max_str_digits()} digits", code="invalid_json") from None
    escaped = "\\u" in text and _ESCAPED_SURROGATE.search(text) is not None
    if escaped or invalid_text_at(text) is not None:
        _walk_text(obj)


#: a JSON string (the unrolled form: fast, no per-character alternation)
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRINGS = re.compile(_STRING)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
#: what naming the deep field looks at: a key (string then colon), a string, a bracket
_DEPTH_TOKENS = re.compile(rf"({_STRING})\s*:|{_STRING}|[\[\]{{}}]")


def _max_depth(text: str) -> int:
    """The deepest nesting in ``text``, counted on its brackets outside strings (C speed)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text)).encode("ascii")
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _name_too_deep(text: str, max_depth: int) -> None:
    """Raise the too-deep 400, naming the top-level field the nesting is in.

    Walks tokens only up to the first bracket past ``max_depth`` (a 3000-deep body
    costs 65 matches), never parsing the nested part.
    """
    depth = 0
    field: str | None = None
    for match in _DEPTH_TOKENS.finditer(text):
        token = match.group(0)
        if match.group(1) is not None:
            if depth == 1:
                try:
                    field = json.loads(match.group(1))
                except ValueError:
                    field = None
        elif token in "[{":
            depth += 1
            if depth > max_depth:
                break
        elif token in "]}":
            depth -= 1
    raise _too_deep(field, max_depth)


def _walk_text(obj: Any) -> None:
    """Find the string (or key) holding a lone surrogate, depth-first, without recursion."""
    if not isinstance(obj, dict | list):
        if isinstance(obj, str):
            _check_string((), obj)
        return
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(obj, ())]
    while stack:
        value, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                index = invalid_text_at(key)
                if index is not None:
                    raise _invalid(path + (key,), key, index, "a key is ")
            kind = type(item)
            if kind is str:
                _check_string(path + (key,), item)
            elif kind is dict or kind is list:
                stack.append((item, path + (key,)))


def _check_string(path: tuple[str | int, ...], text: str) -> None:
    index = invalid_text_at(text)
    if index is not None:
        raise _invalid(path, text, index, "")


def _invalid(path: tuple[str | int, ...], text: str, index: int, what: str) -> APIError:
    """A 400 naming the field (or key) whose text is not valid Unicode."""
    param = param_of(path)
    message = f"{what}{describe_invalid(text, index)}"
    return APIError(f"{param}: {message}" if param else f"the request body is {message}",
                    param=param, code="invalid_text")


def _too_deep(field: str | None, max_depth: int) -> APIError:
    """A 400 naming the top-level field that nests too deep."""
    param = None if field is None else param_of((field,))
    if param is None:
        return APIError(f"the request body nests deeper than {max_depth} levels",
                        code="json_too_deep")
    return APIError(f"{param}: nests deeper than {max_depth} levels", param=param,
                    code="json_too_deep")


def param_of(path: tuple[str | int, ...]) -> str | None:
    """``("messages", 0, "content")`` -> ``"messages[0].content"`` (keys made printable)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = printable(part)
            out += f".{key}" if out else key
    return out or None
