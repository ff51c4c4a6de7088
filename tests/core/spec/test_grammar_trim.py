"""Drafts cut at the first grammar-refused token before the forward (``trim_to_grammar``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.spec.step import StepDrafts
from draftwise.spec.grammar_trim import trim_to_grammar


class PrefixMatcher:
    """Accepts tokens while they are below ``limit`` (a stand-in for a grammar)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def valid_prefix(self, tokens: list[int]) -> int:
        n = 0
        while n < len(tokens) and tokens[n] < self.limit:
            n += 1
        return n


def drafts(rows: list[list[int]], probs: bool, sampled: bool = False) -> StepDrafts:
    """``probs``: explicit q over 10 tokens, one-hot at each draft (a greedy drafter's) or,
    with ``sampled``, spread over every token (a probabilistic drafter's)."""
    flat = np.array([t for r in rows for t in r], dtype=np.int64)
    q = None
    if probs:
        q = torch.full((len(flat), 10), 0.1) if sampled else torch.zeros(len(flat), 10)
        if not sampled:
            q[torch.arange(len(flat)), torch.from_numpy(flat)] = 1.0
    return StepDrafts(flat, [len(r) for r in rows], [0 if r else None for r in rows], q,
                      [{} for _ in rows])


@pytest.mark.parametrize("probs", [False, True], ids=["no-q", "one-hot-q"])
def test_rows_are_cut_at_their_first_refused_token(probs: bool) -> None:
    d = drafts([[1, 2, 9, 3], [5, 6], [], [1, 9]], probs=probs)
    out = trim_to_grammar([PrefixMatcher(5), None, PrefixMatcher(5), PrefixMatcher(0)], d)
    assert out.num_draft_tokens == [2, 2, 0, 0]
    assert out.token_ids.tolist() == [1, 2, 5, 6]
    if probs:
        assert torch.equal(out.draft_probs, d.draft_probs[torch.tensor([0, 1, 4, 5])])
    assert out.owner == d.owner


def test_a_sampled_refused_token_is_kept_and_what_follows_it_cut() -> None:
    d = drafts([[1, 2, 9, 3], [5, 6], [1, 9]], probs=True, sampled=True)
    out = trim_to_grammar([PrefixMatcher(5), None, PrefixMatcher(0)], d)
    assert out.num_draft_tokens == [3, 2, 1]
    assert out.token_ids.tolist() == [1, 2, 9, 5, 6, 1]


def test_nothing_cut_is_the_same_object() -> None:
    d = drafts([[1, 2], [3]], probs=False)
    assert trim_to_grammar([PrefixMatcher(9), None], d) is d
    assert trim_to_grammar([None, None], d) is d


# -- sampling: a cut must not depend on the cut draft's own sampled value ------------------
def _first_tokens(method: str, trials: int = 3000) -> np.ndarray:
    """Each trial: a probabilistic drafter samples x ~ q = (.8, 0, .2), the grammar forbids
    token 2 (so p = (.5, .5, 0)), the draft is trimmed, verify emits position 0's token."""
    from draftwise.sampling_params import SamplingParams
    from draftwise.structured.masks import bitmask_width
    from draftwise.spec.verify import verify

    q_row = torch.tensor([0.8, 0.0, 0.2])
    xs = torch.multinomial(q_row, trials, replacement=True,
                           generator=torch.Generator().manual_seed(0))
    d = StepDrafts(xs.numpy().astype(np.int64), [1] * trials, [0] * trials,
                   q_row.repeat(trials, 1), [{} for _ in range(trials)])
    out = trim_to_grammar([PrefixMatcher(2)] * trials, d)
    n = out.num_draft_tokens
    logits = torch.zeros(sum(n) + trials, 3)  # p uniform over what the grammar allows
    mask = np.full((logits.shape[0], bitmask_width(3)), 0b011, dtype=np.int32)
    gens = [torch.Generator().manual_seed(1000 + i) for i in range(trials)]
    res = verify(logits, out.token_ids, n, [SamplingParams(temperature=1.0)] * trials, gens,
                 out.draft_probs, method, token_bitmask=mask)
    return np.array([toks[0] for toks in res.output_token_ids])


@pytest.mark.parametrize("method", ["standard", "block"])
def test_trimming_a_sampled_draft_keeps_the_target_distribution(method: str) -> None:
    """Trimming at the refused token itself sampled position 0 from p whenever the draft
    drew 2 (p(0) = .5 + .2 * .5 = .6); verifying it rejects it and samples the residual
    max(p - q, 0), which gives exactly p. The sd of the frequency here is 0.009."""
    first = _first_tokens(method)
    assert abs(float((first == 0).mean()) - 0.5) < 0.04, float((first == 0).mean())
    assert not (first == 2).any()
