"""uvicorn's h11 protocol with the two connection limits an ASGI app cannot enforce.

An app only sees a request once its headers are complete, so a client that connects and
trickles header bytes (slowloris), or never sends any, holds a socket and a descriptor
for as long as it likes under plain uvicorn (its keep-alive timer runs only between
requests, and any byte resets it). :class:`GuardedH11Protocol` adds:

- a header deadline: a request's headers must be complete ``header_timeout`` seconds
  after the connection opened or the previous response ended; past it the client gets
  a 408 (if it sent anything) and the connection is closed;
- a first-byte deadline: a fresh connection that has sent nothing ``first_byte_timeout``
  seconds after opening is closed (it asked nothing, so nothing is answered);
- a connection cap that reclaims idle slots: a connection opened while
  ``max_connections`` are already open closes the longest-idle open connection (one
  with no request begun: fresh and silent, or kept alive between requests), as nginx
  drains its reusable connections when it runs out. Only when every open connection is
  inside a request is the new one answered with an OpenAI-shaped 503
  ``too_many_connections`` on its first request, then closed (uvicorn's own
  ``limit_concurrency`` answers plain text and counts the new connection against
  itself).

Why reclaim rather than only refuse: 256 sockets opened and left silent held every slot
until the header deadline, and a client reopening them every 10 s kept an honest client
out for good. A cap per client address would not help where it matters (behind a proxy
or on loopback every client has one address) and would refuse honest local clients.
Reclaiming idle slots makes silent sockets cost the server nothing an honest client
needs: a silent socket is closed the moment a client with a request needs its slot, and
the newest connection (the one about to send) is the last to go. A client that trickles
header bytes is inside a request and keeps its slot until the header deadline.

The body's size and time limits live in the app (``draftwise.server.body``), where a
refusal can be an OpenAI-shaped error. Built on uvicorn's ``H11Protocol`` (its
``conn``, ``transport``, ``connections``, ``app`` and ``on_response_complete``).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Collection
from typing import Any

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from draftwise.server.errors import APIError
from draftwise.server.limits import ServerLimits


class GuardedH11Protocol(H11Protocol):
    """H11Protocol plus a header deadline, a first-byte deadline and a connection cap
    that reclaims idle slots (see the module doc)."""

    def __init__(self, *args: Any, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._header_timer: asyncio.TimerHandle | None = None
        self._first_byte_timer: asyncio.TimerHandle | None = None
        #: when this connection last became idle (loop time), None while in a request
        self.idle_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection; at the cap reclaim an idle slot, else the 503 app."""
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        if _open_count(self.connections) > self.limits.max_connections:
            victim = _longest_idle(self.connections, exclude=self)
            if victim is not None:
                victim.transport.close()
            else:
                self.app = functools.partial(_over_capacity, self.limits.max_connections)
        self._arm_header_timer()
        if self.limits.first_byte_timeout < self.limits.header_timeout:
            self._first_byte_timer = self.loop.call_later(self.limits.first_byte_timeout,
                                                          self._first_byte_deadline)

    def data_received(self, data: bytes) -> None:
        """Feed h11; once a request's headers are parsed its deadline is off."""
        self.idle_since = None
        self._cancel_first_byte_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        """The next request's headers are due ``header_timeout`` after this response."""
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
            if self.is_idle():
                self.idle_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the timers with the connection."""
        self._cancel_header_timer()
        self._cancel_first_byte_timer()
        super().connection_lost(exc)

    def is_idle(self) -> bool:
        """No request begun and none in flight: closing it loses nobody's request."""
        return (
            not self.transport.is_closing()
            and (self.cycle is None or self.cycle.response_complete)
            and self.conn.their_state is h11.IDLE
            and not self.conn.trailing_data[0]
        )

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout,
                                                  self._header_deadline)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_first_byte_timer(self) -> None:
        if self._first_byte_timer is not None:
            self._first_byte_timer.cancel()
            self._first_byte_timer = None

    def _first_byte_deadline(self) -> None:
        """Nothing sent since the connection opened: close it, answering nothing."""
        self._first_byte_timer = None
        if self.is_idle():
            self.transport.close()

    def _header_deadline(self) -> None:
        """Headers still incomplete: a 408 to a client that started one, then close."""
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        started, _ = self.conn.trailing_data
        if started:
            self.transport.write(_header_timeout_response(self.limits.header_timeout))
        self.transport.close()


def _open_count(connections: Collection[Any]) -> int:
    """Connections not already closing (a closed one leaves the set a loop turn later)."""
    return sum(1 for c in connections if not c.transport.is_closing())


def _longest_idle(connections: Collection[Any], exclude: Any) -> GuardedH11Protocol | None:
    """The open connection idle longest (the newest, about to send, goes last), or None."""
    idle = [c for c in connections if c is not exclude and isinstance(c, GuardedH11Protocol)
            and c.idle_since is not None and c.is_idle()]
    return min(idle, key=lambda c: c.idle_since or 0.0, default=None)


def _header_timeout_response(seconds: float) -> bytes:
    """A whole 408 response, written raw: h11 has no request yet to answer."""
    err = APIError(f"the request headers did not arrive within {seconds:g} seconds "
                   "(--header-timeout)", status=408, code="request_timeout")
    body = json.dumps(err.body()).encode()
    head = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


async def _over_capacity(cap: int, scope: Scope, receive: Receive, send: Send) -> None:
    """The app a connection over the cap gets: 503 and close, for any request."""
    err = APIError(f"the server has its maximum of {cap} open connections "
                   "(--max-connections); retry shortly", status=503,
                   code="too_many_connections")
    await err.response(close=True)(scope, receive, send)


def protocol_factory(limits: ServerLimits) -> Callable[..., GuardedH11Protocol]:
    """What ``uvicorn.Config(http=...)`` takes: the protocol with these limits bound."""
    return functools.partial(GuardedH11Protocol, limits=limits)
