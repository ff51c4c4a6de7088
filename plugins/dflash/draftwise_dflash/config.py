"""A DFlash drafter's own config.json, read once into :class:`DFlashConfig`.

Every accepted variant (``shared/reference/drafter-formats.md`` §1.1, z-lab
``dflash/model.py``):

1. ``block_size`` under ``dflash_config`` or at the top level (``dflash_config`` wins, as
   SGLang's ``parse_dflash_draft_config``; both present and different is refused);
2. ``dflash_config.target_layer_ids``, else z-lab's ``build_target_layer_ids``:
   ``[L // 2]`` for one draft layer, otherwise ``round(1 + i * (L - 4) / (n - 1))``;
   ids number the OUTPUT of target decoder layer ``id`` (z-lab's
   ``hidden_states[id + 1]``), which is the core's hidden-state channel's numbering;
3. ``mask_token_id`` (``dflash_config`` or top level), else ``mask_token`` (a string the
   target's tokenizer must know; SGLang's default ``<|MASK|>``);
4. causality per layer: ``dflash_config.causal`` (vLLM) or top-level ``is_causal``
   (z-lab) override every layer; otherwise a layer is causal iff
   ``layer_types[i] == "sliding_attention"`` (z-lab and vLLM agree), and sliding layers
   take ``sliding_window``;
5. ``input_embedding_scale`` scales the block's embeddings, ``output_multiplier`` and
   ``final_logit_softcapping`` the logits (z-lab ``compute_logits``);
6. DFlash2 (``DFlash2DraftModel``) adds ``conv_kernel_size``, ``conv_group_size``,
   ``selector_rank``, ``selector_top_k``.

The draft decoder's own shape (heads, head_dim, norms, rope) is the core's Qwen3
:class:`~draftwise.models.config.ModelConfig`, read from the same dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from draftwise.kit import ModelConfig, ModelFormatError

DFLASH1 = "DFlashDraftModel"
DFLASH2 = "DFlash2DraftModel"
ARCHITECTURES = (DFLASH1, DFLASH2)


class DFlashConfigError(ModelFormatError):
    """A DFlash config this engine cannot honour; the message says which key and what works."""


@dataclass(frozen=True, slots=True)
class Dflash2Params:
    """DFlash2's extra keys: the block convolutions and the candidate selector."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int


@dataclass(frozen=True, slots=True)
class DFlashConfig:
    """What the loader, model and proposer need from the draft's config."""

    architecture: str
    decoder: ModelConfig
    block_size: int
    #: target layers whose outputs are concatenated into the context (rule 2)
    target_layer_ids: tuple[int, ...]
    #: None: resolved from ``mask_token`` through the target's tokenizer at load
    mask_token_id: int | None
    mask_token: str | None
    #: per draft layer: causal inside the block (rule 4)
    causal: tuple[bool, ...]
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    num_target_layers: int | None = None
    #: DFlash2 only
    v2: Dflash2Params | None = None

    @property
    def num_speculative_tokens(self) -> int:
        """k = B - 1: the anchor slot drafts nothing (in-place indexing)."""
        return self.block_size - 1


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's fallback when ``target_layer_ids`` is absent (rule 2)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def parse_config(d: Mapping[str, Any], path: str) -> DFlashConfig:
    """Read a DFlash1 or DFlash2 config dict; refuse what is missing or contradictory."""
    archs = d.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in ARCHITECTURES:
        raise DFlashConfigError(
            path,
            f"architectures={archs!r} is not a DFlash drafter. Instead: a z-lab DFlash "
            f"checkpoint ({' or '.join(ARCHITECTURES)}).",
        )
    sub = d.get("dflash_config") or {}
    if not isinstance(sub, Mapping):
        raise DFlashConfigError(path, "dflash_config must be an object")

    def value(name: str, default: Any = None) -> Any:
        return sub.get(name, d.get(name, default))

    qwen = {k: v for k, v in d.items() if k not in ("architectures", "layer_types")}
    qwen["architectures"] = ["Qwen3ForCausalLM"]
    qwen["model_type"] = "qwen3"
    decoder = ModelConfig.from_hf_dict(qwen, path)
    layers = decoder.num_hidden_layers
    causal = _causality(d, sub, layers, path)
    types = tuple(d.get("layer_types") or ())
    # from_hf_dict reads Qwen3 windows only under use_sliding_window; a DFlash config
    # declares its sliding layers by layer_types alone
    sliding = "sliding_attention" in types
    decoder = replace(
        decoder,
        sliding_window=int(d["sliding_window"]) if sliding else None,
        layer_types=types if sliding else (),
    )
    block = _block_size(d, sub, path)
    num_target = d.get("num_target_layers")
    ids = value("target_layer_ids")
    if ids is None:
        if not isinstance(num_target, int):
            raise DFlashConfigError(
                path,
                "neither dflash_config.target_layer_ids nor num_target_layers is set, so the "
                "tapped target layers are unknown. Instead: add one of them to config.json.",
            )
        ids = build_target_layer_ids(num_target, layers)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DFlashConfigError(path, f"target_layer_ids={ids!r} must be a non-empty int list")
    mask_id, mask_tok = value("mask_token_id"), value("mask_token")
    if mask_id is None and mask_tok is None:
        raise DFlashConfigError(
            path,
            "no mask token: set dflash_config.mask_token_id (or mask_token, a string the "
            "target's tokenizer knows).",
        )
    if mask_id is not None and not isinstance(mask_id, int):
        raise DFlashConfigError(path, f"mask_token_id={mask_id!r} must be an integer")
    softcap = value("final_logit_softcapping")
    return DFlashConfig(
        architecture=arch,
        decoder=decoder,
        block_size=block,
        target_layer_ids=tuple(ids),
        mask_token_id=mask_id,
        mask_token=None if mask_tok is None else str(mask_tok),
        causal=causal,
        input_embedding_scale=float(value("input_embedding_scale", 1.0)),
        output_multiplier=float(value("output_multiplier", 1.0)),
        final_logit_softcapping=None if softcap is None or float(softcap) <= 0 else float(softcap),
        num_target_layers=num_target if isinstance(num_target, int) else None,
        v2=_v2_params(value, decoder, path) if arch == DFLASH2 else None,
    )


def _block_size(d: Mapping[str, Any], sub: Mapping[str, Any], path: str) -> int:
    """Rule 1 (z-lab's default is 16 when neither place sets it)."""
    nested, top = sub.get("block_size"), d.get("block_size")
    if nested is not None and top is not None and nested != top:
        raise DFlashConfigError(
            path,
            f"dflash_config.block_size={nested} and block_size={top} disagree. Instead: keep "
            "one of them.",
        )
    block = nested if nested is not None else top if top is not None else 16
    if not isinstance(block, int) or block < 2:
        raise DFlashConfigError(path, f"block_size={block!r} must be an integer >= 2")
    return block


def _causality(
    d: Mapping[str, Any], sub: Mapping[str, Any], layers: int, path: str
) -> tuple[bool, ...]:
    """Rule 4; a sliding layer made non-causal is refused (no non-causal window here)."""
    forced = [x for x in (sub.get("causal"), d.get("is_causal")) if x is not None]
    if len(forced) == 2 and bool(forced[0]) != bool(forced[1]):
        raise DFlashConfigError(
            path, "dflash_config.causal and is_causal disagree. Instead: keep one of them."
        )
    types = d.get("layer_types") or ["full_attention"] * layers
    if len(types) != layers or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise DFlashConfigError(
            path, f"layer_types needs {layers} entries of full_attention/sliding_attention"
        )
    causal = [bool(forced[0]) if forced else t == "sliding_attention" for t in types]
    sliding = [t == "sliding_attention" for t in types]
    if any(s and not c for s, c in zip(sliding, causal)):
        raise DFlashConfigError(
            path,
            "a sliding_attention layer is declared non-causal; a non-causal sliding window "
            "is not implemented. Instead: drop dflash_config.causal / is_causal (sliding "
            "layers are then causal, as z-lab and vLLM run them).",
        )
    if any(sliding) and not isinstance(d.get("sliding_window"), int):
        raise DFlashConfigError(path, "sliding_attention layers need an integer sliding_window")
    return tuple(causal)


def _v2_params(value: Any, decoder: ModelConfig, path: str) -> Dflash2Params:
    """DFlash2's keys, each required (z-lab reads them without defaults)."""
    got = {}
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        v = value(name)
        if not isinstance(v, int) or v < 1:
            raise DFlashConfigError(
                path, f"DFlash2 needs dflash_config.{name} (a positive integer), got {v!r}"
            )
        got[name] = v
    if decoder.hidden_size % got["conv_group_size"]:
        raise DFlashConfigError(
            path,
            f"conv_group_size={got['conv_group_size']} does not divide hidden_size="
            f"{decoder.hidden_size}",
        )
    return Dflash2Params(**got)


__all__ = [
    "ARCHITECTURES",
    "DFLASH1",
    "DFLASH2",
    "DFlashConfig",
    "DFlashConfigError",
    "Dflash2Params",
    "build_target_layer_ids",
    "parse_config",
]
