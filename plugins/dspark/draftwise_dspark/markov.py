"""DSpark's Markov head: a low-rank transition bias added to each slot's base logits.

DeepSpec ``markov_head.py`` (``shared/reference/drafter-formats.md`` §2.2), with
``e = W1[prev]`` (``markov_w1``, an embedding ``[V, r]``) and ``W2`` (``markov_w2``,
Linear ``r -> V``, no bias):

- ``vanilla``: ``bias = W2 e`` (a rank-r bigram bias);
- ``gated``: ``bias = W2 (sigmoid(G [h; e]) * e)``, ``G`` = ``gate_proj`` ``[r, H + r]``;
- ``rnn``: ``[g, c, o] = J [s; e; h]`` (``joint_proj`` ``[3r, 2r + H]``),
  ``s' = sigmoid(g) s + (1 - sigmoid(g)) tanh(c)``, ``bias = W2 tanh(o)``; ``s`` starts
  at zero at each block's first slot.

``h`` is the slot's backbone output after the draft's final norm (what the LM head
reads). With a reduced draft vocabulary (:mod:`draftwise_dspark.draft_vocab`) ``W2`` has
the draft's rows and ``W1`` the verifier's (speculators' ``MarkovHead``): the bias and
the pick are in draft-index space, and a pick fed back as the next previous token goes
through the map first (:meth:`MarkovHead.feed`). ``G`` and ``J`` run on the core's
packed GEMM where the loader packed them (rows independent of the batch, unlike torch's
bf16 ``F.linear`` on this machine). Every call serves all drafting rows of one block
position at once; the caller walks the positions left to right, feeding back the token
just picked.

Each type's bias is ``W2 u`` for a latent ``u`` ``[R, r]`` (:meth:`MarkovHead.latent`),
and streaming ``W2`` (``[V, r]``) once per block position is the pass's whole cost.
A greedy pick needs only the argmax, which :meth:`MarkovHead.certified_argmax` finds
exactly without most of ``W2``: by Cauchy-Schwarz ``|W2[v] . u| <= |W2[v]| |u|``, so
with ``b_v`` that bound widened past the kernel's fp32 accumulation and bf16 rounding,
``lb = max_v (base_v - b_v)`` is at most the corrected maximum, and every token with
``base_v + b_v < lb`` is out. The corrected logits of the 64-output blocks of the packed
``W2`` that hold the survivors are the same kernel's outputs for those blocks (bitwise
the full product's: each output is its own in-order accumulator), and their first
maximum is the full argmax, ties included. When the bound leaves too many blocks (a
bias large against the logit margin), or a value is not finite, it answers None and
the caller runs the full product.

All-greedy passes on packed weights run natively (:mod:`draftwise_dspark.native`, one C
call with this screen, the windows of :mod:`draftwise_dspark.lookahead` and a fused
product and argmax: bitwise these tokens); this module's pass is the reference, and what
runs for sampled rows and where the C kernels are not built.

For ``rnn`` it never answers: ``u = tanh(o)`` is dense with entries of order 1, so
``|u|`` is ~sqrt(r) times a ``W1`` row's and the bound ~sqrt(r) times looser than the
bias it bounds (on ``benchmarks/dspark_step.py``'s drafter, r = 256: ``|u|`` ~7 against
vanilla's ~0.3, a window of ~4.6 logits against a base spread of ~0.5). An exact
quantized screen (Q8_0 ``W2`` through the core's quantized GEMM with a proven interval)
certified every rnn step but measured no cheaper in the engine (it still streams
``V x r`` weights), so it is not here; the rnn pass runs the full product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from draftwise.kit import BLOCK_N, BlockedWeight, Weight, linear

from draftwise_dspark.draft_vocab import DraftVocab, to_target

#: the bound's relative widening: bf16 rounding of the kernel's output is 2^-8 relative,
#: its fp32 accumulation over r <= 4096 terms far less; 2^-6 leaves room for both
_WIDEN = 1.0 + 2.0**-6
#: the certified pick gives up (full product) past this share of W2's blocks (or 4)
MAX_BLOCK_SHARE = 0.125


@dataclass(slots=True)
class MarkovWeights:
    """The head's tensors (``gate``/``joint`` only for their type)."""

    kind: str
    w1: torch.Tensor  # [V, r], V the verifier's vocabulary
    w2: Weight  # [Vd, r], packed for this machine; Vd the draft's (V unless reduced)
    gate: tuple[Weight, torch.Tensor] | None = None  # [r, H + r], [r]
    joint: tuple[Weight, torch.Tensor] | None = None  # [3r, 2r + H], [3r]
    #: a reduced draft vocabulary (W2's rows are draft indices), or None
    vocab: DraftVocab | None = None

    @property
    def rank(self) -> int:
        """r."""
        return int(self.w1.shape[1])


class MarkovHead:
    """The bias of one block position for a batch of rows (module doc)."""

    def __init__(self, w: MarkovWeights) -> None:
        self.w = w
        #: |W2[v]| in fp32, for the certified argmax (packed native W2 only: its
        #: blocks are what the pick recomputes bitwise)
        self.row_norms: torch.Tensor | None = None
        if isinstance(w.w2, BlockedWeight):
            self.row_norms = w.w2.unpack().float().norm(dim=1)
        self._w2_rows: torch.Tensor | None = None

    def w2_rows(self) -> torch.Tensor:  # [V, r]
        """``W2`` dense, unpacked once on first use: the look-ahead guesses gather rows."""
        if self._w2_rows is None:
            if not isinstance(self.w.w2, BlockedWeight):
                raise RuntimeError("W2's dense rows are only kept for a packed W2")
            self._w2_rows = self.w.w2.unpack()
        return self._w2_rows

    def feed(self, pick: torch.Tensor) -> torch.Tensor:  # [R] -> [R]
        """The previous-token ids (``W1``'s rows, the verifier's) of draft picks."""
        return to_target(self.w.vocab, pick)

    def init_state(self, rows: int, dtype: torch.dtype, device: torch.device
                   ) -> torch.Tensor | None:
        """The rnn state at a block's first slot (zeros); None for the stateless types."""
        if self.w.kind != "rnn":
            return None
        return torch.zeros(rows, self.w.rank, dtype=dtype, device=device)

    def latent(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:  # u [R, r], new state
        """``prev`` ``[R]`` the previous tokens (verifier ids), ``h`` ``[R, H]`` the slots'
        hidden states: the ``u`` whose ``W2 u`` is the bias (module doc), and the rnn's
        next state."""
        w = self.w
        e = F.embedding(prev, w.w1)
        if w.kind == "gated":
            if w.gate is None:
                raise RuntimeError("gated Markov head without gate_proj")
            return torch.sigmoid(linear(torch.cat([h, e], -1), *w.gate)) * e, state
        if w.kind == "rnn":
            if w.joint is None or state is None:
                raise RuntimeError("rnn Markov head without joint_proj or state")
            r = w.rank
            gco = linear(torch.cat([state, e, h], -1), *w.joint)
            gate = torch.sigmoid(gco[:, :r])
            state = gate * state + (1 - gate) * torch.tanh(gco[:, r : 2 * r])
            return torch.tanh(gco[:, 2 * r :]), state
        return e, state

    def bias(self, u: torch.Tensor) -> torch.Tensor:  # [R, V] float32
        """``W2 u`` over the whole vocabulary."""
        return linear(u, self.w.w2).float()

    def certified_argmax(self, base: torch.Tensor, u: torch.Tensor
                         ) -> torch.Tensor | None:  # [R] int64, or None: run the full bias
        """``argmax(base + W2 u)`` per row, from the blocks of W2 the bound cannot rule
        out (module doc); None when it cannot certify cheaply."""
        norms, w2 = self.row_norms, self.w.w2
        if norms is None or not isinstance(w2, BlockedWeight) or u.dtype != torch.bfloat16:
            return None
        bound = norms * (u.float().norm(dim=1, keepdim=True) * _WIDEN)  # [R, V]
        bound += 1e-6 * (base.abs() + 1.0)  # the fp32 add of base and bias
        lb = (base - bound).amax(dim=1, keepdim=True)
        if not bool(torch.isfinite(lb).all()):
            return None
        alive = (base + bound >= lb).any(dim=0)  # [V]: a token some row cannot rule out
        v = base.shape[1]
        pad = -v % BLOCK_N
        if pad:
            alive = F.pad(alive, (0, pad))
        blocks = alive.view(-1, BLOCK_N).any(dim=1).nonzero().flatten()
        if blocks.numel() == 0 or blocks.numel() > max(4, MAX_BLOCK_SHARE * w2.data.shape[0]):
            return None
        sub = BlockedWeight(w2.data.index_select(0, blocks), blocks.numel() * BLOCK_N,
                            w2.in_features)
        cols = (blocks[:, None] * BLOCK_N + torch.arange(BLOCK_N)).flatten()  # ascending
        keep = cols < v
        corrected = base.index_select(1, cols[keep]) + linear(u, sub).float()[:, keep]
        return cols[keep][corrected.argmax(dim=1)]


def store_pick(
    tok: torch.Tensor,  # [total_drafts] drafted tokens, flat over the rows
    q: torch.Tensor | None,  # [total_drafts, vocab] draft probabilities, or None (greedy)
    at: torch.Tensor,  # [live rows] the flat slots this position fills
    pick: torch.Tensor,  # [live rows]
    q_pick: torch.Tensor | None,  # [live rows, vocab], or None: a one-hot q at the pick
) -> None:
    """Record one position's picks and their q for the live rows (one place for the plain
    pass and the look-ahead windows, whose outputs must be bitwise the same)."""
    tok[at] = pick
    if q is None:
        return
    if q_pick is None:
        q[at, pick] = 1.0
    else:
        q[at] = q_pick


__all__ = ["MarkovHead", "MarkovWeights", "store_pick"]
