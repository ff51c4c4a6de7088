"""Drafts cut at the first grammar-refused token before the forward (``trim_to_grammar``)."""

from __future__ import annotations

import numpy as np
import torch

from draftwise.step import StepDrafts
from draftwise.structured.drafts import trim_to_grammar


class PrefixMatcher:
    """Accepts tokens while they are below ``limit`` (a stand-in for a grammar)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def valid_prefix(self, tokens: list[int]) -> int:
        n = 0
        while n < len(tokens) and tokens[n] < self.limit:
            n += 1
        return n


def drafts(rows: list[list[int]], probs: bool) -> StepDrafts:
    flat = np.array([t for r in rows for t in r], dtype=np.int64)
    q = torch.arange(len(flat) * 4, dtype=torch.float32).reshape(len(flat), 4) if probs else None
    return StepDrafts(flat, [len(r) for r in rows], [0 if r else None for r in rows], q,
                      [{} for _ in rows])


def test_rows_are_cut_at_their_first_refused_token() -> None:
    d = drafts([[1, 2, 9, 3], [5, 6], [], [1, 9]], probs=True)
    out = trim_to_grammar([PrefixMatcher(5), None, PrefixMatcher(5), PrefixMatcher(0)], d)
    assert out.num_draft_tokens == [2, 2, 0, 0]
    assert out.token_ids.tolist() == [1, 2, 5, 6]
    assert torch.equal(out.draft_probs, d.draft_probs[torch.tensor([0, 1, 4, 5])])
    assert out.owner == d.owner


def test_nothing_cut_is_the_same_object() -> None:
    d = drafts([[1, 2], [3]], probs=False)
    assert trim_to_grammar([PrefixMatcher(9), None], d) is d
    assert trim_to_grammar([None, None], d) is d
