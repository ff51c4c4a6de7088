"""draftwise-draft-model: a smaller model drafts autoregressively, batched over rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import Speculator, hookimpl

from draftwise_draft_model.loader import DraftModelLoader
from draftwise_draft_model.options import CAPABILITIES, DESCRIPTION, REFUSALS, DraftModelOptions

if TYPE_CHECKING:
    from draftwise.kit import Proposer, ProposerContext, RegisterSpeculator
    from pydantic import BaseModel


def make_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """The draft the loader read (``ctx.draft``) over the KV the core allocated for it."""
    from draftwise_draft_model.proposer import DraftModelProposer

    if not isinstance(options, DraftModelOptions):
        raise TypeError(f"draft_model needs DraftModelOptions, got {type(options).__name__}")
    if ctx.kv_cache is None:
        raise ValueError("draft_model keeps its KV in the core's pool; ctx.kv_cache is missing")
    return DraftModelProposer(
        ctx.draft, ctx.kv_cache, ctx.num_speculative_tokens, ctx.block_size,
        probabilistic=ctx.draft_sample_method == "probabilistic",
        min_confidence=options.min_draft_confidence,
    )


def own_depth_stop(options: BaseModel) -> str | None:
    """``min_draft_confidence`` > 0 stops a row's draft after an unsure token: the
    drafter prices its own depth, so the core keeps fixed depth unless asked."""
    threshold = getattr(options, "min_draft_confidence", 0.0)
    return f"min_draft_confidence={threshold:g}" if threshold else None


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``draft_model``."""
    register(
        Speculator(
            method="draft_model",
            options=DraftModelOptions,
            make_proposer=make_proposer,
            refusals=REFUSALS,
            loader=DraftModelLoader(),
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
            own_depth_stop=own_depth_stop,
        )
    )
