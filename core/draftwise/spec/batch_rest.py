"""A batch whose drafts never get verified stops paying for the decision: it rests.

Adaptive depth decides every step, for every row, whether drafts pay (:mod:`draftwise.spec.adaptive`):
it reserves a depth, the drafter looks the drafts up, the cut keeps what the evidence
earns, and verify's outcome is learned from. That bookkeeping is Python, ~0.2 ms a step
at one row and ~0.65 ms at eight on the 2-core VM (the default model's step: 5.6 and
18 ms). Where the batch's forward is compute-bound (eight rows on two AVX2 cores: two
tokens a row cost 1.9x one) no evidence the rows meet pays, every step cuts every draft,
and the bookkeeping is the whole difference from speculation off: 0.94-0.97x its
throughput.

So, like a parked row's probes (:meth:`~draftwise.spec.adaptive.DepthPolicy.probe_interval`),
the batch backs off as a whole: after ``probe_interval`` steps in a row at the same batch
size that asked for drafts and verified none, it rests ``probe_interval`` steps (no row
drafts, nothing is looked up or observed), and each rest that ends in another such run
is ``probe_backoff`` times longer, up to ``max_probe_interval``. A verified draft ends
the backing off; a change of batch size (a request joins or leaves: the forward's
economics change) or a new request (which may be grounded where the others are open
text) ends a rest at once. A resting step does not count towards a parked row's probe.

Lossless: it only sets how many drafts are verified (none), never how.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class BatchRest:
    """The back-off state of one engine's batch (the settings are the probes')."""

    #: idle steps before a rest, and the first rest's length (``probe_interval``)
    base: int
    #: each further rest is this many times longer (``probe_backoff``)
    backoff: float
    #: the longest rest (``max_probe_interval``)
    longest: int
    #: off: every step decides (``"batch_rest": false``)
    enabled: bool = True
    #: steps in a row at ``rows`` rows that asked for drafts and verified none
    idle: int = 0
    #: the batch size of those steps, and of the rest they started
    rows: int = 0
    #: steps of the current rest left
    left: int = 0
    #: the last rest's length (0: none since the last verified draft or reset)
    last: int = 0
    #: rests taken and steps rested, for bench reports and ``/metrics``
    num_rests: int = 0
    num_rested_steps: int = 0
    #: rows of this step when the policy asked any for drafts (0: it did not)
    asked_rows: int = 0

    def resting(self, num_rows: int) -> bool:
        """Whether this step of ``num_rows`` rows rests (asks no row for drafts); the
        policy calls this first each step."""
        self.asked_rows = 0
        if self.left <= 0:
            return False
        if num_rows != self.rows:  # a request came or went: decide again
            self.reset()
            return False
        self.left -= 1
        self.num_rested_steps += 1
        return True

    def step_verified(self, verified: bool) -> None:
        """After the step's cut: whether it verifies any draft. Counts only a step whose
        policy asked for drafts (``asked_rows``)."""
        if self.asked_rows:
            self.observe(self.asked_rows, verified)
            self.asked_rows = 0

    def observe(self, num_rows: int, verified: bool) -> None:
        """A step of ``num_rows`` rows that asked for drafts: whether any was verified."""
        if verified:
            self.idle = self.last = 0
            return
        if num_rows != self.rows:
            self.rows, self.idle = num_rows, 0
        self.idle += 1
        if self.enabled and self.idle >= self.base:
            grown = int(self.last * self.backoff) if self.last else self.base
            self.left = self.last = max(self.base, min(self.longest, grown))
            self.idle = 0
            self.num_rests += 1

    def reset(self) -> None:
        """Decide from the next step on, backed off from scratch (a new request came)."""
        self.idle = self.left = self.last = self.rows = 0

    def summary(self) -> dict[str, Any]:
        """JSON for bench reports and ``/metrics``."""
        return {"enabled": self.enabled, "rests": self.num_rests,
                "rested_steps": self.num_rested_steps}


__all__ = ["BatchRest"]
