"""One HTTP request through an ASGI app in-process, its response streamed back in parts.

A replica runs the single-process server's FastAPI app unchanged (routes, auth, limits,
error shapes, SSE); the ingress hands it the request as a plain dict and relays what
comes back. The parts are a head (``{"status", "headers"}``) and then body chunks, so a
stream's events reach the client as the engine makes them. When the caller stops
reading (the client left, Ray cancelled the call) the app sees ``http.disconnect``, as
it would from uvicorn, and aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message

#: what the ingress sends: method, path, query (bytes), headers [(name, value)], body
HTTPRequest = dict[str, Any]


async def call(app: ASGIApp, request: HTTPRequest) -> AsyncIterator[dict[str, Any] | bytes]:
    """Yield the response head, then each body chunk; the app runs as a task."""
    out: asyncio.Queue[Message | None] = asyncio.Queue()
    body_sent = False
    gone = asyncio.Event()

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.get("body", b""),
                    "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await out.put(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": request["method"], "scheme": "http", "path": request["path"],
        "raw_path": request["path"].encode(), "root_path": "",
        "query_string": request.get("query", b""),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in request.get("headers", [])],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
    }

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await out.put(None)

    task = asyncio.create_task(run())
    try:
        while True:
            message = await out.get()
            if message is None:
                break
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [(k.decode("latin-1"), v.decode("latin-1"))
                                   for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        await task
    finally:
        gone.set()  # the app reads http.disconnect: an unfinished request is aborted
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
