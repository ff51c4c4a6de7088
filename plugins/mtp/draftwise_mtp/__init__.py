"""draftwise-mtp: multi-token-prediction heads (Qwen3.5 ``mtp.*``, DeepSeek nextn) as drafters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import Speculator, hookimpl

from draftwise_mtp.loader import MtpLoader
from draftwise_mtp.options import ALIASES, CAPABILITIES, DESCRIPTION, REFUSALS, MtpOptions

if TYPE_CHECKING:
    from draftwise.kit import Proposer, ProposerContext, RegisterSpeculator
    from pydantic import BaseModel


def make_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """The head the draft stage loaded (``ctx.draft``), over the KV the core allocated."""
    from draftwise_mtp.proposer import MtpProposer

    if ctx.kv_cache is None:
        raise ValueError("mtp keeps its KV in the core's pool; ctx.kv_cache is missing")
    return MtpProposer(
        ctx.draft, ctx.target.model, ctx.num_speculative_tokens, ctx.kv_cache, ctx.block_size,
        probabilistic=ctx.draft_sample_method == "probabilistic",
    )


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``mtp`` and vLLM's 26 MTP model types as its aliases."""
    register(
        Speculator(
            method="mtp",
            options=MtpOptions,
            make_proposer=make_proposer,
            aliases=ALIASES,
            refusals=REFUSALS,
            loader=MtpLoader(),
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
