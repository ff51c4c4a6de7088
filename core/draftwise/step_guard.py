"""The step guard: one driver per engine, and a failure inside a step fails one request.

Its own module because it is one idea apart from the phases of a step: what happens when
a step cannot run (a second thread is already inside it) or raises before commit (an
exception in propose, forward or verify that names no row). ``LLMEngine.step`` then still
reads schedule -> propose -> forward -> verify -> commit -> feedback, with the guard
around it rather than inside it.

- **One driver.** Two threads stepping one engine would interleave two steps' scheduling
  and commits; the second is refused with :class:`~draftwise.errors.EngineBusyError`, not
  serialized (two drivers also race on adding requests and reading outputs).
- **Failure isolation.** A step's rows are re-run one by one; the row that fails alone is
  failed alone and the others go on. That is right because nothing outside a step's own
  records changes before commit (``draftwise.spec.step``), so a step can be run again for any
  subset of its rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from draftwise.errors import EngineBusyError

if TYPE_CHECKING:
    from draftwise.request import Request, RequestOutput
    from draftwise.scheduler import ScheduledRow, Scheduler
    from draftwise.step_clock import StepClock

logger = logging.getLogger("draftwise.engine")

#: runs propose -> forward -> verify -> commit -> feedback for rows, timed on the clock
RunRows = Callable[[list["ScheduledRow"], "StepClock"], list["RequestOutput"]]


class StepGuard:
    """Refuses a second driver and isolates a failed step's rows (see the module doc)."""

    def __init__(
        self,
        scheduler: Scheduler,
        release_state: Callable[[str], None],
        fail: Callable[[Request, BaseException], RequestOutput],
    ) -> None:
        self._lock = threading.Lock()
        self._scheduler = scheduler
        #: drops a request's runner-side and speculation-side state (by request id)
        self._release_state = release_state
        #: finishes one request as failed and returns its output
        self._fail = fail

    @contextmanager
    def one_driver(self) -> Iterator[None]:
        """Held for a whole step; a second thread entering meanwhile is refused by name."""
        if not self._lock.acquire(blocking=False):  # two drivers would corrupt a step
            raise EngineBusyError("LLMEngine.step() is already running in another thread: one "
                                  "thread drives an engine (a server's engine loop owns its "
                                  "engine; give another driver its own engine)")
        try:
            yield
        finally:
            self._lock.release()

    def run(
        self, rows: list[ScheduledRow], clock: StepClock, run_rows: RunRows
    ) -> list[RequestOutput]:
        """``run_rows(rows, clock)``; if it raises, each row is re-run alone (:meth:`isolate`)."""
        try:
            return run_rows(rows, clock)
        except Exception as exc:  # noqa: BLE001 - attributed to a row, or to all of them
            return self.isolate(rows, exc, clock, run_rows)

    def isolate(
        self, rows: list[ScheduledRow], exc: Exception, clock: StepClock, run_rows: RunRows
    ) -> list[RequestOutput]:
        """After a failed step: run each row alone; fail only the rows that fail alone.

        A row's retry starts from its committed tokens with its cache state discarded and
        recomputed (prefix-cache hits make that cheap): the failed forward may already have
        advanced a recurrent state in place, and recomputing is the one retry that is
        right for every model. Recomputation is what preemption does, so it is lossless.
        """
        if len(rows) == 1:
            return [self._fail(rows[0].request, exc)]
        logger.warning(
            "engine step over %d rows failed (%s: %s); re-running each row alone",
            len(rows), type(exc).__name__, exc,
        )
        outputs: list[RequestOutput] = []
        for row in rows:
            req = row.request
            if req.status.finished:
                continue
            self._release_state(req.req_id)
            retry = self._scheduler.restart(req)
            if retry is None:  # no blocks for it alone now: back to the queue, recomputed later
                continue
            try:
                outputs.extend(run_rows([retry], clock.again()))
            except Exception as row_exc:  # noqa: BLE001 - this row fails alone
                outputs.append(self._fail(req, row_exc))
        return outputs


__all__ = ["RunRows", "StepGuard"]
