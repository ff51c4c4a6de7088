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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from draftwise.models.linear import Weight, linear


@dataclass(slots=True)
class MarkovWeights:
    """The head's tensors (``gate``/``joint`` only for their type)."""

    kind: str
    w1: torch.Tensor  # [V, r]
    w2: Weight  # [V, r], packed for this machine
    gate: tuple[torch.Tensor, torch.Tensor] | None = None  # [r, H + r], [r]
    joint: tuple[torch.Tensor, torch.Tensor] | None = None  # [3r, 2r + H], [3r]

    @property
    def rank(self) -> int:
        """r."""
        return int(self.w1.shape[1])


class MarkovHead:
    """The bias of one block position for a batch of rows (module doc)."""

    def __init__(self, w: MarkovWeights) -> None:
        self.w = w

    def init_state(self, rows: int, dtype: torch.dtype, device: torch.device
                   ) -> torch.Tensor | None:
        """The rnn state at a block's first slot (zeros); None for the stateless types."""
        if self.w.kind != "rnn":
            return None
        return torch.zeros(rows, self.w.rank, dtype=dtype, device=device)

    def bias(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [R, V] float32, new state
        """``prev`` ``[R]`` the previous tokens, ``h`` ``[R, H]`` the slots' hidden states."""
        w = self.w
        e = F.embedding(prev, w.w1)
        if w.kind == "gated":
            if w.gate is None:
                raise RuntimeError("gated Markov head without gate_proj")
            g = torch.sigmoid(F.linear(torch.cat([h, e], -1), *w.gate))
            return linear(g * e, w.w2).float(), state
        if w.kind == "rnn":
            if w.joint is None or state is None:
                raise RuntimeError("rnn Markov head without joint_proj or state")
            r = w.rank
            gco = F.linear(torch.cat([state, e, h], -1), *w.joint)
            gate = torch.sigmoid(gco[:, :r])
            state = gate * state + (1 - gate) * torch.tanh(gco[:, r : 2 * r])
            return linear(torch.tanh(gco[:, 2 * r :]), w.w2).float(), state
        return linear(e, w.w2).float(), state


__all__ = ["MarkovHead", "MarkovWeights"]
