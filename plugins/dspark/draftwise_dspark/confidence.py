"""DSpark's confidence head: each drafted slot's predicted chance of being accepted.

DeepSpec ``AcceptRatePredictor`` (``shared/reference/drafter-formats.md`` §2.2):
``c_j = sigmoid(proj([h_j ; W1[prev_j]]))``, ``proj`` a Linear ``H (+ r) -> 1`` with
bias, the ``W1[prev_j]`` term (``markov_w1`` of the token before slot ``j``: the anchor
for slot 0) only with ``confidence_head_with_markov``. ``h_j`` is the slot's backbone
output after the final norm, what the LM head reads. The proposer verifies only the
drafts before the first ``c_j`` under the threshold (DeepSpec ``_confident_prefix_length``).

Scored in fp32 with one row-wise product and sum, so a row's score never depends on
which rows share the batch (the cut then does not either).
"""

from __future__ import annotations

import torch


class ConfidenceHead:
    """``c_j`` for a batch of slots (module doc)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor,
                 markov_w1: torch.Tensor | None) -> None:
        self.weight = weight.float().reshape(-1)  # [H (+ r)]
        self.bias = float(bias.float().reshape(-1)[0])
        self.w1 = markov_w1  # [V, r] when the head reads the previous token

    def __call__(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:  # [N] fp32
        """``hidden`` ``[N, H]`` the slots' states, ``prev`` ``[N]`` their previous tokens."""
        x = hidden.float()
        if self.w1 is not None:
            x = torch.cat([x, self.w1.index_select(0, prev).float()], -1)
        return torch.sigmoid((x * self.weight).sum(-1) + self.bias)


__all__ = ["ConfidenceHead"]
