"""Drafting helpers model-based proposers share: picking draft tokens and their q.

``draft_sample_method`` (vLLM): ``greedy`` drafts the argmax and leaves q one-hot (verify
accepts with p(x)); ``probabilistic`` samples each random row's draft from its processed
draft distribution (the request's temperature, min-p, top-k, top-p: the same code as the
target's p) and returns that distribution as q, which standard and block verification
use. Greedy requests always draft the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from draftwise.logits_process import TokenHistory, apply_logits_processors
from draftwise.sampling import (
    SamplingMetadata,
    SamplingParams,
    argmax_rows,
    categorical,
    draw_uniforms,
)


def pick_draft_tokens(
    logits: torch.Tensor,  # [R, V] float32 draft logits, one row per drafting request
    params: Sequence[SamplingParams],  # [R]
    generators: Sequence[torch.Generator | None],  # [R]
    probabilistic: bool,
    histories: Sequence[TokenHistory | None] | None = None,  # [R] each row's next position
) -> tuple[torch.Tensor, torch.Tensor | None]:  # tokens [R] int64, q [R, V] float32 or None
    """One draft token per row, and q when any row sampled (greedy rows get one-hot q).

    With ``histories`` (target-vocabulary logits only), each row's logits first get the
    request's penalties, bias and masks at the drafted position, as the target's will in
    verify: not needed for exactness (q is whatever the draft sampled from) but the draft
    then proposes what the processed target is likely to accept.
    """
    if histories is not None and any(h is not None for h in histories):
        logits = apply_logits_processors(logits, np.arange(len(histories) + 1), histories)
    if not probabilistic:
        return argmax_rows(logits), None
    meta = SamplingMetadata.from_params(params)
    if meta.all_greedy:
        return argmax_rows(logits), None
    tokens = torch.empty(logits.shape[0], dtype=torch.int64)
    q = torch.zeros(logits.shape, dtype=torch.float32)
    greedy = np.flatnonzero(meta.greedy)
    if greedy.size:
        gi = torch.from_numpy(greedy)
        tokens[gi] = argmax_rows(logits[gi])
        q[gi, tokens[gi]] = 1.0
    rand = np.flatnonzero(~meta.greedy)
    ri = torch.from_numpy(rand)
    probs = meta.select(rand).probs(logits[ri])
    u = draw_uniforms([generators[i] for i in rand.tolist()], [1] * len(rand))
    tokens[ri] = categorical(probs, u)
    q[ri] = probs
    return tokens, q


__all__ = ["pick_draft_tokens"]
