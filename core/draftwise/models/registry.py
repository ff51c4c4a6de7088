"""Architecture name -> implementation; everything else is refused by name.

Checked from the checkpoint's own config before any weight is read, so a wrong model
fails in milliseconds with the list of what would work.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from draftwise.formats.errors import ConfigError, UnsupportedArchitectureError
from draftwise.formats.values import ConfigValues
from draftwise.models.config import GGUF_ARCHITECTURES, HF_MODEL_TYPES, ModelConfig
from draftwise.models.llama import LlamaForCausalLM

#: HF architecture -> class; the whole llama family is one implementation
SUPPORTED_ARCHITECTURES: Mapping[str, type[LlamaForCausalLM]] = MappingProxyType(
    {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": LlamaForCausalLM,
        "Qwen2ForCausalLM": LlamaForCausalLM,
        "Qwen3ForCausalLM": LlamaForCausalLM,
    }
)

_MOE = "mixture-of-experts models are not implemented"
_GDN = "GGUF Gated-DeltaNet hybrids are not implemented yet (the safetensors checkpoint loads)"

#: the GDN hybrid (models/qwen3_next.py; dense MLP only: MoE is refused below)
HYBRID_ARCHITECTURES = frozenset(
    {"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"}
)

#: known architectures refused on purpose, with the reason
REFUSED_ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {
        "MixtralForCausalLM": _MOE,
        "Qwen2MoeForCausalLM": _MOE,
        "Qwen3MoeForCausalLM": _MOE,
        "Qwen3_5MoeForCausalLM": _MOE,
        "OlmoeForCausalLM": _MOE,
        "GptOssForCausalLM": _MOE,
        "Llama4ForCausalLM": _MOE,
        "Llama4ForConditionalGeneration": _MOE,
        "DeepseekV2ForCausalLM": _MOE + " (nor multi-head latent attention)",
        "DeepseekV3ForCausalLM": _MOE + " (nor multi-head latent attention)",
        "MistralForConditionalGeneration": "multimodal checkpoints are not supported",
        "Qwen2VLForConditionalGeneration": "multimodal checkpoints are not supported",
    }
)

REFUSED_GGUF_ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {
        "qwen2moe": _MOE,
        "qwen3moe": _MOE,
        "llama4": _MOE,
        "gpt-oss": _MOE,
        "deepseek2": _MOE,
        "olmoe": _MOE,
        "qwen3next": _GDN,
        "qwen35": _GDN,
        "qwen35moe": _GDN,
    }
)


def supported_names() -> list[str]:
    """HF architectures and GGUF ``general.architecture`` values that load."""
    return [
        *SUPPORTED_ARCHITECTURES,
        *sorted(HYBRID_ARCHITECTURES),
        *(f"gguf:{a}" for a in GGUF_ARCHITECTURES),
    ]


def check_hf_config(config: Mapping[str, Any], path: str) -> str:
    """The architecture of an HF config if supported; otherwise a refusal naming it."""
    v = ConfigValues(config, path)
    archs = v.texts("architectures", [])
    by_type = {mt: a for a, mt in HF_MODEL_TYPES.items()}
    arch = archs[0] if archs else by_type.get(v.text("model_type", ""), "<missing>")
    if arch in REFUSED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            path, arch, supported_names(), REFUSED_ARCHITECTURES[arch]
        )
    if arch not in SUPPORTED_ARCHITECTURES and arch not in HYBRID_ARCHITECTURES:
        raise UnsupportedArchitectureError(path, arch, supported_names())
    text = v.mapping("text_config") or v
    experts = text.integer("num_local_experts", None, minimum=0) or text.integer(
        "num_experts", 0, minimum=0
    )
    if experts > 0:
        raise UnsupportedArchitectureError(path, arch, supported_names(), _MOE)
    return arch


def check_gguf_metadata(meta: Mapping[str, Any], path: str) -> str:
    """The GGUF architecture if supported (llama-arch MoE files, e.g. Mixtral, refused)."""
    v = ConfigValues(meta, path)
    arch = v.text("general.architecture", "<missing>")
    if arch in REFUSED_GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            path, arch, supported_names(), REFUSED_GGUF_ARCHITECTURES[arch]
        )
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(path, arch, supported_names())
    if v.integer(f"{arch}.expert_count", 0, minimum=0) > 0:
        raise UnsupportedArchitectureError(path, arch, supported_names(), _MOE)
    return arch


def model_class(config: ModelConfig, path: str) -> type[LlamaForCausalLM]:
    """The implementation for a parsed config, after checking what it cannot do."""
    cls = SUPPORTED_ARCHITECTURES.get(config.architecture)
    if cls is None:
        raise UnsupportedArchitectureError(path, config.architecture, supported_names())
    if config.hidden_act != "silu":
        raise ConfigError(path, f"hidden_act {config.hidden_act!r} is not supported (only silu)")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            path,
            f"{config.num_attention_heads} attention heads are not a multiple of "
            f"{config.num_key_value_heads} KV heads",
        )
    return cls
