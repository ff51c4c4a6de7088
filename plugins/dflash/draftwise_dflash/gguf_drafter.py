"""DFlash drafters stored as GGUF, in llama.cpp mainline's ``dflash`` layout.

The contract (llama.cpp ``conversion/qwen.py`` ``DFlashModel`` and ``gguf-py``
``MODEL_ARCH.DFLASH``, as read from upstream by the reference notes):

1. ``general.architecture == "dflash"`` for DFlash1 and DFlash2 alike; DFlash2 is told
   apart by its own tensors (``blk.N.attn_conv_*``, ``blk.N.ffn_conv_*``, ``selector_*``)
   and DSpark by ``markov_*``/``conf_proj``. Only DFlash1 runs from GGUF here: the
   DFlash2 tensor names are not pinned by a primary source, so they are refused by name
   rather than guessed. Bee/buun's ``dflash-draft`` schema is refused by name too.
2. metadata: the usual ``dflash.block_count``, ``.embedding_length``,
   ``.feed_forward_length``, ``.attention.head_count[_kv]``, ``.attention.key_length``,
   ``.rope.freq_base``, ``.attention.layer_norm_rms_epsilon``, ``.context_length``,
   optional ``.attention.sliding_window`` with ``.attention.sliding_window_pattern``
   (true = sliding); ``dflash.block_size``; ``dflash.target_layers`` written as
   ``target_layer_ids + 1`` by the converter (it records vLLM-style input captures), so
   1 is subtracted here; the mask token in the standard ``tokenizer.ggml.mask_token_id``;
3. tensors: ``fc`` ``[H, taps * H]``, ``enc.output_norm`` (hidden_norm), ``output_norm``
   (norm) and the Qwen3 ``blk.N.*`` set (NEOX rope: Q/K are not permuted); no embedding
   and no LM head (the target's), norms stored raw.

Quantized projections (and ``fc``) stay in their stored type where the core's quantized
kernels run them (``models.quant.NATIVE_TYPES``, bf16 on CPU: Q8_0, Q4_K, Q6_K, ...); the
rest is dequantized to the model dtype, and that is said in the load summary.
"""

from __future__ import annotations

from typing import Any

import torch

from draftwise.formats.errors import ModelFormatError
from draftwise.models.gguf_weights import keep_quantized
from draftwise.models.llama import DecoderLayer
from draftwise.models.quant import NATIVE_TYPES, QuantPart, pack_quant
from draftwise_dflash.config import DFlashConfig

ARCH = "dflash"

_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight",
           "output_norm.weight": "norm.weight"}
#: z-lab name of each fused projection's parts -> the core layer's weight
_FUSED = {"qkv_weight": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "o_weight": ("self_attn.o_proj",), "gate_up_weight": ("mlp.gate_proj", "mlp.up_proj"),
          "down_weight": ("mlp.down_proj",)}


class DFlashGGUFError(ModelFormatError):
    """A GGUF this loader cannot run as a DFlash drafter; says why and what works."""


def z_name(gguf_name: str) -> str | None:
    """The z-lab safetensors name of a GGUF tensor (None: not a DFlash1 tensor)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
        return f"layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return None


def config_dict(ckpt: Any, runs: str) -> dict[str, Any]:
    """Rules 1-2: the z-lab config.json this GGUF stands for, or a named refusal."""
    path, meta = ckpt.path, ckpt.metadata
    arch = ckpt.architecture
    if arch == "dflash-draft":
        raise DFlashGGUFError(path, "general.architecture 'dflash-draft' is the Bee/buun GGUF "
                              "schema, not llama.cpp mainline's 'dflash'. Instead: convert the "
                              f"drafter with llama.cpp's convert_hf_to_gguf.py, or {runs}.")
    if arch != ARCH:
        raise DFlashGGUFError(path, f"general.architecture is {arch!r}, not 'dflash': not a "
                              f"DFlash drafter. Instead: {runs}.")
    names = ckpt.tensor_names
    if any(n.split(".")[0] in ("markov_w1", "markov_w2", "conf_proj") for n in names):
        raise DFlashGGUFError(path, "this 'dflash' GGUF carries a DSpark head (markov_w1/"
                              "markov_w2/conf_proj). Instead: method 'dspark' with the "
                              "drafter's safetensors directory (dspark reads no GGUF yet).")
    v2 = [n for n in names if "_conv" in n or n.startswith("selector")]
    if v2:
        raise DFlashGGUFError(
            path,
            f"a DFlash2 GGUF ({v2[0]}, ...): DFlash2's convolution and selector tensors have "
            "no pinned GGUF naming here, so they are not guessed. Instead: the DFlash2 "
            f"drafter as {runs}.",
        )

    def need(key: str) -> Any:
        if key not in meta:
            raise DFlashGGUFError(path, f"metadata key {key!r} is missing; a DFlash GGUF needs "
                                  f"it. Instead: re-convert the drafter, or {runs}.", key=key)
        return meta[key]

    hidden = int(need("dflash.embedding_length"))
    heads = int(need("dflash.attention.head_count"))
    layers = int(need("dflash.block_count"))
    taps = [int(t) - 1 for t in need("dflash.target_layers")]
    tokens = meta.get("tokenizer.ggml.tokens")
    d: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("dflash.attention.head_count_kv", heads)),
        "head_dim": int(meta.get("dflash.attention.key_length", hidden // heads)),
        "intermediate_size": int(need("dflash.feed_forward_length")),
        # DFlash1 reads no vocabulary of its own (embedding and head are the target's)
        "vocab_size": len(tokens) if tokens else int(meta.get("dflash.vocab_size", 1)),
        "rms_norm_eps": float(meta.get("dflash.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get("dflash.rope.freq_base", 1e6)),
        "max_position_embeddings": int(meta.get("dflash.context_length", 32768)),
        "dflash_config": {
            "block_size": int(need("dflash.block_size")),
            "target_layer_ids": taps,
            "mask_token_id": int(need("tokenizer.ggml.mask_token_id")),
        },
    }
    pattern = meta.get("dflash.attention.sliding_window_pattern")
    if pattern is not None:
        d["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        d["sliding_window"] = int(need("dflash.attention.sliding_window"))
    return d


def check_tensors(ckpt: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Rule 3 from the header: every expected tensor, no other, each of its shape.
    Returns z-lab name -> GGUF name."""
    found: dict[str, str] = {}
    extra = []
    for n in ckpt.tensor_names:
        z = z_name(n)
        if z is None:
            extra.append(n)
        else:
            found[z] = n
    if extra:
        raise DFlashGGUFError(ckpt.path, f"tensors {extra[:4]} are not DFlash1 tensors",
                              key=extra[0])
    missing = [z for z in shapes if z not in found]
    if missing:
        raise DFlashGGUFError(ckpt.path, f"missing tensors {[_gguf(z) for z in missing[:4]]}",
                              key=missing[0])
    for z, shape in shapes.items():
        got = tuple(ckpt.info(found[z]).shape)
        if got != shape:
            raise DFlashGGUFError(ckpt.path, f"tensor {found[z]!r} has shape {list(got)}, "
                                  f"expected {list(shape)} from its metadata", key=found[z])
    return found


def _gguf(z: str) -> str:
    """The GGUF name of a z-lab tensor (messages only)."""
    rev = {v: k for k, v in _GLOBAL.items()}
    if z in rev:
        return rev[z]
    _, i, rest = z.split(".", 2)
    base, suffix = rest.rsplit(".", 1)
    kind = next(k for k, v in _LAYER.items() if v == base)
    return f"blk.{i}.{kind}.{suffix}"


def read_gguf_weights(ckpt: Any, cfg: DFlashConfig, found: dict[str, str], dtype: torch.dtype,
                      device: torch.device) -> tuple[Any, list[str]]:
    """The drafter's weights (``model.DFlashWeights``) and one line per stored type that
    was dequantized. Projections stay quantized where the kernels run them."""
    from draftwise_dflash.loader import pack_layers
    from draftwise_dflash.model import DFlashWeights

    keep, why = keep_quantized(dtype, device)
    widened: dict[str, int] = {}

    def dense(z: str) -> torch.Tensor:
        name = found[z]
        qt = ckpt.qtype(name)
        if qt.name not in ("F32", "F16", "BF16"):
            widened[qt.name] = widened.get(qt.name, 0) + 1
        return torch.from_numpy(ckpt.dequantize(name).copy()).to(dtype=dtype, device=device)

    def quant(zs: tuple[str, ...], k: int) -> Any:
        if not keep or not all(ckpt.qtype(found[z]) in NATIVE_TYPES for z in zs):
            return None
        parts = [QuantPart(ckpt.qtype(found[z]), ckpt.raw(found[z])) for z in zs]
        return pack_quant(parts, k)

    c = cfg.decoder
    h = c.hidden_size
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        layer = DecoderLayer(c, i, dtype, device)
        with torch.no_grad():
            layer.input_norm.copy_(dense(p + "input_layernorm.weight"))
            layer.post_norm.copy_(dense(p + "post_attention_layernorm.weight"))
            if layer.qk_norm is not None:
                layer.qk_norm.copy_(torch.cat([
                    dense(p + "self_attn.q_norm.weight").expand(c.num_attention_heads, -1),
                    dense(p + "self_attn.k_norm.weight").expand(c.num_key_value_heads, -1)]))
        for slot, bases in _FUSED.items():
            zs = tuple(f"{p}{b}.weight" for b in bases)
            k = c.intermediate_size if slot == "down_weight" else (
                c.q_size if slot == "o_weight" else h)
            packed = quant(zs, k)
            if packed is not None:
                layer.set_packed(slot, packed)
            else:
                with torch.no_grad():
                    getattr(layer, slot).copy_(torch.cat([dense(z) for z in zs]))
        layers.append(layer)
    pack_layers(layers)
    fc = quant(("fc.weight",), len(cfg.target_layer_ids) * h)
    weights = DFlashWeights(fc if fc is not None else dense("fc.weight"),
                            dense("hidden_norm.weight"), dense("norm.weight"), layers)
    notes = [f"{n} ({count} tensors) dequantized to {str(dtype).removeprefix('torch.')}"
             + (f": {why}" if why else ": no native kernel for the type")
             for n, count in sorted(widened.items())]
    return weights, notes


__all__ = ["ARCH", "DFlashGGUFError", "check_tensors", "config_dict", "read_gguf_weights",
           "z_name"]
