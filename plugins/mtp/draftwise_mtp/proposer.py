"""MtpProposer: drafts k tokens per row by looping the target's own MTP head.

Position p of the head pairs token ``x_{p+1}`` with the target's last hidden state
``h_p`` (pre-final-norm): ``fc([norm(E[x_{p+1}]) ; norm(h_p)])`` -> MTP layer (own KV) ->
``norm`` -> the target's LM head predicts ``x_{p+2}``. The head's KV lives in the core's
block pool (``ProposerContext.kv_cache``, one layer per MTP layer, indexed by the
request's block table). Each propose first writes the head's KV for the positions from
``row.num_kv_computed`` to the last one with a target hidden state (``row.hidden``: the
prompt, then each step's committed tokens), which yields draft 1; then it feeds its own
output back ``k-1`` times (vLLM ``llm_base_proposer.propose``; layer ``step % layers``).
Those k-1 entries are scratch, never right even when accepted (they used the head's
output instead of the target's), so ``kv_valid`` stops before them and the next propose
overwrites them with real pairs. The proposer keeps no per-request state.

Two witnesses per propose say the loop really ran: the draft forwards (k-1 beyond the
first) and how many delivered rows are more than a copy of their first column.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from draftwise.kit import (
    AttentionMetadata,
    DraftInput,
    DraftRow,
    Drafts,
    KVCache,
    VerifyOutcome,
    build_forward_batch,
    linear,
    pick_draft_tokens,
    rms_norm,
)

from draftwise_mtp.head import MtpHead


@dataclass(slots=True)
class ProposeWitness:
    """What one propose call did (and, summed, what all of them did)."""

    draft_forwards: int = 0  # head forwards run
    extra_forwards: int = 0  # forwards beyond the first: k-1 when some row drafts k
    rows: int = 0  # rows given drafts
    rows_beyond_copy: int = 0  # rows whose drafts are not all equal to their first

    def add(self, other: ProposeWitness) -> None:
        """Fold one call into the totals."""
        self.draft_forwards += other.draft_forwards
        self.extra_forwards += other.extra_forwards
        self.rows += other.rows
        self.rows_beyond_copy += other.rows_beyond_copy


@dataclass(slots=True)
class _Row:
    """A row that drafts this call."""

    index: int  # in the batch
    row: DraftRow
    want: int  # drafts to make
    hidden: torch.Tensor  # [n - 1 - num_kv_computed, hidden]


class MtpProposer:
    """Proposer protocol over an :class:`MtpHead` sharing the target's embedding and LM head."""

    def __init__(
        self,
        head: MtpHead,
        target: Any,
        k: int,
        kv: KVCache,
        block_size: int,
        probabilistic: bool = False,
    ) -> None:
        self.head, self.target, self.k = head, target, k
        self.block_size = block_size
        self.probabilistic = probabilistic
        #: the target layer whose output the head conditions on (its last, pre-final-norm)
        self.hidden_layer = target.config.num_hidden_layers - 1
        if kv.block_size != block_size or len(kv.k) != head.num_layers:
            raise ValueError(
                f"MTP needs {head.num_layers} KV layers of block size {block_size}, got "
                f"{len(kv.k)} of {kv.block_size}"
            )
        #: one single-layer view of the core's cache per MTP layer
        self.layer_kv = [KVCache([kv.k[i]], [kv.v[i]], block_size) for i in range(len(kv.k))]
        self.last_witness = ProposeWitness()
        self.witness = ProposeWitness()

    # -- Proposer protocol ------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, batch: DraftInput) -> Drafts:
        """Up to ``min(k, row.max_draft)`` drafts per row with its hidden states delivered."""
        todo: list[_Row] = []
        for i, row in enumerate(batch.rows):
            n, start = len(row.token_ids), row.num_kv_computed
            want = min(self.k, row.max_draft)
            hidden = None if row.hidden is None else row.hidden.get(self.hidden_layer)
            if want < 1 or hidden is None or start >= n - 1 or hidden.shape[0] != n - 1 - start:
                continue
            todo.append(_Row(i, row, want, hidden))
        witness = ProposeWitness()
        drafts: list[list[int]] = [[] for _ in batch.rows]
        probs: list[list[torch.Tensor]] = [[] for _ in batch.rows]
        kv_valid = [row.num_kv_computed for row in batch.rows]
        if todo:
            self._draft(todo, drafts, probs, witness)
            for r in todo:
                kv_valid[r.index] = len(r.row.token_ids) - 1  # the real pairs only
        witness.rows = sum(1 for d in drafts if d)
        witness.rows_beyond_copy = sum(1 for d in drafts if len(set(d)) > 1)
        self.last_witness = witness
        self.witness.add(witness)
        out = Drafts.from_lists(drafts)
        out.kv_valid = kv_valid
        flat = [q for row in probs for q in row]
        if self.probabilistic and flat:
            out.draft_probs = torch.stack(flat)
        return out

    def stats(self) -> dict[str, Any]:
        """Both witnesses, for ``draftwise generate --json`` and bench reports."""
        return {"witness": asdict(self.witness), "last_witness": asdict(self.last_witness)}

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Nothing to undo: the core moved the KV frontier; scratch is overwritten next time."""

    def release(self, req_id: str) -> None:
        """No per-request state: the head's KV blocks are the request's, freed by the core."""

    # -- drafting ---------------------------------------------------------------------------
    def _draft(
        self,
        rows: list[_Row],
        drafts: list[list[int]],
        probs: list[list[torch.Tensor]],
        w: ProposeWitness,
    ) -> None:
        """First pass over the new real positions, then k-1 passes on the head's own output."""
        ids = [[int(t) for t in r.row.token_ids[r.row.num_kv_computed + 1 :]] for r in rows]
        starts = [r.row.num_kv_computed for r in rows]
        tables = [r.row.block_table for r in rows]
        hidden = torch.cat([r.hidden for r in rows])
        logits, feedback = self._forward(ids, hidden, starts, tables, 0)
        w.draft_forwards += 1
        tok = self._pick(rows, logits, drafts, probs)
        self._continue(rows, tok, feedback, drafts, probs, w)

    def _continue(
        self,
        rows: list[_Row],
        tok: torch.Tensor,  # [R] the last drafts
        feedback: torch.Tensor,  # [R, hidden] the head's own output for them
        drafts: list[list[int]],
        probs: list[list[torch.Tensor]],
        w: ProposeWitness,
    ) -> None:
        """Loop the head on its own output until every row has its drafts."""
        live = list(range(len(rows)))
        for step in range(1, max(r.want for r in rows)):
            live = [j for j in live if rows[j].want > step]
            sub = [rows[j] for j in live]
            pos = [len(r.row.token_ids) - 2 + step for r in sub]
            ids = [[int(tok[j])] for j in live]
            tables = [r.row.block_table for r in sub]
            layer = step % len(self.head.layers)
            logits, out = self._forward(ids, feedback[live], pos, tables, layer)
            w.draft_forwards += 1
            w.extra_forwards += 1
            nxt = self._pick(sub, logits, drafts, probs)
            tok, feedback = tok.clone(), feedback.clone()
            tok[live], feedback[live] = nxt, out

    def _pick(
        self,
        rows: list[_Row],
        logits: torch.Tensor,  # [R, vocab]
        drafts: list[list[int]],
        probs: list[list[torch.Tensor]],
    ) -> torch.Tensor:  # [R] the chosen tokens
        """Argmax, or a sample with its q (``draft_sample_method: probabilistic``)."""
        tok, q = pick_draft_tokens(
            logits, [r.row.params for r in rows], [r.row.generator for r in rows],
            self.probabilistic,
            [None if r.row.history is None else r.row.history.after(drafts[r.index])
             for r in rows],
        )
        for j, r in enumerate(rows):
            drafts[r.index].append(int(tok[j]))
            if self.probabilistic:
                if q is None:  # an all-greedy batch: q is one-hot
                    one = torch.zeros(logits.shape[1], dtype=torch.float32)
                    one[tok[j]] = 1.0
                    probs[r.index].append(one)
                else:
                    probs[r.index].append(q[j])
        return tok

    def _forward(
        self,
        ids: list[list[int]],
        hidden: torch.Tensor,  # [sum(len(ids)), hidden]
        starts: list[int],
        tables: list[list[int]],
        layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # logits [R, vocab] fp32, fed-back hidden [R, H]
        """One head forward over rows of (token, hidden) pairs at positions from ``starts``."""
        head, target = self.head, self.target
        batch = build_forward_batch(
            ids, starts, tables, self.block_size, [[len(t) - 1] for t in ids], device=target.device
        )
        native = head.native
        norm = _zc_norm if head.zero_centred else rms_norm
        emb = norm(target.embed(batch.input_ids), head.norm_embedding, head.eps, native)
        if head.mask_first_embedding:
            emb = emb.masked_fill((batch.positions == 0).unsqueeze(-1), 0.0)
        hid = norm(hidden.contiguous(), head.norm_hidden, head.eps, native)
        x = linear(torch.cat((emb, hid), dim=-1), head.fc)
        target.ensure_positions(batch.max_seq_len)
        mod = head.layers[layer]
        kv = self.layer_kv[layer]
        window = getattr(mod, "window", None)
        meta = AttentionMetadata.build(batch, self.block_size, {None, window},
                                       backend=head.attention, num_blocks=kv.num_blocks)
        if head.zero_centred:
            out = mod(x, target.partial_rope(batch.positions), kv, meta, batch, None)
        else:
            cos = target.rope_cos[batch.positions].unsqueeze(1)
            sin = target.rope_sin[batch.positions].unsqueeze(1)
            out = mod(x, cos, sin, kv.k[0], kv.v[0], meta)
        normed = norm(out.index_select(0, batch.logits_indices), head.final_norm, head.eps,
                      native)
        logits = (
            linear(normed, head.lm_head).float()
            if head.lm_head is not None
            else target.lm_head(normed)
        )
        return logits, normed


def _zc_norm(x: torch.Tensor, w: torch.Tensor, eps: float, native: bool) -> torch.Tensor:
    from draftwise.kit import zc_rms_norm

    return zc_rms_norm(x, w, eps, native)
