"""A trained DSpark drafter (speculators' layout) in DeepSpec's own checkpoint layout.

Why: DeepSpec (deepseek-ai/DeepSpec, the method's authors) publishes its drafters as
``Qwen3DSparkModel`` folders (``deepseek-ai/dspark_qwen3_*_block7``); its evaluator, the
dspark plugin and every reader of those checkpoints then take the trained drafter as they
take DeepSeek's. What DeepSpec writes, read at afdfa7c (``deepspec/modeling/dspark/
qwen3/{config.py,modeling.py}``, ``deepspec/trainer/ckpt_manager.py``'s
``save_pretrained``; ``shared/reference/drafter-formats.md`` §2.1):

1. ``config.json`` is a deep copy of the TARGET's config (``build_draft_config``) with
   ``architectures: ["Qwen3DSparkModel"]``, ``num_target_layers``, ``num_hidden_layers``
   (the draft's), ``block_size``, ``tie_word_embeddings: false``, ``layer_types`` (all
   ``full_attention``), ``mask_token_id``, ``target_layer_ids`` (top level; ``-1`` the
   embedding output, ``i`` layer ``i``'s output: speculators'
   ``aux_hidden_state_layer_ids`` - 1), ``num_anchors`` (training only; the run's
   ``--anchors``, else DeepSpec's published 512), ``enable_confidence_head``,
   ``confidence_head_with_markov`` (only with the confidence head), ``markov_rank`` and
   ``markov_head_type`` (only with ``markov_rank > 0``). The draft decoder's own shape
   (``transformer_layer_config``: heads, head_dim, intermediate_size, ...) is written
   over the target's copy, since DeepSpec's modeling builds its layers from these keys;
   ``model_type`` is ``qwen3`` (the draft is a Qwen3 decoder whatever the target). A
   target with no ``config.json`` (a GGUF file) gives no copy: the draft's keys alone.
2. The weights are the module tree's names (the same as speculators' for the body and
   heads) plus ``embed_tokens.weight`` and ``lm_head.weight`` ``[V, H]``: copies of the
   target's, which DeepSpec trains frozen and ships (speculators saves neither for a
   full vocabulary: they are read from the target here, dequantized if it is quantized).
   bf16, as DeepSpec's checkpoints and the trainer's.

Refused by name, what DeepSpec's layout cannot express: a reduced draft vocabulary
(DeepSpec's ``lm_head`` and ``markov_w2`` span the whole vocabulary and it has no
``d2t``/``t2d``: widening them would let the drafter propose tokens it never could, other
drafts), ``sample_from_anchor: false`` (DeepSpec's block is always next-token),
sliding-window or non-causal-window layers, a non-Qwen3 draft decoder, a
``target_hidden_size`` other than the draft's width. The folder checks are
:func:`draftwise.train.llamacpp_export.read_drafter`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.train.llamacpp_export import CONFIG, WEIGHTS, DrafterExportError, read_drafter
from draftwise.train.loop import REPORT  # the trainer's report, where the run's --anchors is

FORMAT = "deepspec"
ARCH = "Qwen3DSparkModel"
SPECULATORS_ARCH = "DSparkSpeculator"
#: DeepSpec's ``num_anchors`` (``config/dspark/dspark_qwen3_*.py``) where the run's own
#: ``--anchors`` is not recorded
DEEPSPEC_NUM_ANCHORS = 512


@dataclass(frozen=True, slots=True)
class DeepSpecReport:
    """What was written, for the CLI's summary."""

    out: Path
    tensors: int
    bytes: int
    target_layer_ids: tuple[int, ...]  # DeepSpec's numbering
    block_size: int
    mask_token_id: int


def refuse_unexpressible(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The module doc's refusals; returns the draft decoder's config."""
    tl = config.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise DrafterExportError(f"{where}: {CONFIG} has no transformer_layer_config: not a "
                                 "drafter `draftwise train dspark` wrote.")
    vocab = tl.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size", vocab)
    if draft_vocab != vocab:
        raise DrafterExportError(
            f"{where}: draft_vocab_size {draft_vocab} of the target's {vocab}: DeepSpec's "
            "layout has no reduced vocabulary (its lm_head and markov_w2 span the whole "
            "vocabulary, with no d2t/t2d), and widening them would change the drafts. "
            f"Instead: train with --draft-vocab {vocab}, or run this folder as it is "
            "(speculators' layout: the dspark plugin, vLLM and speculators load it).")
    bad = [
        (config.get("sample_from_anchor", True) is not True,
         "sample_from_anchor false (DeepSpec's block is always next-token)"),
        (bool(config.get("sliding_window_non_causal")), "sliding_window_non_causal true"),
        (any(t != "full_attention" for t in tl.get("layer_types") or []),
         f"layer_types {tl.get('layer_types')}"),
        (tl.get("model_type", "qwen3") != "qwen3",
         f"a {tl.get('model_type')!r} draft decoder (DeepSpec's is Qwen3)"),
        (config.get("target_hidden_size") not in (None, tl.get("hidden_size")),
         f"target_hidden_size {config.get('target_hidden_size')} (not the draft's width)"),
    ]
    for is_bad, what in bad:
        if is_bad:
            raise DrafterExportError(f"{where}: {what}: DeepSpec's layout cannot express it.")
    return tl


def target_path(config: dict[str, Any], target: str | None, where: str) -> str:
    """``--target``, else the target the drafter records (``speculators_config.verifier``)."""
    if target:
        return target
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    if not verifier.get("name_or_path"):
        raise DrafterExportError(f"{where}: the drafter does not record its target "
                                 "(speculators_config.verifier.name_or_path). Instead: "
                                 "--target, the model it was trained for.")
    return str(verifier["name_or_path"])


def deepspec_config(config: dict[str, Any], tl: dict[str, Any], target_config: dict[str, Any],
                    num_anchors: int) -> dict[str, Any]:
    """Rule 1: the target's config, the draft decoder's keys over it, DeepSpec's keys."""
    rank = int(config.get("markov_rank", 0))
    conf = bool(config.get("enable_confidence_head", False))
    out = {**target_config, **{k: v for k, v in tl.items() if k != "architectures"}}
    out.update(
        architectures=[ARCH], model_type="qwen3",
        num_target_layers=int(target_config.get("num_hidden_layers", 0)) or None,
        block_size=int(config["block_size"]), tie_word_embeddings=False,
        layer_types=["full_attention"] * int(tl["num_hidden_layers"]),
        mask_token_id=int(config["mask_token_id"]),
        target_layer_ids=[int(a) - 1 for a in config["aux_hidden_state_layer_ids"]],
        num_anchors=num_anchors, enable_confidence_head=conf, markov_rank=rank,
        torch_dtype="bfloat16")
    for key in ("auto_map", "quantization_config", "speculators_config"):
        out.pop(key, None)
    if conf:
        out["confidence_head_with_markov"] = bool(config.get("confidence_head_with_markov"))
    if rank:
        out["markov_head_type"] = str(config.get("markov_head_type", "vanilla"))
    return out


def export_deepspec(drafter: Path, out: Path, target: str | None = None,
                    show: Callable[[str], None] | None = None) -> DeepSpecReport:
    """Write ``out`` (a folder: weights, then the config, each renamed into place)."""
    import torch
    from safetensors.torch import save_file

    from draftwise.train.loop import load_target

    where = f"--drafter {drafter}"
    config, arrays = read_drafter(drafter, SPECULATORS_ARCH, "dspark", "speculators'")
    tl = refuse_unexpressible(config, where)
    path = target_path(config, target, where)
    t = load_target(path)
    vocab, hidden = int(tl["vocab_size"]), int(tl["hidden_size"])
    if tuple(t.embed.shape) != (vocab, hidden):
        raise DrafterExportError(
            f"{where}: vocab_size {vocab} x hidden_size {hidden}, but the target {path} has "
            f"{tuple(t.embed.shape)}: the drafter was trained for another target.")
    cfg_file = Path(path) / CONFIG
    target_config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {
        "num_hidden_layers": int(t.facts.num_layers)}
    report = drafter / REPORT
    anchors = (json.loads(report.read_text()).get("training", {}).get("anchors")
               if report.is_file() else None)
    doc = deepspec_config(config, tl, target_config, int(anchors or DEEPSPEC_NUM_ANCHORS))
    if doc["num_target_layers"] is None or not all(
            -1 <= t < doc["num_target_layers"] for t in doc["target_layer_ids"]):
        raise DrafterExportError(f"{where}: target_layer_ids {doc['target_layer_ids']} are not "
                                 f"layers of the target {path}.")
    tensors = {k: torch.from_numpy(a).to(torch.bfloat16).contiguous()
               for k, a in arrays.items() if k not in ("d2t", "t2d")}
    tensors["embed_tokens.weight"] = t.embed.to(torch.bfloat16).contiguous()
    tensors["lm_head.weight"] = t.head.to(torch.bfloat16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{WEIGHTS}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS)
    tmp = out / f"{CONFIG}.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / CONFIG)
    result = DeepSpecReport(out=out, tensors=len(tensors),
                            bytes=(out / WEIGHTS).stat().st_size,
                            target_layer_ids=tuple(doc["target_layer_ids"]),
                            block_size=doc["block_size"], mask_token_id=doc["mask_token_id"])
    if show is not None:
        show(f"export: {result.tensors} tensors, {result.bytes / 2**20:.1f} MiB -> {out}")
    return result


__all__ = ["ARCH", "FORMAT", "DeepSpecReport", "export_deepspec", "refuse_unexpressible"]
