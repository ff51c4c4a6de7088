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
reads). Every call serves all drafting rows of one block position at once; the caller
walks the positions left to right, feeding back the token just picked.

Each type's bias is ``W2 u`` for a latent ``u`` ``[R, r]`` (:meth:`MarkovHead.latent`),
and streaming ``W2`` (``[V, r]``) once per block position is the pass's whole cost.
A greedy pick needs only the argmax, which :meth:`MarkovHead.certified_argmax` finds
exactly without most of ``W2``. Each token ``v`` gets an interval that must hold its
bias ``y_v`` (the bf16 kernel's output), ``lb`` = the largest lower end of
``base_v + interval`` is at most the corrected maximum, and every token whose upper end
is under ``lb`` is out. Two intervals, the cheaper first:

1. Cauchy-Schwarz, ``|y_v| <= |W2[v]| |u|`` widened past the kernel's fp32 accumulation
   and bf16 rounding: O(V) per step, and it decides when ``|u|`` is small against the
   logit margins (vanilla, gated: ``u`` is a row of ``W1``, or a gated one);
2. a screen: ``a = Q8_0(W2) . Q8(u)`` (the core's quantized GEMM, ``models/quant.py``:
   1.06 bytes a weight against bf16's 2, integer dot products, activations int8 per 32)
   and ``|y_v - a_v| <= |W2[v] - Q8_0(W2)[v]| |u| + |Q8_0(W2)[v]| |u - Q8(u)|`` plus the
   roundings (:mod:`draftwise_dspark.screen`). The rnn's ``u = tanh(o)`` is dense with
   entries of order 1, so ``|u|`` is ~sqrt(r) times a ``W1`` row's and bound 1 is
   ~sqrt(r) looser than the bias it bounds: it never decides there; this interval,
   ~5% of bound 1's, does.

The corrected logits of the 64-output blocks of the packed ``W2`` that hold the
survivors are the same kernel's outputs for those blocks (bitwise the full product's:
each output is its own in-order accumulator), and their first maximum is the full
argmax, ties included (a token tied with the maximum is never under ``lb``). When
neither interval leaves few blocks (a bias large against the logit margin), or a value
is not finite, it answers None and the caller runs the full product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from draftwise.models.linear import BLOCK_N, BlockedWeight, Weight, linear

from draftwise_dspark.screen import Screen, build_screen

#: the bound's relative widening: bf16 rounding of the kernel's output is 2^-8 relative,
#: its fp32 accumulation over r <= 4096 terms far less; 2^-6 leaves room for both
_WIDEN = 1.0 + 2.0**-6
#: the certified pick gives up (full product) past this share of W2's blocks (or 4)
MAX_BLOCK_SHARE = 0.125
#: consecutive failures after which an interval is only retried now and then
GIVE_UP = 4
#: retry an interval once every this many calls after giving up on it
RETRY = 32


@dataclass(slots=True)
class MarkovWeights:
    """The head's tensors (``gate``/``joint`` only for their type)."""

    kind: str
    w1: torch.Tensor  # [V, r]
    w2: Weight  # [V, r], packed for this machine
    gate: tuple[Weight, torch.Tensor] | None = None  # [r, H + r], [r]
    joint: tuple[Weight, torch.Tensor] | None = None  # [3r, 2r + H], [3r]

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
        #: interval 2's quantized copy of W2 (module doc); None where it cannot be built
        self.screen: Screen | None = None
        if isinstance(w.w2, BlockedWeight):
            dense = w.w2.unpack()
            self.row_norms = dense.float().norm(dim=1)
            self.screen = build_screen(dense)
        #: per interval: consecutive calls it failed, calls skipped since (``_attempt``)
        self._misses, self._skipped = [0, 0], [0, 0]

    def init_state(self, rows: int, dtype: torch.dtype, device: torch.device
                   ) -> torch.Tensor | None:
        """The rnn state at a block's first slot (zeros); None for the stateless types."""
        if self.w.kind != "rnn":
            return None
        return torch.zeros(rows, self.w.rank, dtype=dtype, device=device)

    def latent(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:  # u [R, r], new state
        """``prev`` ``[R]`` the previous tokens, ``h`` ``[R, H]`` the slots' hidden states:
        the ``u`` whose ``W2 u`` is the bias (module doc), and the rnn's next state."""
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
        """``argmax(base + W2 u)`` per row, from the blocks of W2 the intervals cannot rule
        out (module doc), cheaper interval first; None when neither certifies cheaply."""
        norms, w2, screen = self.row_norms, self.w.w2, self.screen
        if norms is None or not isinstance(w2, BlockedWeight) or u.dtype != torch.bfloat16:
            return None
        for tier in (0, 1):
            if (tier == 1 and screen is None) or not self._attempt(tier):
                continue
            if screen is None or tier == 0:
                coef = u.float().norm(dim=1, keepdim=True) * _WIDEN  # [R, 1]
                mid, per_token = base, norms[None, :]
                bmax = coef[:, 0] * norms.max()
            else:
                approx, coef = screen.approx(u)
                mid, per_token = base + approx, screen.norms
                bmax = coef @ screen.norms_max
            hi = torch.addmm(mid, coef, per_token)  # [R, V]: every corrected logit's upper
            lo = torch.addmm(mid, coef, per_token, alpha=-1.0)  # and lower end
            pick = self._pick(base, u, lo, hi, bmax, w2)
            self._misses[tier] = 0 if pick is not None else self._misses[tier] + 1
            if pick is not None:
                return pick
        return None

    def _attempt(self, tier: int) -> bool:
        """Whether to try interval ``tier`` now: always, until it has failed
        :data:`GIVE_UP` times in a row (a head whose bias is large against its logit
        margins for that interval, where trying only costs), then once every
        :data:`RETRY` calls. Either way the pick is the same token: this only moves time."""
        if self._misses[tier] < GIVE_UP:
            return True
        self._skipped[tier] += 1
        return self._skipped[tier] % RETRY == 0

    def _pick(self, base: torch.Tensor, u: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
              bmax: torch.Tensor, w2: BlockedWeight) -> torch.Tensor | None:
        """The argmax given ``lo <= corrected <= hi`` ``[R, V]``: ``lb = max lo`` is at most
        each row's maximum, and only the blocks with some ``hi >= lb`` are computed
        exactly, in one call. The fp32 sums behind ``lo``, ``hi`` round by at most 2^-24
        of magnitudes near ``|lb| + 2 bmax`` for the tokens that matter; ``tol`` is 16
        times that."""
        rows, v = base.shape
        lb = lo.amax(dim=1)  # [R]
        full = v // BLOCK_N * BLOCK_N
        top = hi[:, :full].view(rows, -1, BLOCK_N).amax(dim=2)  # [R, V // 64]
        if full < v:
            top = torch.cat([top, hi[:, full:].amax(dim=1, keepdim=True)], dim=1)
        if not bool(torch.isfinite(lb).all() & torch.isfinite(top).all()):
            return None
        tol = (lb.abs() + 2.0 * bmax + 1.0) * 2.0**-20
        blocks = (top >= (lb - tol)[:, None]).any(dim=0).nonzero().flatten()
        if blocks.numel() > max(4, MAX_BLOCK_SHARE * w2.data.shape[0]):
            return None
        cols, corrected = self._exact(base, u, blocks)
        return cols[corrected.argmax(dim=1)]

    def _exact(self, base: torch.Tensor, u: torch.Tensor, blocks: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:  # cols [n], corrected [R, n]
        """The corrected logits of the tokens in ``blocks`` (ascending 64-output block
        ids), bitwise the full pass's: the same kernel over those blocks of packed W2,
        and the same fp32 add. Columns past V (the padded last block) are dropped."""
        w2 = self.w.w2
        if not isinstance(w2, BlockedWeight):
            raise RuntimeError("the certified pick needs the packed W2")
        sub = BlockedWeight(w2.data.index_select(0, blocks), blocks.numel() * BLOCK_N,
                            w2.in_features)
        cols = (blocks[:, None] * BLOCK_N + torch.arange(BLOCK_N)).flatten()  # ascending
        keep = cols < base.shape[1]
        return cols[keep], base.index_select(1, cols[keep]) + linear(u, sub).float()[:, keep]


__all__ = ["MarkovHead", "MarkovWeights"]
