"""Method ngram's declaration: options, refusals, capabilities, and the proposer factory.

Prompt lookup (vLLM's ``ngram``): find the longest earlier occurrence of the context's
suffix, trying n-gram lengths from ``prompt_lookup_max`` down to ``prompt_lookup_min``,
and draft the tokens that followed it. No model, no draft distribution.
"""

from __future__ import annotations

from typing import Any

from draftwise.kit import (
    Capabilities,
    InvalidValueError,
    Refusal,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator

from draftwise_ngram.lazy import lazy_factory

#: vLLM's default for both bounds when neither is set (its source calls it untuned)
DEFAULT_LOOKUP = 5
_MIN, _MAX = "prompt_lookup_min", "prompt_lookup_max"
_PROPOSER_MODULE = "draftwise_ngram.proposer"

DESCRIPTION = (
    "Prompt lookup: drafts the tokens that followed the longest earlier match of the "
    "context's suffix (n-gram lengths prompt_lookup_min..prompt_lookup_max); no model."
)
CAPABILITIES = Capabilities(needs_checkpoint=False, draft_probs=False)
#: nothing beyond what the core refuses from the capabilities (probabilistic drafting, a model)
REFUSALS: tuple[Refusal, ...] = ()


class NgramOptions(BaseModel):
    """vLLM's prompt-lookup bounds: both 5 when neither is set, one copies the other."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    prompt_lookup_min: int = Field(DEFAULT_LOOKUP, ge=1, description="shortest n-gram to match")
    prompt_lookup_max: int = Field(DEFAULT_LOOKUP, ge=1, description="longest n-gram to match")

    @model_validator(mode="before")
    @classmethod
    def _copy_missing_bound(cls, data: Any) -> Any:
        """vLLM: if only one bound is set, the other takes its value; null means unset."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in (_MIN, _MAX) and v is None)}
        if _MIN in data and _MAX not in data:
            data[_MAX] = data[_MIN]
        elif _MAX in data and _MIN not in data:
            data[_MIN] = data[_MAX]
        return data

    @model_validator(mode="after")
    def _min_not_above_max(self) -> NgramOptions:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise InvalidValueError(
                f"prompt_lookup_min={self.prompt_lookup_min} is invalid: it is larger than "
                f"prompt_lookup_max={self.prompt_lookup_max}. Instead: set "
                "prompt_lookup_min <= prompt_lookup_max.",
                key=_MIN, value=self.prompt_lookup_min,
                reason="prompt_lookup_min > prompt_lookup_max",
                instead="set prompt_lookup_min <= prompt_lookup_max",
            )
        return self


#: import the proposer only when one is built, so declaring ngram stays cheap
make_ngram_proposer = lazy_factory("ngram", _PROPOSER_MODULE, "NgramProposer", NgramOptions)
