"""DSpark's training objective on a reduced draft vocabulary, rule by rule.

DeepSpec ``deepspec/modeling/dspark/{common,loss}.py`` and ``qwen3/modeling.py``
(``shared/reference/training.md`` §3.2), with speculators' reduced vocabulary:

1. the draft vocabulary is the ``Vd`` target ids most frequent among the training
   sequences' response tokens (the labels), ties to the lower id, ascending (as
   speculators' ``build_vocab_mappings_from_distribution`` keeps them); ids never seen
   fill it from the lowest up when the data has fewer distinct tokens;
2. anchors as DFlash's (``dflash_objective.sample_anchors``: response positions ``a``
   with a next token); the block is ``[token[a], MASK x (B-1)]`` at ``a .. a+B-1`` over
   the context before ``a``, and slot ``j`` (0 .. B-1) is labelled with ``token[a+j+1]``
   (next-token indexing: every slot drafts, the engine's ``sample_from_anchor``);
3. the Markov head is teacher-forced: slot ``j``'s previous token is ``token[a+j]``
   (the anchor for slot 0), never the draft's own pick;
4. the target distribution of slot ``j`` is ``softmax(head @ final[a+j])`` over the
   target's whole vocabulary, from the recorded post-norm state (DeepSpec recomputes
   it the same way, at the label positions only);
5. per slot: ``0.1 CE + 0.9 L1 + 1.0 BCE``. CE is on the label's draft index (a label
   outside the draft vocabulary has no CE term); L1 is ``sum_v |p_d - p_t|`` over the
   whole target vocabulary, the draft's probability zero outside its vocabulary (so the
   target's mass there is a constant of the term); both on the Markov-corrected logits
   at T = 1. The confidence BCE is against the soft, detached label
   ``c* = 1 - L1 / 2`` (the chance the target accepts the slot's sample);
6. slots weigh ``exp(-j / gamma)`` (DeepSpec's code, ``loss_decay_gamma`` 4: the
   configs that produced the released drafters), normalised by the step's weight sum
   over slots whose label exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

#: rule 5's weights (DeepSpec ``ce_loss_alpha``, ``l1_loss_alpha``, ``confidence_head_alpha``)
CE_ALPHA, L1_ALPHA, CONF_ALPHA = 0.1, 0.9, 1.0
#: rule 6's gamma (DeepSpec ``loss_decay_gamma``)
DEFAULT_GAMMA = 4.0


def token_counts(sequences: list, vocab: int) -> np.ndarray:  # [vocab] int64
    """How often each target id is a response token (rule 1's counts)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for seq in sequences:
        ids = np.asarray(seq.token_ids[seq.response_start:], dtype=np.int64)
        counts += np.bincount(ids, minlength=vocab)[:vocab]
    return counts


def choose_draft_vocab(counts: np.ndarray, size: int) -> torch.Tensor:  # [size] int64
    """Rule 1: the ``size`` most frequent ids (ties to the lower id), ascending."""
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count desc, then id asc
    return torch.from_numpy(np.sort(order[:size]).astype(np.int64))


def coverage(counts: np.ndarray, ids: torch.Tensor) -> float:
    """The share of response tokens the draft vocabulary holds."""
    total = int(counts.sum())
    return float(counts[ids.numpy()].sum()) / total if total else 0.0


def next_token_blocks(
    ids: torch.Tensor,  # [T] int64
    anchors: torch.Tensor,  # [N]
    block_size: int,
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rules 2-3: blocks ``[N, B]``, labels ``[N, B]`` (target ids), which labels exist
    ``[N, B]`` bool, and each slot's previous token ``[N, B]`` (teacher-forced)."""
    t = ids.shape[0]
    at = anchors[:, None] + torch.arange(block_size)  # slot j sits at a + j
    valid = at + 1 < t
    labels = ids[(at + 1).clamp(max=t - 1)]
    prev = ids[at.clamp(max=t - 1)]
    blocks = torch.full((anchors.shape[0], block_size), mask_token_id, dtype=torch.int64)
    blocks[:, 0] = ids[anchors]
    return blocks, labels, valid, prev


@dataclass(frozen=True, slots=True)
class SlotLosses:
    """Rule 5's terms per slot ``[N, B]`` (the caller weighs and sums them)."""

    ce: torch.Tensor
    l1: torch.Tensor
    bce: torch.Tensor

    def total(self) -> torch.Tensor:
        return CE_ALPHA * self.ce + L1_ALPHA * self.l1 + CONF_ALPHA * self.bce


def target_probs(
    final: torch.Tensor,  # [N, B, H] the recorded post-norm state at a + j
    head: torch.Tensor,  # [V, H] the target's head (its dtype is the GEMM's)
    draft_ids: torch.Tensor,  # [Vd]
) -> tuple[torch.Tensor, torch.Tensor]:  # p_t at the draft ids [N, B, Vd], the rest [N, B]
    """Rule 4: the target's distribution at the draft ids, and its mass outside them."""
    n, b, h = final.shape
    logits = F.linear(final.reshape(-1, h).to(head.dtype), head).float()
    p = torch.softmax(logits, -1)
    inside = p.index_select(1, draft_ids)
    outside = (1.0 - inside.sum(-1)).clamp(min=0.0)
    return inside.view(n, b, -1), outside.view(n, b)


def slot_losses(
    logits: torch.Tensor,  # [N, B, Vd] Markov-corrected draft logits, float32
    conf_logit: torch.Tensor,  # [N, B]
    label_d: torch.Tensor,  # [N, B] int64 the label's draft index (0 where outside)
    label_in: torch.Tensor,  # [N, B] bool: the label is in the draft vocabulary
    p_in: torch.Tensor,  # [N, B, Vd] target probabilities at the draft ids
    p_out: torch.Tensor,  # [N, B] target mass outside the draft vocabulary
) -> SlotLosses:
    """Rule 5 per slot."""
    logp = torch.log_softmax(logits, -1)
    ce = -logp.gather(-1, label_d[..., None])[..., 0] * label_in
    l1 = (logp.exp() - p_in).abs().sum(-1) + p_out
    label = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)
    bce = F.binary_cross_entropy_with_logits(conf_logit, label, reduction="none")
    return SlotLosses(ce, l1, bce)


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:  # [B]
    """Rule 6: ``exp(-j / gamma)`` for j = 0 .. B-1."""
    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / gamma)


__all__ = ["CE_ALPHA", "CONF_ALPHA", "DEFAULT_GAMMA", "L1_ALPHA", "SlotLosses",
           "choose_draft_vocab", "coverage", "next_token_blocks", "slot_losses",
           "slot_weights", "target_probs", "token_counts"]
