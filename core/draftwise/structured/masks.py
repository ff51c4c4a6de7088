"""A step's grammar masks: one bitmask row per verified position, and applying them.

Layout: the same as ``spec/verify.py``'s logits. Row ``r`` of the step owns ``num_draft[r] + 1``
consecutive rows; its row ``j`` is the mask after the request's committed tokens plus
``drafts[:j]``. llguidance computes all of a request's rows in one call
(``fill_next_token_bitmask_par_with_draft_tokens``): it walks the matcher through the
drafts, writes the mask before each, and rolls the walk back before returning, so the
matcher is left at the committed tokens (``matcher.py``).

Rows past a draft the grammar refuses (or past a completed grammar) are never written:
they keep :data:`ALL_ALLOWED` and the logits there stay as they are. They cannot emit a
token: the refused draft has p = 0 (greedy: it is not the masked argmax) at its own,
correctly masked row, so verification stops there, and block verification's p_i is 0
from that position on. A mask is 32 tokens per int32, token ``t`` at bit ``t % 32``
of word ``t // 32`` (llguidance's and xgrammar's layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from draftwise.structured.matcher import GrammarMatcher

#: an int32 word with every bit set: its 32 tokens are allowed
ALL_ALLOWED = -1


def bitmask_width(vocab_size: int) -> int:
    """int32 words per mask row."""
    return (vocab_size + 31) // 32


def step_bitmask(
    executor: Any,
    matchers: Sequence[GrammarMatcher | None],  # [B] None: no grammar
    drafts: Sequence[Sequence[int]],  # [B] each row's draft tokens
    vocab_size: int,
) -> np.ndarray | None:  # [sum(len(drafts)) + B, W] int32, None if no row has a grammar
    """Every verified position's mask, rows in verify's order; None when nothing is masked."""
    if all(m is None for m in matchers):
        return None
    import llguidance.numpy as lln

    total = sum(len(d) for d in drafts) + len(drafts)
    bitmask = np.full((total, bitmask_width(vocab_size)), ALL_ALLOWED, dtype=np.int32)
    drafted: list[tuple[Any, int, list[int]]] = []
    plain: list[tuple[Any, int]] = []  # llguidance's draft call refuses an empty draft
    start = 0
    for m, row in zip(matchers, drafts):
        if m is not None:
            m.check_usable()
            if len(row):
                drafted.append((m.ll_matcher, start, [int(t) for t in row]))
            else:
                plain.append((m.ll_matcher, start))
        start += len(row) + 1
    if drafted:
        lln.fill_next_token_bitmask_par_with_draft_tokens(executor, drafted, bitmask)
    if plain:
        lln.fill_next_token_bitmask_par(executor, plain, bitmask)
    return bitmask


def allowed_tokens(
    bitmask: np.ndarray | torch.Tensor, vocab_size: int  # [T, W] int32
) -> torch.Tensor:  # [T, vocab_size] bool
    """Unpack a bitmask: True where the token is allowed."""
    words = bitmask.numpy() if isinstance(bitmask, torch.Tensor) else bitmask
    words = np.ascontiguousarray(words, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")  # [T, 32 W]
    return torch.from_numpy(bits[:, :vocab_size].astype(bool))


def apply_token_bitmask(
    logits: torch.Tensor,  # [T, V] float32
    bitmask: np.ndarray | torch.Tensor | None,  # [T, W] int32
) -> torch.Tensor:  # [T, V], forbidden tokens at -inf (a new tensor; the input is kept)
    """Forbidden tokens to -inf, only on rows whose mask forbids anything."""
    if bitmask is None:
        return logits
    words = bitmask.numpy() if isinstance(bitmask, torch.Tensor) else bitmask
    rows = np.flatnonzero((words != ALL_ALLOWED).any(axis=1))
    if rows.size == 0:
        return logits
    vocab = logits.shape[1]
    allowed = allowed_tokens(words[rows], vocab)
    out = logits.clone()
    idx = torch.from_numpy(rows)
    out[idx] = out[idx].masked_fill(~allowed, float("-inf"))
    return out


__all__ = ["ALL_ALLOWED", "allowed_tokens", "apply_token_bitmask", "bitmask_width", "step_bitmask"]
