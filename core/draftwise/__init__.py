"""draftwise: a speculative-decoding inference engine whose speculators are plugins.

Public surface::

    from draftwise import LLM, EngineArgs, LLMEngine, SamplingParams, SpeculativeParams, hookimpl
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from draftwise.onednn_isa import cap_isa

cap_isa()  # before any oneDNN primitive exists: see draftwise/onednn_isa.py

__version__ = "0.1.0"

#: plugins decorate their hook implementations with this marker
hookimpl = pluggy.HookimplMarker("draftwise")

__all__ = [
    "LLM", "EngineArgs", "LLMEngine", "SamplingParams", "SpeculativeParams", "__version__",
    "hookimpl",
]

if TYPE_CHECKING:
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs
    from draftwise.llm import LLM
    from draftwise.sampling_params import SamplingParams
    from draftwise.spec.params import SpeculativeParams

_LAZY = {
    "LLM": "draftwise.llm",
    "LLMEngine": "draftwise.engine",
    "EngineArgs": "draftwise.engine_args",
    "SamplingParams": "draftwise.sampling_params",
    "SpeculativeParams": "draftwise.spec.params",
}


def __getattr__(name: str) -> Any:
    """Import torch-heavy parts only when used, so `draftwise plugins` stays fast."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'draftwise' has no attribute {name!r}")
