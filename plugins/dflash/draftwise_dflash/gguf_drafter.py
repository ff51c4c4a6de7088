"""DFlash drafters stored as GGUF, in llama.cpp mainline's ``dflash`` layout.

The contract, read from the llama.cpp tree vendored by llama-cpp-python 0.3.36
(``vendor/llama.cpp``; line numbers of that tree):

1. ``general.architecture == "dflash"`` for DFlash1 and DFlash2 alike
   (``src/llama-arch.cpp:146``). DFlash2 is told apart the way llama.cpp tells it:
   ``selector_hidden.weight`` is present (``src/models/dflash.cpp:139``). DSpark carries
   ``markov_w1.weight`` (``dflash.cpp:127``) and is sent to method ``dspark``; Bee/buun's
   ``dflash-draft`` schema is refused by name.
2. metadata: the usual ``dflash.block_count``, ``.embedding_length``,
   ``.feed_forward_length``, ``.attention.head_count[_kv]``, ``.attention.key_length``,
   ``.rope.freq_base``, ``.attention.layer_norm_rms_epsilon``, ``.context_length``,
   optional ``.attention.sliding_window`` with ``.attention.sliding_window_pattern``
   (true = sliding); ``dflash.block_size``; ``dflash.target_layers`` written as
   ``target_layer_ids + 1`` by the converter (``conversion/qwen.py:735-738``: it records
   input captures), so 1 is subtracted here; the mask token in the standard
   ``tokenizer.ggml.mask_token_id`` (``qwen.py:696-698``). Optional, as the converter
   writes them (``qwen.py:719-734``, ``751-754``): ``.embedding_scale``
   (input_embedding_scale), ``.logit_scale`` (output_multiplier),
   ``.final_logit_softcapping``, ``.attention.causal`` (is_causal). ``.hidden_act`` other
   than silu and ``.attention.value_scale`` have no implementation here and are refused.
   DFlash2 adds ``dflash.conv_kernel_size``, ``.conv_group_size``, ``.selector_rank``,
   ``.selector_top_k`` (``llama-arch.cpp:374-378``, written by ``qwen.py:713-717``),
   all required once the selector is present (``dflash.cpp:141-146``).
3. tensors: ``fc`` ``[H, taps * H]``, ``enc.output_norm`` (hidden_norm), ``output_norm``
   (norm) and the Qwen3 ``blk.N.*`` set (NEOX rope: Q/K are not permuted); no embedding
   and no LM head (the target's), norms stored raw. DFlash2's, with ggml's ``ne`` order
   reversed into numpy's (``dflash.cpp:153-155``, ``250-257``; names
   ``llama-arch.cpp:708-714``, HF sources ``gguf-py/gguf/tensor_mapping.py:1410-1436``):

   - ``blk.N.attn_conv_base`` / ``blk.N.ffn_conv_base`` (no ``.weight`` suffix): z-lab
     ``layers.N.{attention,mlp}_conv.base_kernel``, ``[2, kernel, H]``; the converter
     stores them F32 (a name not ending in ``.weight``: ``conversion/base.py:1119``);
   - ``blk.N.attn_conv_proj.weight`` / ``ffn_conv_proj.weight``:
     ``kernel_projection.weight``, ``[2 * kernel * H / group, H]``, rows read as
     ``[side, tap, group]`` exactly as z-lab views them (``dflash.cpp:436``: ggml
     ``reshape_4d(dynamic, groups, kernel, 2, T)``), so nothing is permuted;
   - ``selector_predecessor.weight`` / ``selector_successor.weight``: the codebooks
     ``[V, rank]`` (the converter appends ``.weight``, ``qwen.py:852-856``), read by row
     gathers (``GGML_OP_GET_ROWS``, ``llama-arch.cpp:1005-1006``);
   - ``selector_hidden.weight``: ``hidden_projection.weight`` ``[rank, H]``.

Quantized matrices (projections, ``fc``, the conv projections, the selector's hidden
projection) stay in their stored type where the core's quantized kernels run them
(a type's ``WeightType.native``, bf16 on CPU: Q8_0, Q4_K, Q6_K, ...); quantized codebooks
stay quantized too and their gathered rows are dequantized exactly to fp32
(``models.quant.dequant_rows``, as ggml's get_rows does). The rest is dequantized to the
model dtype, and that is said in the load summary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from draftwise.kit import (
    DecoderLayer,
    ModelFormatError,
    QuantPart,
    keep_quantized,
    pack_quant,
)

from draftwise_dflash.config import DFlashConfig
from draftwise_dflash.conv import BlockConv, SelectorWeights

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
#: DFlash2 per-layer tensors: GGUF kind -> z-lab module under ``layers.N.``
_CONV = {"attn_conv_base": "attention_conv.base_kernel",
         "ffn_conv_base": "mlp_conv.base_kernel",
         "attn_conv_proj": "attention_conv.kernel_projection",
         "ffn_conv_proj": "mlp_conv.kernel_projection"}
_SELECTOR = {"selector_predecessor.weight": "candidate_selector.predecessor_codebook",
             "selector_successor.weight": "candidate_selector.successor_codebook",
             "selector_hidden.weight": "candidate_selector.hidden_projection.weight"}
#: llama.cpp's DFlash2 marker (``dflash.cpp:139``)
V2_MARKER = "selector_hidden.weight"
_V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
#: z-lab name of each fused projection's parts -> the core layer's weight
_FUSED = {"qkv_weight": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "o_weight": ("self_attn.o_proj",), "gate_up_weight": ("mlp.gate_proj", "mlp.up_proj"),
          "down_weight": ("mlp.down_proj",)}


class DFlashGGUFError(ModelFormatError):
    """A GGUF this loader cannot run as a DFlash drafter; says why and what works."""


def z_name(gguf_name: str) -> str | None:
    """The z-lab safetensors name of a GGUF tensor (None: not a DFlash tensor)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    if gguf_name in _SELECTOR:
        return _SELECTOR[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    if len(parts) == 4 and parts[2] in _LAYER:
        return f"layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    if len(parts) == 3 and parts[2].endswith("_conv_base"):
        return f"layers.{parts[1]}.{_CONV[parts[2]]}" if parts[2] in _CONV else None
    if len(parts) == 4 and parts[2].endswith("_conv_proj") and parts[3] == "weight":
        return f"layers.{parts[1]}.{_CONV[parts[2]]}.weight" if parts[2] in _CONV else None
    return None


def config_dict(ckpt: Any, runs: str) -> dict[str, Any]:
    """Rules 1-2: the z-lab config.json this GGUF stands for, or a named refusal."""
    _check_container(ckpt, runs)
    d = _base_config(ckpt, runs)
    _optional_keys(ckpt, d, runs)
    return d


def _need(ckpt: Any, key: str, runs: str) -> Any:
    """A required metadata value, or a refusal naming the key."""
    if key not in ckpt.metadata:
        raise DFlashGGUFError(ckpt.path, f"metadata key {key!r} is missing; a DFlash GGUF "
                              f"needs it. Instead: re-convert the drafter, or {runs}.", key=key)
    return ckpt.metadata[key]


def _check_container(ckpt: Any, runs: str) -> None:
    """Rule 1: a mainline ``dflash`` GGUF without a DSpark head."""
    path, arch = ckpt.path, ckpt.architecture
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
                              "drafter (its safetensors directory or this GGUF).")


def _base_config(ckpt: Any, runs: str) -> dict[str, Any]:
    """Rule 2's required keys as the config dict; keys with no implementation refused."""
    path, meta, names = ckpt.path, ckpt.metadata, ckpt.tensor_names
    v2 = V2_MARKER in names

    def need(key: str) -> Any:
        return _need(ckpt, key, runs)

    hidden = int(need("dflash.embedding_length"))
    heads = int(need("dflash.attention.head_count"))
    layers = int(need("dflash.block_count"))
    taps = [int(t) - 1 for t in need("dflash.target_layers")]
    head_dim = int(meta.get("dflash.attention.key_length", hidden // heads))
    unsupported = {"dflash.attention.value_scale": "an attention value scale"}
    if int(meta.get("dflash.rope.dimension_count", head_dim)) != head_dim:
        unsupported["dflash.rope.dimension_count"] = "partial rotary embeddings"
    for key, why in unsupported.items():
        if key in meta:
            raise DFlashGGUFError(path, f"metadata {key}={meta[key]!r}: {why} is not "
                                  f"implemented for DFlash drafters here. Instead: {runs} "
                                  "of a drafter without it.", key=key)
    act = meta.get("dflash.hidden_act", "silu")
    if act != "silu":
        raise DFlashGGUFError(path, f"dflash.hidden_act={act!r}: only silu MLPs run here. "
                              f"Instead: a silu DFlash drafter.", key="dflash.hidden_act")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens else meta.get("dflash.vocab_size")
    if vocab is None:
        # DFlash1 reads no vocabulary of its own; DFlash2's is its codebooks' rows
        vocab = ckpt.info("selector_predecessor.weight").shape[0] if (
            v2 and "selector_predecessor.weight" in names) else 1
    d: dict[str, Any] = {
        "architectures": ["DFlash2DraftModel" if v2 else "DFlashDraftModel"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("dflash.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "intermediate_size": int(need("dflash.feed_forward_length")),
        "vocab_size": int(vocab),
        "rms_norm_eps": float(meta.get("dflash.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get("dflash.rope.freq_base", 1e6)),
        "max_position_embeddings": int(meta.get("dflash.context_length", 32768)),
        "dflash_config": {
            "block_size": int(need("dflash.block_size")),
            "target_layer_ids": taps,
            "mask_token_id": int(need("tokenizer.ggml.mask_token_id")),
        },
    }
    return d


def _optional_keys(ckpt: Any, d: dict[str, Any], runs: str) -> None:
    """Rule 2's optional keys and DFlash2's four, into ``d``."""
    path, meta = ckpt.path, ckpt.metadata

    def need(key: str) -> Any:
        return _need(ckpt, key, runs)

    sub = d["dflash_config"]
    for key, name in (("embedding_scale", "input_embedding_scale"),
                      ("logit_scale", "output_multiplier"),
                      ("final_logit_softcapping", "final_logit_softcapping")):
        if f"dflash.{key}" in meta:
            sub[name] = float(meta[f"dflash.{key}"])
    if "dflash.attention.causal" in meta:
        d["is_causal"] = bool(meta["dflash.attention.causal"])
    if d["architectures"] == ["DFlash2DraftModel"]:
        missing = [k for k in _V2_KEYS if f"dflash.{k}" not in meta]
        if missing:
            raise DFlashGGUFError(
                path, f"a DFlash2 GGUF ({V2_MARKER} present) without metadata "
                f"{['dflash.' + k for k in missing]} (llama.cpp refuses it too: 'DFlash2 "
                f"model is missing conv/selector metadata'). Instead: re-convert the drafter "
                f"with llama.cpp's convert_hf_to_gguf.py, or {runs}.", key=f"dflash.{missing[0]}")
        sub.update({k: int(meta[f"dflash.{k}"]) for k in _V2_KEYS})
    pattern = meta.get("dflash.attention.sliding_window_pattern")
    if pattern is not None:
        d["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        d["sliding_window"] = int(need("dflash.attention.sliding_window"))


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
    v2 = any(z.startswith("candidate_selector.") for z in shapes)
    extra += [found.pop(z) for z in list(found) if z not in shapes]
    if extra:
        hint = ""
        if not v2 and any("_conv_" in n or n.startswith("selector_") for n in extra):
            hint = (f" (DFlash2 tensors without {V2_MARKER}, which is what marks a DFlash2 "
                    "GGUF for llama.cpp and here)")
        raise DFlashGGUFError(ckpt.path, f"tensors {extra[:4]} are not "
                              f"{'DFlash2' if v2 else 'DFlash1'} tensors{hint}", key=extra[0])
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
    rev = {v: k for k, v in {**_GLOBAL, **_SELECTOR}.items()}
    if z in rev:
        return rev[z]
    _, i, rest = z.split(".", 2)
    conv = {v: k for k, v in _CONV.items()}
    if rest in conv:
        return f"blk.{i}.{conv[rest]}"
    base, suffix = rest.rsplit(".", 1)
    if base in conv:
        return f"blk.{i}.{conv[base]}.{suffix}"
    kind = next(k for k, v in _LAYER.items() if v == base)
    return f"blk.{i}.{kind}.{suffix}"


def read_gguf_weights(ckpt: Any, cfg: DFlashConfig, found: dict[str, str], dtype: torch.dtype,
                      device: torch.device) -> tuple[Any, list[str]]:
    """The drafter's weights (``model.DFlashWeights``) and one line per stored type that
    was dequantized. Projections stay quantized where the kernels run them."""
    from draftwise_dflash.model import DFlashWeights
    from draftwise_dflash.packing import pack_layers, pack_v2

    keep, why = keep_quantized(dtype, device)
    widened: dict[str, int] = {}

    def dense(z: str) -> torch.Tensor:
        name = found[z]
        qt = ckpt.qtype(name)
        if not qt.dense:
            widened[qt.name] = widened.get(qt.name, 0) + 1
        return torch.from_numpy(ckpt.dequantize(name).copy()).to(dtype=dtype, device=device)

    def quant(zs: tuple[str, ...], k: int) -> Any:
        if not keep or not all(ckpt.qtype(found[z]).native for z in zs):
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

    def matrix(z: str, k: int) -> Any:
        packed = quant((z,), k)
        return packed if packed is not None else dense(z)

    fc = matrix("fc.weight", len(cfg.target_layer_ids) * h)
    convs, selector = _v2_weights(cfg, dense, matrix)
    pack_v2(convs, selector)
    weights = DFlashWeights(fc, dense("hidden_norm.weight"), dense("norm.weight"), layers,
                            convs, selector)
    notes = [f"{n} ({count} tensors) dequantized to {str(dtype).removeprefix('torch.')}"
             + (f": {why}" if why else ": no native kernel for the type")
             for n, count in sorted(widened.items())]
    return weights, notes


def _v2_weights(cfg: DFlashConfig, dense: Callable[[str], torch.Tensor],
                matrix: Callable[[str, int], Any]
                ) -> tuple[list[tuple[BlockConv, BlockConv]], SelectorWeights | None]:
    """DFlash2's convolutions and selector (none for DFlash1): base kernels dense, the
    projections and codebooks through ``matrix`` (quantized where the kernels run them)."""
    if cfg.v2 is None:
        return [], None
    h, gs = cfg.decoder.hidden_size, cfg.v2.conv_group_size
    convs: list[tuple[BlockConv, BlockConv]] = []
    for i in range(cfg.decoder.num_hidden_layers):
        attn, mlp = (BlockConv(dense(f"layers.{i}.{n}.base_kernel"),
                               matrix(f"layers.{i}.{n}.kernel_projection.weight", h), gs)
                     for n in ("attention_conv", "mlp_conv"))
        convs.append((attn, mlp))
    r = cfg.v2.selector_rank
    selector = SelectorWeights(
        matrix("candidate_selector.predecessor_codebook", r),
        matrix("candidate_selector.successor_codebook", r),
        matrix("candidate_selector.hidden_projection.weight", h),
        cfg.v2.selector_top_k,
    )
    return convs, selector


__all__ = ["ARCH", "DFlashGGUFError", "check_tensors", "config_dict", "read_gguf_weights",
           "z_name"]
