"""``prompt_logprobs``: the target's log-probabilities of the prompt's own tokens.

vLLM's semantics: entry ``t`` is for prompt token ``t`` (the first has none: ``None``),
computed from the raw logits at position ``t - 1`` (``log_softmax``, before any
processing: penalties and masks belong to generated positions), with the actual token
and the top ``prompt_logprobs``. Speculation does not touch the prompt, so the values are
the prefill forward's whatever the speculative config.

Every prompt position needs its logits, so (as vLLM does) a prefix-cache hit is not
taken for positions still to record: :func:`cache_lookup_ids` cuts the lookup there.
A chunked prefill records each chunk's positions as it runs (:func:`logit_rows` names the
row-local positions still unrecorded), so a recompute after preemption records nothing
twice; recording is idempotent, so a step re-run after a failure is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from draftwise.logprobs import Logprob, PositionLogprobs

if TYPE_CHECKING:
    from draftwise.request import Request


def _recorded(req: Request) -> int:
    """Prompt tokens whose entry is recorded (token 0's ``None`` counts)."""
    return 1 if req.prompt_logprobs is None else len(req.prompt_logprobs)


def cache_lookup_ids(req: Request) -> np.ndarray:
    """The tokens the prefix-cache lookup may match: up to the first unrecorded entry's
    position (its logits must be computed), everything when nothing is asked."""
    if req.params.prompt_logprobs is None:
        return req.all_token_ids
    return req.all_token_ids[: _recorded(req)]


def logit_rows(req: Request, start: int, num_new: int) -> list[int]:
    """Row-local indices (``0 .. num_new-1``) whose logits give unrecorded prompt entries:
    position ``p`` gives token ``p + 1``'s entry, for ``p + 1 < num_prompt_tokens``."""
    if req.params.prompt_logprobs is None:
        return []
    lo = max(start, _recorded(req) - 1)
    hi = min(start + num_new, req.num_prompt_tokens - 1)
    return [p - start for p in range(lo, hi)]


def record(
    req: Request,
    start: int,
    rows: list[int],  # logit_rows(req, start, ...) of this step
    logits: torch.Tensor,  # [len(rows), V] their raw logits
    decode: Callable[[int], str | None],
) -> None:
    """Append the entries of ``rows`` (positions ``start + rows``) to the request."""
    if not rows:
        return
    if req.prompt_logprobs is None:
        req.prompt_logprobs = [None]
    first = start + rows[0] + 1  # the prompt token the first row's logits are for
    if first != len(req.prompt_logprobs):  # already recorded (a re-run step)
        return
    lp = logits.float().log_softmax(-1)
    toks = torch.tensor(req.prompt_token_ids[first : first + len(rows)], dtype=torch.int64)
    chosen = lp.gather(1, toks.unsqueeze(1))[:, 0]
    ranks = (lp > chosen.unsqueeze(1)).sum(-1) + 1
    num = req.params.prompt_logprobs or 0
    top = lp.topk(num, dim=-1) if num else None
    for m, tok in enumerate(toks.tolist()):
        entry: PositionLogprobs = {tok: Logprob(float(chosen[m]), int(ranks[m]), decode(tok))}
        if top is not None:
            for r, (v, t) in enumerate(zip(top.values[m].tolist(), top.indices[m].tolist())):
                if t not in entry:
                    entry[t] = Logprob(float(v), r + 1, decode(t))
        req.prompt_logprobs.append(entry)


def split_logits(
    logits: torch.Tensor,  # [sum(prompt_counts) + sampling rows, V] in the forward's order
    prompt_counts: list[int],  # per row: its prompt rows, first in the row's logits
    sample_counts: list[int],  # per row: its sampling rows after them
) -> tuple[list[torch.Tensor], torch.Tensor]:  # per row's prompt logits, verify's logits
    """Take the prompt rows out; what is left is the logits verify expects."""
    if not any(prompt_counts):
        return [logits[:0]] * len(prompt_counts), logits
    prompt, keep, at = [], [], 0
    for np_, ns in zip(prompt_counts, sample_counts):
        prompt.append(logits[at : at + np_])
        keep.extend(range(at + np_, at + np_ + ns))
        at += np_ + ns
    return prompt, logits[torch.tensor(keep, dtype=torch.int64)]


__all__ = ["cache_lookup_ids", "logit_rows", "record", "split_logits"]
