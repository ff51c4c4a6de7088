"""One normalised description of a llama-family target, whatever file it came from.

HF ``config.json`` (old ``rope_theta``/``rope_scaling`` keys or transformers-5
``rope_parameters``) and GGUF metadata (``{arch}.*`` keys) both become a
:class:`ModelConfig`, so the model code never looks at either format.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from draftwise.formats.errors import ConfigError

#: GGUF ``general.architecture`` -> the HF architecture it corresponds to
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

#: HF architecture -> model_type, for the family implemented in ``models/llama.py``
HF_MODEL_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and numerics of a decoder-only llama-family model."""

    architecture: str
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    #: normalised HF-style scaling dict with a ``rope_type`` key; None = plain RoPE
    rope_scaling: dict[str, Any] | None = None
    #: GGUF ``rope_freqs`` (llama3.1-style files): inv_freq is divided by these
    rope_freq_factors: tuple[float, ...] | None = None
    qk_norm: bool = False
    attention_bias: bool = False  # bias on q/k/v projections
    o_proj_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    #: per layer, "full_attention" or "sliding_attention" (empty: all full)
    layer_types: tuple[str, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    @property
    def q_size(self) -> int:
        """Width of the query projection."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections."""
        return self.num_key_value_heads * self.head_dim

    def window_of(self, layer: int) -> int | None:
        """Sliding window of ``layer`` (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], path: str = "config.json") -> ModelConfig:
        """Read an HF ``config.json`` dict (the caller checked the architecture)."""
        archs = d.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(d.get("model_type"), path)
        model_type = HF_MODEL_TYPES.get(arch, str(d.get("model_type", "")))
        theta, scaling = _hf_rope(d, path)
        heads = _req(d, "num_attention_heads", path)
        hidden = _req(d, "hidden_size", path)
        head_dim = d.get("head_dim") or hidden // heads
        bias = bool(d.get("attention_bias", False))
        sliding, layer_types = _hf_sliding(d, model_type)
        eos = d.get("eos_token_id")
        return cls(
            architecture=arch,
            model_type=model_type,
            hidden_size=hidden,
            num_hidden_layers=_req(d, "num_hidden_layers", path),
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=_req(d, "intermediate_size", path),
            vocab_size=_req(d, "vocab_size", path),
            rope_theta=theta,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rope_scaling=scaling,
            qk_norm=model_type == "qwen3",
            attention_bias=True if model_type == "qwen2" else bias,
            o_proj_bias=False if model_type == "qwen2" else bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            sliding_window=sliding,
            layer_types=layer_types,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            pad_token_id=d.get("pad_token_id"),
        )

    @classmethod
    def from_gguf_metadata(
        cls,
        meta: Mapping[str, Any],
        tensor_names: Collection[str],
        path: str = "model.gguf",
        rope_freq_factors: tuple[float, ...] | None = None,
    ) -> ModelConfig:
        """Read GGUF metadata; tied embeddings and biases are inferred from the tensors."""
        arch = str(meta["general.architecture"])

        def key(name: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{name}", default)

        hidden = _req_gguf(meta, f"{arch}.embedding_length", path)
        heads = _req_gguf(meta, f"{arch}.attention.head_count", path)
        kv_heads = key("attention.head_count_kv") or heads
        vocab = key("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
        if not vocab:
            raise ConfigError(path, f"no '{arch}.vocab_size' and no tokenizer.ggml.tokens")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")
        eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
        bias = "blk.0.attn_q.bias" in tensor_names
        return cls(
            architecture=GGUF_ARCHITECTURES.get(arch, arch),
            model_type=arch,
            hidden_size=int(hidden),
            num_hidden_layers=int(_req_gguf(meta, f"{arch}.block_count", path)),
            num_attention_heads=int(heads),
            num_key_value_heads=int(kv_heads),
            head_dim=int(key("attention.key_length") or hidden // heads),
            intermediate_size=int(_req_gguf(meta, f"{arch}.feed_forward_length", path)),
            vocab_size=int(vocab),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            tie_word_embeddings="output.weight" not in tensor_names,
            max_position_embeddings=int(key("context_length", 2048)),
            rope_scaling=_gguf_rope_scaling(key),
            rope_freq_factors=rope_freq_factors,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            attention_bias=bias,
            o_proj_bias="blk.0.attn_output.bias" in tensor_names,
            mlp_bias="blk.0.ffn_up.bias" in tensor_names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        )


def _req(d: Mapping[str, Any], name: str, path: str) -> int:
    if name not in d or d[name] is None:
        raise ConfigError(path, f"config has no {name!r}")
    return int(d[name])


def _req_gguf(meta: Mapping[str, Any], name: str, path: str) -> Any:
    if name not in meta:
        raise ConfigError(path, f"GGUF metadata has no {name!r}")
    return meta[name]


def _arch_from_model_type(model_type: Any, path: str) -> str:
    for arch, mt in HF_MODEL_TYPES.items():
        if mt == model_type:
            return arch
    raise ConfigError(path, f"config has no 'architectures' and model_type {model_type!r}")


def _hf_rope(d: Mapping[str, Any], path: str) -> tuple[float, dict[str, Any] | None]:
    """Theta and scaling from either the old or the transformers-5 key layout."""
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(d.get("rope_theta", 10000.0))
        raw = d.get("rope_scaling")
        scaling = dict(raw) if isinstance(raw, Mapping) else {}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if float(d.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ConfigError(path, "partial_rotary_factor != 1 is not supported")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def _hf_sliding(d: Mapping[str, Any], model_type: str) -> tuple[int | None, tuple[str, ...]]:
    """Mistral slides every layer; Qwen2/3 only when ``use_sliding_window`` says so."""
    window = d.get("sliding_window")
    if model_type in ("qwen2", "qwen3"):
        if not d.get("use_sliding_window", False) or window is None:
            return None, ()
        types = d.get("layer_types")
        if not types:
            first = int(d.get("max_window_layers", 0))
            types = [
                "sliding_attention" if i >= first else "full_attention"
                for i in range(int(d["num_hidden_layers"]))
            ]
        return int(window), tuple(types)
    if model_type == "mistral" and window is not None:
        return int(window), ()
    return None, ()


def _gguf_rope_scaling(key: Any) -> dict[str, Any] | None:
    kind = key("rope.scaling.type")
    factor = key("rope.scaling.factor")
    if kind in (None, "none") or not factor:
        return None
    scaling: dict[str, Any] = {"rope_type": str(kind), "factor": float(factor)}
    original = key("rope.scaling.original_context_length")
    if original:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling
