"""DSparkProposer: the DFlash backbone, next-token indexing, the Markov pass, the cut.

It is :class:`~draftwise_dflash.proposer.DFlashProposer` (same row plan, same context-KV
injection into the core's paged draft KV, same batching) with four differences, per row
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
   greedy takes the argmax (certified from a few blocks of ``W2`` where the bound allows:
   :meth:`~draftwise_dspark.markov.MarkovHead.certified_argmax`, the same token),
   ``draft_sample_method: "probabilistic"`` samples from the request's processed
   distribution of the corrected logits and keeps it as q; the rnn head runs windows
   of positions per ``W2`` product under guessed previous tokens, kept only where the
   guess was the pick (:mod:`draftwise_dspark.lookahead`: the same tokens and q). When
   every row is greedy and the drafter is on the native GEMM, the whole pass is one C
   call instead (:mod:`draftwise_dspark.native`: the same tokens, bitwise), decided once
   at construction (``self.native``). With a reduced draft vocabulary (speculators'
   ``d2t``/``t2d``, :mod:`draftwise_dspark.draft_vocab`) ``base``, the bias and the picks
   are in draft-index space, the previous token a step reads is the pick's target id,
   and the block's drafts and q are mapped to the target's vocabulary once, after the
   pass (q zero outside the draft vocabulary);
4. with ``"draftwise": {"confidence_threshold": t}`` (t > 0) and a confidence head
   (:mod:`draftwise_dspark.confidence`), only the drafts before the first slot scored
   under t are returned (DeepSpec ``_confident_prefix_length``): lossless, since verify
   only ever sees fewer drafts; ``draft_tokens`` counts what was drafted,
   ``confidence_cut_tokens`` what was drafted and not verified.
"""

from __future__ import annotations

from typing import Any

import torch
from draftwise.kit import DraftRow, KVCache, build_forward_batch, linear, pick_draft_tokens
from draftwise_dflash.proposer import BlockPlan, DFlashProposer, plan_blocks

from draftwise_dspark.draft_vocab import scatter_q, to_target
from draftwise_dspark.loader import LoadedDSpark
from draftwise_dspark.lookahead import HitRate, can_look_ahead, lookahead_pass
from draftwise_dspark.markov import store_pick
from draftwise_dspark.native import NativeMarkov, native_pass

#: consecutive failed certifications after which the pick is only retried now and then
GIVE_UP = 4
#: retry the certified pick once every this many Markov steps after giving up
RETRY = 32


class DSparkProposer(DFlashProposer):
    """DFlash's proposer with DSpark's block, picking and confidence cut (module doc)."""

    def __init__(self, draft: LoadedDSpark, target: Any, kv: KVCache, k: int, block_size: int,
                 probabilistic: bool = False, confidence_threshold: float = 0.0) -> None:
        super().__init__(draft, target, kv, k, block_size, probabilistic)  # type: ignore[arg-type]
        self.draft = draft
        self.block = draft.cfg.block_size
        self.hidden_taps = tuple(t for t in self.taps if t >= 0)
        self.threshold = confidence_threshold
        #: Markov picks: block positions (torch pass, rows batched), row positions (native)
        self.counters["markov_steps"] = 0
        #: Markov steps whose greedy picks the bound certified without the full W2 product
        self.counters["markov_certified"] = 0
        self._certify_misses = 0  # consecutive steps the bound could not certify
        self._certify_skipped = 0
        #: drafted but not verified (rule 4): ``draft_tokens`` minus these is what verify saw
        self.counters["confidence_cut_tokens"] = 0
        #: full ``W2 u`` products run (the rnn look-ahead serves several positions with one)
        self.counters["markov_w2_products"] = 0
        #: the rnn pass's windows (:mod:`draftwise_dspark.lookahead`); False: one position
        #: per product, as the other types
        self.look_ahead = True
        self._hits = HitRate()
        #: the greedy pass as one C call (:mod:`draftwise_dspark.native`), decided here once;
        #: None: the torch pass below runs (no kernels, or a drafter it cannot take)
        self.native: NativeMarkov | None = native_pass(
            draft.markov, draft.cfg.backbone.decoder.hidden_size)
        #: Markov picks (row positions) the native pass made
        self.counters["markov_native_picks"] = 0

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
        """Rules 2-4: one backbone forward for every row, B batched Markov steps, the cut."""
        model, dev = self.model, self.model.device
        b = self.block
        anchors = [int(rows[p.index].token_ids[-1]) for p in plans]
        ids = [[a] + [self.mask] * (b - 1) for a in anchors]
        batch = build_forward_batch(
            ids, [p.anchor_pos for p in plans], [rows[p.index].block_table for p in plans],
            self.block_size, [list(range(p.drafts)) for p in plans], device=dev,
        )
        block_index = torch.arange(b, device=dev).repeat(len(plans))
        x = self.draft.embed_ids(batch.input_ids)
        hidden = model.block_hidden(x, batch, self.kv, block_index)
        hidden = hidden.index_select(0, batch.logits_indices)  # [N = sum w, H], row-major
        base = linear(hidden, self.draft.lm_head).float()
        self.counters["draft_forwards"] += 1
        tok, prev, q = self._markov_pass(rows, plans, hidden, base, anchors)
        tok, q = to_target(self.draft.vocab, tok), scatter_q(self.draft.vocab, q)
        keep = self._confident(plans, hidden, prev)
        out, at, flat = [], 0, tok.tolist()
        for p, n in zip(plans, keep):
            qs = [] if q is None else list(q[at : at + n])
            out.append((flat[at : at + n], qs))
            at += p.drafts
        return out

    def _markov_pass(self, rows: list[DraftRow], plans: list[BlockPlan], hidden: torch.Tensor,
                     base: torch.Tensor, anchors: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rule 3, left to right: position ``j`` of every row still drafting is one batched
        bias and one pick (an rnn head on the native kernel: windows of positions per
        bias, :func:`~draftwise_dspark.lookahead.lookahead_pass`); all-greedy rows on the
        native pass: one C call (:meth:`_native_pass`). Returns the tokens (draft
        indices), each slot's previous token (row-major ``[N]``, target ids) and q
        (``[N, Vd]``, probabilistic only)."""
        dev = hidden.device
        counts = [p.drafts for p in plans]
        head = self.draft.markov
        params = [rows[p.index].params for p in plans]
        gens = [rows[p.index].generator for p in plans]
        if self.native is not None and (not self.probabilistic
                                        or all(p.is_greedy for p in params)):
            return self._native_pass(hidden, base, counts, anchors)
        if self.look_ahead and head is not None and can_look_ahead(head):
            def pick(logits: torch.Tensor, live: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
                return pick_draft_tokens(logits, [params[r] for r in live],
                                         [gens[r] for r in live], self.probabilistic)

            return lookahead_pass(head, hidden, base, counts, anchors, pick, head.w2_rows(),
                                  self._hits, self.counters, self.probabilistic)
        starts = torch.tensor([0, *counts[:-1]], device=dev).cumsum(0)
        tok = torch.empty(base.shape[0], dtype=torch.int64, device=dev)
        prev_of = torch.empty_like(tok)
        q = (torch.zeros(base.shape, dtype=torch.float32) if self.probabilistic else None)
        prev = torch.tensor(anchors, device=dev)
        state = None if head is None else head.init_state(len(plans), hidden.dtype, dev)
        greedy = [not self.probabilistic or p.is_greedy for p in params]
        live = list(range(len(plans)))
        first = starts  # each live row's first slot
        for j in range(max(counts)):
            sel = [i for i, r in enumerate(live) if counts[r] > j]
            if len(sel) < len(live):  # rows whose drafts are done drop out
                keep = torch.tensor(sel, device=dev)
                live = [live[i] for i in sel]
                prev, first = prev.index_select(0, keep), first.index_select(0, keep)
                if state is not None:
                    state = state.index_select(0, keep)
            at = first + j
            logits = base.index_select(0, at)
            prev_of[at] = prev
            pick: torch.Tensor | None = None
            qj: torch.Tensor | None = None
            if head is not None:
                u, state = head.latent(prev, hidden.index_select(0, at), state)
                self.counters["markov_steps"] += 1
                if all(greedy[r] for r in live) and self._try_certify():
                    pick = head.certified_argmax(logits, u)
                    self._certify_misses = 0 if pick is not None else self._certify_misses + 1
                if pick is None:
                    logits = logits + head.bias(u)
                    self.counters["markov_w2_products"] += 1
                else:
                    self.counters["markov_certified"] += 1
            if pick is None:
                pick, qj = pick_draft_tokens(logits.contiguous(), [params[r] for r in live],
                                             [gens[r] for r in live], self.probabilistic)
            store_pick(tok, q, at, pick.to(dev), qj)
            prev = to_target(self.draft.vocab, pick.to(dev))
        return tok, prev_of, q

    def _native_pass(self, hidden: torch.Tensor, base: torch.Tensor, counts: list[int],
                     anchors: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rule 3 for all-greedy rows in one C call (:mod:`draftwise_dspark.native`): the
        same tokens and previous tokens as the torch pass; q one-hot when probabilistic."""
        if self.native is None:
            raise RuntimeError("the native Markov pass is not available for this drafter")
        tok, prev, stats = self.native.run(hidden, base, counts, anchors,
                                           screen=self._try_certify(), give_up=GIVE_UP)
        self.counters["markov_steps"] += len(tok)
        self.counters["markov_native_picks"] += len(tok)
        self.counters["markov_certified"] += stats["certified"]
        self.counters["markov_w2_products"] += stats["products"]
        self._certify_misses = 0 if stats["certified"] else (
            self._certify_misses + stats["screened"])
        q = None
        if self.probabilistic:  # every row greedy: one-hot q, as store_pick writes it
            q = torch.zeros(base.shape, dtype=torch.float32)
            q[torch.arange(len(tok)), tok] = 1.0
        return tok, prev, q

    def _try_certify(self) -> bool:
        """Whether to try the certified pick this step: always, until it has failed
        :data:`GIVE_UP` times in a row (a drafter whose bias is large against its logit
        margins, where the bound only costs), then once every :data:`RETRY` steps.
        Either path picks the same token, so this only moves time."""
        if self._certify_misses < GIVE_UP:
            return True
        self._certify_skipped += 1
        return self._certify_skipped % RETRY == 0

    def _confident(self, plans: list[BlockPlan], hidden: torch.Tensor, prev: torch.Tensor
                   ) -> list[int]:
        """Rule 4 (DeepSpec ``_confident_prefix_length``): per row, the drafts before the
        first slot whose confidence ``sigmoid(proj([h_j; W1[prev_j]]))`` is under the
        threshold; every draft when the threshold is 0."""
        counts = [p.drafts for p in plans]
        conf = self.draft.confidence
        if not self.threshold or conf is None:
            return counts
        scores = conf(hidden, prev).tolist()
        keep, at = [], 0
        for n in counts:
            cut = next((j for j in range(n) if scores[at + j] < self.threshold), n)
            keep.append(cut)
            self.counters["confidence_cut_tokens"] += n - cut
            at += n
        return keep


__all__ = ["DSparkProposer"]
