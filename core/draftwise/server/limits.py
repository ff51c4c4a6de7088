"""Every limit the server puts on a client, with its default, in one place.

``draftwise serve`` exposes each field as a flag (docs/server.md lists them); the app's
body guard and the HTTP protocol read them from ``ServerConfig.limits``. The defaults
are sized for an OpenAI-style client on a real network: generous for honest requests,
short enough that idle or trickling sockets cannot pile up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: JSON nesting a request body may have (OpenAI bodies nest 4-6 deep; a tool's JSON
#: schema a few more). Deeper is a 400 ``json_too_deep`` naming where it went too deep.
MAX_JSON_DEPTH = 64
#: bodies above this many bytes are vetted off the event loop (parsing 4 MiB takes ~50 ms)
VET_IN_THREAD_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Size, time and connection limits; each has a ``draftwise serve`` flag."""

    #: largest request body, checked on Content-Length before reading and while reading
    #: (413); 4 MiB holds a full 128K-token prompt as JSON text or token ids
    max_request_bytes: int = 4 * 1024 * 1024
    #: seconds a client has to send a request's headers, from the connection opening or
    #: the previous response ending (slow-header clients are cut: 408 and close)
    header_timeout: float = 10.0
    #: seconds a fresh connection has to send its first byte; past it, closed silently
    #: (it asked nothing). An honest client writes its request as soon as it connects,
    #: while a socket opened and left silent only holds a slot: this frees it sooner than
    #: the header deadline (the smaller of the two applies)
    first_byte_timeout: float = 5.0
    #: seconds a client has to send the whole body once the headers are in (408)
    body_timeout: float = 30.0
    #: seconds an idle keep-alive connection stays open between requests
    keep_alive_timeout: float = 5.0
    #: open connections served at once. A connection opened at the cap first closes the
    #: longest-idle one (no request begun: fresh and silent, or kept alive between
    #: requests), as nginx reuses idle connections; only when every open connection is
    #: inside a request does the new one get a 503 ``too_many_connections`` and close
    max_connections: int = 256

    def __post_init__(self) -> None:
        for name in ("header_timeout", "first_byte_timeout", "body_timeout",
                     "keep_alive_timeout"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be at least 1024, got "
                             f"{self.max_request_bytes}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
