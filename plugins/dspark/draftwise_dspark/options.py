"""Method dspark's declaration: options, refusals, capabilities, the block-size check.

DSpark (DeepSeek) drafts blocks semi-autoregressively with a Markov correction head,
conditioned on target hidden states. k defaults to the checkpoint's block size and
may not be smaller: a check that needs the checkpoint's config.json, so it is declared
here as ``DSparkOptions.check_checkpoint`` and run by the loader stage
(``ResolvedSpeculativeConfig.with_checkpoint``), still before any weights are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise.kit import Capabilities, Refusal, RefusedValueError
from pydantic import BaseModel, ConfigDict, Field

DESCRIPTION = (
    "DSpark semi-autoregressive block drafter with a Markov correction head, conditioned "
    "on target hidden states (vanilla, gated and rnn Markov heads; the confidence-head cut "
    "with draftwise.confidence_threshold). Formats: DeepSpec's native "
    "Qwen3DSparkModel safetensors directory, speculators' DSparkSpeculator (full or "
    "reduced draft vocabulary, d2t/t2d), SpecForge's DSparkDraftModel, llama.cpp's DSpark "
    "GGUF (vanilla); NVFP4 "
    "safetensors drafters (ModelOpt, compressed-tensors) dequantized at load; EXL3 "
    "drafters are refused by name."
)
CAPABILITIES = Capabilities(
    needs_checkpoint=True,
    needs_target_hidden=True,
    own_kv_cache=True,
    draft_probs=True,
    confidence_head=True,
)
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "parallel_drafting",
        "dspark always drafts its blocks in parallel (vLLM forces it on)",
        "drop parallel_drafting, or set it to true",
        values=(False,),
    ),
    Refusal(
        "dspark_draft_topk",
        "top-k drafting from the corrected logits is not implemented in draftwise yet",
        "drop dspark_draft_topk (drafts are the argmax, or with draft_sample_method "
        "'probabilistic' a draw from the request's processed corrected distribution)",
    ),
    Refusal(
        "enable_adaptive_verification",
        "vLLM's adaptive verification (a verify length chosen per request from measured "
        "cost curves and the confidence head's survival product) is not implemented in "
        "draftwise",
        "drop enable_adaptive_verification; for DeepSpec's confidence-head cut set "
        "\"draftwise\": {\"confidence_threshold\": t}",
        values=(True,),
    ),
)


def block_size(config: Mapping[str, Any]) -> int | None:
    """The draft's block size: DeepSpec/V4 top level, or the speculators' dflash_config."""
    nested = config.get("dflash_config") or {}
    for value in (
        config.get("dspark_block_size"),
        config.get("block_size"),
        nested.get("block_size"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class DSparkOptions(BaseModel):
    """vLLM's dspark keys; k is checked against the block size once the config is read
    (it must equal it: smaller gives wrong drafts, larger is not drafted)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    parallel_drafting: bool = Field(True, description="always true for dspark")
    dspark_draft_topk: int | None = Field(
        None, ge=1, description="sample drafts from the top-k of the corrected logits"
    )
    enable_adaptive_verification: bool = Field(
        False, description="let the confidence head choose how many drafts to verify"
    )

    def check_checkpoint(
        self, num_speculative_tokens: int | None, checkpoint_config: Mapping[str, Any]
    ) -> int:
        """k defaults to the block size and must be at least the block size."""
        block = block_size(checkpoint_config)
        if block is None:
            raise RefusedValueError(
                "model is refused: the dspark checkpoint's config.json declares no block "
                "size (dspark_block_size, block_size or dflash_config.block_size). "
                "Instead: point 'model' at a DSpark draft checkpoint.",
                key="model", reason="no block size in config.json",
                instead="point 'model' at a DSpark draft checkpoint",
            )
        k = num_speculative_tokens
        if k is None:
            return block
        if k < block:
            raise RefusedValueError(
                f"num_speculative_tokens={k} is refused: dspark drafts whole blocks and the "
                f"checkpoint's block size is {block}. Instead: set it to at least {block}, "
                "or leave it out to use the block size.",
                key="num_speculative_tokens", value=k, reason=f"smaller than block size {block}",
                instead=f"set it to at least {block}, or leave it out",
            )
        if k > block:
            raise RefusedValueError(
                f"num_speculative_tokens={k} is refused: dspark drafts one block of {block} "
                f"tokens per step (the checkpoint's block size) and chaining a second block "
                f"is not implemented, so {k - block} of them would never be drafted. "
                f"Instead: set it to {block}, or leave it out.",
                key="num_speculative_tokens", value=k, reason=f"larger than block size {block}",
                instead=f"set it to {block}, or leave it out",
            )
        return k
