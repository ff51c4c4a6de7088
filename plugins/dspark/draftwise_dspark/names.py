"""The names every DSpark layout reader shares: the three architectures, what runs, the
config error.

Its own module because ``config.py`` reads a speculators or SpecForge config through its
layout module (``speculators_layout.py``, ``specforge_layout.py``), and those need these
names: kept in ``config.py`` they made the two import each other.
"""

from __future__ import annotations

from draftwise_dflash.config import DFlashConfigError

NATIVE = "Qwen3DSparkModel"
SPECULATORS = "DSparkSpeculator"
SPECFORGE = "DSparkDraftModel"
MARKOV_TYPES = ("vanilla", "gated", "rnn")
RUNS = ("a llama.cpp DSpark GGUF (vanilla Markov head), a speculators DSparkSpeculator "
        "directory (full or reduced draft vocabulary), a SpecForge DSparkDraftModel "
        "directory or a DeepSpec Qwen3DSparkModel safetensors directory (config.json + "
        "*.safetensors, bf16/fp16/fp32, or NVFP4 from ModelOpt or compressed-tensors)")


class DSparkConfigError(DFlashConfigError):
    """A DSpark config this engine cannot honour; the message says which key and what works."""


__all__ = ["MARKOV_TYPES", "NATIVE", "RUNS", "SPECFORGE", "SPECULATORS", "DSparkConfigError"]
