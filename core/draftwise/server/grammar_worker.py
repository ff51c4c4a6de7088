"""Grammar work off the event loop: a few threads with a deep stack, a queue bound and a
time budget.

Why: checking and compiling a request's output constraint (a JSON schema with 10,000
required properties, 5,000 tools' parameter schemas) takes seconds in llguidance. Run on
the event loop, that froze every other stream for as long (3.1-3.4 s measured); here the
event loop only awaits it. llguidance drops the GIL while it validates and compiles, so
the engine thread keeps stepping meanwhile; the worker threads run at a lower scheduling
priority (``nice`` +:data:`NICE`) so that on a busy machine the engine's step wins the core.

- **Stack**: :data:`STACK_BYTES` per thread. ``structured/bounds.py`` refuses documents
  whose nesting could overflow the library's recursion on an 8 MiB stack with eight
  times margin; the deeper stack is a second line, not the first.
- **Budget**: a request whose grammar takes longer than :data:`BUDGET_SECONDS` gets a
  400 naming ``structured_outputs``. The work itself cannot be interrupted (it is native
  code), so it finishes on its thread and its result is dropped.
- **Queue bound**: at most :data:`MAX_PENDING` grammars wait or run at once; more is a
  503 ``grammar_queue_full`` (retry later), so a flood of slow grammars costs the server
  at most its worker threads' CPU, never its memory or its other requests' tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from draftwise.server.errors import APIError

logger = logging.getLogger("draftwise.server")

T = TypeVar("T")

#: threads compiling grammars (each holds one compile; more would only take cores from the
#: engine on a small machine)
THREADS = 2
#: stack of each worker thread (reserved address space; only touched pages cost memory)
STACK_BYTES = 64 * 1024 * 1024
#: seconds a request waits for its grammar before a 400
BUDGET_SECONDS = 10.0
#: grammars queued or compiling at once before a 503
MAX_PENDING = 16
#: niceness of the worker threads relative to the process (Linux: per thread)
NICE = 5

_STOP = object()


class GrammarWorker:
    """Runs ``fn()`` on a grammar thread and awaits it within the budget (module doc)."""

    def __init__(self, threads: int = THREADS, budget: float = BUDGET_SECONDS,
                 max_pending: int = MAX_PENDING) -> None:
        self.budget = budget
        self.max_pending = max_pending
        self._threads_wanted = threads
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pending = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the threads (done by the first :meth:`run` otherwise)."""
        with self._lock:
            if not self._threads:
                self._start_locked()

    def _start_locked(self) -> None:
        """Threads with the deep stack (``threading.stack_size`` is process-wide: it is set
        only while these are created)."""
        previous = threading.stack_size(STACK_BYTES)
        try:
            for i in range(self._threads_wanted):
                t = threading.Thread(target=self._run, name=f"draftwise-grammar-{i}",
                                     daemon=True)
                t.start()
                self._threads.append(t)
        finally:
            threading.stack_size(previous)

    def stop(self) -> None:
        """Let the threads finish what they run and exit (not joined: native work cannot be
        interrupted, and the process may be exiting)."""
        with self._lock:
            for _ in self._threads:
                self._queue.put(_STOP)
            self._threads = []

    @property
    def pending(self) -> int:
        """Grammars queued or compiling now."""
        return self._pending

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a worker thread; its own exceptions propagate unchanged.

        Raises APIError 503 when :data:`MAX_PENDING` are already waiting, 400 when the
        budget runs out.
        """
        with self._lock:
            if not self._threads:  # started on first use: apps built in tests need no lifespan
                self._start_locked()
            if self._pending >= self.max_pending:
                raise APIError(
                    f"structured_outputs: {self.max_pending} output constraints are being "
                    "compiled already; retry shortly", status=503, code="grammar_queue_full")
            self._pending += 1
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fn, future))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.budget)
        except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
            raise APIError(
                f"structured_outputs: compiling the output constraint took longer than "
                f"{self.budget:g} s; simplify the schema or grammar",
                param="structured_outputs", code="grammar_too_slow") from None

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: niceness per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, future = item
            run = future.set_running_or_notify_cancel()
            result: Any = None
            error: BaseException | None = None
            if run:
                try:
                    result = fn()
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                    error = exc
            with self._lock:  # the slot is free before the request hears back
                self._pending -= 1
            # a running future cannot be cancelled; the guard keeps the thread alive anyway
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                if run and error is None:
                    future.set_result(result)
                elif run:
                    future.set_exception(error)


__all__ = ["BUDGET_SECONDS", "MAX_PENDING", "STACK_BYTES", "THREADS", "GrammarWorker"]
