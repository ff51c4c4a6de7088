"""The draft stage's loader for method ``dflash``: identify, check, load.

``detect`` reads only the draft's own files, in this order (the cheapest refusal first):

1. the container: a safetensors directory runs (plain, or NVFP4 in ModelOpt's or
   compressed-tensors' convention: ``draftwise.formats.nvfp4``), and a llama.cpp
   ``dflash`` GGUF of a DFlash1 or DFlash2 drafter (``draftwise_dflash.gguf_drafter``); an EXL3
   directory (``quantization_config.quant_method == "exl3"``) and any other quantized
   declaration are refused by name with what would work;
2. the config (:func:`draftwise_dflash.config.parse_config`): DFlash1 or DFlash2;
3. every tensor name, shape and stored dtype against that config (headers only).

``check_target`` (before the target loads: its header alone) and ``load`` (again, before
reading a weight) then check the pair: the draft's hidden size is the
target's, every ``target_layer_ids`` entry is a target layer, ``num_target_layers`` (when
declared) is the target's depth, the mask token is in the target's vocabulary (a
``mask_token`` string is looked up in the target's tokenizer, by ``load`` only), and
DFlash2's codebooks cover the target's vocabulary. The embedding and LM head are the target's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from draftwise.kit import (
    DecoderLayer,
    DraftCheckpoint,
    KVLayout,
    LoadedDraft,
    ModelFormatError,
    TargetHeader,
    read_json,
)
from pydantic import BaseModel

from draftwise_dflash.config import DFlashConfig, parse_config
from draftwise_dflash.conv import BlockConv, SelectorWeights
from draftwise_dflash.model import DFlashModel, DFlashWeights
from draftwise_dflash.packing import pack_layers, pack_v2

#: what runs, for messages and ``draftwise plugins``
RUNS = ("a safetensors directory (config.json + *.safetensors: bf16/fp16/fp32, or NVFP4 "
        "from ModelOpt or compressed-tensors) or a llama.cpp 'dflash' GGUF of a DFlash1 or "
        "DFlash2 drafter")


class DFlashError(ModelFormatError):
    """A DFlash drafter this engine cannot use with this target; says why and what works."""


class DFlashLoader:
    """``Loader`` for z-lab DFlash1/DFlash2 drafters."""

    def detect(self, path: str) -> DraftCheckpoint:
        """Container, config and tensor headers of the draft (module doc, rules 1-3)."""
        gguf_path = _gguf_file(path)
        if gguf_path is not None:
            from draftwise.kit import GGUFCheckpoint

            from draftwise_dflash.gguf_drafter import check_tensors, config_dict

            gckpt = GGUFCheckpoint(gguf_path)
            cfg = parse_config(config_dict(gckpt, RUNS), gguf_path)
            check_tensors(gckpt, expected_shapes(cfg))
            fmt, path = "gguf", gguf_path
        else:
            from draftwise.kit import SafetensorsCheckpoint

            raw, decl = read_container(path, RUNS)
            cfg = parse_config(raw, os.path.join(path, "config.json"))
            packed = _check_tensors(SafetensorsCheckpoint(path), cfg, decl)
            fmt = "safetensors" if decl is None else f"safetensors (NVFP4, {decl.convention})"
        return DraftCheckpoint(
            path,
            fmt,
            cfg.architecture,
            {
                "block_size": cfg.block_size,
                "target_layer_ids": list(cfg.target_layer_ids),
                "hidden_size": cfg.decoder.hidden_size,
                "num_hidden_layers": cfg.decoder.num_hidden_layers,
                "dflash": cfg,
                "nvfp4": None if gguf_path is not None or decl is None else (decl, packed),
            },
        )

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """The pair checks the target's header decides (hidden size, layers, vocabulary)."""
        check_sizes(checkpoint.path, checkpoint.config["dflash"], target.hidden_size,
                    target.num_hidden_layers, target.vocab_size)

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The drafter over ``target``'s embedding and LM head (pair checks first)."""
        cfg: DFlashConfig = checkpoint.config["dflash"]
        mask = check_pair(checkpoint.path, cfg, target)
        model = target.model
        notes: list[str] = []
        if checkpoint.format == "gguf":
            from draftwise.kit import GGUFCheckpoint

            from draftwise_dflash.gguf_drafter import check_tensors, read_gguf_weights

            gckpt = GGUFCheckpoint(checkpoint.path)
            found = check_tensors(gckpt, expected_shapes(cfg))
            weights, notes = read_gguf_weights(gckpt, cfg, found, model.dtype, model.device)
        else:
            from draftwise.kit import SafetensorsCheckpoint

            nv = checkpoint.config.get("nvfp4")
            weights = read_weights(SafetensorsCheckpoint(checkpoint.path), cfg, model.dtype,
                                   model.device, nv)
            if nv is not None:
                notes.append(f"{len(nv[1])} NVFP4 modules dequantized to "
                             f"{str(model.dtype).removeprefix('torch.')} (no packed NVFP4 kernel)")
        dc = cfg.decoder
        version = "DFlash2" if cfg.v2 is not None else "DFlash1"
        return LoadedDraft(
            weights=LoadedDFlash(
                DFlashModel(cfg, weights, model.dtype, model.device, model.backend), mask),
            kv_layout=KVLayout(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim,
                               model.dtype),
            hidden_layers=cfg.target_layer_ids,
            max_model_len=dc.max_position_embeddings,
            summary=(f"{version}, block {cfg.block_size}, {dc.num_hidden_layers} layers, taps "
                     f"{list(cfg.target_layer_ids)}, mask {mask}"
                     + "".join(f"; {n}" for n in notes)),
        )


class LoadedDFlash:
    """What the proposer gets: the model and the resolved mask token id."""

    def __init__(self, model: DFlashModel, mask_token_id: int) -> None:
        self.model = model
        self.mask_token_id = mask_token_id


def _gguf_file(path: str) -> str | None:
    """A ``.gguf`` file, or a directory without config.json holding exactly one."""
    if os.path.isfile(path):
        return path if path.endswith(".gguf") or _is_gguf(path) else None
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        found = [f for f in os.listdir(path) if f.endswith(".gguf")]
        if len(found) == 1:
            return os.path.join(path, found[0])
        if found:
            raise DFlashError(path, f"holds {len(found)} .gguf files; name the one to use")
    return None


def read_container(path: str, runs: str = RUNS) -> tuple[dict[str, Any], Any]:
    """Rule 1: the config dict of a directory this loader runs and its NVFP4 declaration
    (None: not quantized), else a named refusal (``runs``: what works, for messages;
    dspark reuses it)."""
    if not os.path.exists(path):
        raise DFlashError(path, f"no such file or directory. Instead: {runs}.")
    if not os.path.isdir(path):
        raise DFlashError(path, f"not a DFlash drafter. Instead: {runs}.")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise DFlashError(path, f"no config.json. Instead: {runs}.")
    d = read_json(cfg_path)
    quant = d.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "exl3":
        raise DFlashError(
            path,
            f"an EXL3 drafter (bits={quant.get('bits')}, codebook="
            f"{quant.get('codebook', 'mul1')}): EXL3 trellis weights decode only through "
            f"exllamav3's CUDA kernels. Instead: {runs}, or an NVFP4 export.",
            key="quantization_config",
        )
    from draftwise.kit import nvfp4 as nvfp4_format

    return d, nvfp4_format.declaration(path, d, runs)


def _is_gguf(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"GGUF"


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, as z-lab's ``save_pretrained`` writes them."""
    c = cfg.decoder
    h = c.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, len(cfg.target_layer_ids) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        for name, width in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (width, h)
            if c.attention_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (width,)
        shapes[f"{p}self_attn.o_proj.weight"] = (h, c.q_size)
        shapes[f"{p}self_attn.q_norm.weight"] = (c.head_dim,)
        shapes[f"{p}self_attn.k_norm.weight"] = (c.head_dim,)
        for name in ("gate", "up"):
            shapes[f"{p}mlp.{name}_proj.weight"] = (c.intermediate_size, h)
        shapes[f"{p}mlp.down_proj.weight"] = (h, c.intermediate_size)
        shapes[f"{p}input_layernorm.weight"] = (h,)
        shapes[f"{p}post_attention_layernorm.weight"] = (h,)
        if cfg.v2 is not None:
            taps, groups = cfg.v2.conv_kernel_size, h // cfg.v2.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                shapes[f"{p}{conv}.base_kernel"] = (2, taps, h)
                shapes[f"{p}{conv}.kernel_projection.weight"] = (2 * taps * groups, h)
    if cfg.v2 is not None:
        v, r = c.vocab_size, cfg.v2.selector_rank
        shapes["candidate_selector.predecessor_codebook"] = (v, r)
        shapes["candidate_selector.successor_codebook"] = (v, r)
        shapes["candidate_selector.hidden_projection.weight"] = (r, h)
    return shapes


#: z-lab's from_pretrained key_mapping for DFlash2 codebooks saved as ``.weight``
_ALIASES = {
    f"candidate_selector.{n}.weight": f"candidate_selector.{n}"
    for n in ("predecessor_codebook", "successor_codebook")
}


def _check_tensors(ckpt: Any, cfg: DFlashConfig, decl: Any = None) -> dict[str, str]:
    """Rule 3: names, shapes, dtypes from the headers; a DFlash2 tensor in a DFlash1
    config (or the other way round) is named. With an NVFP4 declaration, the Linear
    modules are checked against it both ways; returns module -> packed/plain."""
    stored = {_ALIASES.get(n, n): t for n, t in ckpt.tensors.items()}
    want = expected_shapes(cfg)
    stored, want, packed = strip_nvfp4(decl, stored, want, ckpt.path)
    missing = [n for n in want if n not in stored]
    if missing:
        hint = ""
        if cfg.v2 is not None and any("conv" in n or "selector" in n for n in missing):
            hint = " (the config says DFlash2, but the DFlash2 tensors are absent)"
        raise DFlashError(ckpt.path, f"missing tensors {missing[:4]}{hint}", key=missing[0])
    extra = [n for n in stored if n not in want]
    if extra:
        hint = ""
        if cfg.v2 is None and any("conv" in n or "selector" in n for n in extra):
            hint = (" (DFlash2 tensors in a DFlash1 config: architectures should be "
                    "DFlash2DraftModel)")
        raise DFlashError(ckpt.path, f"unexpected tensors {extra[:4]}{hint}", key=extra[0])
    for name, shape in want.items():
        got = tuple(stored[name].shape)
        if got != shape:
            raise DFlashError(ckpt.path, f"tensor {name!r} has shape {list(got)}, expected "
                              f"{list(shape)} from config.json", key=name)
    plain = [n for n in ckpt.tensors if _ALIASES.get(n, n) in want]
    ckpt.check_dtypes(plain)
    return packed


def is_linear(name: str) -> bool:
    """A Linear module's weight (what NVFP4 quantizes); norms, codebooks and conv base
    kernels are not (public: dspark's rule extends it with its heads)."""
    return name == "fc.weight" or name.endswith(("_proj.weight", "_projection.weight"))


def strip_nvfp4(decl: Any, stored: dict[str, Any], want: dict[str, tuple[int, ...]],
                path: str, linear: Callable[[str], bool] = is_linear,
                ) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, str]]:
    """The NVFP4 part of rule 3 (``decl`` None: nothing to do): every Linear in ``want``
    (``linear``, default this loader's rule) checked against the declaration and the
    tensors both ways (``formats.nvfp4.plan``); returns ``stored`` without the packed
    modules' tensors, ``want`` without their weights (so the plain name/shape/dtype
    checks run over the rest), and the packed modules (module -> "packed"). dspark
    passes its own Linears (its heads) through the same rule."""
    if decl is None:
        return stored, want, {}
    from draftwise.kit import nvfp4 as nvfp4_format

    linears = {n.removesuffix(".weight"): shape for n, shape in want.items()
               if len(shape) == 2 and linear(n)}
    packed = {m: kind for m, kind in nvfp4_format.plan(decl, stored, linears, path).items()
              if kind == "packed"}
    side = nvfp4_format.side_tensors(decl, packed)
    want = {n: s for n, s in want.items() if n.removesuffix(".weight") not in packed}
    stored = {n: t for n, t in stored.items() if n not in side}
    return stored, want, packed


def check_pair(path: str, cfg: DFlashConfig, target: Any) -> int:
    """The pair checks of the module doc; returns the mask token id."""
    tc = target.config
    check_sizes(path, cfg, int(tc.hidden_size), int(tc.num_hidden_layers), int(tc.vocab_size))
    vocab = int(tc.vocab_size)
    mask = cfg.mask_token_id
    if mask is None:
        tok = getattr(target, "tokenizer", None)
        mask = None if tok is None else tok.backend.token_to_id(cfg.mask_token)
        if mask is None:
            raise DFlashError(
                path,
                f"mask_token {cfg.mask_token!r} is not in the target's vocabulary. Instead: "
                "set dflash_config.mask_token_id.",
                key="mask_token",
            )
    check_mask_id(path, int(mask), vocab)
    return int(mask)


def check_sizes(path: str, cfg: DFlashConfig, hidden_size: int, num_layers: int,
                vocab: int) -> None:
    """The pair checks two headers decide (the target's sizes against the drafter's
    config): run by ``check_target`` before the target loads and again by ``load``."""
    if cfg.decoder.hidden_size != hidden_size:
        raise DFlashError(
            path,
            f"the drafter's hidden_size is {cfg.decoder.hidden_size} and the target's "
            f"{hidden_size}: DFlash feeds the target's hidden states and embeddings to the "
            "drafter unchanged. Instead: the DFlash drafter trained for this target.",
            key="hidden_size",
        )
    layers = num_layers
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise DFlashError(
            path,
            f"target_layer_ids {list(cfg.target_layer_ids)} name layers {bad} outside the "
            f"target's 0..{layers - 1} (z-lab numbers the output of decoder layer i). "
            "Instead: the drafter trained for this target.",
            key="target_layer_ids",
        )
    if cfg.num_target_layers is not None and cfg.num_target_layers != layers:
        raise DFlashError(
            path,
            f"num_target_layers={cfg.num_target_layers} but the target has {layers} layers: "
            "the drafter was trained on another target. Instead: its own target, or the "
            "drafter trained for this one.",
            key="num_target_layers",
        )
    if cfg.v2 is not None and cfg.decoder.vocab_size != vocab:
        raise DFlashError(
            path,
            f"the DFlash2 selector's codebooks cover {cfg.decoder.vocab_size} tokens and the "
            f"target has {vocab}: its candidate scores would index other tokens. Instead: "
            "the drafter trained for this target.",
            key="vocab_size",
        )
    if cfg.v2 is not None and cfg.v2.selector_top_k > vocab:
        raise DFlashError(
            path,
            f"selector_top_k={cfg.v2.selector_top_k} exceeds the target's vocabulary ({vocab}): "
            "the candidate walk cannot run, and DFlash2 is never replaced by a per-slot "
            "argmax. Instead: the drafter trained for this target.",
            key="selector_top_k",
        )
    if cfg.mask_token_id is not None:  # a token string needs the target's tokenizer
        check_mask_id(path, cfg.mask_token_id, vocab)


def check_mask_id(path: str, mask: int, vocab: int) -> None:
    """The mask token must be one of the target's ids (the block's slots embed it)."""
    if not 0 <= mask < vocab:
        raise DFlashError(
            path, f"mask_token_id={mask} is outside the target's vocabulary [0, {vocab})",
            key="mask_token_id",
        )


def read_weights(
    ckpt: Any, cfg: DFlashConfig, dtype: torch.dtype, device: torch.device, nvfp4: Any = None
) -> DFlashWeights:
    """Every tensor into its slot (q/k/v and gate/up fused as the core's layers keep them),
    then the projections packed for this machine. ``nvfp4``: (declaration, packed
    modules) from detect; those modules are dequantized (``draftwise.formats.nvfp4``)."""
    c = cfg.decoder
    side: set[str] = set()
    t: dict[str, torch.Tensor] = {}
    if nvfp4 is not None:
        from draftwise.kit import nvfp4 as nvfp4_format

        decl, packed = nvfp4
        side = nvfp4_format.side_tensors(decl, packed)
        t.update(dequantized(ckpt, decl, packed, dtype, device))
    plain = [n for n in ckpt.tensors if n not in side]
    t.update({_ALIASES.get(n, n): x.to(dtype=dtype, device=device)
              for n, x in ckpt.iter_tensors(plain)})
    layers: list[DecoderLayer] = []
    convs: list[tuple[BlockConv, BlockConv]] = []
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        layer = DecoderLayer(c, i, dtype, device)
        a = p + "self_attn."
        with torch.no_grad():
            layer.input_norm.copy_(t[p + "input_layernorm.weight"])
            layer.post_norm.copy_(t[p + "post_attention_layernorm.weight"])
            layer.qkv_weight.copy_(torch.cat([t[a + f"{n}_proj.weight"] for n in "qkv"]))
            if layer.qkv_bias is not None:
                layer.qkv_bias.copy_(torch.cat([t[a + f"{n}_proj.bias"] for n in "qkv"]))
            if layer.qk_norm is not None:
                layer.qk_norm.copy_(torch.cat([
                    t[a + "q_norm.weight"].expand(c.num_attention_heads, -1),
                    t[a + "k_norm.weight"].expand(c.num_key_value_heads, -1),
                ]))
            layer.o_weight.copy_(t[a + "o_proj.weight"])
            layer.gate_up_weight.copy_(torch.cat([t[p + "mlp.gate_proj.weight"],
                                                  t[p + "mlp.up_proj.weight"]]))
            layer.down_weight.copy_(t[p + "mlp.down_proj.weight"])
        layers.append(layer)
        if cfg.v2 is not None:
            gs = cfg.v2.conv_group_size
            convs.append(tuple(  # type: ignore[arg-type]
                BlockConv(t[f"{p}{n}.base_kernel"], t[f"{p}{n}.kernel_projection.weight"], gs)
                for n in ("attention_conv", "mlp_conv")))
    pack_layers(layers)
    selector = None
    if cfg.v2 is not None:
        selector = SelectorWeights(
            t["candidate_selector.predecessor_codebook"],
            t["candidate_selector.successor_codebook"],
            t["candidate_selector.hidden_projection.weight"],
            cfg.v2.selector_top_k,
        )
    pack_v2(convs, selector)
    return DFlashWeights(t["fc.weight"], t["hidden_norm.weight"], t["norm.weight"], layers,
                         convs, selector)


def dequantized(ckpt: Any, decl: Any, packed: dict[str, str], dtype: torch.dtype,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Each NVFP4 module's weight (``{module}.weight``), dequantized from its stored bytes
    (public: dspark dequantizes its heads with it)."""
    from draftwise.kit import nvfp4 as nvfp4_format
    from safetensors import safe_open

    w, s, g, _ = nvfp4_format.SUFFIXES[decl.convention]
    out = {}
    for module in packed:
        parts = []
        for suffix in (w, s, g):
            entry = ckpt.tensors[f"{module}.{suffix}"]
            with safe_open(entry.file, framework="pt") as fh:
                parts.append(fh.get_tensor(entry.name))
        out[f"{module}.weight"] = nvfp4_format.dequantize(*parts, decl.convention).to(dtype=dtype,
                                                                         device=device)
    return out


__all__ = ["DFlashError", "DFlashLoader", "LoadedDFlash", "check_pair", "dequantized",
           "expected_shapes", "is_linear", "read_container",
           "read_weights", "strip_nvfp4"]
