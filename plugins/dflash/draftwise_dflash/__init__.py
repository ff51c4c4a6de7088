"""draftwise-dflash: z-lab DFlash1/DFlash2 block-diffusion drafters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import LazyLoader, Speculator, hookimpl

from draftwise_dflash.options import CAPABILITIES, DESCRIPTION, REFUSALS, DFlashOptions

if TYPE_CHECKING:
    from draftwise.kit import Proposer, ProposerContext, RegisterSpeculator
    from pydantic import BaseModel


def make_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """The drafter the loader read, over the KV the core allocated for it."""
    from draftwise_dflash.proposer import DFlashProposer

    if ctx.kv_cache is None or ctx.target is None:
        raise ValueError("dflash keeps its KV in the core's pool and borrows the target's head")
    return DFlashProposer(
        ctx.draft, ctx.target, ctx.kv_cache, ctx.num_speculative_tokens, ctx.block_size,
        probabilistic=ctx.draft_sample_method == "probabilistic",
    )


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``dflash``."""
    register(
        Speculator(
            method="dflash",
            options=DFlashOptions,
            make_proposer=make_proposer,
            refusals=REFUSALS,
            loader=LazyLoader("draftwise_dflash.loader:DFlashLoader"),  # torch only when used
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
