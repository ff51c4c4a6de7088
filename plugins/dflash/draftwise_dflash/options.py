"""Method dflash's declaration: options, refusals, capabilities.

DFlash (z-lab) drafts a whole block in one forward of a small block-diffusion model
conditioned on target hidden states (``dflash_config.target_layer_ids``). vLLM forces
``parallel_drafting`` on for it; draftwise refuses an explicit ``false`` instead of
silently overriding it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from draftwise.speculator import Capabilities, Refusal

DESCRIPTION = (
    "DFlash block-diffusion drafter: one forward drafts a block, conditioned on target "
    "hidden states."
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
