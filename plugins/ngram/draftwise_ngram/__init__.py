"""draftwise-ngram: model-free drafting: prompt lookup (``ngram``) and suffix decoding
(``suffix``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.kit import Speculator, hookimpl

from draftwise_ngram import suffix_options as suffix
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
    """Declare methods ``ngram`` and ``suffix``."""
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
    register(
        Speculator(
            method="suffix",
            options=suffix.SuffixOptions,
            make_proposer=suffix.make_suffix_proposer,
            refusals=suffix.REFUSALS,
            capabilities=suffix.CAPABILITIES,
            description=suffix.DESCRIPTION,
        )
    )
