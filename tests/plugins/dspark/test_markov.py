"""The certified greedy pick equals the full product's argmax, ties included.

:meth:`MarkovHead.certified_argmax` answers from a few 64-output blocks of the packed
``W2`` or not at all; whenever it answers, it must be ``argmax(base + W2 u)`` exactly as
the full pass computes it (first index of the maximum). Cases: a small bias (it answers),
a large one (it must give up), exact ties planted across blocks, a vocabulary that is not
a multiple of 64, and non-finite logits.
"""

from __future__ import annotations

import pytest
import torch
from draftwise.models.linear import BlockedWeight, pack_weights
from draftwise_dspark.markov import MarkovHead, MarkovWeights

V, R = 1000, 32


def head() -> MarkovHead:
    g = torch.Generator().manual_seed(0)
    w1 = (torch.randn(V, R, generator=g) * 0.3).bfloat16()
    w2 = pack_weights([(torch.randn(V, R, generator=g) * 0.3).bfloat16()])[0]
    if not isinstance(w2, BlockedWeight):
        pytest.skip("the certified pick needs the native packed layout (kernels not built)")
    return MarkovHead(MarkovWeights("vanilla", w1, w2))


def full(h: MarkovHead, base: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return (base + h.bias(u)).argmax(dim=1)


@pytest.mark.parametrize(("rows", "spread"), [(1, 8.0), (3, 8.0), (1, 3.0), (4, 1.0)])
def test_equals_the_full_argmax_whenever_it_answers(rows: int, spread: float) -> None:
    h, g = head(), torch.Generator().manual_seed(1)
    answered = 0
    for _ in range(60):
        base = (torch.randn(rows, V, generator=g) * spread).bfloat16().float()
        u = (torch.randn(rows, R, generator=g) * 0.3).bfloat16()
        got = h.certified_argmax(base, u)
        if got is not None:
            answered += 1
            assert torch.equal(got, full(h, base, u))
    if rows == 1 and spread > 5:
        assert 0 < answered, "a small bias against a wide margin must be certified"


def test_gives_up_when_the_bias_dwarfs_the_margin() -> None:
    h, g = head(), torch.Generator().manual_seed(2)
    base = torch.randn(2, V, generator=g).bfloat16().float() * 0.01
    u = (torch.randn(2, R, generator=g) * 3).bfloat16()
    assert h.certified_argmax(base, u) is None


def test_planted_ties_pick_the_first_index() -> None:
    """base chosen so three tokens in different blocks tie exactly after correction."""
    h, g = head(), torch.Generator().manual_seed(3)
    u = (torch.randn(1, R, generator=g) * 0.05).bfloat16()
    bias = h.bias(u)
    base = torch.full((1, V), -50.0)
    for v in (130, 700, 990):  # 990: the padded last block
        base[0, v] = 10.0 - float(bias[0, v])
    corrected = base + bias
    top = corrected.max()
    ties = (corrected[0] == top).nonzero().flatten().tolist()
    got = h.certified_argmax(base, u)
    assert got is not None and int(got[0]) == ties[0] == int(full(h, base, u)[0])


def test_non_finite_logits_are_left_to_the_full_pass() -> None:
    h = head()
    u = torch.zeros(1, R, dtype=torch.bfloat16)
    for bad in (float("nan"), float("inf")):
        base = torch.zeros(1, V)
        base[0, 5] = bad
        assert h.certified_argmax(base, u) is None


def test_a_bias_aligned_with_its_row_is_not_ruled_out() -> None:
    """u along W2[v0] gives v0 nearly the whole Cauchy-Schwarz bias, and only that bias
    lifts it over v1 (the token the bias pushes down most): a bound much tighter than
    |W2[v]| |u| drops the right answer."""
    h = head()
    dense = h.w.w2.unpack().float()
    answered = 0
    for v0 in (70, 900, 520):
        u = (dense[v0] / dense[v0].norm() * 2.0).bfloat16()[None]
        bias = h.bias(u)[0]
        v1 = int(bias.argmin())
        base = torch.full((1, V), -100.0)
        base[0, v1] = -float(bias[v1])
        base[0, v0] = -0.9 * float(bias[v0])
        got = h.certified_argmax(base, u)
        assert int(full(h, base, u)[0]) == v0
        if got is not None:
            answered += 1
            assert int(got[0]) == v0
    assert answered == 3
