"""draftwise-dspark: DeepSeek DSpark semi-autoregressive block drafters.

Built on draftwise-dflash (a declared dependency): DSpark is the DFlash backbone plus a
Markov transition bias, so the backbone, the context-KV injection and the batching are
the DFlash plugin's code, imported, not copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import LazyLoader, Speculator, hookimpl

from draftwise_dspark.options import CAPABILITIES, DESCRIPTION, REFUSALS, DSparkOptions

if TYPE_CHECKING:
    from draftwise.kit import Proposer, ProposerContext, RegisterSpeculator
    from pydantic import BaseModel


def make_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """The drafter the loader read, over the KV the core allocated for it."""
    from draftwise_dspark.loader import DSparkError
    from draftwise_dspark.proposer import DSparkProposer

    if ctx.kv_cache is None or ctx.target is None:
        raise ValueError("dspark keeps its KV in the core's pool")
    if ctx.confidence_threshold and ctx.draft.confidence is None:
        raise DSparkError(
            ctx.draft.path,
            f"draftwise.confidence_threshold={ctx.confidence_threshold} needs the drafter's "
            "confidence head, and its config.json has enable_confidence_head false. Instead: "
            "drop confidence_threshold, or use a drafter trained with the head.",
            key="enable_confidence_head")
    return DSparkProposer(
        ctx.draft, ctx.target, ctx.kv_cache, ctx.num_speculative_tokens, ctx.block_size,
        probabilistic=ctx.draft_sample_method == "probabilistic",
        confidence_threshold=ctx.confidence_threshold,
    )


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``dspark``."""
    register(
        Speculator(
            method="dspark",
            options=DSparkOptions,
            make_proposer=make_proposer,
            refusals=REFUSALS,
            loader=LazyLoader("draftwise_dspark.loader:DSparkLoader"),  # torch only when used
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
