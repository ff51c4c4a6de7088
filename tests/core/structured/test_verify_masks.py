"""Grammar masks in verification: the fast path equals the reference, and the mask of
position j applies at position j (an exact-distribution test that a shift fails)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from draftwise.sampling import SamplingParams, make_generator
from draftwise.structured.masks import (
    ALL_ALLOWED,
    allowed_tokens,
    apply_token_bitmask,
    bitmask_width,
)
from draftwise.spec.verify import VerifyInputError, rejection_sample_reference, verify

VOCAB = 40


def bitmask_of(allowed: list[set[int] | None], vocab: int = VOCAB) -> np.ndarray:
    """One row per position; None: every token allowed."""
    out = np.full((len(allowed), bitmask_width(vocab)), ALL_ALLOWED, dtype=np.int32)
    for r, toks in enumerate(allowed):
        if toks is None:
            continue
        bits = np.zeros(bitmask_width(vocab) * 32, dtype=np.uint8)
        bits[list(toks)] = 1
        out[r] = np.packbits(bits, bitorder="little").view(np.int32)
    return out


def test_bitmask_round_trip_and_apply() -> None:
    mask = bitmask_of([{0, 5, 39}, None])
    allowed = allowed_tokens(mask, VOCAB)
    assert allowed[0].nonzero().flatten().tolist() == [0, 5, 39] and bool(allowed[1].all())
    logits = torch.randn(2, VOCAB)
    out = apply_token_bitmask(logits, mask)
    assert torch.isinf(out[0]).sum() == VOCAB - 3 and torch.equal(out[1], logits[1])
    assert not torch.isinf(logits).any()  # the caller's logits are left as they were


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_verify_equals_reference(method: str, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    nd = [3, 0, 4, 2]
    total = sum(nd) + len(nd)
    logits = torch.randn(total, VOCAB, generator=gen) * 2
    rng = np.random.default_rng(1)
    allowed = [set(rng.choice(VOCAB, size=6, replace=False).tolist()) if r % 3 else None
               for r in range(total)]
    drafts, start = [], 0
    for n in nd:  # drafts mostly inside the next position's mask, one outside
        for j in range(n):
            pool = sorted(allowed[start + j] or range(VOCAB))
            drafts.append(int(rng.choice(pool)) if j != 2 else 39)
        start += n + 1
    mask = bitmask_of(allowed)
    params = [SamplingParams(temperature=temperature, seed=s) for s in range(len(nd))]
    for seed in range(20):
        gens = [make_generator(seed * 10 + i) if temperature else None for i in range(len(nd))]
        ref_gens = [make_generator(seed * 10 + i) if temperature else None for i in range(len(nd))]
        fast = verify(logits, drafts, nd, params, gens, method=method, token_bitmask=mask)
        ref = rejection_sample_reference(logits, drafts, nd, params, ref_gens, method=method,
                                         token_bitmask=mask)
        assert torch.equal(fast.to_padded(ref.shape[1]), ref)
        for r, toks in enumerate(fast.output_token_ids):  # every emitted token is allowed
            base = sum(nd[:r]) + r
            assert all(allowed[base + j] is None or t in allowed[base + j]
                       for j, t in enumerate(toks))


def test_mask_applies_at_its_own_position() -> None:
    """Position 0 allows {1, 2}, position 1 allows {3, 4}; the draft is token 1. The output's
    (first, second) pair must follow the exact masked target; any shift of the masks
    changes the allowed sets and fails (a wrong token, or a chi-square far past bound)."""
    logits = torch.tensor([[0.0, 0.5, 0.0, 1.0, 0.2, 0.0],  # pos 0 (unmasked argmax 3)
                           [0.0, 1.0, 0.3, 0.0, 0.9, 0.0]])  # pos 1 after draft 1
    probs = [torch.softmax(torch.tensor([0.5, 0.0]), 0), torch.softmax(torch.tensor([0.0, 0.9]), 0)]
    mask = bitmask_of([{1, 2}, {3, 4}], vocab=6)
    n = 2500
    seen: Counter = Counter()
    for seed in range(n):
        res = verify(logits, [1], [1], [SamplingParams(temperature=1.0)], [make_generator(seed)],
                     token_bitmask=mask)
        seen[tuple(res.output_token_ids[0])] += 1
    # accepted (p = p0[1]) then the bonus from pos 1's mask; or rejected: recovered = 2
    want = {(1, 3): probs[0][0] * probs[1][0], (1, 4): probs[0][0] * probs[1][1],
            (2,): probs[0][1]}
    assert set(seen) <= set(want)
    chi2 = sum((seen[k] - n * float(p)) ** 2 / (n * float(p)) for k, p in want.items())
    assert chi2 < 18.4  # chi-square 0.9999 quantile, 2 degrees of freedom


def test_bitmask_shape_is_checked() -> None:
    with pytest.raises(VerifyInputError, match="token_bitmask"):
        verify(torch.zeros(2, VOCAB), [1], [1], [SamplingParams(temperature=0)], [None],
               token_bitmask=np.zeros((1, bitmask_width(VOCAB)), dtype=np.int32))
