"""Speculative-decoding metrics, named and computed as vLLM does.

- :class:`SpecDecodingStats`: counts for one step (or, merged, for a whole run): drafts,
  draft tokens, accepted tokens, and both per draft position. A request verified with
  no draft tokens is not a draft and is not counted.
- :class:`SpecDecodingLogging`: the periodic ``SpecDecoding metrics: ...`` line, in
  vLLM's exact format, with throughputs over the interval since the last line.
- :class:`SpecDecodingProm`: vLLM's four Prometheus counters under the ``draftwise:``
  prefix, registered on a ``CollectorRegistry`` the caller owns.
- :class:`RequestSpecDecodeMetrics`: per-request counters with the keys vLLM returns
  under ``metrics.speculative_decoding``.

Mean acceptance length = 1 + accepted / drafts (it counts the bonus token).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from draftwise.errors import DraftwiseError

if TYPE_CHECKING:  # imported where the counters are made: only a server exports them
    from prometheus_client import CollectorRegistry, Counter

logger = logging.getLogger(__name__)

#: vLLM's log format (vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log)
LOG_FORMAT = (
    "SpecDecoding metrics: "
    "Mean acceptance length: %.2f, "
    "Accepted throughput: %.2f tokens/s, "
    "Drafted throughput: %.2f tokens/s, "
    "Accepted: %d tokens, "
    "Drafted: %d tokens, "
    "Per-position acceptance rate: %s, "
    "Avg Draft acceptance rate: %.1f%%"
)


class MetricsError(DraftwiseError, ValueError):
    """An observation that cannot be right (more accepted than drafted, beyond k)."""


def _check(num_draft: int, num_accepted: int, num_spec_tokens: int) -> None:
    """Accepted tokens are a prefix of at most k drafts."""
    if not 0 <= num_accepted <= num_draft <= num_spec_tokens:
        raise MetricsError(
            f"need 0 <= accepted ({num_accepted}) <= drafted ({num_draft}) "
            f"<= num_speculative_tokens ({num_spec_tokens})"
        )


@dataclass(slots=True)
class SpecDecodingStats:
    """Draft and acceptance counts for one step; :meth:`merge` makes them cumulative."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # [K]
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)  # [K]

    def __post_init__(self) -> None:
        k = self.num_spec_tokens
        self.num_accepted_tokens_per_pos = self.num_accepted_tokens_per_pos or [0] * k
        self.num_draft_tokens_per_pos = self.num_draft_tokens_per_pos or [0] * k
        if len(self.num_accepted_tokens_per_pos) != k or len(self.num_draft_tokens_per_pos) != k:
            raise MetricsError(f"per-position lists must have num_spec_tokens={k} entries")

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's verified draft; positions below ``num_accepted_tokens`` were accepted."""
        if num_draft_tokens == 0:
            return
        _check(num_draft_tokens, num_accepted_tokens, self.num_spec_tokens)
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1

    def merge(self, other: SpecDecodingStats) -> None:
        """Add another step's counts (cumulative aggregation)."""
        if other.num_spec_tokens != self.num_spec_tokens:
            raise MetricsError(
                f"cannot merge stats for k={other.num_spec_tokens} into k={self.num_spec_tokens}"
            )
        if not other.num_drafts:  # (most adaptive steps verify no draft: nothing to add)
            return
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i in range(self.num_spec_tokens):
            self.num_accepted_tokens_per_pos[i] += other.num_accepted_tokens_per_pos[i]
            self.num_draft_tokens_per_pos[i] += other.num_draft_tokens_per_pos[i]

    def summary(self) -> dict[str, Any]:
        """JSON-ready totals and rates (None where nothing was drafted)."""
        drafts, drafted = self.num_drafts, self.num_draft_tokens
        return {
            "num_spec_tokens": self.num_spec_tokens,
            "num_drafts": drafts,
            "num_draft_tokens": drafted,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": 1 + self.num_accepted_tokens / drafts if drafts else None,
            "draft_acceptance_rate": self.num_accepted_tokens / drafted if drafted else None,
            "acceptance_rate_per_pos": [
                n / drafts if drafts else None for n in self.num_accepted_tokens_per_pos
            ],
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "num_draft_tokens_per_pos": list(self.num_draft_tokens_per_pos),
        }


class SpecDecodingLogging:
    """Accumulates steps between log lines and prints vLLM's ``SpecDecoding metrics`` line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start a new interval (called after each line)."""
        self._observed = False
        self._num_drafts = 0
        self._num_draft_tokens = 0
        self._num_accepted_tokens = 0
        self._accepted_per_pos: list[int] = []
        self._last_log_time = self._clock()

    def observe(self, stats: SpecDecodingStats) -> None:
        """Add one step's stats to the current interval."""
        self._observed = True
        per_pos = stats.num_accepted_tokens_per_pos
        if len(self._accepted_per_pos) < len(per_pos):
            self._accepted_per_pos.extend([0] * (len(per_pos) - len(self._accepted_per_pos)))
        if not stats.num_drafts:  # (most adaptive steps verify no draft: nothing to add)
            return
        self._num_drafts += stats.num_drafts
        self._num_draft_tokens += stats.num_draft_tokens
        self._num_accepted_tokens += stats.num_accepted_tokens
        for i, n in enumerate(per_pos):
            self._accepted_per_pos[i] += n

    def format(self) -> str | None:
        """The line for the current interval, or None when nothing was observed."""
        if not self._observed:
            return None
        drafts, drafted = self._num_drafts, self._num_draft_tokens
        accepted = self._num_accepted_tokens
        elapsed = self._clock() - self._last_log_time
        draft_tput = drafted / elapsed if elapsed > 0 else 0.0
        accept_tput = accepted / elapsed if elapsed > 0 else 0.0
        nan = float("nan")
        mean_len = 1 + accepted / drafts if drafts else nan
        rates = ", ".join(f"{(n / drafts if drafts else nan):.3f}" for n in self._accepted_per_pos)
        avg_rate = accepted / drafted * 100 if drafted else nan
        return LOG_FORMAT % (
            mean_len, accept_tput, draft_tput, accepted, drafted, rates, avg_rate
        )

    def log(self, log_fn: Callable[[str], None] | None = None) -> str | None:
        """Emit the line (info level by default), start a new interval, return the line."""
        line = self.format()
        if line is None:
            return None
        if log_fn is None:
            logger.info("%s", line)
        else:
            log_fn(line)
        self.reset()
        return line


class SpecDecodingProm:
    """vLLM's spec-decode counters (``draftwise:spec_decode_*_total``) for one engine."""

    def __init__(
        self,
        registry: CollectorRegistry,
        num_spec_tokens: int,
        model_name: str,
        engine: str | int = 0,
        prefix: str = "draftwise:",
    ) -> None:
        from prometheus_client import Counter

        names = ["model_name", "engine"]
        labels = {"model_name": model_name, "engine": str(engine)}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{prefix}{name}", doc, [*names, *extra], registry=registry)

        self.num_drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Number of accepted tokens."
        )
        per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ("position",),
        )
        self._drafts = self.num_drafts.labels(**labels)
        self._draft_tokens = self.num_draft_tokens.labels(**labels)
        self._accepted = self.num_accepted_tokens.labels(**labels)
        self._per_pos = [per_pos.labels(**labels, position=str(i)) for i in range(num_spec_tokens)]

    def observe(self, stats: SpecDecodingStats) -> None:
        """Add one step's counts; a step with no drafts changes nothing."""
        if stats.num_drafts == 0:
            return
        self._drafts.inc(stats.num_drafts)
        self._draft_tokens.inc(stats.num_draft_tokens)
        self._accepted.inc(stats.num_accepted_tokens)
        for child, n in zip(self._per_pos, stats.num_accepted_tokens_per_pos):
            if n:
                child.inc(n)


@dataclass(slots=True)
class RequestSpecDecodeMetrics:
    """One request's speculation record (vLLM's ``metrics.speculative_decoding``)."""

    num_spec_tokens: int
    acceptance_histogram: list[int] = field(default_factory=list)  # [K + 1]
    num_draft_tokens: int = 0
    #: per-step lists, kept only for ``per_request_spec_decode_metrics="detailed"``
    detailed: bool = False
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    #: what adaptive depth learned of the request (``AcceptanceEstimate.as_dict``), set
    #: when it ends, so only the final output carries it (rounding its rates on every
    #: step's output cost ~1% of a one-thread decode step); None: fixed depth, or running
    adaptive: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.acceptance_histogram = self.acceptance_histogram or [0] * (self.num_spec_tokens + 1)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verify step of this request; steps without drafts are not speculation."""
        if num_draft_tokens == 0:
            return
        _check(num_draft_tokens, num_accepted_tokens, self.num_spec_tokens)
        self.acceptance_histogram[num_accepted_tokens] += 1
        self.num_draft_tokens += num_draft_tokens
        if self.detailed:
            self.per_step_accepted.append(num_accepted_tokens)
            self.per_step_drafted.append(num_draft_tokens)

    def as_dict(self) -> dict[str, Any]:
        """The response payload; rates default to 1.0 / 0.0 before any speculative step."""
        steps = sum(self.acceptance_histogram)
        accepted = sum(n * c for n, c in enumerate(self.acceptance_histogram))
        out: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.num_draft_tokens if self.num_draft_tokens
            else 0.0,
            "acceptance_histogram": list(self.acceptance_histogram),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if self.detailed:
            out["per_step_accepted"] = list(self.per_step_accepted)
            out["per_step_drafted"] = list(self.per_step_drafted)
        return out

