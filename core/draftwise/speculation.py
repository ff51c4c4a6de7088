"""The engine's side of speculation: the drafter chain, draft probabilities, feedback.

A config names one speculator, or a ``drafter_chain`` of several in preference order;
per row, the first proposer that produces a draft wins (an n-gram lookup that finds
nothing hands the row to the next drafter). The engine calls the proposers directly
through the :class:`~draftwise.speculator.Proposer` protocol, never through pluggy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftwise.metrics import SpecDecodingLogging, SpecDecodingStats
from draftwise.speculator import (
    DraftInput,
    DraftRow,
    HiddenStateConsumer,
    Proposer,
    ProposerContext,
    VerifyOutcome,
)

if TYPE_CHECKING:
    from draftwise.config import ResolvedSpeculativeConfig
    from draftwise.models.loader import LoadedModel
    from draftwise.request import Request
    from draftwise.scheduler import ScheduledRow


class Speculation:
    """Proposers in preference order, plus the bookkeeping verify and feedback need."""

    def __init__(
        self,
        config: ResolvedSpeculativeConfig,
        proposers: list[Proposer],
        vocab_size: int,
        hidden_layers: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.k = max_draft_len(config)
        self.proposers = proposers
        #: checked once here, not per row per step (a runtime Protocol check is slow)
        self._hidden_consumers = [p for p in proposers if isinstance(p, HiddenStateConsumer)]
        self.vocab_size = vocab_size
        self.hidden_layers = hidden_layers
        #: cumulative since start; per-step stats are merged in by observe_step
        self.metrics = SpecDecodingStats(num_spec_tokens=self.k)
        self.logging = SpecDecodingLogging()
        #: called with each step's stats (the server's Prometheus counters subscribe here)
        self.observers: list[Callable[[SpecDecodingStats], None]] = []
        #: which proposer drafted each request's current draft, and its probabilities
        self._owner: dict[str, int] = {}
        self._probs: dict[str, torch.Tensor] = {}

    def propose(self, rows: list[ScheduledRow]) -> list[np.ndarray | None]:
        """Drafts per scheduled row (None for rows that do not speculate this step)."""
        drafts: list[np.ndarray | None] = [None] * len(rows)
        self._owner.clear()
        self._probs.clear()
        pending = [i for i, r in enumerate(rows) if r.max_draft > 0]
        for pid, proposer in enumerate(self.proposers):
            if not pending:
                break
            batch = DraftInput(
                rows=[
                    DraftRow(
                        req_id=rows[i].request.req_id,
                        token_ids=rows[i].request.all_token_ids,
                        max_draft=rows[i].max_draft,
                        temperature=rows[i].request.params.temperature,
                    )
                    for i in pending
                ]
            )
            out = proposer.propose(batch)
            cu = out.cu_num_draft_tokens
            still: list[int] = []
            for j, i in enumerate(pending):
                n = min(out.num_draft_tokens[j], rows[i].max_draft)
                if n == 0:
                    still.append(i)
                    continue
                req_id = rows[i].request.req_id
                drafts[i] = out.token_ids[cu[j] : cu[j] + n]
                self._owner[req_id] = pid
                if out.draft_probs is not None:
                    self._probs[req_id] = out.draft_probs[cu[j] : cu[j] + n]
            pending = still
        return drafts

    def draft_probs_for(self, reqs: list[Request], drafts: list[np.ndarray]) -> torch.Tensor | None:
        """``[total_drafts, vocab]`` q for verify, or None when every row's q is one-hot.

        In a chain only some proposers give probabilities; rows of the others get an
        explicit one-hot q, which verify treats exactly like "no probabilities".
        """
        if not self._probs:
            return None
        parts: list[torch.Tensor] = []
        for req, draft in zip(reqs, drafts):
            if len(draft) == 0:
                continue
            probs = self._probs.get(req.req_id)
            if probs is None:
                probs = torch.zeros((len(draft), self.vocab_size), dtype=torch.float32)
                probs[torch.arange(len(draft)), torch.as_tensor(draft)] = 1.0
            parts.append(probs.float())
        return torch.cat(parts) if parts else None

    def on_verified(
        self,
        req_ids: list[str],
        num_draft: list[int],
        num_accepted: list[int],
        output_token_ids: list[list[int]],
        hidden_states: dict[int, torch.Tensor],
    ) -> None:
        """Tell each proposer what happened to the drafts it made."""
        by_owner: dict[int, list[int]] = {}
        for j, req_id in enumerate(req_ids):
            by_owner.setdefault(self._owner.get(req_id, 0), []).append(j)
        for pid, idx in by_owner.items():
            self.proposers[pid].on_verified(
                VerifyOutcome(
                    req_ids=[req_ids[j] for j in idx],
                    num_draft_tokens=[num_draft[j] for j in idx],
                    num_accepted=[num_accepted[j] for j in idx],
                    output_token_ids=[output_token_ids[j] for j in idx],
                    hidden_states=hidden_states or None,
                )
            )

    def add_hidden(self, req_id: str, start: int, hidden_states: dict[int, torch.Tensor]) -> None:
        """A row's target hidden states at its committed positions, to proposers that use them."""
        for proposer in self._hidden_consumers:
            layer = proposer.hidden_layers[-1]
            if layer in hidden_states:
                proposer.add_hidden(req_id, start, hidden_states[layer])

    def observe_step(self, stats: SpecDecodingStats) -> None:
        """Fold one step's counts into the totals, the log window and any observers."""
        self.metrics.merge(stats)
        self.logging.observe(stats)
        for observer in self.observers:
            observer(stats)

    def proposer_stats(self) -> list[dict[str, Any]]:
        """What each proposer reports about itself (``stats()``, optional in the protocol)."""
        out: list[dict[str, Any]] = []
        for member, proposer in zip(self.config.drafters, self.proposers):
            stats = getattr(proposer, "stats", None)
            out.append({"method": member.method, **(stats() if callable(stats) else {})})
        return out

    def release(self, req_id: str) -> None:
        """A request left the running set: every proposer drops its state."""
        for proposer in self.proposers:
            proposer.release(req_id)


def max_draft_len(config: ResolvedSpeculativeConfig) -> int:
    """k the scheduler reserves per row: the largest of the chain's members."""
    return max(m.num_speculative_tokens or 0 for m in config.drafters)


def build_speculation(
    config: ResolvedSpeculativeConfig, loaded: LoadedModel, max_model_len: int
) -> Speculation:
    """Build the proposer of each drafter (one, or a chain in preference order)."""
    from draftwise.plugins.manager import load_speculators

    registry = load_speculators()
    proposers: list[Proposer] = []
    hidden: set[int] = set()
    for member in config.drafters:
        ctx = ProposerContext(
            num_speculative_tokens=member.num_speculative_tokens or 0,
            vocab_size=loaded.config.vocab_size,
            max_model_len=max_model_len,
            dtype=str(loaded.dtype).removeprefix("torch."),
            draft_sample_method=member.draft_sample_method,
            target=loaded,
        )
        reg = registry.get(member.method or "")
        hidden.update(reg.speculator.capabilities.target_hidden_layers)
        proposer = registry.build_proposer(member, ctx)
        if isinstance(proposer, HiddenStateConsumer):  # layers known once loaded (MTP)
            hidden.update(proposer.hidden_layers)
        proposers.append(proposer)
    return Speculation(config, proposers, loaded.config.vocab_size, tuple(sorted(hidden)))


def describe(spec: Speculation | None) -> dict[str, Any]:
    """A short JSON-able summary for CLI and bench output."""
    if spec is None:
        return {"enabled": False}
    return {"enabled": True, "method": spec.config.method, "k": spec.k}
