"""The checks a request passes once its prompt is tokenized: what only the model can say.

SamplingParams bounds every field on its own (``draftwise.sampling``); what needs the
model (its vocabulary, context length, tokenizer) is checked here, before the request
is queued, each refusal naming its field.
"""

from __future__ import annotations

from draftwise.errors import RequestError
from draftwise.sampling_params import SamplingParams


def check_params(
    params: SamplingParams, ids: list[int], vocab: int, max_model_len: int, has_tokenizer: bool
) -> None:
    """Refuse what this model cannot honour for this prompt, by field."""
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise RequestError("prompt_token_ids", f"token id {bad[0]} outside [0, {vocab})")
    for name, toks in (
        ("stop_token_ids", params.stop_token_ids),
        ("allowed_token_ids", params.allowed_token_ids or ()),
        ("logit_bias", tuple(params.logit_bias or ())),
    ):
        bad = [t for t in toks if t >= vocab]
        if bad:
            raise RequestError(name, f"token id {bad[0]} outside [0, {vocab}): not in this "
                               "model's vocabulary")
    if len(ids) + params.max_tokens > max_model_len:
        raise RequestError(
            "max_tokens",
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
            f"context length {max_model_len}; ask for at most {max_model_len - len(ids)} tokens",
        )
    if not has_tokenizer and params.bad_words:
        raise RequestError("bad_words", "this checkpoint has no tokenizer, so bad words cannot "
                           "be tokenized; use allowed_token_ids or logit_bias")
    if not has_tokenizer and params.stop_strings:
        raise RequestError("stop", "this checkpoint has no tokenizer, so stop strings cannot match")
    if params.structured_outputs is not None:
        _check_structured(params)


def _check_structured(params: SamplingParams) -> None:
    """A completed grammar allows only EOS, so settings that forbid EOS there contradict it."""
    if params.ignore_eos:
        raise RequestError(
            "ignore_eos",
            "ignore_eos cannot be combined with structured output: a completed grammar "
            "allows only EOS, so the output could never end there; drop ignore_eos",
        )
    if params.min_tokens:
        raise RequestError(
            "min_tokens",
            "min_tokens cannot be combined with structured output: min_tokens forbids EOS "
            "where a completed grammar allows nothing else; drop min_tokens (the grammar "
            "decides the length) or set max_tokens",
        )


__all__ = ["check_params"]
