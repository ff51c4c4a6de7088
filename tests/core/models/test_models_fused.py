"""The C versions of the decoder's small ops against their torch references (models.fused)."""

from __future__ import annotations

import pytest
import torch
from draftwise.models import attention
from draftwise.models.fused import add_rms_norm, apply_rope_, rms_norm, silu_mul
from draftwise.models.rope import apply_rope, inv_frequencies, rope_tables

pytestmark = pytest.mark.skipif(attention._kernels is None, reason="C kernels not built")


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 values' distance in units in the last place (same-sign finite values)."""
    ai, bi = a.view(torch.int16).int(), b.view(torch.int16).int()
    return (ai - bi).abs()


@pytest.mark.parametrize("dim", [576, 64, 100])
def test_rms_norm_matches_transformers_rounding(dim: int) -> None:
    torch.manual_seed(0)
    x = (torch.randn(37, dim) * 3).bfloat16()
    w = (torch.rand(dim) + 0.5).bfloat16()
    ours, ref = rms_norm(x, w, 1e-5, native=True), rms_norm(x, w, 1e-5)
    # only the fp32 sum of squares is ordered differently: at most one bf16 ulp, rarely
    assert _ulps_apart(ours, ref).max() <= 1
    assert (ours != ref).float().mean() < 0.01
    # rows are independent: one row alone gives the same bits as inside the batch
    assert torch.equal(rms_norm(x[5:6], w, 1e-5, native=True), ours[5:6])


def test_silu_mul_matches_torch() -> None:
    torch.manual_seed(0)
    gate_up = (torch.randn(9, 2 * 1536) * 4).bfloat16()
    gate_up[0, :8] = torch.tensor([0.0, -0.0, 20.0, -20.0, 90.0, -90.0, 1e-3, -1e-3])
    ours, ref = silu_mul(gate_up, native=True), silu_mul(gate_up)
    assert _ulps_apart(ours, ref).max() <= 1
    assert (ours != ref).float().mean() < 0.01
    assert torch.equal(silu_mul(gate_up[3:4].contiguous(), native=True), ours[3:4])


def test_silu_mul_split_across_threads_is_each_row_alone() -> None:
    """8 wide rows (a batched decode of a 1.5B model) run on the pool: same bits as each
    row alone and as one thread."""
    from draftwise.models import kernels

    torch.manual_seed(1)
    gate_up = (torch.randn(8, 2 * 8960) * 4).bfloat16()
    saved = kernels._threads
    try:
        kernels.set_kernel_threads(2)
        many = silu_mul(gate_up, native=True)
        for i in range(8):
            assert torch.equal(silu_mul(gate_up[i : i + 1].contiguous(), native=True), many[i : i + 1])
        kernels.set_kernel_threads(1)
        assert torch.equal(silu_mul(gate_up, native=True), many)
    finally:
        kernels.set_kernel_threads(saved)


def test_rope_is_bitwise_the_torch_path() -> None:
    torch.manual_seed(0)
    d, heads = 64, 12
    inv, scaling = inv_frequencies(d, 10000.0, None, 2048)
    cos_t, sin_t = rope_tables(inv, 2048, scaling, torch.bfloat16)
    positions = torch.tensor([0, 5, 300, 2047, 17])
    qkv = torch.randn(5, heads * d + 4 * d).bfloat16()  # rope on the first `heads` heads
    cos, sin = cos_t[positions].unsqueeze(1), sin_t[positions].unsqueeze(1)
    view = qkv[:, : heads * d].view(5, heads, d)  # strided rows, as in the fused qkv output
    ref = apply_rope(view, cos, sin)
    tail = qkv[:, heads * d :].clone()
    out = apply_rope_(view, cos, sin)
    assert torch.equal(out, ref)
    assert torch.equal(qkv[:, heads * d :], tail)  # the rest of the row is untouched


def test_add_rms_norm_is_the_residual_add_then_the_norm() -> None:
    torch.manual_seed(0)
    h = (torch.randn(7, 576) * 3).bfloat16()
    delta = torch.randn(7, 576).bfloat16()
    w = (torch.rand(576) + 0.5).bfloat16()
    new_h, x = add_rms_norm(h, delta.clone(), w, 1e-5, native=True)
    ref_h, ref_x = add_rms_norm(h, delta.clone(), w, 1e-5)
    assert torch.equal(new_h, ref_h)  # the bf16 residual add is exact to torch's
    assert _ulps_apart(x, ref_x).max() <= 1
    assert torch.equal(x, rms_norm(new_h, w, 1e-5, native=True))
