"""draftwise-mtp: multi-token-prediction heads (Qwen3.5 ``mtp.*``, DeepSeek nextn) as drafters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise import hookimpl
from draftwise.speculator import Speculator
from draftwise_mtp.options import ALIASES, CAPABILITIES, DESCRIPTION, REFUSALS, MtpOptions

if TYPE_CHECKING:
    from pydantic import BaseModel

    from draftwise.plugins.hookspecs import RegisterSpeculator
    from draftwise.speculator import Proposer, ProposerContext


def make_proposer(options: BaseModel, ctx: ProposerContext) -> Proposer:
    """Load the head from the target's checkpoint (weights are read only here)."""
    from draftwise_mtp.loader import head_path, load_head
    from draftwise_mtp.proposer import MtpProposer

    head = load_head(head_path(ctx.target, None), ctx.target, ctx.device)
    k = MtpOptions().check_checkpoint(
        ctx.num_speculative_tokens or None, {"n_predict": head.num_layers}
    )
    return MtpProposer(head, ctx.target.model, k)


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
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
