"""The GDN hybrid's configuration: Qwen3-Next / Qwen3.5 / Qwen3.6 ``config.json`` parsed and
refused by name (mixture-of-experts layers, odd RoPE, biased attention).

Its own module because the layers (``models.gdn``, ``models.hybrid_layers``), the model
(``models.qwen3_next``) and the loader's config-only inspection all read it, and it reads
none of them: the shapes flow one way, from here down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from draftwise.formats.errors import ConfigError, UnsupportedArchitectureError
from draftwise.formats.values import ConfigValues
from draftwise.models.config import ModelConfig

#: HF architecture -> whether its GDN projections are Qwen3-Next's fused grouped ones
HYBRID_ARCHITECTURES: Mapping[str, bool] = {
    "Qwen3NextForCausalLM": True,
    "Qwen3_5ForCausalLM": False,
    "Qwen3_5ForConditionalGeneration": False,
}


@dataclass(frozen=True, slots=True)
class HybridConfig:
    """The hybrid's shapes beyond the llama-family ``ModelConfig`` it also carries."""

    base: ModelConfig
    layer_types: tuple[str, ...]
    rotary_dim: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    fused_projections: bool
    mtp_num_hidden_layers: int = 0

    @property
    def key_dim(self) -> int:
        """Width of q (and of k) over all key heads."""
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        """Width of v (and of z) over all value heads."""
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], path: str = "config.json") -> HybridConfig:
        """Parse a Qwen3-Next / Qwen3.5 ``config.json``; MoE and odd ropes are refused by name.

        Every value is read through :class:`ConfigValues`: a wrong type or range is a
        :class:`ConfigError` naming the key (``text_config.hidden_size``).
        """
        top = ConfigValues(d, path)
        archs = top.texts("architectures", ["<missing>"]) or ["<missing>"]
        arch = archs[0]
        if arch not in HYBRID_ARCHITECTURES:
            raise UnsupportedArchitectureError(path, arch, HYBRID_ARCHITECTURES)
        t = top.mapping("text_config") or top
        experts = t.integer("num_experts", 0, minimum=0)
        n = t.integer("num_hidden_layers")
        if experts > 0 and len(set(t.data.get("mlp_only_layers") or ())) < n:
            raise UnsupportedArchitectureError(
                path,
                arch,
                HYBRID_ARCHITECTURES,
                f"mixture-of-experts layers (num_experts={experts}) are not implemented; "
                "only dense-MLP hybrids load",
            )
        rope_v = t.mapping("rope_parameters") or t.mapping("rope_scaling")
        rope = dict(rope_v.data) if rope_v is not None else {}
        theta = (rope_v if rope_v is not None and "rope_theta" in rope_v else t).number(
            "rope_theta", 10000.0
        )
        partial = (
            rope_v if rope_v is not None and "partial_rotary_factor" in rope_v else t
        ).number("partial_rotary_factor", 1.0)
        if not 0 < partial <= 1:
            raise t.error("partial_rotary_factor", "a fraction in (0, 1]")
        for key in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"):
            rope.pop(key, None)  # text positions: plain RoPE
        kind = rope.get("rope_type", rope.get("type", "default"))
        types = tuple(
            t.texts("layer_types", None)
            or _interval_types(n, t.integer("full_attention_interval", 4))
        )
        if len(types) != n or any(k not in ("full_attention", "linear_attention") for k in types):
            raise t.error("layer_types", f"{n} entries of full_attention / linear_attention")
        heads = t.integer("num_attention_heads")
        hidden = t.integer("hidden_size")
        head_dim = t.integer("head_dim", None)
        if head_dim is None:
            if hidden % heads:
                raise t.error("num_attention_heads", f"a divisor of hidden_size={hidden}")
            head_dim = hidden // heads
        vocab = t.integer("vocab_size")
        eos_v = t if "eos_token_id" in t else top
        bos_v = t if "bos_token_id" in t else top
        tie_v = t if "tie_word_embeddings" in t else top
        base = ModelConfig(
            architecture=arch,
            model_type=t.text("model_type", ""),
            hidden_size=hidden,
            num_hidden_layers=n,
            num_attention_heads=heads,
            num_key_value_heads=t.integer("num_key_value_heads", heads),
            head_dim=head_dim,
            intermediate_size=t.integer("intermediate_size"),
            vocab_size=vocab,
            rope_theta=theta,
            rms_norm_eps=t.number("rms_norm_eps", 1e-6),
            tie_word_embeddings=tie_v.flag("tie_word_embeddings", False),
            max_position_embeddings=t.integer("max_position_embeddings", 2048),
            rope_scaling=None if kind == "default" else rope,
            qk_norm=True,
            hidden_act=t.text("hidden_act", "silu"),
            layer_types=types,
            bos_token_id=bos_v.optional_id("bos_token_id", below=vocab),
            eos_token_ids=eos_v.ids("eos_token_id", below=vocab),
            pad_token_id=t.optional_id("pad_token_id", below=vocab),
        )
        if base.hidden_act != "silu" or t.flag("attention_bias", False):
            raise ConfigError(path, "only silu and bias-free attention are implemented")
        mtp_key = "mtp_num_hidden_layers" if "mtp_num_hidden_layers" in t else (
            "num_nextn_predict_layers"
        )
        return cls(
            base=base,
            layer_types=types,
            rotary_dim=int(head_dim * partial),
            num_k_heads=t.integer("linear_num_key_heads"),
            num_v_heads=t.integer("linear_num_value_heads"),
            head_k_dim=t.integer("linear_key_head_dim"),
            head_v_dim=t.integer("linear_value_head_dim"),
            conv_kernel=t.integer("linear_conv_kernel_dim", 4),
            fused_projections=HYBRID_ARCHITECTURES[arch],
            mtp_num_hidden_layers=t.integer(mtp_key, 0, minimum=0),
        )


def _interval_types(n: int, interval: int) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
