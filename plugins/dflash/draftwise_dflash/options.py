"""Method dflash's declaration: options, refusals, capabilities, and the rule for k.

DFlash (z-lab) drafts a whole block in one forward of a small block-diffusion model
conditioned on target hidden states (``dflash_config.target_layer_ids``). vLLM forces
``parallel_drafting`` on for it; draftwise refuses an explicit ``false`` instead of
silently overriding it. k: the anchor slot drafts nothing, so a block of B drafts B - 1;
``num_speculative_tokens`` is required (as the issue and vLLM's dflash usage ask) and may
not exceed B - 1. A smaller k runs a shorter block, as z-lab's ``dflash_generate(...,
block_size=k + 1)`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise.kit import Capabilities, MissingKeyError, Refusal, RefusedValueError
from pydantic import BaseModel, ConfigDict, Field

DESCRIPTION = (
    "DFlash1/DFlash2 block-diffusion drafters (z-lab): one non-causal forward drafts a "
    "block, conditioned on target hidden states. Formats: safetensors directory (bf16/fp16/"
    "fp32, NVFP4 ModelOpt or compressed-tensors), llama.cpp 'dflash' GGUF for DFlash1 and "
    "DFlash2 (bf16, Q8_0, Q4_K_M and the other quantized types); EXL3 refused."
)
CAPABILITIES = Capabilities(
    needs_checkpoint=True,
    needs_target_hidden=True,
    own_kv_cache=True,
    draft_probs=True,
)
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "parallel_drafting",
        "dflash always drafts its whole block in one forward (vLLM forces it on)",
        "drop parallel_drafting, or set it to true",
        values=(False,),
    ),
)


class DFlashOptions(BaseModel):
    """dflash's options: only vLLM's parallel_drafting, which is always on."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    parallel_drafting: bool = Field(True, description="always true for dflash")

    def check_checkpoint(
        self, num_speculative_tokens: int | None, checkpoint_config: Mapping[str, Any]
    ) -> int:
        """k is required and at most the block's B - 1 drafting slots."""
        nested = checkpoint_config.get("dflash_config") or {}
        block = nested.get("block_size", checkpoint_config.get("block_size", 16))
        k = num_speculative_tokens
        if k is None:
            raise MissingKeyError(
                "method 'dflash' needs 'num_speculative_tokens': this drafter's block is "
                f"{block}, so it drafts {block - 1} tokens per step. Instead: set "
                f"\"num_speculative_tokens\": {block - 1}.",
                key="num_speculative_tokens", reason="k is required",
                instead=f"set num_speculative_tokens to {block - 1}",
            )
        if k > block - 1:
            raise RefusedValueError(
                f"num_speculative_tokens={k} is refused: the drafter's block_size is {block} "
                f"and its anchor slot drafts nothing, so it drafts at most {block - 1}. "
                f"Instead: use num_speculative_tokens <= {block - 1}.",
                key="num_speculative_tokens", value=k, reason=f"above block_size - 1 = {block - 1}",
                instead=f"use at most {block - 1}",
            )
        return k
