"""The SpecForge DSpark layout (``DSparkDraftModel``), read as the DeepSpec config it
stands for.

sgl-project/SpecForge (``specforge/modeling/draft/dspark.py``, ``dflash.py``,
``algorithms/common/dflash_family_model.py``, ``export/to_hf.py``, read at a6b6b02):
``DSparkDraftModel(DFlashDraftModel)`` is a ``Qwen3PreTrainedModel`` saved with
``save_pretrained`` (``specforge export --to hf``). Its config.json is a Qwen3 config
with ``architectures: ["DSparkDraftModel"]``, ``auto_map``, ``block_size`` and
``num_target_layers`` at the top level, and everything else under ``dflash_config``:
``mask_token_id``, ``target_layer_ids`` (z-lab numbering: ``hidden_states[id + 1]``, so
-1 is the embedding output; absent: z-lab's ``build_target_layer_ids``),
``projector_type: "dspark"``, ``attention_mode`` (``gqa`` | ``mha``), ``markov_rank``
(default 0), ``markov_head_type`` (default ``vanilla``), ``enable_confidence_head``
(default: ``confidence_head_alpha > 0``, alpha's default 0), ``confidence_head_with_markov``
(default false). The state dict is the DFlash body (``layers.*``, ``fc``, ``hidden_norm``,
``norm``) plus ``markov_head.*`` and ``confidence_head.proj.*``: no ``embed_tokens``
(a DFlash-family draft owns none) and no ``lm_head`` (the target's, as in training).

The block is DeepSpec's, not z-lab's in-place one: SpecForge trains DSpark with
next-token labels (``OnlineDSparkModel._build_dspark_labels_and_mask``: slot ``j`` of
the block at ``anchor`` learns the token at ``anchor + j + 1``, the anchor slot
included; the Markov ``prev`` of slot 0 is the anchor), context visible strictly before
the anchor, and its own serving gate (``scripts/gates/normalize_dflash_export.py``)
relabels the export ``Qwen3DSparkModel`` for SGLang. (``DSparkDraftModel.spec_generate``,
inherited from DFlash, reads the B-1 mask slots in place; that disagrees with the
training labels and is not what this reader follows.) So the lane is the native one
with the target's embedding and head borrowed (a quantized target table is refused by
the loader).

Refused by name: ``projector_type`` other than ``dspark``, ``attention_mode`` other than
``gqa``/``mha``, sliding-window draft layers, a top-level DSpark key contradicting
``dflash_config``, heads saved under the early ``logit_head.`` prefix (the loader).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise_dflash.config import build_target_layer_ids

from draftwise_dspark.names import NATIVE, DSparkConfigError

#: the DSpark keys SpecForge reads from dflash_config, with its defaults
MARKOV_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head",
               "confidence_head_with_markov")


def native_config(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The DeepSpec top-level config this SpecForge config stands for (module doc)."""
    sub = d.get("dflash_config")
    if not isinstance(sub, Mapping):
        raise DSparkConfigError(path, "dflash_config is missing: the SpecForge layout keeps "
                                      "mask_token_id and the DSpark keys there")
    projector = sub.get("projector_type", "dspark")
    if projector != "dspark":
        raise DSparkConfigError(
            path, f"dflash_config.projector_type={projector!r}: a DSparkDraftModel has "
                  "projector 'dspark' (SpecForge refuses any other)", key="projector_type")
    mode = str(sub.get("attention_mode", "gqa")).lower()
    if mode not in ("gqa", "mha"):
        raise DSparkConfigError(
            path, f"dflash_config.attention_mode={mode!r} is not implemented: SpecForge's "
                  "DSpark has gqa or mha attention", key="attention_mode")
    if any(t != "full_attention" for t in d.get("layer_types") or ()):
        raise DSparkConfigError(path, f"layer_types={d.get('layer_types')!r}: sliding-window "
                                      "draft layers are not implemented for dspark",
                                key="layer_types")
    if "block_size" not in d:
        raise DSparkConfigError(path, "block_size is missing (SpecForge's DSparkDraftModel "
                                      "reads it at the top level of config.json)")
    if sub.get("block_size", d["block_size"]) != d["block_size"]:
        raise DSparkConfigError(path, f"dflash_config.block_size={sub['block_size']} and "
                                      f"block_size={d['block_size']} disagree")
    if "mask_token_id" not in sub:
        raise DSparkConfigError(path, "dflash_config.mask_token_id is missing")
    alpha = sub.get("confidence_head_alpha", 0.0) or 0.0
    defaults = {"markov_rank": 0, "markov_head_type": "vanilla",
                "enable_confidence_head": float(alpha) > 0.0,
                "confidence_head_with_markov": False}
    dspark = {k: sub.get(k, defaults[k]) for k in MARKOV_KEYS}
    if isinstance(dspark["markov_head_type"], str):
        dspark["markov_head_type"] = dspark["markov_head_type"].lower()
    for k in MARKOV_KEYS:
        if k in d and d[k] != dspark[k]:
            raise DSparkConfigError(path, f"{k}={d[k]!r} at the top level contradicts "
                                          f"dflash_config.{k}={dspark[k]!r}", key=k)
    ids = sub.get("target_layer_ids")
    if ids is None:
        layers, target = d.get("num_hidden_layers"), d.get("num_target_layers")
        if not isinstance(layers, int) or not isinstance(target, int):
            raise DSparkConfigError(path, "neither dflash_config.target_layer_ids nor "
                                          "num_target_layers is set: the taps are unknown")
        ids = build_target_layer_ids(target, layers)
    out = {k: v for k, v in d.items() if k not in ("architectures", "auto_map", "dflash_config")}
    out.update(architectures=[NATIVE], mask_token_id=sub["mask_token_id"],
               target_layer_ids=ids, tie_word_embeddings=False, **dspark)
    return out


__all__ = ["MARKOV_KEYS", "native_config"]
