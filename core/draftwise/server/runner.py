"""Running an app under uvicorn: graceful SIGTERM/SIGINT for the CLI, a thread for tests.

Shutdown on SIGTERM or SIGINT is a drain the server runs itself, still listening:

1. the engine loop stops admitting: a new request (on a new or a kept-alive connection)
   gets the documented 503 ``shutting_down`` body, never a refused socket;
2. in-flight requests get up to ``shutdown_timeout`` seconds to finish;
3. if any are left then, the engine loop ends them all (``EngineLoop.expire``): each
   stream gets an ``{"error": ...}`` event and ``data: [DONE]``, a non-streamed request
   its 503, and their KV blocks are freed; they get :data:`FLUSH_GRACE_S` seconds to be
   sent, then any connection still open (a client not reading) is dropped;
4. uvicorn closes the socket and the lifespan stops the engine loop.

Nothing is cancelled from outside the app, so no CancelledError reaches the log. The
process then exits 0: uvicorn's habit of re-raising the signal afterwards (exit 143 /
KeyboardInterrupt) is dropped because the shutdown it asked for has completed. A second
SIGINT forces the exit.

The uvicorn settings come from the app's ``ServerConfig.limits`` (keep-alive, header
deadline and connection cap through :mod:`draftwise.server.connection`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from types import FrameType
from typing import Any

import uvicorn

from draftwise.server.connection import protocol_factory
from draftwise.server.limits import ServerLimits

logger = logging.getLogger("draftwise.server")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: seconds ended streams get to send their error event and [DONE] after the timeout
FLUSH_GRACE_S = 2.0


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that drains while still listening (see the module doc)."""

    def __init__(self, config: uvicorn.Config, engine_loop: Any = None,
                 shutdown_timeout: float | None = 30.0) -> None:
        super().__init__(config)
        self.engine_loop = engine_loop
        self.shutdown_timeout = shutdown_timeout
        self._drain_deadline: float | None = None
        self._flush_deadline: float | None = None

    @property
    def draining(self) -> bool:
        """Whether a shutdown began."""
        return self._drain_deadline is not None

    def begin_drain(self) -> None:
        """Stop admitting requests; in-flight ones go on until done or the timeout."""
        if self._drain_deadline is not None:
            return
        timeout = math.inf if self.shutdown_timeout is None else self.shutdown_timeout
        self._drain_deadline = time.monotonic() + timeout
        if self.engine_loop is not None:
            self.engine_loop.stop_accepting()
        logger.info("shutting down: draining in-flight requests (up to %ss)", timeout)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install our handlers (main thread only) and restore the old ones after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain. A second SIGINT forces exit (uvicorn's behaviour)."""
        if self.draining and sig == signal.SIGINT:
            self.should_exit = self.force_exit = True
        else:
            self.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s); while draining, exit once the drain is over."""
        if await super().on_tick(counter):
            return True
        return self.draining and self._drain_done()

    def _drain_done(self) -> bool:
        """Advance the drain: done when no request task is left."""
        if not self.server_state.tasks:
            return True
        now = time.monotonic()
        if self._flush_deadline is None and now >= (self._drain_deadline or now):
            logger.warning("shutdown timeout: ending %d request(s) still in flight",
                           len(self.server_state.tasks))
            if self.engine_loop is not None:
                self.engine_loop.expire()
            self._flush_deadline = now + FLUSH_GRACE_S
        if self._flush_deadline is not None and now >= self._flush_deadline:
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:  # a client that is not reading its stream
                    transport.abort()
            return True
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before serving, so port 0 yields a known free port with no race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _config(app: Any, log_level: str) -> uvicorn.Config:
    """uvicorn settings shared by the CLI and the thread runner (guarded h11, lifespan on)."""
    limits = _serving(app).config.limits if _serving(app) is not None else ServerLimits()
    return uvicorn.Config(
        app,
        log_level=log_level,
        # the drain is ours (GracefulServer); this only backstops uvicorn's final wait
        timeout_graceful_shutdown=int(FLUSH_GRACE_S),
        # typed int, but uvicorn hands it to loop.call_later, which takes float seconds
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
        lifespan="on",
        access_log=log_level == "debug",
        http=protocol_factory(limits),  # type: ignore[arg-type]
    )


def _serving(app: Any) -> Any:
    """The app's ServingContext, or None for a foreign ASGI app."""
    return getattr(getattr(app, "state", None), "serving", None)


def _server(app: Any, log_level: str, shutdown_timeout: float | None) -> GracefulServer:
    serving = _serving(app)
    return GracefulServer(_config(app, log_level), serving.loop if serving else None,
                          shutdown_timeout)


def serve(app: Any, host: str, port: int, *, log_level: str = "info",
          shutdown_timeout: float | None = 30.0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain (see the module doc) and return."""
    sock = bind_socket(host, port)
    server = _server(app, log_level, shutdown_timeout)
    if on_ready is not None:
        bound = sock.getsockname()
        on_ready(f"http://{host}:{bound[1]}")
    server.run(sockets=[sock])


class ServerThread:
    """uvicorn in a background thread on a free loopback port (tests, load generator)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", log_level: str = "warning",
                 shutdown_timeout: float | None = 5.0) -> None:
        self.app = app
        self.sock = bind_socket(host, 0)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = _server(app, log_level, shutdown_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="draftwise-uvicorn", daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        """Start and wait until the app's lifespan started; returns the base URL."""
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout / 0.02)):
            if self.server.started:
                return self.url
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup")
            deadline.wait(0.02)
        raise TimeoutError(f"server did not start within {timeout}s")

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop, as on SIGTERM (the drain runs on the server's own loop)."""
        self.server.begin_drain()
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(app: Any, **kwargs: Any) -> Iterator[str]:
    """``with running(app) as url:`` — a served app for the duration of the block."""
    thread = ServerThread(app, **kwargs)
    with thread as url:
        yield url
