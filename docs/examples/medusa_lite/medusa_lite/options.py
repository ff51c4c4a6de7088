"""Options, refusals and capabilities of ``medusa_lite`` (no torch here)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from draftwise.kit import Capabilities, Proposer, ProposerContext, Refusal

# No checkpoint and no KV: the heads read the target's last hidden state, and the
# proposer names that layer itself (its hidden_layers property, the kit's TapsHidden).
CAPABILITIES = Capabilities(needs_target_hidden=True)

REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "draft_sample_method",
        "medusa_lite heads draft greedily and give no draft probabilities",
        'drop draft_sample_method or set it to "greedy"',
        values=("probabilistic",),
    ),
)


class MedusaLiteOptions(BaseModel):
    """The keys medusa_lite honours: how its checkpoint-less heads are initialised."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    medusa_init_std: float = Field(
        0.0, ge=0.0,
        description="std of the heads' seeded random init; 0: each head drafts the "
        "LM head's own token for the newest position",
    )
    medusa_seed: int = Field(0, ge=0, description="seed of the heads' random init")


def make_medusa_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """Build the proposer (torch is imported here, not when the plugin loads)."""
    from medusa_lite.proposer import MedusaLiteProposer

    if not isinstance(options, MedusaLiteOptions):
        raise TypeError(f"medusa_lite needs MedusaLiteOptions, got {type(options).__name__}")
    return MedusaLiteProposer(options, ctx)
