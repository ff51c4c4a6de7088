"""DSparkProposer: the DFlash backbone, next-token indexing, then the Markov pass.

It is :class:`~draftwise_dflash.proposer.DFlashProposer` (same row plan, same context-KV
injection into the core's paged draft KV, same batching) with three differences, per row
of ``n`` tokens (``shared/reference/drafter-formats.md`` §2.1-2.2):

1. a tap ``-1`` is the target's embedding output of the context tokens (the core's
   hidden-state channel carries decoder layers only);
2. the block is always the full ``[anchor, MASK x (B-1)]`` at ``n-1 .. n+B-2`` with the
   draft's own embedding (a shorter block changes every slot's non-causal attention, so a
   row whose KV pages do not reach ``n+B-2`` does not draft), and slot ``j`` predicts the
   token at ``n+j`` (next-token indexing): ``w = min(B, k, row.max_draft)`` drafts;
3. ``base = lm_head(h)`` (the draft's own head) for all slots in one forward, then a
   left-to-right pass over the positions, each step one batched call for every row still
   drafting: ``logits_j = base_j + markov_bias(prev_j, h_j)``, ``prev_0`` = the anchor;
   greedy takes the argmax, ``draft_sample_method: "probabilistic"`` samples from the
   request's processed distribution of the corrected logits and keeps it as q.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from draftwise.drafting import pick_draft_tokens
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.linear import linear
from draftwise.speculator import DraftRow
from draftwise_dflash.proposer import BlockPlan, DFlashProposer, plan_blocks

from draftwise_dspark.loader import LoadedDSpark


class DSparkProposer(DFlashProposer):
    """DFlash's proposer with DSpark's block and picking (module doc)."""

    def __init__(self, draft: LoadedDSpark, target: Any, kv: KVCache, k: int, block_size: int,
                 probabilistic: bool = False) -> None:
        super().__init__(draft, target, kv, k, block_size, probabilistic)  # type: ignore[arg-type]
        self.draft = draft
        self.block = draft.cfg.block_size
        self.hidden_taps = tuple(t for t in self.taps if t >= 0)
        self.counters["markov_steps"] = 0

    def _plans(self, rows: list[DraftRow]) -> list[BlockPlan]:
        """A row drafts only when its whole block fits its KV pages."""
        return [
            p for p in plan_blocks(rows, min(self.k, self.block), self.hidden_taps)
            if (p.anchor_pos + self.block - 1) // self.block_size < len(rows[p.index].block_table)
        ]

    def context_taps(self, rows: list[DraftRow], todo: list[BlockPlan]) -> list[torch.Tensor]:
        """Rule 1: ``-1`` is the target's embedding of the context tokens."""
        hidden = iter(super().context_taps_of(rows, todo, self.hidden_taps))
        out = []
        for t in self.taps:
            if t >= 0:
                out.append(next(hidden))
                continue
            ids = [int(x) for p in todo for x in rows[p.index].token_ids[p.context.start:
                                                                        p.context.stop]]
            out.append(self.target.model.embed(torch.tensor(ids, device=self.model.device)))
        return out

    def _draft(self, rows: list[DraftRow], plans: list[BlockPlan]
               ) -> list[tuple[list[int], list[torch.Tensor]]]:
        """Rules 2-3: one backbone forward for every row, then B batched Markov steps."""
        model, dev = self.model, self.model.device
        b = self.block
        ids = [[int(rows[p.index].token_ids[-1])] + [self.mask] * (b - 1) for p in plans]
        batch = build_forward_batch(
            ids, [p.anchor_pos for p in plans], [rows[p.index].block_table for p in plans],
            self.block_size, [list(range(p.drafts)) for p in plans], device=dev,
        )
        block_index = torch.arange(b, device=dev).repeat(len(plans))
        x = F.embedding(batch.input_ids, self.draft.embed)
        hidden = model.block_hidden(x, batch, self.kv, block_index)
        hidden = hidden.index_select(0, batch.logits_indices)  # [sum w, H], row-major
        base = linear(hidden, self.draft.lm_head).float()
        self.counters["draft_forwards"] += 1
        starts = [0]
        for p in plans:
            starts.append(starts[-1] + p.drafts)
        prev = torch.tensor([ids_[0] for ids_ in ids], device=dev)
        head = self.draft.markov
        state = None if head is None else head.init_state(len(plans), hidden.dtype, dev)
        toks = [[] for _ in plans]
        qs: list[list[torch.Tensor]] = [[] for _ in plans]
        for j in range(max(p.drafts for p in plans)):
            live = [r for r, p in enumerate(plans) if p.drafts > j]
            at = torch.tensor([starts[r] + j for r in live], device=dev)
            logits = base.index_select(0, at)
            if head is not None:
                li = torch.tensor(live, device=dev)
                sub = None if state is None else state.index_select(0, li)
                bias, sub = head.bias(prev.index_select(0, li), hidden.index_select(0, at), sub)
                logits = logits + bias
                if state is not None and sub is not None:
                    state = state.index_copy(0, li, sub)
                self.counters["markov_steps"] += 1
            rep = [rows[plans[r].index] for r in live]
            tok, q = pick_draft_tokens(logits.contiguous(), [r.params for r in rep],
                                       [r.generator for r in rep], self.probabilistic)
            prev = prev.index_copy(0, torch.tensor(live, device=dev), tok.to(dev))
            for i, r in enumerate(live):
                toks[r].append(int(tok[i]))
                if self.probabilistic:
                    qs[r].append(_one_hot(int(tok[i]), logits.shape[1]) if q is None else q[i])
        return list(zip(toks, qs))


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    """q of a greedy row in a probabilistic batch."""
    q = torch.zeros(vocab, dtype=torch.float32)
    q[token] = 1.0
    return q


__all__ = ["DSparkProposer"]
