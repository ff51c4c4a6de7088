"""How much prompt one step may compute while other streams are decoding.

A step's rows all wait for its one forward, so a decode row's gap between tokens is the
whole step: a 2,048-token prefill chunk (``max_num_batched_tokens``) holds every running
stream for seconds on a CPU, and a later chunk of the same prompt for longer still, since
each of its tokens attends over the whole prefix before it (issue 40: 2.2, 4.3, 6.3 s
gaps behind one 6,500-token prompt on 2 cores).

So while any running request decodes, a step's prefill is bounded by *work*, not only by
tokens: its prefill rows together may do no more than ``long_prefill_token_threshold``
tokens would do at the start of a context. A token at position ``p`` costs ``1 + (p + 1)
/ K``, where ``K`` (:func:`attention_context_scale`) is the context length at which
attention's multiply-adds for one token equal the rest of the layer's: chunks shrink as a
prompt's prefix grows, and the step's time stays near the bound at any prompt length,
rather than growing with it. The bound is in tokens and positions only, never in measured
time, so the same requests give the same steps on any machine (the tests count them).

With no row decoding, prefill takes the whole ``max_num_batched_tokens``: nobody waits
on the step but the prompts themselves, and bigger chunks run faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    """The bound on a step's prefill while a row decodes (module doc)."""

    #: prompt tokens a step may compute at the start of a context while any row decodes
    #: (vLLM's ``long_prefill_token_threshold``, counted over all the step's prefill
    #: rows); 0: no bound beyond ``max_num_batched_tokens``
    threshold: int
    #: ``K``: the context length at which a token's attention costs as much as the rest
    #: of its layer; None: context is not counted (every token costs the same)
    context_scale: int | None = None

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.threshold}")
        if self.context_scale is not None and self.context_scale < 1:
            raise ValueError(f"context_scale must be >= 1, got {self.context_scale}")

    @property
    def enabled(self) -> bool:
        """Whether decode rows bound prefill at all."""
        return self.threshold > 0

    def work(self, start: int, num_tokens: int) -> int:
        """The work of computing positions ``start .. start + num_tokens - 1``, in
        integer units (``2K`` per token at context 0; 1 per token without ``K``):
        ``sum(2K + 2(p + 1))`` over the positions, exact."""
        k = self.context_scale
        if k is None:
            return num_tokens
        return 2 * k * num_tokens + 2 * num_tokens * start + num_tokens * (num_tokens + 1)

    @property
    def limit(self) -> int:
        """A step's prefill work while a row decodes: ``threshold`` tokens from position 0."""
        return self.work(0, self.threshold)

    def tokens(self, start: int, need: int, spent: int) -> int:
        """The most of a row's next ``need`` prompt tokens from ``start`` whose work fits
        in what the step has left (``limit - spent``). A step's first prefill row gets at
        least one token, so a prompt always makes progress."""
        left = self.limit - spent
        k = self.context_scale
        if k is None:
            n = left
        else:  # the largest n with n^2 + (2K + 2s + 1) n <= left
            b = 2 * k + 2 * start + 1
            n = int((-b + math.sqrt(b * b + 4 * max(left, 0))) / 2) if left > 0 else 0
            while n > 0 and self.work(start, n) > left:
                n -= 1
            while self.work(start, n + 1) <= left:
                n += 1
        n = min(need, max(n, 0))
        return max(n, 1) if spent == 0 and need > 0 else n


def attention_context_scale(config: Any) -> int:
    """``K`` for a decoder: multiply-adds per token of a layer's projections and MLP
    over its attention's per key (``2 * heads * head_dim``: scores and values), divided
    by the share of layers that attend (hybrid models' linear-attention layers do not).

    A count of multiply-adds, not a timing: the SmolLM2-135M default model gets 3,072.
    """
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim, kv_heads = config.head_dim, config.num_key_value_heads
    per_token = hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim)
    per_token += 3 * hidden * config.intermediate_size
    per_key = 2 * heads * head_dim
    types = getattr(config, "layer_types", None)
    share = 1.0 if not types else sum(t == "full_attention" for t in types) / len(types)
    if share == 0:
        raise ValueError("a model with no attention layer has no context scale")
    return max(1, round(per_token / per_key / share))


__all__ = ["PrefillBudget", "attention_context_scale"]
