"""The Triton GGUF quantized matmul (imported by :mod:`draftwise.gpu.quant` on first use;
the block layouts and the reference are there).

Each program computes a ``[BLOCK_M, BLOCK_N]`` tile of ``x @ W.T``: it walks K in
``BLOCK_K`` steps, loads the weight rows' GGUF bytes for that step, dequantizes them in
registers (:func:`_dequant`: scales and quants are decoded from the bytes by integer
shifts and masks, fp16 scales assembled from two bytes and bitcast, so no address ever
comes from a loaded pointer and no byte needs 2-byte alignment), and accumulates an fp32
``tl.dot`` (``input_precision="ieee"``: no TF32). The weights are never widened in
memory: a GPU reads 4.5 (Q4_K), 6.56 (Q6_K) or 8.5 (Q8_0) bits a weight.

Batch invariance: the tile sizes are constants, a row of ``x`` always sits in a
``BLOCK_M`` tile padded with zero rows, and K is walked in one fixed order, so an output
row's bits do not depend on how many rows the batch has or where the row is.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: ggml's type numbers for the formats this kernel decodes
Q8_0: tl.constexpr = tl.constexpr(8)
Q4_K: tl.constexpr = tl.constexpr(12)
Q6_K: tl.constexpr = tl.constexpr(14)


@triton.jit
def _f16(ptr, off, mask):
    """The little-endian fp16 at byte ``off`` (any alignment), as fp32."""
    lo = tl.load(ptr + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _dequant(w_ptr, rows, row_bytes, k, mask, QTYPE: tl.constexpr):
    """Weights ``[len(rows), len(k)]``: element ``k`` of each row, from its block bytes."""
    if QTYPE == Q8_0:  # [d: fp16][32 x int8]
        base = rows[:, None] * row_bytes + (k // 32)[None, :] * 34
        d = _f16(w_ptr, base, mask)
        q = tl.load(w_ptr + base + 2 + (k % 32)[None, :], mask=mask, other=0)
        return d * q.to(tl.int8, bitcast=True).to(tl.float32)
    elif QTYPE == Q4_K:  # [d][dmin][12 bytes: 8 six-bit scales and mins][128 x 2 nibbles]
        base = rows[:, None] * row_bytes + (k // 256)[None, :] * 144
        e = (k % 256)[None, :]
        j = e // 32  # sub-block: its scale and min
        d = _f16(w_ptr, base, mask)
        dmin = _f16(w_ptr, base + 2, mask)
        s_j = tl.load(w_ptr + base + 4 + j, mask=mask, other=0).to(tl.int32)
        s_j4 = tl.load(w_ptr + base + 4 + (j + 4) % 12, mask=mask, other=0).to(tl.int32)
        s_jm4 = tl.load(w_ptr + base + 4 + tl.where(j >= 4, j - 4, 0), mask=mask,
                        other=0).to(tl.int32)
        low = j < 4
        sc = tl.where(low, s_j & 63, (s_j4 & 15) | ((s_jm4 >> 6) << 4))
        mn = tl.where(low, s_j4 & 63, (s_j4 >> 4) | ((s_j >> 6) << 4))
        byte = tl.load(w_ptr + base + 16 + (e // 64) * 32 + e % 32, mask=mask,
                       other=0).to(tl.int32)
        q = tl.where(j % 2 == 1, byte >> 4, byte & 15)
        return d * sc.to(tl.float32) * q.to(tl.float32) - dmin * mn.to(tl.float32)
    else:  # Q6_K: [128 low nibbles][64 x 4 high pairs][16 x int8 scales][d]
        base = rows[:, None] * row_bytes + (k // 256)[None, :] * 210
        e = (k % 256)[None, :]
        half = e // 128
        g = (e % 128) // 32  # which quarter of the half: picks nibble and high pair
        lane = e % 32
        ql = tl.load(w_ptr + base + half * 64 + lane + (g % 2) * 32, mask=mask,
                     other=0).to(tl.int32)
        qh = tl.load(w_ptr + base + 128 + half * 32 + lane, mask=mask, other=0).to(tl.int32)
        q = (tl.where(g >= 2, ql >> 4, ql & 15) | (((qh >> (2 * g)) & 3) << 4)) - 32
        sc = tl.load(w_ptr + base + 192 + half * 8 + lane // 16 + 2 * g, mask=mask, other=0)
        d = _f16(w_ptr, base + 208, mask)
        return d * sc.to(tl.int8, bitcast=True).to(tl.float32) * q.to(tl.float32)


@triton.jit
def quant_matmul_kernel(
    x_ptr, w_ptr, out_ptr,  # x [M, K] fp32/fp16, w [N, row_bytes] uint8, out [M, N]
    M, N, K, row_bytes, stride_xm, stride_om,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = m < M
    nmask = n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                    mask=mmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        w = _dequant(w_ptr, n.to(tl.int64), row_bytes, k, nmask[:, None] & kmask[None, :],
                     QTYPE)
        w = tl.where(nmask[:, None] & kmask[None, :], w, 0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])
