"""The Triton paged-attention kernel (imported by :mod:`draftwise.gpu.attention` on first
use; see there for the layout and the reference it equals).

Why this shape: one program per (query token, kv head) computes every query head of that
kv head's GQA group at once (``[REP, D]`` against each key tile), so a kv head's keys are
read once per token, not once per query head.

Batch invariance by construction: a program reads only its own token's query, row
(block table) and position; it walks key tiles of ``BLOCK_N`` positions aligned to
absolute multiples of ``BLOCK_N`` from the first visible key to the token's own
position, with an online softmax (running max and sum in fp32) whose update order is
that walk. Nothing about the batch (its size, the token's index in it, other rows'
lengths) enters a program's instruction sequence or its reduction order, so a row's
output bits are the same alone or in any batch. Products are broadcast-and-sum in fp32
(``tl.sum`` over a fixed axis length), not ``tl.dot``: the interpreter cannot run a bf16
``tl.dot`` and a decode has too few query heads per kv head (M < 16) for one anyway.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,  # q [T, H, D], caches [NB, BS, KV, D]
    block_tables_ptr, token_row_ptr, token_pos_ptr,  # [B, W], [T], [T]
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    scale, window,  # window 0: full causal
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    REP: tl.constexpr, REP_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0)
    g = tl.program_id(1)
    row = tl.load(token_row_ptr + t)
    pos = tl.load(token_pos_ptr + t)
    r = tl.arange(0, REP_PAD)
    d = tl.arange(0, D_PAD)
    rmask = r < REP
    dmask = d < HEAD_DIM
    heads = g * REP + r
    qmask = rmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=qmask, other=0.0).to(tl.float32)  # [REP_PAD, D_PAD]
    start = pos * 0
    if window > 0:
        start = tl.maximum(pos - window + 1, 0)
    lo = (start // BLOCK_N) * BLOCK_N
    m_i = tl.full([REP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D_PAD], tl.float32)
    for n0 in range(lo, pos + 1, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = (n >= start) & (n <= pos)
        blk = tl.load(block_tables_ptr + row * stride_bt + n // BLOCK_SIZE, mask=nmask, other=0)
        off = blk * stride_cb + (n % BLOCK_SIZE) * stride_cs + g * stride_ch  # [BLOCK_N]
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + off[:, None] + d[None, :], mask=kvmask,
                    other=0.0).to(tl.float32)  # [BLOCK_N, D_PAD]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [REP_PAD, BLOCK_N]
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + off[:, None] + d[None, :], mask=kvmask,
                    other=0.0).to(tl.float32)  # [BLOCK_N, D_PAD]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=qmask)


def next_power_of_2(n: int) -> int:
    """triton's helper, re-exported so the launcher needs no triton import of its own."""
    return int(triton.next_power_of_2(n))
