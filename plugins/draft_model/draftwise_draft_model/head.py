"""A draft LM head over part of the vocabulary (``lm_head_tokens``): FR-Spec's trade.

A small draft spends a large share of its step in the LM head: Qwen2.5-0.5B's 151,936 x
896 output matrix is 145 MB of its 392 MB in Q8_0, read once per drafted token. The draft's
only job is to propose; the target's verification decides every emitted token, so a draft
that can propose only some tokens stays lossless and just misses the rest (a token it
cannot propose is one it would have lost anyway). :class:`SubsetHead` keeps the rows of
the first ``n`` token ids (BPE vocabularies are numbered in merge order, most frequent
first, so a prefix is a frequency cut) plus every special or end-of-sequence id, packed in
the head's stored type, and scatters their logits into a full-vocabulary row whose other
entries are ``-inf``. Everything after the head (logits processing, the probabilistic
draft's q, the heterogeneous-vocabulary mask) sees an ordinary row in which the missing
tokens have probability 0, which is exactly the distribution the draft then samples from.
A prefix misses words that text reuses from its own context whatever their rank (in
Qwen2.5's vocabulary the code fence is id 73,594), so each step also scores the rows of
the drafting rows' context tokens (:meth:`SubsetHead.context`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from draftwise.kit import (
    QuantPart,
    QuantWeight,
    Weight,
    dequant_rows,
    linear,
    linear_quant,
    pack_quant,
    pack_weight,
)


@dataclass(frozen=True, slots=True)
class SubsetHead:
    """The kept rows of a draft's LM head and where their logits go."""

    ids: torch.Tensor  # [n] int64, ascending draft-vocabulary ids
    weight: QuantWeight | Weight  # [n, hidden]
    vocab_size: int
    #: the model's whole head, for the rows of context tokens outside ``ids``
    full: QuantWeight | torch.Tensor
    #: ``ids`` as a mask over the vocabulary
    kept: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        kept = np.zeros(self.vocab_size, dtype=bool)
        kept[self.ids.numpy()] = True
        object.__setattr__(self, "kept", kept)

    @property
    def num_tokens(self) -> int:
        """Token ids the head scores (besides the context's)."""
        return int(self.ids.numel())

    def context(self, token_ids: np.ndarray) -> ContextRows:
        """The rows of the tokens in ``token_ids`` (draft vocabulary) the cut head lacks:
        text tends to reuse its own words (names, fences), whatever their rank."""
        ids = np.unique(token_ids[(token_ids >= 0) & (token_ids < self.vocab_size)])
        ids = torch.from_numpy(ids[~self.kept[ids]].astype(np.int64))
        if isinstance(self.full, QuantWeight):
            rows = dequant_rows(self.full, ids, torch.float32)
        else:
            rows = self.full.detach().index_select(0, ids).float()
        return ContextRows(ids, rows)

    def logits(
        self, normed: torch.Tensor, extra: ContextRows | None = None
    ) -> torch.Tensor:  # [R, hidden] -> [R, vocab]
        """float32 logits over the whole vocabulary, ``-inf`` off the kept and context ids."""
        if isinstance(self.weight, QuantWeight):
            part = linear_quant(normed, self.weight, out_f32=True)
        else:
            part = linear(normed, self.weight).float()
        out = torch.full((normed.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)
        out.index_copy_(1, self.ids, part)
        if extra is not None and extra.ids.numel():
            out.index_copy_(1, extra.ids, normed.float() @ extra.rows.T)
        return out


@dataclass(frozen=True, slots=True)
class ContextRows:
    """Head rows of a step's context tokens outside the kept ids (fp32, a plain matmul:
    a draft's logits need no batch invariance, only the target's do)."""

    ids: torch.Tensor  # [E] int64
    rows: torch.Tensor  # [E, hidden] float32


def kept_ids(n: int, vocab_size: int, always: Iterable[int]) -> np.ndarray:
    """``[0, n)`` and ``always`` (specials, end-of-sequence ids), sorted, inside the vocab."""
    extra = [i for i in always if 0 <= i < vocab_size]
    return np.unique(np.concatenate([np.arange(min(n, vocab_size)), np.array(extra, np.int64)]))


def special_ids(loaded: Any) -> list[int]:
    """The model's end-of-sequence ids and its tokenizer's added (special) tokens."""
    ids = list(loaded.eos_token_ids)
    tok = getattr(loaded, "tokenizer", None)
    backend = getattr(tok, "backend", None)
    if backend is not None:
        ids += [int(i) for i in backend.get_added_tokens_decoder()]
    return ids


def build_subset_head(loaded: Any, n: int) -> SubsetHead | None:
    """The head of ``loaded`` (a LoadedModel) cut to :func:`kept_ids`; None when that keeps
    every row (nothing to save).

    A GGUF head kept quantized is repacked from the file's own rows (same type, same
    bytes, so a kept token's logit is the one the full head computes); a dense head is
    sliced and packed like any projection.
    """
    model = loaded.model
    vocab = int(loaded.config.vocab_size)
    ids = kept_ids(n, vocab, special_ids(loaded))
    if len(ids) >= vocab:
        return None
    head = model.lm_head_weight
    if isinstance(head, QuantWeight):
        weight: QuantWeight | Weight = _quant_rows(loaded.path, ids, head.in_features)
    else:
        rows = head.detach().index_select(0, torch.from_numpy(ids))
        weight = pack_weight(rows.contiguous())
    return SubsetHead(torch.from_numpy(ids), weight, vocab, head)


def _quant_rows(path: str, ids: np.ndarray, k: int) -> QuantWeight:
    """Rows ``ids`` of the GGUF's output matrix (the token embedding when tied), packed."""
    from draftwise.kit import GGUFCheckpoint

    ckpt = GGUFCheckpoint(path)
    names = ckpt.tensor_names
    name = "output.weight" if "output.weight" in names else "token_embd.weight"
    weight = pack_quant([QuantPart(ckpt.qtype(name), ckpt.raw(name), ids.astype(np.int64))], k)
    ckpt.release(name)
    return weight


__all__ = ["ContextRows", "SubsetHead", "build_subset_head", "kept_ids", "special_ids"]
