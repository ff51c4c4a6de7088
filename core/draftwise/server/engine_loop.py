"""The background loop that drives one step-level engine for many concurrent requests.

The engine is not thread-safe and ``step()`` blocks for a whole forward pass, so it
lives on ONE dedicated thread that owns it: requests and aborts reach it as commands on
a thread-safe queue, drained between steps (that is where continuous batching happens:
whatever arrived during a step joins the next one). Outputs go back to each request's
``asyncio.Queue`` through ``call_soon_threadsafe``, so the event loop never waits on a
forward pass.

Tokenizing (and rendering a chat template) is not the engine thread's work: a request's
``build`` runs on a small pool of tokenizer threads first (the tokenizer releases the
GIL and is safe to share), so a megabyte prompt cannot freeze the streams in flight;
only the finished ids reach the engine thread, as an add command.

Failure containment: an exception while preparing or adding a request fails that
request only; so does a failure inside a step, which the engine pins on its row by
re-running the rows alone (the output carries ``error``). Only an exception escaping
``step()`` itself (the scheduler) fails every request in flight, whose blocks are freed,
and the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from draftwise.request import RequestOutput

logger = logging.getLogger("draftwise.server")

#: builds (prompt, SamplingParams) from the engine's tokenizer, on a tokenizer thread
BuildFn = Callable[[Any], tuple[Any, Any]]
#: threads that tokenize prompts concurrently (each prompt is bounded by the body limit
#: and the engine's prompt-length check, so two keep up with a CPU engine)
TOKENIZER_THREADS = 2


class LoopClosed(Exception):
    """The loop is shutting down (or died) and takes no new requests."""

    def __init__(self, message: str, code: str = "shutting_down") -> None:
        super().__init__(message)
        self.code = code


class RequestFailed(Exception):
    """A request was ended by the server: a failed step, or shutdown."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class Observer(Protocol):
    """What the loop reports per request (implemented by ``ServerMetrics``)."""

    def on_first_token(self, ttft: float) -> None: ...
    def on_tokens(self, seconds_per_token: float) -> None: ...
    def on_finished(self, out: RequestOutput, e2e: float) -> None: ...
    def on_step(self) -> None: ...


@dataclass(slots=True)
class _Stream:
    """Loop-side state of one request; touched only on the engine thread."""

    request_id: str
    queue: asyncio.Queue[RequestOutput | BaseException]
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None


class RequestStream:
    """The client side of one request: iterate outputs; ``close()`` aborts if unfinished."""

    def __init__(self, loop: EngineLoop, stream: _Stream) -> None:
        self._loop = loop
        self._stream = stream
        self.request_id = stream.request_id
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._stream.queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item

    def close(self) -> None:
        """Abort the request unless it finished; safe to call from ``finally`` on cancel."""
        if not self.finished:
            self.finished = True
            self._loop.abort(self.request_id)


class EngineLoop:
    """Owns the engine on a dedicated thread; the async API is ``submit`` / ``abort``."""

    def __init__(self, engine: Any, observer: Observer | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._cmds: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._aio: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: set when the shutdown timeout expired: queued adds are refused, not run
        self._expired = False
        self.accepting = False
        self._tokenizers: concurrent.futures.ThreadPoolExecutor | None = None
        #: submissions whose add command has not run yet (failed at shutdown)
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()
        #: engine figures published after every iteration (read by /health without locks)
        self.snapshot: dict[str, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, aio: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; outputs are delivered on ``aio``."""
        self._aio = aio
        self.accepting = True
        self._tokenizers = concurrent.futures.ThreadPoolExecutor(
            TOKENIZER_THREADS, thread_name_prefix="draftwise-tokenize")
        self._publish()
        self._thread = threading.Thread(target=self._run, name="draftwise-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stop_accepting(self) -> None:
        """First step of a graceful shutdown: new requests get 503, running ones go on."""
        self.accepting = False

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever still runs (freeing its blocks) and join the engine thread."""
        self.accepting = False
        if self._tokenizers is not None:
            self._tokenizers.shutdown(wait=False)  # queued ones finish; their adds are refused
        if self._thread is None:
            return
        self._cmds.put(self._shutdown)
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover - a step longer than the timeout
            logger.warning("engine thread still running after %.0fs", timeout)

    # -- the async API ------------------------------------------------------------------

    async def submit(
        self, request_id: str, build: BuildFn, speculative: Any = None,
        isolation_key: str | None = None,
    ) -> RequestStream:
        """Tokenize on a worker thread, then add on the engine thread.

        ``speculative``: the request's ``SpeculativeParams`` (None: the server's settings).
        ``isolation_key``: whose outputs it may be drafted from (``Request.isolation_key``).

        Raises what ``build`` or ``add_request`` raised (bad input), or :class:`LoopClosed`.
        """
        self._check_open()
        tokenizers = self._tokenizers
        if tokenizers is None:  # pragma: no cover - _check_open refuses an unstarted loop
            raise LoopClosed("the engine loop is not running")
        try:
            tokenized = tokenizers.submit(build, self.engine)
        except RuntimeError as exc:  # the pool was shut down under us
            raise LoopClosed("the server is shutting down") from exc
        prompt, params = await asyncio.wrap_future(tokenized)
        stream = _Stream(request_id, asyncio.Queue())
        added: concurrent.futures.Future[None] = concurrent.futures.Future()

        def add() -> None:
            with self._lock:
                self._pending.discard(added)
            if not added.set_running_or_notify_cancel():
                return  # the client left before the request reached the engine
            if self._expired:
                added.set_exception(LoopClosed("the server is shutting down"))
                return
            try:
                extra: dict[str, Any] = {}
                if speculative is not None:
                    extra["speculative"] = speculative
                if isolation_key is not None:
                    extra["isolation_key"] = isolation_key
                self.engine.add_request(prompt, params, request_id, **extra)
            except Exception as exc:  # noqa: BLE001 - handed to the request's caller
                added.set_exception(exc)
                return
            self._streams[request_id] = stream
            added.set_result(None)

        with self._lock:  # a request is either queued before shutdown or refused
            if self._stopping or not self.alive:
                raise LoopClosed("the server is shutting down")
            self._pending.add(added)
            self._cmds.put(add)
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            self.abort(request_id)  # it may have been added just before the cancel
            raise
        return RequestStream(self, stream)

    def _check_open(self) -> None:
        """New requests are refused once a shutdown began (or before the loop started)."""
        with self._lock:
            if self.accepting and self.alive:
                return
            if self._thread is not None and not self.accepting:
                raise LoopClosed("the server is shutting down")
            raise LoopClosed("the engine loop is not running", "engine_unavailable")

    def expire(self, message: str = "the server is shutting down: the shutdown timeout "
               "expired") -> None:
        """End every request now (their streams get an error event and ``[DONE]``).

        Runs between steps like any command; later adds are refused. Used when the
        shutdown timeout passes with requests still in flight.
        """

        def cmd() -> None:
            self._expired = True
            self._fail_all(RequestFailed(message, status=503))

        self.accepting = False
        self._cmds.put(cmd)

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); non-blocking, so it is safe while cancelled."""

        def cmd() -> None:
            if self._streams.pop(request_id, None) is not None:
                self.engine.abort_request(request_id)

        self._cmds.put(cmd)

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between steps (debug / tests)."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def cmd() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

        self._cmds.put(cmd)
        return await asyncio.wrap_future(fut)

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        """Drain commands, step, dispatch; block only when there is nothing to do."""
        try:
            while not self._stopping:
                self._drain(block=not self.engine.has_unfinished_requests())
                if self._stopping or not self.engine.has_unfinished_requests():
                    self._publish()
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    logger.exception("engine step failed; failing the requests in flight")
                    self._fail_all(RequestFailed(f"engine step failed: {type(exc).__name__}: "
                                                 f"{exc}"))
                    continue
                if self.observer is not None:  # before dispatch: a client that saw its
                    try:                           # output sees the counters include it
                        self.observer.on_step()
                    except Exception:
                        logger.exception("step observer failed")
                self._dispatch(outputs)
                self._publish()
        except BaseException as exc:  # pragma: no cover - a bug in the loop itself
            logger.exception("engine loop crashed")
            self._fail_all(RequestFailed(f"engine loop crashed: {exc}"))
            self._close(LoopClosed("the engine loop crashed", "engine_unavailable"))

    def _drain(self, block: bool) -> None:
        """Run every pending command; wait for the first one when idle."""
        try:
            cmd = self._cmds.get(timeout=0.5) if block else self._cmds.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                cmd()
            except Exception:
                logger.exception("engine loop command failed")
            if self._stopping:
                return
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Route outputs to their requests and record latencies."""
        now = time.monotonic()
        batch: list[tuple[_Stream, RequestOutput | BaseException]] = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted while its step ran
            try:
                self._observe(stream, out, now)
            except Exception as exc:
                logger.exception("observing request %s failed", out.request_id, exc_info=exc)
            if out.finished:
                self._streams.pop(out.request_id, None)
            if out.error is not None:  # failed alone inside a step; the others went on
                status = 400 if out.error_field is not None else 500
                batch.append((stream, RequestFailed(f"request failed: {out.error}", status)))
                continue
            batch.append((stream, out))
        self._deliver(batch)

    def _observe(self, stream: _Stream, out: RequestOutput, now: float) -> None:
        """TTFT, per-token latency and end-to-end latency, measured where steps end."""
        n_new = len(out.new_token_ids)
        if n_new:
            if stream.first_token is None:
                stream.first_token = now
                if self.observer:
                    self.observer.on_first_token(now - stream.arrival)
            elif self.observer and stream.last_token is not None:
                self.observer.on_tokens((now - stream.last_token) / n_new)
            stream.last_token = now
        if out.finished and self.observer and out.error is None:  # failures: on_failed
            self.observer.on_finished(out, now - stream.arrival)

    def _deliver(self, batch: list[tuple[_Stream, RequestOutput | BaseException]]) -> None:
        """Hand items to the event loop in one callback (asyncio queues are not thread-safe)."""
        if not batch or self._aio is None:
            return

        def put_all() -> None:
            for stream, item in batch:
                stream.queue.put_nowait(item)

        try:
            self._aio.call_soon_threadsafe(put_all)
        except RuntimeError:  # pragma: no cover - event loop already closed
            pass

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request in flight (returning its blocks) and fail it with ``exc``."""
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            try:
                self.engine.abort_request(stream.request_id)
            except Exception:
                logger.exception("abort of %s failed", stream.request_id)
        self._deliver([(s, exc) for s in streams])
        self._publish()

    def _shutdown(self) -> None:
        """The last command: abort what is left and leave the loop."""
        self._fail_all(RequestFailed("the server is shutting down", status=503))
        self._close(LoopClosed("the server is shutting down"))

    def _close(self, exc: LoopClosed) -> None:
        """Stop; submissions queued behind this point will never run, so fail them now."""
        with self._lock:
            self._stopping = True
            pending = list(self._pending)
            self._pending.clear()
        for fut in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(exc)

    def _publish(self) -> None:
        """Swap in a fresh snapshot of the engine's load and cache use."""
        kv = getattr(self.engine, "kv", None)
        scheduler = getattr(self.engine, "scheduler", None)
        stats = getattr(kv, "prefix_cache_stats", None) if kv is not None else None
        self.snapshot = {
            "num_requests": len(self._streams),
            "num_unfinished": int(getattr(self.engine, "num_unfinished_requests", 0)),
            # what a router reads: the queue, the batch, the cache's fill and its hits
            "num_waiting": len(scheduler.waiting) if scheduler is not None else None,
            "num_running": len(scheduler.running) if scheduler is not None else None,
            "kv_used_blocks": int(kv.num_used_blocks) if kv is not None else None,
            "kv_free_blocks": int(kv.num_free_blocks) if kv is not None else None,
            "kv_usage": float(kv.usage) if kv is not None else None,
            "prefix_cache_queries": stats.queries if stats is not None else None,
            "prefix_cache_hits": stats.hits if stats is not None else None,
        }
