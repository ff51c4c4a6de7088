"""DFlashProposer: one block per drafting row, every row in one draft forward.

Per row of ``n`` tokens (the last, the anchor, has no target KV yet) with draft-KV
frontier ``s`` (``row.num_kv_computed``) and ``w = min(k, row.max_draft)`` drafts:

1. the context: target hidden states of positions ``s .. n-2`` (``row.hidden``, every
   tapped layer; the target's last layer after its final norm, because z-lab taps HF's
   ``hidden_states[id + 1]`` and HF's last entry is normed) are written as K/V at those
   positions (``DFlashModel.write_context``);
2. the block: ``[anchor, MASK x w]`` at positions ``n-1 .. n-1+w``, non-causal over the
   context and itself; slots ``1..w`` predict tokens ``n .. n+w-1`` (in-place indexing:
   the anchor slot drafts nothing). A row with fewer than k drafts runs a shorter block,
   as z-lab's loop does near ``max_length``;
3. picking: DFlash1 takes each slot's argmax, or samples each slot from the request's
   processed distribution (``draft_sample_method: "probabilistic"``, q kept), after the
   request's penalties, bias and masks where it has any (``row.history``: slot ``j`` sees
   slots ``< j``'s picks); DFlash2 walks the candidate selector
   (:func:`~draftwise_dflash.conv.selector_walk`) on unprocessed scores;
4. ``kv_valid = n - 1``: the context is right whatever verify keeps; the block's K/V
   (positions ``n-1`` on) is scratch, overwritten by the next context write.

The proposer keeps no per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from draftwise.kit import (
    DraftInput,
    DraftRow,
    Drafts,
    KVCache,
    VerifyOutcome,
    argmax_rows,
    build_forward_batch,
    categorical,
    draw_uniforms,
    pick_draft_tokens,
)

from draftwise_dflash.conv import selector_walk
from draftwise_dflash.loader import LoadedDFlash


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """What one row does this step (rules 1-2)."""

    index: int  # in the batch
    context: range  # positions whose context K/V is written
    anchor_pos: int  # n - 1
    drafts: int  # w


def plan_blocks(rows: list[DraftRow], k: int, taps: tuple[int, ...]) -> list[BlockPlan]:
    """The rows that draft, with their context and block (rows lacking hidden states for
    their new context positions do not draft)."""
    plans = []
    for i, row in enumerate(rows):
        n, s = len(row.token_ids), row.num_kv_computed
        want = min(k, row.max_draft)
        if want < 1 or s > n - 1:
            continue
        if s < n - 1:
            hidden = row.hidden or {}
            if any(t not in hidden or hidden[t].shape[0] != n - 1 - s for t in taps):
                continue
        plans.append(BlockPlan(i, range(s, n - 1), n - 1, want))
    return plans


def slots_of(table: list[int], positions: range, block_size: int) -> list[int]:
    """Flat KV slots of ``positions`` through a block table."""
    return [table[p // block_size] * block_size + p % block_size for p in positions]


class DFlashProposer:
    """The Proposer shell around :func:`plan_blocks` and :class:`DFlashModel`."""

    def __init__(self, draft: LoadedDFlash, target: Any, kv: KVCache, k: int, block_size: int,
                 probabilistic: bool = False) -> None:
        self.model, self.mask = draft.model, draft.mask_token_id
        self.target = target
        self.kv, self.k, self.block_size = kv, k, block_size
        self.probabilistic = probabilistic
        self.taps = self.model.cfg.target_layer_ids
        if len(kv.k) != self.model.num_layers or kv.block_size != block_size:
            raise ValueError(
                f"DFlash needs {self.model.num_layers} KV layers of block size {block_size}, "
                f"got {len(kv.k)} of {kv.block_size}"
            )
        self.counters = {"draft_forwards": 0, "rows_drafted": 0, "draft_tokens": 0,
                         "context_positions": 0}

    @torch.inference_mode()
    def propose(self, batch: DraftInput) -> Drafts:
        """Drafts for every row, ``min(k, row.max_draft)`` each (module doc)."""
        rows = batch.rows
        plans = self._plans(rows)
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        kv_valid = [r.num_kv_computed for r in rows]
        if plans:
            self._write_context(rows, plans)
            for p, (toks, qs) in zip(plans, self._draft(rows, plans)):
                drafts[p.index], probs[p.index] = toks, qs
                kv_valid[p.index] = p.anchor_pos
        out = Drafts.from_lists(drafts)
        out.kv_valid = kv_valid
        flat = [q for row in probs for q in row]
        if self.probabilistic and flat:
            out.draft_probs = torch.stack(flat)
        self.counters["rows_drafted"] += len(plans)
        self.counters["draft_tokens"] += sum(p.drafts for p in plans)
        return out

    def _plans(self, rows: list[DraftRow]) -> list[BlockPlan]:
        """The rows that draft this step and their blocks (a subclass may narrow them)."""
        return plan_blocks(rows, self.k, self.taps)

    def _write_context(self, rows: list[DraftRow], plans: list[BlockPlan]) -> None:
        """Rule 1 for every drafting row at once."""
        todo = [p for p in plans if len(p.context)]
        if not todo:
            return
        dev = self.model.device
        taps = self.context_taps(rows, todo)
        positions = [q for p in todo for q in p.context]
        slots = [s for p in todo
                 for s in slots_of(rows[p.index].block_table, p.context, self.block_size)]
        ctx = self.model.context_features(taps)
        self.model.write_context(ctx, torch.tensor(positions, device=dev),
                                 torch.tensor(slots, device=dev), self.kv)
        self.counters["context_positions"] += len(positions)

    def context_taps(self, rows: list[DraftRow], todo: list[BlockPlan]) -> list[torch.Tensor]:
        """One ``[T, H]`` tensor per tapped layer over ``todo``'s context positions, in
        ``self.taps`` order (dspark overrides it for its embedding-output tap)."""
        return self.context_taps_of(rows, todo, self.taps)

    def context_taps_of(self, rows: list[DraftRow], todo: list[BlockPlan],
                        layers: tuple[int, ...]) -> list[torch.Tensor]:
        """The rows' hidden states of target ``layers`` (the last one after the target's
        final norm: z-lab taps HF's ``hidden_states[id + 1]``, and HF's last is normed)."""
        taps = [torch.cat([rows[p.index].hidden[t] for p in todo])  # type: ignore[index]
                for t in layers]
        last = int(self.target.config.num_hidden_layers) - 1
        return [self.target.model.final_norm(x) if t == last else x
                for t, x in zip(layers, taps)]

    def _draft(self, rows: list[DraftRow], plans: list[BlockPlan]
               ) -> list[tuple[list[int], list[torch.Tensor]]]:
        """Rules 2-3: one block forward for all rows, then the pick per version."""
        model, target = self.model, self.target.model
        ids = [[int(rows[p.index].token_ids[-1])] + [self.mask] * p.drafts for p in plans]
        batch = build_forward_batch(
            ids, [p.anchor_pos for p in plans], [rows[p.index].block_table for p in plans],
            self.block_size, [list(range(1, p.drafts + 1)) for p in plans], device=model.device,
        )
        block_index = torch.cat([torch.arange(len(t), device=model.device) for t in ids])
        x = target.embed(batch.input_ids)
        if model.cfg.input_embedding_scale != 1.0:
            x = x * model.cfg.input_embedding_scale
        hidden = model.block_hidden(x, batch, self.kv, block_index)
        hidden = hidden.index_select(0, batch.logits_indices)
        logits = self._logits(target.lm_head(hidden))
        self.counters["draft_forwards"] += 1
        if model.w.selector is not None:
            return self._walk(rows, plans, hidden, logits)
        if any(rows[p.index].history is not None for p in plans):
            tok, q = self._pick_in_order(rows, plans, logits)
        else:
            rep = [rows[p.index] for p in plans for _ in range(p.drafts)]
            tok, q = pick_draft_tokens(logits, [r.params for r in rep],
                                       [r.generator for r in rep], self.probabilistic)
        out, at = [], 0
        for p in plans:
            span = slice(at, at + p.drafts)
            toks = tok[span].tolist()
            if not self.probabilistic:
                qs: list[torch.Tensor] = []
            elif q is None:
                qs = [_one_hot(t, logits.shape[1]) for t in toks]
            else:
                qs = list(q[span])
            out.append((toks, qs))
            at += p.drafts
        return out

    def _pick_in_order(self, rows: list[DraftRow], plans: list[BlockPlan],
                       logits: torch.Tensor  # [N, V] the block's slots, row-major
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [N], [N, V] | None
        """Rule 3 with the request's penalties, bias and masks: slot ``j`` is processed
        with the history after slots ``< j``'s picks (``history.after``), so one call per
        slot column; the block forward stays one. Exact without it (verify processes the
        target), but a draft that ignores a penalty proposes what verify rejects."""
        starts = [0]
        for p in plans:
            starts.append(starts[-1] + p.drafts)
        tok = torch.empty(logits.shape[0], dtype=torch.int64)
        q = torch.zeros(logits.shape, dtype=torch.float32) if self.probabilistic else None
        sampled = False
        picked: list[list[int]] = [[] for _ in plans]
        for j in range(max(p.drafts for p in plans)):
            live = [i for i, p in enumerate(plans) if p.drafts > j]
            at = torch.tensor([starts[i] + j for i in live])
            rs = [rows[plans[i].index] for i in live]
            hist = [None if r.history is None else r.history.after(picked[i])
                    for i, r in zip(live, rs)]
            t, qj = pick_draft_tokens(logits[at], [r.params for r in rs],
                                      [r.generator for r in rs], self.probabilistic, hist)
            tok[at] = t
            if q is not None:
                if qj is None:
                    q[at, t] = 1.0
                else:
                    q[at], sampled = qj, True
            for i, v in zip(live, t.tolist()):
                picked[i].append(v)
        return tok, q if sampled else None

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] float32
        """z-lab ``compute_logits``: ``output_multiplier``, then ``final_logit_softcapping``."""
        cfg = self.model.cfg
        if cfg.output_multiplier != 1.0:
            logits = logits * cfg.output_multiplier
        if cfg.final_logit_softcapping is not None:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits.contiguous()

    def _walk(self, rows: list[DraftRow], plans: list[BlockPlan], hidden: torch.Tensor,
              logits: torch.Tensor) -> list[tuple[list[int], list[torch.Tensor]]]:
        """DFlash2's scored walk: argmax, or (probabilistic, temperature > 0) a draw from
        ``softmax(S / T)`` over the candidates with that distribution kept as q."""
        sel = self.model.w.selector
        if sel is None:
            raise RuntimeError("DFlash2 walk without a candidate selector")
        row_of = [rows[p.index] for p in plans]

        def choose(scores: torch.Tensor, live: list[int], t: int
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
            index = argmax_rows(scores.contiguous())
            temps = [row_of[r].params.temperature for r in live]
            sampled = [j for j, temp in enumerate(temps) if self.probabilistic and temp > 0]
            if not sampled:
                return index, None
            q = torch.zeros_like(scores)
            q[torch.arange(len(live)), index] = 1.0
            js = torch.tensor(sampled)
            temp = torch.tensor([temps[j] for j in sampled], dtype=torch.float32)
            qs = torch.softmax(scores[js] / temp[:, None], dim=-1)
            u = draw_uniforms([row_of[live[j]].generator for j in sampled], [1] * len(sampled))
            index = index.clone()
            index[js] = categorical(qs, u)
            q[js] = qs
            return index, q

        anchors = [int(rows[p.index].token_ids[-1]) for p in plans]
        tokens, qs = selector_walk(sel, hidden, logits, anchors, [p.drafts for p in plans],
                                   choose, keep_q=self.probabilistic)
        return list(zip(tokens, qs))

    def stats(self) -> dict[str, Any]:
        """Draft forwards (one per step with drafting rows), rows, tokens, context written."""
        return dict(self.counters)

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Nothing to undo: the core keeps ``min(kv_valid, committed)`` of the draft KV."""

    def release(self, req_id: str) -> None:
        """No per-request state: the draft KV blocks are the request's, freed by the core."""


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    """q of a greedy row in a probabilistic batch."""
    q = torch.zeros(vocab, dtype=torch.float32)
    q[token] = 1.0
    return q


__all__ = ["BlockPlan", "DFlashProposer", "plan_blocks", "slots_of"]
