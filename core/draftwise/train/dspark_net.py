"""The DSpark drafter as a trainable torch module, in speculators' parameter names.

DSpark's backbone is DFlash's (the dspark plugin runs it through the dflash plugin's
``DFlashModel``), so :class:`DSparkNet` is :class:`~draftwise.train.dflash_net.DFlashNet`
with DeepSpec's two heads added (``shared/reference/drafter-formats.md`` §2.2-2.3):

1. the Markov head, vanilla: ``markov_w1`` an embedding ``[V, r]`` over the TARGET's
   vocabulary (the previous token is a target id), ``markov_w2`` a Linear ``r -> Vd``
   into the draft vocabulary; the bias of slot ``j`` is ``W2 W1[prev_j]``;
2. the confidence head: ``proj`` a Linear ``H + r -> 1`` over ``[h_j ; W1[prev_j]]``
   (``confidence_head_with_markov``), a logit of slot ``j``'s acceptance chance.

The LM head (the target's rows at the draft vocabulary) and the embedding are the
target's, frozen, and not parameters here. Initialisation: the body as DFlash's
(transformers' Qwen3 init), ``W1`` as ``nn.Embedding``'s (N(0, 1)), ``W2`` and the
confidence head at zero, so the untrained drafter's corrected logits are its base logits
and its confidence 0.5, and ``W2``'s first gradients are those of a bigram bias over
``W1``'s features (two small random factors start near a saddle: the speculators note
that the Markov factors barely train at a low rate).

``state_dict()`` keys are speculators' DSpark names (``fc.weight``, ``layers.0...``,
``markov_head.markov_w1.weight``, ``confidence_head.proj.weight``, ...).
"""

from __future__ import annotations

import torch
from torch import nn

from draftwise.train.dflash_net import DFlashNet, DFlashShape


class MarkovHead(nn.Module):
    """Rule 1 (vanilla)."""

    def __init__(self, vocab: int, draft_vocab: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)


class ConfidenceHead(nn.Module):
    """Rule 2."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)


class DSparkNet(DFlashNet):
    """The DFlash backbone plus DSpark's heads (module doc)."""

    def __init__(self, shape: DFlashShape, draft_vocab: int, markov_rank: int) -> None:
        super().__init__(shape)
        self.draft_vocab, self.markov_rank = draft_vocab, markov_rank
        self.markov_head = MarkovHead(shape.vocab_size, draft_vocab, markov_rank)
        self.confidence_head = ConfidenceHead(shape.hidden_size + markov_rank)

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """The body as DFlash's, then the heads (module doc), from one seed."""
        super().init_weights(seed, std)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            w1 = self.markov_head.markov_w1.weight
            w1.copy_(torch.randn(w1.shape, generator=gen))
            self.markov_head.markov_w2.weight.zero_()
            self.confidence_head.proj.weight.zero_()
            self.confidence_head.proj.bias.zero_()

    def heads(self, hidden: torch.Tensor,  # [N, B, H] after the final norm
              prev: torch.Tensor,  # [N, B] int64 target ids: each slot's previous token
              ) -> tuple[torch.Tensor, torch.Tensor]:  # bias [N, B, Vd], conf logit [N, B]
        """The Markov bias and the confidence logit of every slot, ``prev`` given."""
        e = self.markov_head.markov_w1(prev)
        bias = self.markov_head.markov_w2(e)
        conf = self.confidence_head.proj(torch.cat([hidden, e], -1))[..., 0]
        return bias, conf


__all__ = ["DSparkNet"]
