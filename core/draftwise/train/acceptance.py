"""The offline acceptance estimate: what a greedy verify would accept of each drafted block.

Teacher-forced on held-out sequences of the data folder (never trained on), at evenly
spread anchors ``a`` whose whole block lies inside the sequence:

1. the drafter drafts ``d_1 .. d_{B-1}`` from the context before ``a`` (its argmax);
2. the target's greedy token after position ``p`` is ``g_p = argmax(lm_head(final_p))``,
   recomputed from the recorded post-norm state (the data folder keeps it for this);
3. slot ``k`` is accepted when every slot ``j <= k`` matched (``d_j = g_{a+j-1}``) and the
   recorded context the estimate ran on is the greedy path up to there (``token[a+j] =
   g_{a+j-1}`` for ``j < k``). On a greedy row the second condition always holds; on a
   sampled row, past the first sampled deviation the estimate stops counting (what the
   target would say there was never recorded), so it is a lower bound there;
4. the mean acceptance length is ``1 + mean accepted`` (vLLM's: the bonus token counts),
   the number of tokens a step would commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.train.dflash_net import DFlashNet
from draftwise.train.shards import Sequence


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Rule 4's number with what it was measured on."""

    mean_length: float
    anchors: int
    sequences: int
    #: share of anchors whose first k slots were all accepted, k = 1 .. B-1
    per_position: tuple[float, ...]

    def as_dict(self) -> dict[str, object]:
        return {"mean_acceptance_length": round(self.mean_length, 4), "anchors": self.anchors,
                "sequences": self.sequences,
                "accepted_through_slot": [round(x, 4) for x in self.per_position]}


def spread_anchors(length: int, response_start: int, block_size: int,
                   count: int) -> np.ndarray:  # [<= count] int64
    """Up to ``count`` anchors spread evenly over the positions whose block fits."""
    last = length - block_size + 1
    if last < response_start or count <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(response_start, last, num=count).round().astype(np.int64))


@torch.no_grad()
def estimate_acceptance(
    net: DFlashNet,
    sequences: list[Sequence],
    taps_of: object,  # Callable[[Sequence], Tensor [T, taps*H]]
    embed: torch.Tensor,  # [V, H] the target's embedding
    head: torch.Tensor,  # [V, H] the target's LM head (its dtype is the GEMMs')
    max_anchors: int = 256,
) -> Acceptance:
    """Rules 1-4 over ``sequences`` (at most ``max_anchors`` anchors in all)."""
    b = net.shape.block_size
    per_seq = max(1, -(-max_anchors // max(1, len(sequences))))
    accepted: list[torch.Tensor] = []
    used = 0
    for seq in sequences:
        ids = torch.from_numpy(np.asarray(seq.token_ids, dtype=np.int64))
        anchors = torch.from_numpy(spread_anchors(len(ids), seq.response_start, b, per_seq))
        if anchors.numel() == 0:
            continue
        used += 1
        blocks = torch.full((anchors.shape[0], b), net.shape.mask_token_id, dtype=torch.int64)
        blocks[:, 0] = ids[anchors]
        hidden = net(taps_of(seq), embed[blocks], anchors)  # type: ignore[operator]
        h = hidden.shape[-1]
        rows = hidden[:, 1:].reshape(-1, h).to(head.dtype)
        drafts = F.linear(rows, head).argmax(-1).view(-1, b - 1)
        start = seq.response_start
        final = torch.from_numpy(np.asarray(seq.states["final"][start:], dtype=np.float32))
        greedy = F.linear(final.to(head.dtype), head).argmax(-1)  # g_p for p >= start
        at = anchors[:, None] + torch.arange(b - 1)  # positions p = a + k - 1
        g = greedy[at - start]
        match = drafts == g
        on_path = torch.ones_like(match)
        on_path[:, 1:] = (ids[at[:, :-1] + 1] == g[:, :-1]).cumprod(1).bool()
        accepted.append((match & on_path).int().cumprod(1))
    if not accepted:
        return Acceptance(1.0, 0, 0, tuple(0.0 for _ in range(b - 1)))
    acc = torch.cat(accepted)  # [N, B-1] 1 while still accepted
    return Acceptance(1.0 + float(acc.sum(1).float().mean()), acc.shape[0], used,
                      tuple(float(x) for x in acc.float().mean(0)))


__all__ = ["Acceptance", "estimate_acceptance", "spread_anchors"]
