"""The proposer: K heads, each a residual SiLU block then the target's LM head."""

from __future__ import annotations

from typing import Any

import torch

from draftwise.kit import DraftInput, Drafts, ProposerContext, VerifyOutcome

from medusa_lite.options import MedusaLiteOptions


class MedusaLiteProposer:
    """Head i maps ``x = final_norm(h)`` to ``lm_head(x + silu(x W_i^T + b_i))`` and
    drafts the token ``i + 1`` positions past the row's last (already chosen) token."""

    def __init__(self, options: MedusaLiteOptions, ctx: ProposerContext) -> None:
        if ctx.target is None:
            raise ValueError("medusa_lite needs the target model (ctx.target)")
        self.k = ctx.num_speculative_tokens
        self.target = ctx.target.model
        self.layer = ctx.target.config.num_hidden_layers - 1  # the last layer's output
        size = ctx.target.config.hidden_size
        gen = torch.Generator().manual_seed(options.medusa_seed)
        self.w = torch.randn(self.k, size, size, generator=gen) * options.medusa_init_std
        self.b = torch.zeros(self.k, size)  # [K, hidden]; w is [K, hidden, hidden]
        self.head_forwards = 0
        self.rows_without_hidden = 0

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """TapsHidden: the target layer our rows carry (checked when the engine builds)."""
        return (self.layer,)

    def heads(self, h_last: torch.Tensor, depth: int) -> torch.Tensor:  # [B, hidden]
        """The first ``depth`` heads' greedy tokens for each row's newest hidden state,
        ``[B, depth]``. Only the heads asked for run: adaptive depth prices a draft token
        as a propose call's time over the drafts it made, so a depth-1 probe that ran all
        K heads would read K times dearer than it is."""
        x = self.target.final_norm(h_last).float()  # what the target's LM head reads
        w, b = self.w[:depth], self.b[:depth]
        z = x.unsqueeze(0) + torch.nn.functional.silu(
            torch.einsum("bh,koh->kbo", x, w) + b.unsqueeze(1))  # [depth, B, hidden]
        k, rows, size = z.shape
        logits = self.target.lm_head(z.reshape(k * rows, size).to(self.target.dtype))
        self.head_forwards += 1
        return logits.argmax(-1).reshape(k, rows).T

    def propose(self, batch: DraftInput) -> Drafts:
        """One head pass over every row that has a hidden state to read."""
        drafts: list[list[int]] = [[] for _ in batch.rows]
        wanted, states = [], []
        for i, row in enumerate(batch.rows):
            # row.hidden[layer]: [n, hidden], n = len(token_ids) - 1 - num_kv_computed >= 1,
            # the positions committed since this method was last handed the row, the
            # newest (position len(token_ids) - 2) last: its LM head gave token_ids[-1]
            h = row.hidden.get(self.layer) if row.hidden is not None else None
            if h is None or h.shape[0] == 0:  # never, per the docs: counted, not trusted
                self.rows_without_hidden += 1
                continue
            if row.max_draft > 0:
                wanted.append((i, min(self.k, row.max_draft)))
                states.append(h[-1])
        if wanted:
            tokens = self.heads(torch.stack(states), max(n for _, n in wanted)).tolist()
            for (i, n), row_tokens in zip(wanted, tokens):
                drafts[i] = [int(t) for t in row_tokens[:n]]
        return Drafts.from_lists(drafts)

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Stateless: nothing to learn from verification."""

    def release(self, req_id: str) -> None:
        """Stateless: no per-request state to drop."""

    def stats(self) -> dict[str, Any]:
        """Counters for ``generate --json`` and ``llm.engine.spec.proposer_stats()``."""
        return {"head_forwards": self.head_forwards,
                "rows_without_hidden": self.rows_without_hidden}
