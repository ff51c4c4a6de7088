"""Find and load an MTP head (the heavy half of the loader), or refuse it by name.

Layouts (drafter-formats §3):

- ``qwen3_next`` — ``mtp.*`` inside a Qwen3-Next / Qwen3.5 / Qwen3.6 checkpoint: ``fc``,
  ``pre_fc_norm_{embedding,hidden}``, ``norm`` (zero-centred) and ``mtp.layers.{i}``, a
  gated full-attention layer of the target's own type.
- ``deepseek_nextn`` — DeepSeek-V3 style, ``model.layers.{L+i}.{eh_proj, enorm, hnorm,
  shared_head.{norm,head}}`` plus a normal decoder block, here on a llama-family target.
- GGUF — ``blk.{N}.nextn.*`` is detected (``{arch}.nextn_predict_layers``); a file without
  it is refused by name, one with it is refused as not loadable yet.

The head shares the target's embedding (and LM head, unless ``shared_head.head`` is
present) and gets its own one-layer attention per MTP layer. MoE MTP layers are refused.

It runs the target's kernels (``target.backend``, decided once at load): its projections,
``fc`` and an own LM head are packed like the target's (:func:`pack_weights`: the native
GEMM on bf16), its norms, RoPE and SiLU-and-multiply are the C elementwise kernels where
the target's are, and its attention is the native paged attention where the backend
takes its head size (``Backend.attention_for``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from draftwise.kit import ModelFormatError, SafetensorsCheckpoint, Weight, pack_weights
from torch import nn

_DEEPSEEK_HEAD = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")


class MtpHeadError(ModelFormatError):
    """The checkpoint has no usable MTP head; the message says which and what works."""


@dataclass(slots=True)
class MtpHead:
    """A loaded head: the input fusion, its decoder layers, the output norm."""

    layout: str  # "qwen3_next" or "deepseek_nextn"
    fc: Weight  # [hidden, 2 * hidden]: [norm(E[x_{t+1}]) ; norm(h_t)] -> hidden, packed
    norm_embedding: torch.Tensor  # [hidden]
    norm_hidden: torch.Tensor  # [hidden]
    final_norm: torch.Tensor  # [hidden]
    layers: list[nn.Module]
    zero_centred: bool  # x̂·(1+w) (Qwen) or w·x̂ (DeepSeek / llama)
    eps: float
    lm_head: Weight | None = None  # shared_head.head (packed); None: the target's LM head
    mask_first_embedding: bool = False  # DeepSeek zeroes the embedding at position 0
    names: list[str] = field(default_factory=list)
    #: the target's kernels: ``native`` or ``torch`` attention at the head's size, and
    #: whether norms/RoPE/SiLU run as C kernels
    attention: str = "torch"
    native: bool = False

    @property
    def num_layers(self) -> int:
        """MTP layers (vLLM's n_predict)."""
        return len(self.layers)


def detect(path: str) -> str:
    """``safetensors:<layout>`` when a usable head is there; a named refusal otherwise."""
    return f"safetensors:{detect_layout(path)[0]}"


def detect_layout(path: str) -> tuple[str, int, dict[str, Any]]:
    """(layout, MTP layers, config.json) of a checkpoint; reads headers, never weights."""
    if path.endswith(".gguf"):
        detect_gguf(path)  # always refuses for now, by name
    if not os.path.isdir(path):
        raise MtpHeadError(path, "an MTP head is read from a safetensors checkpoint directory")
    ckpt = SafetensorsCheckpoint(path)
    layout, n = _safetensors_layout(ckpt, path)
    return layout, n, dict(ckpt.config)


def detect_gguf(path: str) -> str:
    """Find ``blk.{N}.nextn.*`` in a GGUF; refuse files without it by name."""
    from draftwise.kit import GGUFCheckpoint

    ckpt = GGUFCheckpoint(path)
    arch = ckpt.architecture
    n = int(ckpt.metadata.get(f"{arch}.nextn_predict_layers") or 0)
    heads = sorted(
        {m.group(1) for t in ckpt.tensor_names if (m := re.match(r"blk\.(\d+)\.nextn\.", t))}
    )
    if n == 0 or not heads:
        raise MtpHeadError(
            path,
            f"this GGUF ({arch}) has no MTP head: {arch}.nextn_predict_layers={n}, "
            f"{len(heads)} blk.N.nextn.* blocks (many community conversions drop it). "
            "Instead: use a GGUF converted with its nextn block, or the safetensors checkpoint.",
        )
    raise MtpHeadError(
        path,
        f"found an MTP head in this GGUF (blk.{','.join(heads)}.nextn.*, "
        f"{arch}.nextn_predict_layers={n}) but GGUF MTP heads are not loadable yet. "
        "Instead: point 'model' at the safetensors checkpoint.",
    )


def _safetensors_layout(ckpt: SafetensorsCheckpoint, path: str) -> tuple[str, int]:
    """(layout, number of MTP layers) from tensor names; refusals name what is missing."""
    cfg = dict(ckpt.config.get("text_config") or ckpt.config)
    names = set(ckpt.tensors)
    qwen = sorted({int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
    if qwen:
        if any(
            ".mlp.experts." in n or n.endswith("mlp.gate.weight")
            for n in names
            if n.startswith("mtp.")
        ):
            raise MtpHeadError(
                path,
                "the MTP layer is mixture-of-experts, which is not implemented. "
                "Instead: use a dense model's MTP head, or another method (ngram).",
            )
        return "qwen3_next", len(qwen)
    base = int(cfg.get("num_hidden_layers", 0))
    deepseek = [i for i in range(base, base + 8) if f"model.layers.{i}.eh_proj.weight" in names]
    if deepseek:
        if any(re.match(rf"model\.layers\.{deepseek[0]}\.mlp\.experts\.", n) for n in names):
            raise MtpHeadError(
                path, "the nextn layer is mixture-of-experts, which is not implemented."
            )
        return "deepseek_nextn", len(deepseek)
    raise MtpHeadError(
        path,
        "no MTP head in this checkpoint: neither mtp.layers.* (Qwen3-Next/3.5) nor "
        f"model.layers.{base}.eh_proj (DeepSeek nextn). Instead: use a checkpoint that ships "
        "its MTP head, or another method (ngram, draft_model).",
    )


def load_head(path: str, target: Any, device: str | torch.device = "cpu") -> MtpHead:
    """Load the head found at ``path`` (usually the target's own directory) for ``target``."""
    if path.endswith(".gguf"):
        detect_gguf(path)  # always refuses for now, by name
    ckpt = SafetensorsCheckpoint(path)
    layout, n = _safetensors_layout(ckpt, path)
    model = target.model if hasattr(target, "model") else target
    dtype = model.dtype
    hidden = model.config.hidden_size
    if layout == "qwen3_next":
        from draftwise.kit import HybridLayer

        h = model.hybrid
        full = model.attention_layers[0]
        hybrid_layers = [HybridLayer(h, full, 0, dtype, device) for _ in range(n)]
        slots: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        for i, hl in enumerate(hybrid_layers):
            slots.update(hl.weight_slots(f"mtp.layers.{i}.", h))
        layers: list[nn.Module] = list(hybrid_layers)
        head_names = {
            "fc": "mtp.fc.weight",
            "ne": "mtp.pre_fc_norm_embedding.weight",
            "nh": "mtp.pre_fc_norm_hidden.weight",
            "fn": "mtp.norm.weight",
        }
    else:
        base = model.config.num_hidden_layers
        layers, slots = _llama_blocks(model.config, [base + i for i in range(n)], dtype, device)
        p = f"model.layers.{base}."
        head_names = {
            "fc": p + "eh_proj.weight",
            "ne": p + "enorm.weight",
            "nh": p + "hnorm.weight",
            "fn": p + "shared_head.norm.weight",
        }
    want = list(slots) + list(head_names.values())
    shared = f"model.layers.{model.config.num_hidden_layers}.shared_head.head.weight"
    if layout == "deepseek_nextn" and shared in ckpt.tensors:
        want.append(shared)
    missing = [w for w in want if w not in ckpt.tensors]
    if missing:
        raise MtpHeadError(path, f"MTP head is incomplete: missing {missing[:4]}")
    loaded = dict(ckpt.iter_tensors(want))
    with torch.no_grad():
        for name, (shape, dest) in slots.items():
            if tuple(loaded[name].shape) != tuple(shape):
                raise MtpHeadError(
                    path, f"{name} has shape {tuple(loaded[name].shape)}, expected {shape}"
                )
            dest.copy_(loaded[name])
    get = {k: loaded[v].to(dtype=dtype, device=device) for k, v in head_names.items()}
    if tuple(get["fc"].shape) != (hidden, 2 * hidden):
        raise MtpHeadError(
            path, f"fc/eh_proj has shape {tuple(get['fc'].shape)}, expected {(hidden, 2 * hidden)}"
        )
    own_head = loaded[shared].to(dtype=dtype, device=device) if shared in loaded else None
    backend = model.backend
    fc, lm_head = _pack_like_target(layers, get["fc"], own_head, backend)
    return MtpHead(
        layout=layout,
        fc=fc,
        norm_embedding=get["ne"],
        norm_hidden=get["nh"],
        final_norm=get["fn"],
        layers=layers,
        zero_centred=layout == "qwen3_next",
        eps=model.config.rms_norm_eps,
        lm_head=lm_head,
        mask_first_embedding=layout == "deepseek_nextn",
        names=sorted(want),
        attention=backend.attention_for(model.config.head_dim),
        native=backend.elementwise == "native",
    )


def _pack_like_target(
    layers: list[nn.Module], fc: torch.Tensor, lm_head: torch.Tensor | None, backend: Any
) -> tuple[Weight, Weight | None]:
    """Pack every projection, ``fc`` and an own LM head in the target's layout, and set the
    layers' elementwise kernels from its backend; returns the packed ``fc`` and head."""
    from draftwise.kit import DecoderLayer, HybridLayer, set_packed

    slots: list[tuple[nn.Module, str]] = []
    for layer in layers:
        if isinstance(layer, HybridLayer):
            layer.set_backend(backend)
            slots += layer.linear_slots()
        elif isinstance(layer, DecoderLayer):
            layer.native = backend.elementwise == "native"
            slots += [(layer, n) for n in layer._LINEARS]
    dense = [getattr(m, n) for m, n in slots] + [fc] + ([] if lm_head is None else [lm_head])
    packed = pack_weights(dense, backend.dense_gemm)
    for (module, name), weight in zip(slots, packed):
        if isinstance(module, DecoderLayer):
            module.set_packed(name, weight)
        else:
            set_packed(module, name, weight)
    return packed[len(slots)], None if lm_head is None else packed[len(slots) + 1]


def _llama_blocks(
    c: Any, layer_ids: list[int], dtype: torch.dtype, device: str | torch.device
) -> tuple[list[nn.Module], dict[str, tuple[tuple[int, ...], torch.Tensor]]]:
    """Llama-family decoder blocks for nextn layers, and where each HF tensor goes."""
    from draftwise.kit import DecoderLayer

    layers: list[nn.Module] = []
    slots: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
    q, kv, inter, hid = c.q_size, c.kv_size, c.intermediate_size, c.hidden_size
    for lid in layer_ids:
        layer = DecoderLayer(c, 0, dtype, device)
        layers.append(layer)
        p = f"model.layers.{lid}."
        slots[p + "input_layernorm.weight"] = ((hid,), layer.input_norm.data)
        slots[p + "post_attention_layernorm.weight"] = ((hid,), layer.post_norm.data)
        for name, part, width in (
            ("q", slice(0, q), q),
            ("k", slice(q, q + kv), kv),
            ("v", slice(q + kv, None), kv),
        ):
            slots[f"{p}self_attn.{name}_proj.weight"] = ((width, hid), layer.qkv_weight.data[part])
            if layer.qkv_bias is not None:
                slots[f"{p}self_attn.{name}_proj.bias"] = ((width,), layer.qkv_bias.data[part])
        slots[p + "self_attn.o_proj.weight"] = ((hid, q), layer.o_weight.data)
        if layer.qk_norm is not None:
            slots[p + "self_attn.q_norm.weight"] = (
                (c.head_dim,),
                layer.qk_norm.data[: c.num_attention_heads],
            )
            slots[p + "self_attn.k_norm.weight"] = (
                (c.head_dim,),
                layer.qk_norm.data[c.num_attention_heads :],
            )
        slots[p + "mlp.gate_proj.weight"] = ((inter, hid), layer.gate_up_weight.data[:inter])
        slots[p + "mlp.up_proj.weight"] = ((inter, hid), layer.gate_up_weight.data[inter:])
        slots[p + "mlp.down_proj.weight"] = ((hid, inter), layer.down_weight.data)
    return layers, slots


