"""draftwise-draft-model: a smaller model as the drafter (declared; proposer to come)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise import hookimpl
from draftwise.speculator import Speculator
from draftwise_draft_model.options import (
    CAPABILITIES,
    DESCRIPTION,
    REFUSALS,
    DraftModelOptions,
)

if TYPE_CHECKING:
    from draftwise.plugins.hookspecs import RegisterSpeculator


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``draft_model``."""
    register(
        Speculator(
            method="draft_model",
            options=DraftModelOptions,
            make_proposer=None,
            refusals=REFUSALS,
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
