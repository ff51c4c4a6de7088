"""draftwise-ngram: prompt-lookup (n-gram) drafting, with no draft model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import Speculator, hookimpl

from draftwise_ngram.options import (
    CAPABILITIES,
    DESCRIPTION,
    REFUSALS,
    NgramOptions,
    make_ngram_proposer,
)

if TYPE_CHECKING:
    from draftwise.kit import RegisterSpeculator


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``ngram``."""
    register(
        Speculator(
            method="ngram",
            options=NgramOptions,
            make_proposer=make_ngram_proposer,
            refusals=REFUSALS,
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
