"""medusa-lite: Medusa-style heads on the target's last hidden state (no checkpoint, no
KV of its own); docs/writing-a-plugin.md section 5.4. Importing it loads no torch."""

from __future__ import annotations

from draftwise.kit import RegisterSpeculator, Speculator, hookimpl

from medusa_lite.options import CAPABILITIES, REFUSALS, MedusaLiteOptions, make_medusa_proposer


@hookimpl
def register_speculators(register: RegisterSpeculator) -> None:
    """Declare method ``medusa_lite``."""
    register(
        Speculator(
            method="medusa_lite",
            options=MedusaLiteOptions,
            make_proposer=make_medusa_proposer,
            refusals=REFUSALS,
            capabilities=CAPABILITIES,
            description="Medusa-style heads on the target's last hidden state; "
            "no checkpoint, no KV of its own.",
        )
    )
