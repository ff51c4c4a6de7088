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


def rnn_head(v: int = 1000, r: int = 64, seed: int = 0) -> MarkovHead:
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(v, r, generator=g) * 0.3).bfloat16()
    w2 = pack_weights([(torch.randn(v, r, generator=g) * 0.05).bfloat16()])[0]
    if not isinstance(w2, BlockedWeight):
        pytest.skip("the certified pick needs the native packed layout (kernels not built)")
    h = MarkovHead(MarkovWeights("vanilla", w1, w2))
    if h.screen is None:
        pytest.skip("the screen needs the quantized GEMM (kernels not built)")
    return h


@pytest.mark.parametrize(("rows", "spread"), [(1, 1.0), (3, 1.0), (1, 0.3), (4, 1.0)])
def test_the_screen_certifies_where_cauchy_schwarz_cannot(rows: int, spread: float) -> None:
    """An rnn-like latent (dense tanh outputs, |u| ~ sqrt(r)): the Cauchy-Schwarz window
    covers the whole logit range, the quantized screen's does not; every answer is the
    full product's argmax, and the screen answers most of the time."""
    h, g = rnn_head(4096), torch.Generator().manual_seed(4)
    cs = rnn_head(4096)
    cs.screen = None  # interval 1 alone
    answered = 0
    for _ in range(40):
        base = (torch.randn(rows, 4096, generator=g) * spread).bfloat16().float()
        u = torch.tanh(torch.randn(rows, 64, generator=g) * 2).bfloat16()
        cs._misses = [0, 0]
        assert cs.certified_argmax(base, u) is None, "Cauchy-Schwarz alone must not decide"
        got = h.certified_argmax(base, u)
        if got is not None:
            answered += 1
            assert torch.equal(got, full(h, base, u))
    assert answered >= (30 if rows == 1 else 1), answered


def test_a_bias_along_the_quantization_error_is_not_ruled_out() -> None:
    """u along row v0's Q8_0 error E[v0], so the screen's ``a`` misses d0 = y - a of v0's
    bias; base is set so ``a`` ranks v1 first and the exact bias ranks v0 first: the
    pick must answer v0 (a hard case for correctness; the bound's own slack is wide
    enough that a moderately tighter one passes too, see the gives-up test)."""
    from gguf import GGMLQuantizationType, quants

    h = rnn_head()
    dense = h.w.w2.unpack().float()
    q = GGMLQuantizationType.Q8_0
    err = dense - torch.from_numpy(quants.dequantize(quants.quantize(dense.numpy(), q), q))
    answered = 0
    for v0 in (5, 400, 999):
        u = (err[v0] / err[v0].norm() * 6.0).bfloat16()[None]
        y = h.bias(u)[0].double()
        a = h.screen.approx(u)[0][0].double()
        miss = y - a
        v1 = int((miss + 1e9 * (torch.arange(1000) == v0)).argmin())  # missed least
        d0, d1 = float(miss[v0]), float(miss[v1])
        assert d0 > d1
        base = torch.full((1, 1000), -100.0)
        base[0, v1] = 5.0 - float(a[v1])
        base[0, v0] = 5.0 - float(a[v0]) - 0.5 * (d0 - d1)
        assert int(full(h, base, u)[0]) == v0
        assert int((base + a.float()).argmax()) == v1, "a alone must rank v1 first"
        got = h.certified_argmax(base, u)
        if got is not None:
            answered += 1
            assert int(got[0]) == v0
    assert answered == 3
