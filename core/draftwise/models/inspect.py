"""Look at a checkpoint without reading weights: where it is, its format and architecture.

The target loader and bootstrap's draft stage share this, so a draft checkpoint is
refused (unsupported architecture, mixture-of-experts, a bad config) by the same checks
as a target, before a byte of weights is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from draftwise.formats.default_model import resolve_model_path
from draftwise.formats.safetensors_dir import read_json
from draftwise.models.config import ModelConfig
from draftwise.models.registry import (
    HYBRID_ARCHITECTURES,
    check_gguf_metadata,
    check_hf_config,
    model_class,
)

if TYPE_CHECKING:
    from draftwise.speculator import TargetHeader

#: GGUF metadata keys too large to carry around as a checkpoint's config
_BULKY_GGUF_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.merges",
                    "tokenizer.ggml.token_type")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a checkpoint is, from its own config alone."""

    #: a ``.gguf`` file or an HF directory (a directory of one ``.gguf`` resolves to the file)
    path: str
    format: str  # "gguf" or "safetensors"
    architecture: str
    #: None for the GDN hybrid (its config is ``hybrid_config.HybridConfig``)
    config: ModelConfig | None
    #: config.json, or the GGUF metadata without the tokenizer tables
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_hybrid(self) -> bool:
        """Linear-attention layers with recurrent state (models/qwen3_next.py)."""
        return self.architecture in HYBRID_ARCHITECTURES


def inspect_model(path: str | os.PathLike[str] | None) -> ModelInfo:
    """Format, architecture and config of a checkpoint; refuses what cannot load, by name."""
    resolved = resolve_model_path(path)
    if os.path.isdir(resolved):
        config_path = os.path.join(resolved, "config.json")
        raw = read_json(config_path)
        arch = check_hf_config(raw, config_path)
        if arch in HYBRID_ARCHITECTURES:
            return ModelInfo(resolved, "safetensors", arch, None, raw)
        config = ModelConfig.from_hf_dict(raw, config_path)
        model_class(config, config_path)
        return ModelInfo(resolved, "safetensors", arch, config, raw)
    from draftwise.formats.gguf import GGUFCheckpoint

    ckpt = GGUFCheckpoint(resolved)
    check_gguf_metadata(ckpt.metadata, resolved)
    config = ModelConfig.from_gguf_metadata(
        ckpt.metadata, ckpt.tensor_names, resolved, rope_freq_factors=ckpt.rope_freq_factors()
    )
    model_class(config, resolved)
    meta = {k: v for k, v in ckpt.metadata.items() if k not in _BULKY_GGUF_KEYS}
    return ModelInfo(resolved, "gguf", config.architecture, config, meta)


def target_header(info: ModelInfo) -> TargetHeader:
    """The sizes a draft must match (``ChecksTarget``), from the target's config alone."""
    from draftwise.speculator import TargetHeader

    config = info.config
    if config is None:  # the GDN hybrid: its llama-family sizes are its config's base
        from draftwise.models.hybrid_config import HybridConfig

        path = os.path.join(info.path, "config.json")
        config = HybridConfig.from_hf_dict(info.raw, path).base
    return TargetHeader(
        path=info.path,
        architecture=info.architecture,
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        num_hidden_layers=int(config.num_hidden_layers),
    )


__all__ = ["ModelInfo", "inspect_model", "target_header"]
