"""Gated DeltaNet math against transformers' torch fallbacks, and its two forms against each other.

Tolerances (fp32): recurrence vs transformers' recurrence is bitwise (same op order);
chunked vs transformers' chunked and recurrence vs chunked agree to 1e-5 absolute
(different summation order over up to 150 tokens of O(1) values). Conv vs F.conv1d: 1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from draftwise.models.gdn import (
    causal_conv,
    chunk_gated_delta_rule,
    gates,
    recurrent_gated_delta_rule,
)
from transformers.models.qwen3_next import modeling_qwen3_next as hf

ATOL = 1e-5


def inputs(b: int, t: int, hk: int = 2, hv: int = 4, dk: int = 8, dv: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hk, dk, generator=gen)
    k = torch.randn(b, t, hk, dk, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen)
    a = torch.randn(b, t, hv, generator=gen)
    bb = torch.randn(b, t, hv, generator=gen)
    a_log = torch.rand(hv, generator=gen).mul(3).log()
    dt_bias = torch.randn(hv, generator=gen)
    g, beta = gates(a, bb, a_log, dt_bias)
    s0 = 0.1 * torch.randn(b, hv, dk, dv, generator=gen)
    return q, k, v, g, beta, s0


def hf_recurrent(q, k, v, g, beta, s0):
    return hf.torch_recurrent_gated_delta_rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=s0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def hf_chunk(q, k, v, g, beta, s0):
    return hf.torch_chunk_gated_delta_rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=s0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def test_gates_match_transformers_formula() -> None:
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    a_log, dt_bias = torch.randn(4), torch.randn(4)
    g, beta = gates(a, b, a_log, dt_bias)
    # within an ulp: torch's own call on this shape may take its (differently rounded)
    # tail code, which gates() avoids so that its bits never depend on the batch
    one_ulp = {"atol": 0, "rtol": 2.5e-7}
    torch.testing.assert_close(g, -a_log.float().exp() * F.softplus(a.float() + dt_bias), **one_ulp)
    torch.testing.assert_close(beta, b.sigmoid(), **one_ulp)
    assert (g <= 0).all()
    for rows in (1, 2):  # a row's gates are the same bits whatever the batch around it
        g1, b1 = gates(a[:rows], b[:rows], a_log, dt_bias)
        assert torch.equal(g1, g[:rows]) and torch.equal(b1, beta[:rows])


@pytest.mark.parametrize("t", [1, 5, 17])
def test_recurrence_equals_transformers_recurrence(t: int) -> None:
    q, k, v, g, beta, s0 = inputs(2, t)
    out, s, _ = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    ref_out, ref_s = hf_recurrent(q, k, v, g, beta, s0)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(s, ref_s, atol=0, rtol=0)


@pytest.mark.parametrize("t", [1, 7, 64, 150])
def test_chunked_equals_transformers_chunked(t: int) -> None:
    q, k, v, g, beta, s0 = inputs(2, t, seed=t)
    out, s = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    ref_out, ref_s = hf_chunk(q, k, v, g, beta, s0)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, ref_s, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("t", "hk", "hv"), [(3, 4, 4), (70, 2, 4), (150, 1, 3)])
def test_chunked_equals_recurrence(t: int, hk: int, hv: int) -> None:
    q, k, v, g, beta, s0 = inputs(2, t, hk=hk, hv=hv, seed=3)
    out_r, s_r, _ = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    out_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    torch.testing.assert_close(out_c, out_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(s_c, s_r, atol=ATOL, rtol=0)


def test_state_carries_across_calls_and_kept_states_are_prefix_states() -> None:
    q, k, v, g, beta, s0 = inputs(1, 40, seed=5)
    _, s_all, kept = recurrent_gated_delta_rule(q, k, v, g, beta, s0, keep_states=True)
    assert kept is not None and kept.shape == (1, 40, 4, 8, 16)
    # prefix 25 by chunks, then 15 by recurrence: same final state
    _, s_half = chunk_gated_delta_rule(
        q[:, :25], k[:, :25], v[:, :25], g[:, :25], beta[:, :25], s0, chunk=8
    )
    _, s_rest, _ = recurrent_gated_delta_rule(
        q[:, 25:], k[:, 25:], v[:, 25:], g[:, 25:], beta[:, 25:], s_half
    )
    torch.testing.assert_close(s_rest, s_all, atol=ATOL, rtol=0)
    # kept[t] is exactly the final state of running only the first t+1 tokens
    for t in (0, 9, 39):
        _, s_t, _ = recurrent_gated_delta_rule(
            q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], g[:, : t + 1], beta[:, : t + 1], s0
        )
        assert torch.equal(kept[:, t], s_t)


def test_recurrence_rows_are_independent() -> None:
    q, k, v, g, beta, s0 = inputs(3, 4, seed=7)
    out, s, _ = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    for r in range(3):
        o1, s1, _ = recurrent_gated_delta_rule(
            q[r : r + 1], k[r : r + 1], v[r : r + 1], g[r : r + 1], beta[r : r + 1], s0[r : r + 1]
        )
        assert torch.equal(o1[0], out[r]) and torch.equal(s1[0], s[r])


def test_conv_equals_conv1d_and_state_splits() -> None:
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(2, 11, 16, generator=gen)  # C a multiple of the SIMD width, as in real models
    w = torch.randn(16, 4, generator=gen)
    ref = F.silu(
        F.conv1d(u.transpose(1, 2), w.unsqueeze(1), padding=3, groups=16)[:, :, :11]
    ).transpose(1, 2)
    out, state, kept = causal_conv(u, w, keep_states=True)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    assert torch.equal(state, u[:, -3:].transpose(1, 2))
    # chunk 1: 7 tokens, chunk 2: 4 tokens from the carried state
    o1, s1, _ = causal_conv(u[:, :7], w)
    o2, s2, _ = causal_conv(u[:, 7:], w, s1)
    assert torch.equal(torch.cat((o1, o2), 1), out) and torch.equal(s2, state)
    # the kept state after token t is the state after feeding only tokens 0..t
    assert kept is not None
    for t in (0, 2, 6, 10):
        _, s_t, _ = causal_conv(u[:, : t + 1], w)
        assert torch.equal(kept[:, t], s_t)


def test_conv_matches_transformers_update_path() -> None:
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(1, 5, 6, generator=gen)
    w = torch.randn(6, 4, generator=gen)
    hf_state = torch.zeros(1, 6, 4)  # transformers pads its conv state to K
    outs = [
        hf.causal_conv1d_update(u[:, i : i + 1].transpose(1, 2), hf_state, w, None, "silu")
        for i in range(5)
    ]
    ref = torch.cat(outs, dim=2).transpose(1, 2)
    out, state, _ = causal_conv(u, w)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    assert torch.equal(state, hf_state[:, :, 1:])
