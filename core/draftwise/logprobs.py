"""Log-probabilities of emitted tokens: the chosen token's and the top-n, vLLM's shape.

Which distribution (``EngineArgs.logprobs_mode``, vLLM V1's names):

- ``raw_logprobs`` (the default, as in vLLM V1): ``log_softmax`` of the target's raw
  logits at the position, before any processing (no penalty, bias, temperature or
  truncation). It says what the model thinks, whatever the request's settings.
- ``processed_logprobs``: the log of the distribution the token was drawn from: after
  penalties, bias and masks (``draftwise.logits_process``) and, for a sampling request,
  temperature and min-p / top-k / top-p (removed tokens are ``-inf``). A greedy request
  gets the processed logits' ``log_softmax`` without temperature, as vLLM does.

Speculation changes neither: the verified position that emits token ``j`` of a step has
the logits plain decoding computes for that token (the same context), and the processed
logits are what verify accepted against. A rank is 1 + the number of tokens with a
strictly larger log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from draftwise.sampling import SamplingMetadata, SamplingParams, process_logits


class LogprobsMode(str, Enum):
    """vLLM V1's ``logprobs_mode`` values this engine implements."""

    RAW = "raw_logprobs"
    PROCESSED = "processed_logprobs"


@dataclass(frozen=True, slots=True)
class Logprob:
    """One token's log-probability at a position (vLLM's ``Logprob``)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


#: per emitted position: token id -> Logprob (the chosen token first, then the top-n)
PositionLogprobs = dict[int, Logprob]


def position_logprobs(
    raw: torch.Tensor,  # [M, V] the positions' raw target logits
    processed: torch.Tensor,  # [M, V] after per-position processing (verify's logits)
    tokens: list[int],  # [M] the emitted token at each position
    params: SamplingParams,
    mode: LogprobsMode,
    decode: object = None,  # token id -> text, or None
) -> list[PositionLogprobs]:
    """The chosen token's log-probability and rank and the top ``params.logprobs``."""
    num = params.logprobs or 0
    if mode is LogprobsMode.RAW:
        lp = raw.float().log_softmax(-1)
    elif params.is_greedy:
        lp = processed.float().log_softmax(-1)
    else:
        meta = SamplingMetadata.from_params([params]).repeat(torch.tensor([len(tokens)]).numpy())
        lp = process_logits(processed, meta.temperature, meta.top_k, meta.top_p,
                            meta.min_p).log_softmax(-1)
    idx = torch.tensor(tokens, dtype=torch.int64)
    chosen = lp.gather(1, idx.unsqueeze(1))  # [M, 1]
    ranks = (lp > chosen).sum(-1) + 1  # [M]
    top = lp.topk(num, dim=-1) if num else None
    out: list[PositionLogprobs] = []
    for m, tok in enumerate(tokens):
        entry: PositionLogprobs = {
            tok: Logprob(float(chosen[m, 0]), int(ranks[m]), _text(decode, tok))
        }
        if top is not None:
            for r, (v, t) in enumerate(zip(top.values[m].tolist(), top.indices[m].tolist())):
                if t not in entry:
                    entry[t] = Logprob(float(v), r + 1, _text(decode, t))
        out.append(entry)
    return out


def _text(decode: object, tok: int) -> str | None:
    """A token's text, when a tokenizer is there to say it."""
    return None if decode is None else decode(tok)  # type: ignore[operator]


__all__ = ["Logprob", "LogprobsMode", "PositionLogprobs", "position_logprobs"]
