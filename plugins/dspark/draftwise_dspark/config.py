"""A DSpark drafter's own config.json: which lane, then :class:`DSparkConfig`.

The lane comes from the draft's ``architectures`` alone (never from the method string,
never guessed from other keys; ``shared/reference/drafter-formats.md`` §2):

- ``Qwen3DSparkModel`` (DeepSpec native, §2.1; also DeepSpec's ``dflash_*_block7``,
  §1.7, with ``markov_rank: 0``): a copy of the target's config with the DFlash backbone
  keys at the top level (``block_size``, ``mask_token_id``, ``target_layer_ids`` where -1
  is the embedding output), plus ``markov_rank``, ``markov_head_type``,
  ``enable_confidence_head``, ``confidence_head_with_markov``. Runs.
- ``DSparkSpeculator`` (speculators, §2.3): read through the DeepSpec config it stands
  for (:mod:`draftwise_dspark.speculators_layout`); runs with ``sample_from_anchor``
  true, with a full or a reduced draft vocabulary (``draft_vocab_size``, ``d2t``/``t2d``:
  :mod:`draftwise_dspark.draft_vocab`).
- ``DSparkDraftModel`` (SpecForge): Markov keys under ``dflash_config``, no embedding or
  head of its own; read through the DeepSpec config it stands for
  (:mod:`draftwise_dspark.specforge_layout`: SpecForge trains it with DeepSpec's
  next-token block), with the target's embedding and head.
- a DeepSeek-V4 architecture (or ``dspark_block_size``, V4's key): its DSpark head ships
  inside the target as ``mtp.*`` blocks, a different family: refused by name.
- no ``architectures``: refused (not classified by guesswork).

The backbone's keys are DFlash's, so the DFlash plugin's
:func:`~draftwise_dflash.config.parse_config` reads them (one reader for both plugins).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from draftwise_dflash.config import DFLASH1, DFlashConfig
from draftwise_dflash.config import parse_config as parse_dflash_config

from draftwise_dspark.names import (
    MARKOV_TYPES,
    NATIVE,
    RUNS,
    SPECFORGE,
    SPECULATORS,
    DSparkConfigError,
)


@dataclass(frozen=True, slots=True)
class DSparkConfig:
    """What the loader, model and proposer need from a DSpark draft's config."""

    lane: str  # the architecture: NATIVE, SPECULATORS or SPECFORGE
    #: the DFlash backbone (decoder shape, block size, taps with -1 = embedding, mask)
    backbone: DFlashConfig
    vocab_size: int  # the verifier's: markov_w1's rows, the ids drafts are in
    #: rows of lm_head and markov_w2; below vocab_size: a reduced draft vocabulary
    #: (speculators lane only, :mod:`draftwise_dspark.draft_vocab`)
    draft_vocab_size: int
    markov_rank: int  # 0: no Markov head
    markov_head_type: str
    enable_confidence_head: bool
    confidence_head_with_markov: bool

    @property
    def block_size(self) -> int:
        """B: next-token indexing, so all B slots draft."""
        return self.backbone.block_size


def lane_of(d: Mapping[str, Any], path: str) -> str:
    """The lane from ``architectures`` (module doc); anything else is refused by name."""
    archs = d.get("architectures")
    if not archs or not isinstance(archs, list):
        raise DSparkConfigError(
            path,
            "config.json has no architectures, so the DSpark layout is unknown (it is not "
            f"guessed from other keys). Instead: {RUNS}, whose config names {NATIVE}.",
        )
    arch = str(archs[0])
    if "deepseekv4" in arch.lower().replace("_", "") or "dspark_block_size" in d:
        raise DSparkConfigError(
            path,
            f"architectures={archs!r} is DeepSeek-V4's self-contained DSpark, whose draft "
            "blocks ship inside the target (mtp.0-2) for a MoE target: another family, not "
            f"implemented. Instead: {RUNS}.",
        )
    if arch in (SPECULATORS, SPECFORGE):
        return arch
    if arch != NATIVE:
        raise DSparkConfigError(
            path, f"architectures={archs!r} is not a DSpark drafter. Instead: {RUNS}."
        )
    return arch


def parse_config(d: Mapping[str, Any], path: str) -> DSparkConfig:
    """Read a DeepSpec native DSpark config (a speculators or SpecForge one through the
    DeepSpec config it stands for); refuse what is missing or contradictory."""
    lane = lane_of(d, path)
    if lane == SPECULATORS:
        from draftwise_dspark.speculators_layout import native_config

        d = native_config(d, path)
    elif lane == SPECFORGE:
        from draftwise_dspark import specforge_layout

        d = specforge_layout.native_config(d, path)
    if d.get("dflash_config") is not None:
        raise DSparkConfigError(
            path, "a Qwen3DSparkModel config keeps its keys at the top level, but this one "
                  "has dflash_config. Instead: the config DeepSpec's save_pretrained writes.",
        )
    for key in ("block_size", "mask_token_id", "target_layer_ids"):
        if key not in d:
            raise DSparkConfigError(path, f"{key} is missing (DeepSpec writes it at the top "
                                          "level of config.json)")
    ids = d["target_layer_ids"]
    if (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)
            or any(i < -1 for i in ids) or any(a >= b for a, b in pairwise(ids))):
        raise DSparkConfigError(
            path, f"target_layer_ids={ids!r} must be strictly increasing ints >= -1 "
                  "(-1 is the embedding output)")
    backbone = parse_config_backbone(d, path)
    rank = d.get("markov_rank", 0)
    kind = d.get("markov_head_type", "vanilla")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise DSparkConfigError(path, f"markov_rank={rank!r} must be an integer >= 0")
    if rank and kind not in MARKOV_TYPES:
        raise DSparkConfigError(
            path, f"markov_head_type={kind!r} is not one of {', '.join(MARKOV_TYPES)}")
    conf, with_markov = (bool(d.get("enable_confidence_head", False)),
                         bool(d.get("confidence_head_with_markov", False)))
    if conf and with_markov and not rank:
        raise DSparkConfigError(
            path, "confidence_head_with_markov is true but markov_rank is 0: the head reads "
                  "markov_w1, which a rank-0 drafter does not have (DeepSpec refuses it too)")
    vocab = d.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise DSparkConfigError(path, f"vocab_size={vocab!r} must be a positive integer")
    draft_vocab = d.get("draft_vocab_size", vocab) if lane == SPECULATORS else vocab
    if (not isinstance(draft_vocab, int) or isinstance(draft_vocab, bool)
            or not 1 <= draft_vocab <= vocab):
        raise DSparkConfigError(
            path, f"draft_vocab_size={draft_vocab!r} must be an integer from 1 to the "
                  f"verifier's vocab_size={vocab} (a draft vocabulary is a subset of the "
                  "verifier's)", key="draft_vocab_size")
    return DSparkConfig(
        lane=lane,
        backbone=backbone,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        markov_rank=rank,
        markov_head_type=str(kind),
        enable_confidence_head=conf,
        confidence_head_with_markov=conf and with_markov,
    )


def parse_config_backbone(d: Mapping[str, Any], path: str) -> DFlashConfig:
    """The DFlash backbone through the DFlash reader (it reads top-level keys as well);
    only the architecture name differs, and it is put back on the result."""
    from dataclasses import replace

    body = parse_dflash_config({**d, "architectures": [DFLASH1]}, path)
    return replace(body, architecture=NATIVE)


__all__ = ["MARKOV_TYPES", "NATIVE", "RUNS", "SPECFORGE", "SPECULATORS", "DSparkConfig",
           "DSparkConfigError", "lane_of", "parse_config"]
