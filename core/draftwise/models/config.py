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
from draftwise.formats.values import ConfigValues

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
        v = ConfigValues(d, path)
        archs = v.texts("architectures", [])
        arch = archs[0] if archs else _arch_from_model_type(v.text("model_type", None), path)
        model_type = HF_MODEL_TYPES.get(arch, v.text("model_type", ""))
        theta, scaling = _hf_rope(v)
        heads = v.integer("num_attention_heads")
        hidden = v.integer("hidden_size")
        layers = v.integer("num_hidden_layers")
        vocab = v.integer("vocab_size")
        bias = v.flag("attention_bias", False)
        sliding, layer_types = _hf_sliding(v, model_type, layers)
        return cls(
            architecture=arch,
            model_type=model_type,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=v.integer("num_key_value_heads", heads),
            head_dim=_head_dim(v, "head_dim", hidden, heads, "hidden_size", "num_attention_heads"),
            intermediate_size=v.integer("intermediate_size"),
            vocab_size=vocab,
            rope_theta=theta,
            rms_norm_eps=v.number("rms_norm_eps", 1e-6),
            tie_word_embeddings=v.flag("tie_word_embeddings", False),
            max_position_embeddings=v.integer("max_position_embeddings", 2048),
            rope_scaling=scaling,
            qk_norm=model_type == "qwen3",
            attention_bias=True if model_type == "qwen2" else bias,
            o_proj_bias=False if model_type == "qwen2" else bias,
            mlp_bias=v.flag("mlp_bias", False),
            hidden_act=v.text("hidden_act", "silu"),
            sliding_window=sliding,
            layer_types=layer_types,
            bos_token_id=v.optional_id("bos_token_id", below=vocab),
            eos_token_ids=v.ids("eos_token_id", below=vocab),
            pad_token_id=_pad_id(v, vocab),
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
        top = ConfigValues(meta, path)
        arch = top.text("general.architecture")
        sub = {k.removeprefix(f"{arch}."): val for k, val in meta.items() if k.startswith(f"{arch}.")}
        v = ConfigValues(sub, path, f"{arch}.")
        hidden = v.integer("embedding_length")
        heads = v.integer("attention.head_count")
        tokens = top.texts("tokenizer.ggml.tokens", [])
        vocab = v.integer("vocab_size", len(tokens))
        if not vocab:
            raise ConfigError(path, f"no '{arch}.vocab_size' and no tokenizer.ggml.tokens")
        head_dim = _head_dim(
            v, "attention.key_length", hidden, heads, "embedding_length", "attention.head_count"
        )
        for key in ("attention.value_length", "rope.dimension_count"):
            if key in v and v.integer(key) != head_dim:  # partial RoPE / other V width
                raise v.error(key, f"{head_dim} (the head size; other widths are not supported)")
        eos = top.optional_id("tokenizer.ggml.eos_token_id", below=vocab)
        eot = top.optional_id("tokenizer.ggml.eot_token_id", below=vocab)
        eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
        bias = "blk.0.attn_q.bias" in tensor_names
        return cls(
            architecture=GGUF_ARCHITECTURES.get(arch, arch),
            model_type=arch,
            hidden_size=hidden,
            num_hidden_layers=v.integer("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=v.integer("attention.head_count_kv", heads),
            head_dim=head_dim,
            intermediate_size=v.integer("feed_forward_length"),
            vocab_size=vocab,
            rope_theta=v.number("rope.freq_base", 10000.0),
            rms_norm_eps=v.number("attention.layer_norm_rms_epsilon", 1e-6),
            tie_word_embeddings="output.weight" not in tensor_names,
            max_position_embeddings=v.integer("context_length", 2048),
            rope_scaling=_gguf_rope_scaling(v),
            rope_freq_factors=rope_freq_factors,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            attention_bias=bias,
            o_proj_bias="blk.0.attn_output.bias" in tensor_names,
            mlp_bias="blk.0.ffn_up.bias" in tensor_names,
            bos_token_id=top.optional_id("tokenizer.ggml.bos_token_id", below=vocab),
            eos_token_ids=eos_ids,
            pad_token_id=top.optional_id("tokenizer.ggml.padding_token_id", below=vocab),
        )


def _head_dim(
    v: ConfigValues, key: str, hidden: int, heads: int, hidden_key: str, heads_key: str
) -> int:
    """The declared head size, or hidden / heads when that divides."""
    if key in v:
        return int(v.integer(key))
    if hidden % heads:
        raise v.error(
            heads_key, f"a divisor of {v.name(hidden_key)}={hidden} (no {v.name(key)!r} given)"
        )
    return hidden // heads


def _pad_id(v: ConfigValues, vocab: int) -> int | None:
    """``pad_token_id``; -1, which some older Llama configs write for "none", is None."""
    if v.data.get("pad_token_id") == -1 and not isinstance(v.data.get("pad_token_id"), bool):
        return None
    return v.optional_id("pad_token_id", below=vocab)


def _arch_from_model_type(model_type: str | None, path: str) -> str:
    for arch, mt in HF_MODEL_TYPES.items():
        if mt == model_type:
            return arch
    raise ConfigError(path, f"config has no 'architectures' and model_type {model_type!r}")


def _hf_rope(v: ConfigValues) -> tuple[float, dict[str, Any] | None]:
    """Theta and scaling from either the old or the transformers-5 key layout."""
    params = v.mapping("rope_parameters")
    if params is not None and "rope_theta" in params:
        theta = params.number("rope_theta")
        scaling_v: ConfigValues | None = params
        scaling = {k: val for k, val in params.data.items() if k != "rope_theta"}
    else:
        theta = v.number("rope_theta", 10000.0)
        scaling_v = v.mapping("rope_scaling")
        scaling = dict(scaling_v.data) if scaling_v is not None else {}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    partial = v.number("partial_rotary_factor", None)
    if partial is None and scaling_v is not None:
        partial = scaling_v.number("partial_rotary_factor", None)
    if partial is not None and partial != 1.0:
        raise ConfigError(v.path, "partial_rotary_factor != 1 is not supported")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    prefix = scaling_v.prefix if scaling_v is not None else ""
    return theta, check_rope_scaling(scaling, v.path, prefix)


#: per RoPE scaling type: the keys ``models/rope.py`` needs, and the ones it may read
_ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "llama3": (
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        (),
    ),
    "yarn": (
        ("factor",),
        ("original_max_position_embeddings", "attention_factor", "mscale", "mscale_all_dim",
         "beta_fast", "beta_slow"),
    ),
}


def check_rope_scaling(scaling: dict[str, Any], path: str, prefix: str = "") -> dict[str, Any]:
    """A RoPE scaling dict whose type is supported and whose numbers are all usable.

    Checked here, before weights, so a missing ``factor`` is not silently 1.0 and equal
    llama3 frequency factors are not a division by zero inside the rope tables.
    """
    v = ConfigValues(scaling, path, prefix)
    kind = v.text("rope_type")
    if kind not in _ROPE_KEYS:
        raise v.error(
            "rope_type", f"a supported RoPE scaling type (default, {', '.join(_ROPE_KEYS)})"
        )
    required, optional = _ROPE_KEYS[kind]
    for key in required:
        v.number(key)
    for key in optional:
        v.number(key, None)
    if "truncate" in v:
        v.flag("truncate")
    if kind == "llama3" and v.number("high_freq_factor") <= v.number("low_freq_factor"):
        raise v.error("high_freq_factor", "a number larger than low_freq_factor")
    return scaling


_LAYER_KINDS = ("full_attention", "sliding_attention")


def _hf_sliding(v: ConfigValues, model_type: str, layers: int) -> tuple[int | None, tuple[str, ...]]:
    """Mistral slides every layer; Qwen2/3 only when ``use_sliding_window`` says so."""
    window = v.integer("sliding_window", None)
    if model_type in ("qwen2", "qwen3"):
        if not v.flag("use_sliding_window", False) or window is None:
            return None, ()
        types = v.texts("layer_types", None)
        if not types:
            first = v.integer("max_window_layers", 0, minimum=0)
            types = [
                "sliding_attention" if i >= first else "full_attention" for i in range(layers)
            ]
        if len(types) != layers or any(t not in _LAYER_KINDS for t in types):
            raise v.error(
                "layer_types", f"{layers} entries, each one of {', '.join(_LAYER_KINDS)}"
            )
        return window, tuple(types)
    if model_type == "mistral" and window is not None:
        return window, ()
    return None, ()


def _gguf_rope_scaling(v: ConfigValues) -> dict[str, Any] | None:
    kind = v.text("rope.scaling.type", None)
    factor = v.number("rope.scaling.factor", None, positive=False)
    if kind in (None, "none") or not factor:
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": factor}
    original = v.integer("rope.scaling.original_context_length", None, minimum=0)
    if original:
        scaling["original_max_position_embeddings"] = original
    if kind not in ("linear", "yarn"):  # llama3-style files carry rope_freqs instead
        raise v.error("rope.scaling.type", "none, linear or yarn")
    return check_rope_scaling(scaling, v.path, v.prefix + "rope.scaling.")
