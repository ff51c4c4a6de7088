"""DFlash's training objective: random anchors, masked blocks, position-weighted CE.

The published recipe (``shared/reference/training.md`` §3.1; SpecForge
``dflash_family_model.py``, DeepSpec ``sample_anchor_positions``), rule by rule:

1. anchors are drawn at random, without replacement, over a sequence's response positions
   ``a`` whose next token exists (``response_start <= a <= T - 2``), redrawn every step and
   sorted; at inference the anchor is the target's bonus token, which is always a response
   token, so prompt positions never anchor;
2. a block is ``[token[a], MASK x (B-1)]`` at positions ``a .. a+B-1`` (the net's forward
   gives it the context strictly before ``a``);
3. slot ``k`` (1 .. B-1) is labelled with the recorded token at ``a + k`` (the target's
   own token: greedy rows are its argmax, sampled rows its sample); slot 0 has no label,
   and a label past the sequence's end does not count;
4. the loss is CE weighted by ``exp(-(k-1)/gamma)``, normalised by the sum of the weights
   of the labels that count, over the whole step (gamma 7 for B=16, 5 for B=10, 4 for B=8,
   the paper's; ``B / 2`` otherwise).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: the paper's gamma per block size (A.1); other sizes take B / 2
PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """Rule 4's gamma for ``block_size``."""
    return PUBLISHED_GAMMA.get(block_size, block_size / 2)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:  # [B-1]
    """``exp(-(k-1)/gamma)`` for slots k = 1 .. B-1 (rule 4)."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def anchor_candidates(length: int, response_start: int) -> int:
    """How many positions can anchor (rule 1)."""
    return max(0, length - 1 - response_start)


def sample_anchors(length: int, response_start: int, count: int,
                   gen: torch.Generator) -> torch.Tensor:  # [N] int64, sorted
    """Rule 1: ``min(count, candidates)`` distinct anchors, drawn by ``gen``."""
    n = anchor_candidates(length, response_start)
    pick = torch.randperm(n, generator=gen)[:min(count, n)]
    return torch.sort(pick + response_start).values


def block_inputs(
    ids: torch.Tensor,  # [T] int64 the sequence
    anchors: torch.Tensor,  # [N]
    block_size: int,
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [N, B], [N, B-1], [N, B-1] bool
    """Rules 2-3: the blocks' token ids, their labels and which labels count."""
    t = ids.shape[0]
    offsets = torch.arange(1, block_size)
    at = anchors[:, None] + offsets  # [N, B-1]
    valid = at < t
    labels = ids[at.clamp(max=t - 1)]
    blocks = torch.full((anchors.shape[0], block_size), mask_token_id, dtype=torch.int64)
    blocks[:, 0] = ids[anchors]
    return blocks, labels, valid


def weighted_ce_sum(
    logits: torch.Tensor,  # [N, B-1, V]
    labels: torch.Tensor,  # [N, B-1]
    valid: torch.Tensor,  # [N, B-1] bool
    weights: torch.Tensor,  # [B-1]
) -> tuple[torch.Tensor, torch.Tensor]:  # sum of w * CE, and the plain CE per slot [B-1]
    """Rule 4's numerator for one sequence (the caller divides by the step's weight sum),
    and the unweighted CE summed per slot (for the log)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view(labels.shape)
    ce = ce * valid
    return (ce * weights).sum(), ce.detach().sum(0)


def weight_sum(valid: torch.Tensor, weights: torch.Tensor) -> float:
    """Rule 4's denominator contribution of one sequence."""
    return float((valid * weights).sum())


def check_block_size(block_size: int) -> None:
    """A block needs its anchor and at least one drafted slot."""
    from draftwise.errors import EngineConfigError

    if block_size < 2 or not math.isfinite(block_size):
        raise EngineConfigError(
            f"--block-size {block_size}: a DFlash block is the anchor plus at least one "
            "drafted slot. Instead: --block-size 2 or more (8 or 16 as published).")


__all__ = ["PUBLISHED_GAMMA", "anchor_candidates", "block_inputs", "check_block_size",
           "default_gamma", "position_weights", "sample_anchors", "weight_sum",
           "weighted_ce_sum"]
