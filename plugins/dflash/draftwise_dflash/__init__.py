"""draftwise-dflash: DFlash block-diffusion drafters (declared; proposer to come)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise import hookimpl
from draftwise.speculator import Speculator
from draftwise_dflash.options import CAPABILITIES, DESCRIPTION, REFUSALS, DFlashOptions

if TYPE_CHECKING:
    from draftwise.plugins.hookspecs import RegisterSpeculator


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``dflash``."""
    register(
        Speculator(
            method="dflash",
            options=DFlashOptions,
            make_proposer=None,
            refusals=REFUSALS,
            capabilities=CAPABILITIES,
            description=DESCRIPTION,
        )
    )
