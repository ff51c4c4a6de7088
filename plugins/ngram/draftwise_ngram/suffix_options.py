"""Method suffix's declaration: vLLM's four keys, refusals, and the proposer factory.

Suffix decoding (vLLM's ``suffix``, Arctic Inference's SuffixDecoding): drafts from the
request's own context and from the outputs of earlier requests, the draft's length
following the match's length and its frequency-estimated probability. No model, no
draft distribution. It lives in draftwise-ngram's distribution beside ``ngram`` (both
are model-free lookups); the index is :mod:`draftwise_ngram.suffix_index`.
"""

from __future__ import annotations

from draftwise.kit import Capabilities, Refusal
from pydantic import BaseModel, ConfigDict, Field

from draftwise_ngram.lazy import lazy_factory

_PROPOSER_MODULE = "draftwise_ngram.suffix_proposer"

DESCRIPTION = (
    "Suffix decoding: drafts the most frequent continuation of the context's suffix in the "
    "request's own tokens and in earlier requests' outputs (per isolation key), as long as "
    "its estimated probability stays >= min_token_prob; no model."
)
#: sees_every_row: the global index records every request's output, also while adaptive
#: depth keeps the request at k = 0 (else where drafts are priced out it stays empty)
CAPABILITIES = Capabilities(needs_checkpoint=False, draft_probs=False, sees_every_row=True)
#: nothing beyond what the core refuses from the capabilities
REFUSALS: tuple[Refusal, ...] = ()


class SuffixOptions(BaseModel):
    """vLLM's suffix keys, with vLLM's defaults and its ``_validate_suffix_decoding`` bounds."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    suffix_decoding_max_tree_depth: int = Field(
        24, ge=1, description="longest match plus draft (the suffix trees' depth)")
    suffix_decoding_max_cached_requests: int = Field(
        10000, ge=0, le=2**31 - 1,
        description="earlier requests' outputs kept in the global index (0: none)")
    suffix_decoding_max_spec_factor: float = Field(
        1.0, ge=0, description="a draft is at most this times the match length")
    suffix_decoding_min_token_prob: float = Field(
        0.1, ge=0, le=1, description="stop before a draft token less likely than this")

    def default_num_speculative_tokens(self) -> int:
        """vLLM: an unset ``num_speculative_tokens`` is ``suffix_decoding_max_tree_depth``."""
        return self.suffix_decoding_max_tree_depth


#: import the proposer only when one is built, so declaring suffix stays cheap
make_suffix_proposer = lazy_factory("suffix", _PROPOSER_MODULE, "SuffixProposer", SuffixOptions)
