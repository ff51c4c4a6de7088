"""Running an app under uvicorn: graceful SIGTERM/SIGINT for the CLI, a thread for tests.

Shutdown order on SIGTERM or SIGINT: the engine loop stops admitting (new requests get
503), uvicorn closes the listening socket and waits up to ``shutdown_timeout`` seconds
for in-flight responses, then cancels the rest (their streams abort and free their KV
blocks), and the lifespan stops the engine loop. The process then exits 0: uvicorn's
habit of re-raising the signal afterwards (exit 143 / KeyboardInterrupt) is dropped
because the shutdown it asked for has completed.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Generator, Iterator
from types import FrameType
from typing import Any

import uvicorn

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that tells the app a shutdown began and does not re-raise signals."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None = None,
                 ) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

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
        if self.on_shutdown is not None:
            self.on_shutdown()
        super().handle_exit(sig, frame)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before serving, so port 0 yields a known free port with no race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _config(app: Any, log_level: str, shutdown_timeout: float | None) -> uvicorn.Config:
    """uvicorn settings shared by the CLI and the thread runner (h11, lifespan on)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        # typed int, but uvicorn hands it to asyncio.wait_for, which takes seconds as float
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
        lifespan="on",
        access_log=log_level == "debug",
        http="h11",
    )


def _on_shutdown(app: Any) -> Callable[[], None] | None:
    """The hook that makes the engine loop refuse new requests once a shutdown begins."""
    serving = getattr(getattr(app, "state", None), "serving", None)
    return serving.loop.stop_accepting if serving is not None else None


def serve(app: Any, host: str, port: int, *, log_level: str = "info",
          shutdown_timeout: float | None = 30.0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully and return."""
    sock = bind_socket(host, port)
    server = GracefulServer(_config(app, log_level, shutdown_timeout), _on_shutdown(app))
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
        self.server = GracefulServer(_config(app, log_level, shutdown_timeout),
                                     _on_shutdown(app))
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
        """Graceful stop, as on SIGTERM."""
        hook = _on_shutdown(self.app)
        if hook is not None:
            hook()
        self.server.should_exit = True
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
