"""A trained DFlash drafter (z-lab's layout) as llama.cpp's ``dflash`` GGUF.

Why: llama.cpp's ``llama-server --spec-type draft-dflash -md FILE.gguf`` then runs the very
same drafter beside its own target, the fairest peer comparison there is. Every fact below
is llama.cpp's, read at build 0c1e570 (the tree vendored in ``llama-cpp-python==0.3.36``):

1. Architecture ``dflash`` (``gguf-py/gguf/constants.py`` ``MODEL_ARCH.DFLASH``). The drafter
   is written as ``conversion/qwen.py::DFlashModel`` writes it: a Qwen3 decoder's keys under
   ``dflash.*`` plus ``dflash.block_size`` and ``dflash.target_layers``.
2. ``dflash.target_layers`` holds ``id + 1`` for each z-lab ``target_layer_ids`` entry
   (``DFlashModel.set_gguf_parameters``): llama.cpp records a layer's *input*
   (``llama_set_embeddings_layer_inp``, ``res->t_layer_inp[il] = inpL`` in
   ``src/models/llama.cpp``), and the input of layer ``id + 1`` is the output of ``id``.
3. A tap at the target's last layer cannot run on a stock build: the input of layer
   ``n_layer`` is recorded only by the deepseek4, nemotron-h and mimo2 graphs, so a llama or
   qwen2 target aborts on ``GGML_ASSERT(t_layer_inp[il] != nullptr)`` at its first request
   (seen with the default model's drafter on a stock build).
   draftwise's last tap is the target's final *normed* state (``train.record``, z-lab's
   ``hidden_states[L]``). Such a drafter is refused unless ``allow_final_tap`` says the
   llama.cpp in use carries ``benchmarks/llamacpp_final_tap.patch``, which records exactly
   that state.
4. No embedding and no LM head are written: ``llama_model_dflash::load_arch_tensors``
   makes both optional and the decoder graph borrows ``tok_embd``/``output`` from the
   target context (``ctx_other``). The vocabulary must still be the target's (the server
   checks draft/target compatibility), so the ``tokenizer.*`` keys are copied from the
   target GGUF, with ``tokenizer.ggml.mask_token_id`` set to the drafter's mask id
   (``common/speculative.cpp`` reads it through ``llama_vocab_mask``).
5. Attention in the block is non-causal unless ``dflash.attention.causal`` is true
   (``common_speculative_impl_draft_dflash``): the trainer's drafter is bidirectional, so
   the key is not written.
6. Rope is NeoX (``llama_model_rope_type``: DFlash without M-RoPE sections), the layout HF
   Qwen3 and this trainer use, so no Q/K permutation is applied (unlike llama targets).
7. Tensor names (``gguf-py/gguf/tensor_mapping.py``, ``model.`` prefix added by the
   converter): ``fc`` -> ``fc``, ``hidden_norm`` -> ``enc.output_norm``, ``norm`` ->
   ``output_norm``, and the Qwen3 per-layer names ``blk.N.{attn_norm, attn_q, attn_k,
   attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}``.
   Data keep PyTorch's ``[out, in]`` order; gguf-py writes the ggml shape reversed.

gguf 0.19 (draftwise's dependency) predates ``MODEL_ARCH.DFLASH``, so the key strings and
tensor names are spelled here rather than looked up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError

ARCH = "dflash"
#: the trainer's files (``train.dflash_layout``), spelled here so importing stays cheap
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
#: per-layer z-lab suffix -> llama.cpp tensor kind (fact 7)
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
#: the drafter's own tensors outside its layers (fact 7)
TOP_NAMES = {"fc": "fc", "hidden_norm": "enc.output_norm", "norm": "output_norm"}
#: stored types for matrices; vectors (norms) are always F32, as llama.cpp's converter does
TYPES = ("f32", "f16", "bf16", "q8_0")
FINAL_TAP_PATCH = "benchmarks/llamacpp_final_tap.patch"


class DrafterExportError(DraftwiseError, ValueError):
    """A drafter folder or target that cannot become a llama.cpp ``dflash`` GGUF."""


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What was written, for the CLI's summary."""

    out: Path
    tensors: int
    bytes: int
    target_layers: tuple[int, ...]  # as llama.cpp reads them (fact 2)
    block_size: int
    mask_token_id: int
    matrix_type: str


def gguf_name(hf_name: str) -> str:
    """The llama.cpp tensor name of one z-lab tensor (fact 7); unknown names are refused."""
    stem, _, suffix = hf_name.rpartition(".")
    if suffix != "weight":
        raise DrafterExportError(f"tensor {hf_name!r}: llama.cpp's dflash has no such tensor "
                                 "(the trainer writes weights only).")
    if stem in TOP_NAMES:
        return f"{TOP_NAMES[stem]}.weight"
    parts = stem.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}.weight"
    raise DrafterExportError(f"tensor {hf_name!r}: llama.cpp's dflash has no such tensor. "
                             "Instead: a drafter `draftwise train dflash` wrote.")


def read_drafter(drafter: Path, arch: str = "DFlashDraftModel", method: str = "dflash",
                 layout: str = "z-lab's") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A trained drafter folder's config (naming ``arch``) and its fp32 tensors, or a named
    refusal; ``method``/``layout`` name the trainer and its layout in the messages (the
    exports of both trainers share these checks)."""
    made_by = f"a folder `draftwise train {method} --out` wrote"
    if not drafter.is_dir():
        raise DrafterExportError(f"--drafter {drafter}: no such folder. Instead: {made_by}.")
    for name in (CONFIG, WEIGHTS):
        if not (drafter / name).is_file():
            raise DrafterExportError(f"--drafter {drafter}: no {name}, not a {arch} drafter in "
                                     f"{layout} layout. Instead: {made_by}.")
    try:
        config = json.loads((drafter / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise DrafterExportError(f"--drafter {drafter}: {CONFIG} is not JSON ({exc}).") from None
    if not isinstance(config, dict) or arch not in (config.get("architectures") or []):
        raise DrafterExportError(f"--drafter {drafter}: {CONFIG} does not describe a "
                                 f"{arch}. Instead: {made_by}.")
    from safetensors import SafetensorError
    from safetensors.torch import load_file  # numpy has no bf16 (the DSpark trainer's dtype)

    try:
        tensors = load_file(str(drafter / WEIGHTS))
    except (OSError, SafetensorError) as exc:
        raise DrafterExportError(f"--drafter {drafter}: {WEIGHTS} cannot be read ({exc})."
                                 ) from None
    return config, {k: v.float().numpy() for k, v in tensors.items()}


@dataclass(frozen=True, slots=True)
class Shape:
    """The keys of a drafter config this export reads, checked once (:func:`shape_of`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    context: int
    block_size: int
    mask_token_id: int
    taps: tuple[int, ...]
    num_target_layers: int


def shape_of(config: dict[str, Any], where: str) -> Shape:
    """Read and check the config; anything llama.cpp's dflash cannot express is refused."""
    d = config.get("dflash_config") or {}
    try:
        shape = Shape(
            hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            kv_heads=int(config["num_key_value_heads"]), head_dim=int(config["head_dim"]),
            ffn=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
            eps=float(config["rms_norm_eps"]), rope_theta=float(config["rope_theta"]),
            context=int(config["max_position_embeddings"]),
            block_size=int(d.get("block_size") or config["block_size"]),
            mask_token_id=int(d["mask_token_id"]),
            taps=tuple(int(t) for t in d["target_layer_ids"]),
            num_target_layers=int(config["num_target_layers"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DrafterExportError(f"{where}: {CONFIG} lacks or mistypes {exc}: not a config "
                                 "`draftwise train dflash` wrote.") from None
    unsupported = [
        (config.get("hidden_act", "silu") != "silu", f"hidden_act {config.get('hidden_act')!r}"),
        (config.get("rope_scaling") is not None, f"rope_scaling {config.get('rope_scaling')}"),
        (config.get("attention_bias", False), "attention_bias true"),
        (any(t != "full_attention" for t in config.get("layer_types") or []),
         f"layer_types {config.get('layer_types')}"),
        (bool(d.get("causal") or config.get("is_causal")), "causal attention"),
        (config.get("is_neox_style", True) is False, "is_neox_style false"),
    ]
    for bad, what in unsupported:
        if bad:
            raise DrafterExportError(f"{where}: {what} is not exported: the trainer never "
                                     "writes it and this export does not translate it.")
    if shape.block_size < 2:
        raise DrafterExportError(f"{where}: block_size {shape.block_size}: llama.cpp drafts "
                                 "block_size - 1 tokens, so it needs at least 2.")
    if not shape.taps:
        raise DrafterExportError(f"{where}: no target_layer_ids: llama.cpp's dflash needs them "
                                 "(its loader throws without 'target_layers').")
    return shape


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What the export needs of the target GGUF: its shape and its tokenizer keys."""

    path: str
    arch: str
    layers: int
    hidden: int
    vocab: int
    tokenizer: list[tuple[str, Any, Any, Any]]  # (key, value, type, sub_type)


def read_target(path: str) -> TargetFacts:
    """The target's facts from its GGUF header; a non-GGUF target is refused by name."""
    import gguf

    if not (os.path.isfile(path) and path.endswith(".gguf")):
        raise DrafterExportError(
            f"--target {path}: not a .gguf file. The export copies the target's tokenizer "
            "from its GGUF header, and llama.cpp needs the target as GGUF anyway. Instead: "
            "convert it with llama.cpp's convert_hf_to_gguf.py and pass that file.")
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise DrafterExportError(f"--target {path}: not a readable GGUF ({exc}).") from None

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            raise DrafterExportError(f"--target {path}: no {key} in its header.")
        return field.contents()

    arch = str(value("general.architecture"))
    tokenizer = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.mask_token_id":
            sub = field.types[1] if len(field.types) > 1 else None
            tokenizer.append((key, field.contents(), field.types[0], sub))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise DrafterExportError(f"--target {path}: no tokenizer.ggml.tokens: llama.cpp needs "
                                 "the drafter's vocabulary to be the target's.")
    return TargetFacts(path=path, arch=arch, layers=int(value(f"{arch}.block_count")),
                       hidden=int(value(f"{arch}.embedding_length")),
                       vocab=len(tokens.data), tokenizer=tokenizer)


def check_pair(shape: Shape, target: TargetFacts, tensors: dict[str, np.ndarray],
               allow_final_tap: bool, where: str) -> None:
    """The drafter must fit this target and llama.cpp's loader (facts 2-3)."""
    pairs = [("hidden_size", shape.hidden, target.hidden),
             ("num_target_layers", shape.num_target_layers, target.layers),
             ("vocab_size", shape.vocab, target.vocab)]
    for key, mine, theirs in pairs:
        if mine != theirs:
            raise DrafterExportError(f"{where}: {key} {mine}, but the target {target.path} has "
                                     f"{theirs}: the drafter was trained for another target.")
    if not all(0 <= t < target.layers for t in shape.taps):
        raise DrafterExportError(f"{where}: target_layer_ids {list(shape.taps)} are not all "
                                 f"layers of the target (0 .. {target.layers - 1}).")
    if not 0 <= shape.mask_token_id < target.vocab:
        raise DrafterExportError(f"{where}: mask_token_id {shape.mask_token_id} is outside the "
                                 f"target's vocabulary of {target.vocab}.")
    if target.layers - 1 in shape.taps and not allow_final_tap:
        raise DrafterExportError(
            f"{where}: target_layer_ids {list(shape.taps)} tap the target's last layer "
            f"({target.layers - 1}, its final normed state), which a stock llama.cpp "
            f"(0c1e570) does not hand a {target.arch!r} target's drafter: it aborts at the "
            f"first draft (t_layer_inp[{target.layers}] is null). Instead: a llama.cpp built "
            f"with {FINAL_TAP_PATCH}, and --allow-final-tap; or a drafter trained with "
            "--taps below the last layer.")
    want = {gguf_name(k) for k in expected_names(shape)}
    have = {gguf_name(k) for k in tensors}
    if want != have:
        missing, extra = sorted(want - have), sorted(have - want)
        raise DrafterExportError(f"{where}: {WEIGHTS} does not match its config (missing "
                                 f"{missing}, unexpected {extra}).")


def expected_names(shape: Shape) -> list[str]:
    """Every z-lab tensor name a drafter of ``shape`` has."""
    names = [f"{k}.weight" for k in TOP_NAMES]
    for i in range(shape.layers):
        names += [f"layers.{i}.{k}.weight" for k in LAYER_NAMES]
    return names


def expected_shape(shape: Shape, hf_name: str) -> tuple[int, ...]:
    """The PyTorch shape of one tensor (a mis-shaped file is refused before writing)."""
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    kind = hf_name.rsplit(".", 2)[-2] if hf_name.startswith("layers.") else hf_name[:-7]
    table: dict[str, tuple[int, ...]] = {
        "fc": (s.hidden, len(s.taps) * s.hidden), "hidden_norm": (s.hidden,), "norm": (s.hidden,),
        "input_layernorm": (s.hidden,), "post_attention_layernorm": (s.hidden,),
        "q_proj": (q, s.hidden), "k_proj": (kv, s.hidden), "v_proj": (kv, s.hidden),
        "o_proj": (s.hidden, q), "q_norm": (s.head_dim,), "k_norm": (s.head_dim,),
        "gate_proj": (s.ffn, s.hidden), "up_proj": (s.ffn, s.hidden),
        "down_proj": (s.hidden, s.ffn)}
    return table[kind]


def write_metadata(w: Any, shape: Shape, target: TargetFacts, matrix_type: str,
                   name: str) -> None:
    """The header (facts 1, 2, 4, 5): a Qwen3 decoder's keys plus DFlash's."""
    import gguf

    s = shape
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[matrix_type])
    w.add_uint32(f"{ARCH}.context_length", s.context)
    w.add_uint32(f"{ARCH}.embedding_length", s.hidden)
    w.add_uint32(f"{ARCH}.block_count", s.layers)
    w.add_uint32(f"{ARCH}.feed_forward_length", s.ffn)
    w.add_uint32(f"{ARCH}.attention.head_count", s.heads)
    w.add_uint32(f"{ARCH}.attention.head_count_kv", s.kv_heads)
    w.add_uint32(f"{ARCH}.attention.key_length", s.head_dim)
    w.add_uint32(f"{ARCH}.attention.value_length", s.head_dim)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", s.eps)
    w.add_float32(f"{ARCH}.rope.freq_base", s.rope_theta)
    w.add_uint32(f"{ARCH}.rope.dimension_count", s.head_dim)
    w.add_uint32(f"{ARCH}.vocab_size", s.vocab)
    w.add_uint32(f"{ARCH}.block_size", s.block_size)
    w.add_array(f"{ARCH}.target_layers", [t + 1 for t in s.taps])
    for key, value, vtype, sub in target.tokenizer:
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_key_value("tokenizer.ggml.mask_token_id", s.mask_token_id, gguf.GGUFValueType.UINT32)


def stored(arr: np.ndarray, matrix_type: str) -> tuple[np.ndarray, Any]:
    """One tensor as written: vectors F32; matrices in ``matrix_type``."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    if arr.ndim == 1 or matrix_type == "f32":
        return arr.astype(np.float32), None
    if matrix_type == "f16":
        return arr.astype(np.float16), None
    qtype = {"bf16": Q.BF16, "q8_0": Q.Q8_0}[matrix_type]
    if matrix_type == "q8_0" and arr.shape[-1] % gguf.GGML_QUANT_SIZES[Q.Q8_0][0]:
        raise DrafterExportError(f"--type q8_0: a row of {arr.shape[-1]} is not a whole number "
                                 "of 32-element blocks. Instead: --type f16.")
    return gguf.quants.quantize(arr, qtype), qtype


def export_llamacpp(drafter: Path, out: Path, target: str | None = None,
                    matrix_type: str = "f32", allow_final_tap: bool = False,
                    show: Callable[[str], None] | None = None) -> ExportReport:
    """Write ``out`` (renamed into place, so a reader never sees half a file)."""
    import gguf

    from draftwise.formats.default_model import default_model_path

    if matrix_type not in TYPES:
        raise DrafterExportError(f"--type {matrix_type!r}: one of {', '.join(TYPES)}.")
    where = f"--drafter {drafter}"
    config, tensors = read_drafter(drafter)
    shape = shape_of(config, where)
    facts = read_target(target or default_model_path())
    check_pair(shape, facts, tensors, allow_final_tap, where)
    for key in expected_names(shape):
        if tensors[key].shape != expected_shape(shape, key):
            raise DrafterExportError(f"{where}: {key} has shape {list(tensors[key].shape)}, its "
                                     f"config says {list(expected_shape(shape, key))}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), ARCH)
    write_metadata(w, shape, facts, matrix_type, name=f"{drafter.name} (DFlash drafter)")
    for key in expected_names(shape):
        data, qtype = stored(tensors[key], matrix_type)
        w.add_tensor(gguf_name(key), data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    report = ExportReport(out=out, tensors=len(tensors), bytes=out.stat().st_size,
                          target_layers=tuple(t + 1 for t in shape.taps),
                          block_size=shape.block_size, mask_token_id=shape.mask_token_id,
                          matrix_type=matrix_type)
    if show is not None:
        show(f"export: {report.tensors} tensors, {report.bytes / 2**20:.1f} MiB -> {out}")
    return report


__all__ = ["ARCH", "DrafterExportError", "ExportReport", "export_llamacpp", "gguf_name",
           "read_drafter", "read_target"]
