"""One step's timing: one clock, read in one place.

Its own module because two readers want the same few timestamps: the engine's cumulative
phase timings (``EngineStats.timings``, for profiles and ``draftwise bench``) and adaptive
depth's cost model, which prices a decode step from its forward and the rest of it
(:meth:`~draftwise.spec.cost_model.CostModel.observe_step`). Read on two clocks in the step
itself, they took 14 of the step's 43 lines and passed the forward's time back through an
engine field.

The clock is the cost model's when adaptive depth prices the step (the engine thread's
CPU clock with one compute thread, see ``spec/cost_model.py``), else the wall clock, so
the phase timings and the prices are the same measurement. A phase's time is charged when
the next phase starts (:meth:`StepClock.lap`); :meth:`StepClock.done` closes the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from draftwise.scheduler import ScheduledRow
    from draftwise.spec.cost_model import CostModel

#: the phases a step's time is charged to (feedback and outputs are charged to commit)
Phase = Literal["schedule", "propose", "forward", "verify", "commit"]


@dataclass(slots=True)
class StepTimings:
    """Where the steps' time went (seconds, cumulative), for profiling and bench reports."""

    schedule: float = 0.0
    propose: float = 0.0
    forward: float = 0.0
    verify: float = 0.0
    commit: float = 0.0

    def add(self, phase: Phase, seconds: float) -> None:
        """Charge ``seconds`` to ``phase``."""
        setattr(self, phase, getattr(self, phase) + seconds)


class StepClock:
    """Times one run of a step's phases and, on a decode step, prices it for adaptive
    depth (``cost``; None: fixed depth, nothing priced)."""

    __slots__ = ("_now", "_timings", "_cost", "_start", "_last", "_forward")

    def __init__(self, now: Callable[[], float], timings: StepTimings,
                 cost: CostModel | None = None) -> None:
        self._now = now
        self._timings = timings
        self._cost = cost
        self._start = self._last = now()
        #: the last forward lap (None: no forward ran yet)
        self._forward: float | None = None

    @classmethod
    def for_cost(cls, timings: StepTimings, cost: CostModel | None) -> StepClock:
        """A step's clock: the cost model's when adaptive depth prices steps, else wall."""
        return cls(cost.clock if cost is not None else time.perf_counter, timings, cost)

    def again(self) -> StepClock:
        """A fresh clock for rows re-run alone after a failed step (``step_guard``): its
        start is now, so a retry is not priced with the failed run's time."""
        return StepClock(self._now, self._timings, self._cost)

    def lap(self, phase: Phase) -> None:
        """Charge the time since the last lap (or the start) to ``phase``."""
        now = self._now()
        seconds, self._last = now - self._last, now
        self._timings.add(phase, seconds)
        if phase == "forward":
            self._forward = seconds

    def done(self, rows: Sequence[ScheduledRow], num_tokens: int, draft_seconds: float) -> None:
        """Close the step: charge what is left to commit, then, on a decode step (one new
        token per row), give adaptive depth its forward and the rest outside the forward
        and the drafters (``draft_seconds``, what propose measured on this clock)."""
        self.lap("commit")
        if self._cost is None or self._forward is None:
            return
        if all(row.num_new_tokens == 1 for row in rows):
            rest = self._last - self._start - self._forward - draft_seconds
            self._cost.observe_step(len(rows), num_tokens, self._forward, rest)


__all__ = ["Phase", "StepClock", "StepTimings"]
