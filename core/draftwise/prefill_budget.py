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
rather than growing with it. A position whose logits are kept for ``prompt_logprobs``
also pays for the LM head (:func:`logits_share`), and its log-softmax and top-k run in
the same step, so such a prompt's chunks are shorter again. The bound is in tokens and positions only, never in measured
time, so the same requests give the same steps on any machine (the tests count them).

With no row decoding, prefill takes the whole ``max_num_batched_tokens``: nobody waits
on the step but the prompts themselves, and bigger chunks run faster. A newcomer that
could start is the exception: prompts already running are then held to the bound and
leave it half, so a short request arriving behind a long prompt starts at once
(``Scheduler.schedule``).
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
    #: of its layers (:func:`attention_context_scale`)
    context_scale: int
    #: what a position whose logits are computed (``prompt_logprobs``) adds to its
    #: token's cost, as a share of the layers' (:func:`logits_share`)
    logits_share: float = 0.0

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.threshold}")
        if self.context_scale < 1:
            raise ValueError(f"context_scale must be >= 1, got {self.context_scale}")
        if self.logits_share < 0:
            raise ValueError(f"logits_share must be >= 0, got {self.logits_share}")

    @property
    def enabled(self) -> bool:
        """Whether decode rows bound prefill at all."""
        return self.threshold > 0

    def _linear(self, logits: bool) -> int:
        """A token's cost apart from its attention, in work units (``2K`` a token)."""
        k = self.context_scale
        return 2 * k + (round(2 * k * self.logits_share) if logits else 0)

    def work(self, start: int, num_tokens: int, logits: bool = False) -> int:
        """The work of computing positions ``start .. start + num_tokens - 1`` (each with
        its logits when ``logits``), in integer units of ``1 / 2K`` of a token at context
        0: ``sum(2K + 2(p + 1))`` over the positions, exact."""
        n = num_tokens
        return self._linear(logits) * n + 2 * n * start + n * (n + 1)

    @property
    def limit(self) -> int:
        """A step's prefill work while a row decodes: ``threshold`` tokens from position 0."""
        return self.work(0, self.threshold)

    def tokens(self, start: int, need: int, spent: int, logits: bool = False) -> int:
        """The most of a row's next ``need`` prompt tokens from ``start`` whose work fits
        in what the step has left (``limit - spent``). A step's first prefill row gets at
        least one token, so a prompt always makes progress."""
        left = self.limit - spent
        n = 0
        if left > 0:  # the largest n with n^2 + (linear + 2s + 1) n <= left
            b = self._linear(logits) + 2 * start + 1
            n = int((-b + math.sqrt(b * b + 4 * left)) / 2)
            while n > 0 and self.work(start, n, logits) > left:
                n -= 1
            while self.work(start, n + 1, logits) <= left:
                n += 1
        n = min(need, n)
        return max(n, 1) if spent == 0 and need > 0 else n


def attention_context_scale(config: Any) -> int:
    """``K`` for a decoder: multiply-adds per token of a layer's projections and MLP
    over its attention's per key (``2 * heads * head_dim``: scores and values), divided
    by the share of layers that attend (hybrid models' linear-attention layers do not).

    A count of multiply-adds, not a timing: the SmolLM2-135M default model gets 3,072.
    ``config``: a ``ModelConfig``, or a hybrid's (its ``base`` holds the shapes).
    """
    types = getattr(config, "layer_types", None)
    config = getattr(config, "base", config)
    per_key = 2 * config.num_attention_heads * config.head_dim
    share = 1.0 if not types else sum(t == "full_attention" for t in types) / len(types)
    if share == 0:
        raise ValueError("a model with no attention layer has no context scale")
    return max(1, round(_layer_macs(config) / per_key / share))


def logits_share(config: Any) -> float:
    """A logits row's multiply-adds (``hidden * vocab``) over a token's in all layers:
    0.27 on the default model, whose 49,152-token vocabulary is large for its size."""
    config = getattr(config, "base", config)
    return config.hidden_size * config.vocab_size / (
        config.num_hidden_layers * _layer_macs(config))


def _layer_macs(config: Any) -> int:
    """One token's multiply-adds in a layer's projections (q, k, v, o) and MLP."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim, kv_heads = config.head_dim, config.num_key_value_heads
    return hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim + 3 * config.intermediate_size)


__all__ = ["PrefillBudget", "attention_context_scale", "logits_share"]
