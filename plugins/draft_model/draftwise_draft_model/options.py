"""Method draft_model's declaration: options, refusals, capabilities.

A smaller model drafts autoregressively with its KV in the core's pool. ``model`` (a
GGUF file or safetensors directory of any architecture the engine loads) and
``num_speculative_tokens`` are required. vLLM's ``use_heterogeneous_vocab`` (a draft
with another tokenizer: token-level intersection) needs greedy drafting, as in vLLM;
without it the loader refuses vocabularies of different sizes, by name.
"""

from __future__ import annotations

from draftwise.kit import Capabilities, Refusal, RefusedValueError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

DESCRIPTION = (
    "A smaller model drafts autoregressively (KV in the core's pool); other tokenizers "
    "through use_heterogeneous_vocab."
)
CAPABILITIES = Capabilities(needs_checkpoint=True, own_kv_cache=True, draft_probs=True)
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "parallel_drafting",
        "parallel drafting with a draft model (vLLM's PARD path) is not implemented",
        "drop it; for block drafting use method 'dflash' or 'dspark'",
        values=(True,),
    ),
)


class DraftModelOptions(BaseModel):
    """draft_model's options: vLLM's use_heterogeneous_vocab, and draftwise's
    ``lm_head_tokens`` (a draft head over a vocabulary prefix, ``head.py``) and
    ``min_draft_confidence`` (stop drafting a row after an unsure token, ``proposer.py``
    rule 5)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    use_heterogeneous_vocab: bool = Field(
        False, description="the draft has its own tokenizer; tokens are mapped between vocabularies"
    )

    lm_head_tokens: int | None = Field(
        None, gt=0,
        description="the draft's LM head scores only the first N token ids, the special tokens "
        "and the context's (lossless: the target verifies every token; fewer bytes per draft)",
    )

    min_draft_confidence: float = Field(
        0.0, ge=0.0, le=1.0,
        description="a row drafts past a token only while the draft gave it at least this "
        "probability (the token that falls short is still verified; 0: always k drafts)",
    )

    @model_validator(mode="after")
    def _heterogeneous_needs_greedy(self, info: ValidationInfo) -> DraftModelOptions:
        """vLLM: use_heterogeneous_vocab requires draft_sample_method "greedy"."""
        core = (info.context or {}).get("core")
        method = getattr(core, "draft_sample_method", "greedy")
        if self.use_heterogeneous_vocab and method != "greedy":
            raise RefusedValueError(
                f"use_heterogeneous_vocab=true is refused with draft_sample_method="
                f"\"{method}\": draft probabilities over another vocabulary cannot be "
                "compared with the target's. Instead: use draft_sample_method \"greedy\".",
                key="use_heterogeneous_vocab", value=True,
                reason="needs greedy drafting", instead="use draft_sample_method \"greedy\"",
            )
        return self
