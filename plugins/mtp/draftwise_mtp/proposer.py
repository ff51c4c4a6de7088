"""MtpProposer: drafts k tokens per row by looping the target's own MTP head.

Position p of the head pairs token ``x_{p+1}`` with the target's last hidden state
``h_p`` (pre-final-norm): ``fc([norm(E[x_{p+1}]) ; norm(h_p)])`` -> MTP layer (own KV) ->
``norm`` -> the target's LM head predicts ``x_{p+2}``. Each propose first writes the
head's KV for every position whose target hidden state arrived since the last step
(the prompt, then each step's accepted tokens), which yields draft 1; then it feeds
its own output back ``k-1`` times (vLLM ``llm_base_proposer.propose``; layer
``step % num_layers``). Those k-1 entries are scratch: the next propose overwrites them
with real pairs. Target hidden states come in through :meth:`add_hidden`.

Two witnesses per propose say the loop really ran: the draft forwards (k-1 beyond the
first) and how many delivered rows are more than a copy of their first column.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.models.attention import AttentionMetadata
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.fused import rms_norm
from draftwise.speculator import DraftInput, Drafts, VerifyOutcome
from draftwise_mtp.loader import MtpHead


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
class _Seq:
    """Per-request head state: its KV blocks, how far its KV is real, pending hidden rows."""

    blocks: list[int] = field(default_factory=list)
    kv_len: int = 0  # positions 0..kv_len-1 hold real (x_{p+1}, h_p) entries
    pending: torch.Tensor | None = None  # [n, hidden]: h_p for p = kv_len .. kv_len+n-1


class MtpProposer:
    """Proposer protocol over an :class:`MtpHead` sharing the target's embedding and LM head."""

    def __init__(
        self, head: MtpHead, target: Any, k: int, num_blocks: int = 256, block_size: int = 16
    ) -> None:
        self.head, self.target, self.k = head, target, k
        self.block_size = block_size
        #: the target layer whose output the head conditions on (its last, pre-final-norm)
        self.hidden_layers = (target.config.num_hidden_layers - 1,)
        self.kv = [
            KVCache.allocate(
                1, num_blocks, block_size, target.num_kv_heads, target.head_dim, target.dtype
            )
            for _ in head.layers
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self._seqs: dict[str, _Seq] = {}
        self.last_witness = ProposeWitness()
        self.witness = ProposeWitness()

    # -- target hidden states in -----------------------------------------------------------
    def add_hidden(self, req_id: str, start: int, hidden: torch.Tensor) -> None:  # [n, hidden]
        """Target hidden states of committed positions ``start..start+n-1`` (in order)."""
        seq = self._seqs.setdefault(req_id, _Seq())
        rows = hidden.detach().to(self.target.dtype)
        if start == 0:  # a fresh prompt, or a recompute after preemption
            seq.kv_len, seq.pending = 0, rows
            return
        if seq.kv_len < 0:
            return
        have = seq.kv_len + (0 if seq.pending is None else seq.pending.shape[0])
        if start > have:  # a gap: this request cannot draft until it restarts at 0
            seq.kv_len, seq.pending = -1, None
            return
        if start < seq.kv_len or seq.pending is None:  # head KV from start on is stale
            seq.kv_len, seq.pending = start, rows
            return
        seq.pending = torch.cat((seq.pending[: start - seq.kv_len], rows))

    # -- Proposer protocol ------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, batch: DraftInput) -> Drafts:
        """Up to ``min(k, row.max_draft)`` drafts per row; none for rows it lacks hidden for."""
        rows: list[tuple[int, str, np.ndarray, int]] = []
        for i, row in enumerate(batch.rows):
            seq = self._seqs.get(row.req_id)
            n = len(row.token_ids)
            want = min(self.k, row.max_draft)
            if seq is None or seq.kv_len < 0 or seq.pending is None or want < 1:
                continue
            if seq.kv_len + seq.pending.shape[0] < n - 1 or seq.kv_len >= n - 1:
                continue
            rows.append((i, row.req_id, row.token_ids, want))
        witness = ProposeWitness()
        drafts: list[list[int]] = [[] for _ in batch.rows]
        if rows:
            self._draft(rows, drafts, witness)
        witness.rows = sum(1 for d in drafts if d)
        witness.rows_beyond_copy = sum(1 for d in drafts if len(set(d)) > 1)
        self.last_witness = witness
        self.witness.add(witness)
        return Drafts.from_lists(drafts)

    def stats(self) -> dict[str, object]:
        """Both witnesses, for ``draftwise generate --json`` and bench reports."""
        return {"witness": asdict(self.witness), "last_witness": asdict(self.last_witness)}

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Nothing to undo: scratch KV past ``kv_len`` is overwritten by the next propose."""

    def release(self, req_id: str) -> None:
        """Return the request's KV blocks."""
        seq = self._seqs.pop(req_id, None)
        if seq is not None:
            self._free.extend(seq.blocks)

    # -- drafting ---------------------------------------------------------------------------
    def _draft(
        self,
        rows: list[tuple[int, str, np.ndarray, int]],
        drafts: list[list[int]],
        w: ProposeWitness,
    ) -> None:
        """First pass over the new real positions, then k-1 passes on the head's own output."""
        ids, hid, starts, reqs = [], [], [], []
        for _, req_id, tokens, _ in rows:
            seq = self._seqs[req_id]
            n = len(tokens)
            m = n - 1 - seq.kv_len
            if seq.pending is None:  # propose() only passes rows with pending hidden
                raise RuntimeError(f"request {req_id!r} has no pending hidden states")
            ids.append([int(t) for t in tokens[seq.kv_len + 1 : n]])
            hid.append(seq.pending[:m])
            starts.append(seq.kv_len)
            reqs.append(req_id)
        logits, feedback = self._forward(reqs, ids, torch.cat(hid), starts, layer=0)
        w.draft_forwards += 1
        tok = logits.argmax(-1)
        for j, (i, req_id, tokens, _) in enumerate(rows):
            drafts[i].append(int(tok[j]))
            seq = self._seqs[req_id]
            seq.pending = seq.pending[len(ids[j]) :] if seq.pending is not None else None
            seq.kv_len = len(tokens) - 1
        self._continue(rows, drafts, tok, feedback, w)

    def _continue(
        self,
        rows: list[tuple[int, str, np.ndarray, int]],
        drafts: list[list[int]],
        tok: torch.Tensor,  # [R] last drafts
        feedback: torch.Tensor,  # [R, hidden] the head's own output for them
        w: ProposeWitness,
    ) -> None:
        """Loop the head on its own output until every row has its k drafts."""
        live = list(range(len(rows)))
        for step in range(1, max(r[3] for r in rows)):
            live = [j for j in live if rows[j][3] > step]
            reqs = [rows[j][1] for j in live]
            pos = [len(rows[j][2]) - 2 + step for j in live]
            ids = [[int(tok[j])] for j in live]
            logits, out = self._forward(
                reqs, ids, feedback[live], pos, layer=step % len(self.head.layers)
            )
            w.draft_forwards += 1
            w.extra_forwards += 1
            nxt = logits.argmax(-1)
            for n, j in enumerate(live):
                drafts[rows[j][0]].append(int(nxt[n]))
            tok = tok.clone()
            feedback = feedback.clone()
            tok[live], feedback[live] = nxt, out

    def _forward(
        self,
        reqs: list[str],
        ids: list[list[int]],
        hidden: torch.Tensor,
        starts: list[int],
        layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # logits [R, vocab] fp32, fed-back hidden [R, H]
        """One head forward over rows of (token, hidden) pairs at positions from ``starts``."""
        head, target = self.head, self.target
        tables = [self._blocks(r, s + len(t)) for r, s, t in zip(reqs, starts, ids)]
        batch = build_forward_batch(
            ids, starts, tables, self.block_size, [[len(t) - 1] for t in ids], device=target.device
        )
        norm = _zc_norm if head.zero_centred else rms_norm
        emb = norm(target.embed(batch.input_ids), head.norm_embedding, head.eps)
        if head.mask_first_embedding:
            emb = emb.masked_fill((batch.positions == 0).unsqueeze(-1), 0.0)
        x = F.linear(torch.cat((emb, norm(hidden, head.norm_hidden, head.eps)), dim=-1), head.fc)
        target.ensure_positions(batch.max_seq_len)
        cos = target.rope_cos[batch.positions].unsqueeze(1)
        sin = target.rope_sin[batch.positions].unsqueeze(1)
        mod = head.layers[layer]
        kv = self.kv[layer]
        window = getattr(mod, "window", None)
        meta = AttentionMetadata.build(batch, self.block_size, {None, window})
        if head.zero_centred:
            out = mod(x, cos, sin, kv, meta, batch, None)
        else:
            out = mod(x, cos, sin, kv.k[0], kv.v[0], meta)
        normed = norm(out.index_select(0, batch.logits_indices), head.final_norm, head.eps)
        logits = (
            F.linear(normed, head.lm_head).float()
            if head.lm_head is not None
            else target.lm_head(normed)
        )
        return logits, normed

    def _blocks(self, req_id: str, length: int) -> list[int]:
        """The request's block table, grown to hold ``length`` positions."""
        seq = self._seqs[req_id]
        while len(seq.blocks) * self.block_size < length:
            if not self._free:
                raise RuntimeError("MTP head KV cache is full; raise num_blocks")
            seq.blocks.append(self._free.pop())
        return seq.blocks


def _zc_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    from draftwise.models.qwen3_next import zc_rms_norm

    return zc_rms_norm(x, w, eps)
