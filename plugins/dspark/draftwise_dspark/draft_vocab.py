"""A reduced draft vocabulary (speculators' ``d2t``/``t2d``): the one draft-to-target map.

speculators 0.9.0 (``models/dflash/core.py`` through ``model.DraftVocabMixin``, the
mappings built by ``train/vocab_mapping.py::build_vocab_mappings_from_distribution``;
``shared/reference/drafter-formats.md`` §2.3, §5.2) stores, when ``draft_vocab_size`` is
below the verifier's ``vocab_size``:

- ``d2t`` ``[draft_vocab]`` int64 OFFSETS: draft index ``i`` is target id
  ``i + d2t[i]`` (as EAGLE-3; xpress's ``draft_ids + self.d2t[draft_ids]``);
- ``t2d`` ``[verifier_vocab]`` bool: which target ids the draft vocabulary holds. The
  trainer sorts the kept ids, so ``t2d``'s set positions in order are the same ids.

Checked here against each other and the sizes (:func:`from_speculators`): lengths,
``t2d``'s count, every ``i + d2t[i]`` inside the target vocabulary and equal, in order, to
``t2d``'s positions (so the ids are distinct and ascending). What uses the map:

- the draft's ``lm_head`` and ``markov_w2`` are ``[draft_vocab, ...]``: base logits, the
  Markov bias and every pick are in draft-index space;
- ``markov_w1`` is ``[verifier_vocab, r]``: the previous token a Markov step reads is a
  TARGET id (the anchor is one already; a pick goes through :func:`to_target` first);
- the proposer's drafts are :func:`to_target` of the picks, and its q is the draft
  distribution put at those target ids, zero elsewhere (:func:`scatter_q`): a token
  outside the draft vocabulary is never drafted, and rejection sampling's residual
  ``max(p - q, 0)`` gives it its whole target probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: the state-dict names of the map
TENSORS = ("d2t", "t2d")
#: their accepted stored dtypes (speculators writes int64 and bool)
DTYPES = {"d2t": ("I64", "I32"), "t2d": ("BOOL",)}


class DraftVocabError(ValueError):
    """``d2t``/``t2d`` that do not describe one reduced vocabulary; says which check.
    ``key``: the tensor at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class DraftVocab:
    """Draft index ``i`` is target id ``ids[i]`` (ascending, distinct)."""

    ids: torch.Tensor  # [draft_vocab] int64, contiguous
    target_vocab: int

    @property
    def size(self) -> int:
        """draft_vocab."""
        return int(self.ids.shape[0])


def from_speculators(d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab: int,
                     target_vocab: int) -> DraftVocab:
    """The map from speculators' stored offsets and mask (module doc), or
    :class:`DraftVocabError` naming the first check that fails."""
    if d2t.dim() != 1 or d2t.shape[0] != draft_vocab:
        raise DraftVocabError("d2t", f"d2t has shape {list(d2t.shape)}, expected [{draft_vocab}] "
                              "(one offset per draft token: draft_vocab_size)")
    if t2d.dim() != 1 or t2d.shape[0] != target_vocab:
        raise DraftVocabError("t2d", f"t2d has shape {list(t2d.shape)}, expected [{target_vocab}] "
                              "(one flag per verifier token: vocab_size)")
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise DraftVocabError("d2t", f"d2t is {d2t.dtype}: speculators stores int64 offsets")
    if t2d.dtype != torch.bool:
        raise DraftVocabError("t2d", f"t2d is {t2d.dtype}: speculators stores a bool mask")
    kept = int(t2d.sum())
    if kept != draft_vocab:
        raise DraftVocabError("t2d", f"t2d marks {kept} target tokens, but draft_vocab_size is "
                              f"{draft_vocab}")
    ids = torch.arange(draft_vocab, dtype=torch.int64) + d2t.to(torch.int64)
    bad = ((ids < 0) | (ids >= target_vocab)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DraftVocabError("d2t", f"d2t[{i}] = {int(d2t[i])} maps draft token {i} to target id "
                              f"{int(ids[i])}, outside the verifier's vocab_size "
                              f"{target_vocab} (d2t holds offsets: target = draft + d2t)")
    marked = t2d.nonzero().flatten()
    differ = (marked != ids).nonzero().flatten()
    if differ.numel():
        i = int(differ[0])
        raise DraftVocabError("d2t", f"d2t maps draft token {i} to target id {int(ids[i])}, "
                              f"but t2d's {i}-th marked target id is {int(marked[i])}: the "
                              "two maps disagree (or d2t's ids are not ascending)")
    return DraftVocab(ids.contiguous(), target_vocab)


def to_target(vocab: DraftVocab | None, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target ids of draft indices (``None``: a full vocabulary, the same ids)."""
    return draft_ids if vocab is None else vocab.ids[draft_ids]


def scatter_q(vocab: DraftVocab | None, q: torch.Tensor | None) -> torch.Tensor | None:
    """``q`` ``[N, draft_vocab]`` as ``[N, target_vocab]``: each draft token's probability
    at its target id, zero elsewhere (module doc)."""
    if vocab is None or q is None:
        return q
    out = torch.zeros(q.shape[0], vocab.target_vocab, dtype=q.dtype, device=q.device)
    return out.index_copy_(1, vocab.ids.to(q.device), q)


__all__ = ["DTYPES", "TENSORS", "DraftVocab", "DraftVocabError", "from_speculators",
           "scatter_q", "to_target"]
