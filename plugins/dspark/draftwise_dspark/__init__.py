"""draftwise-dspark: DSpark semi-autoregressive block drafters (declared; proposer to come)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise import hookimpl
from draftwise.speculator import Speculator
from draftwise_dspark.options import CAPABILITIES, DESCRIPTION, REFUSALS, DSparkOptions

if TYPE_CHECKING:
    from draftwise.plugins.hookspecs import RegisterSpeculator


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``dspark``."""
    register(
        Speculator(
            method="dspark",
            options=DSparkOptions,
            make_proposer=None,
            refusals=REFUSALS,
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
