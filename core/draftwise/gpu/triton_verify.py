"""The Triton verify kernel (imported by :mod:`draftwise.gpu.verify` on first use; the
rule and its reference are there).

One program takes ``BLOCK_R`` requests, as vectors: greedy and random requests side by
side, each lane deciding by its own flag. The draft walk is a loop over draft positions
in which a lane stays live while it keeps accepting; the recovered or bonus token is an
inverse-CDF draw (the CPU's :func:`draftwise.sampling.categorical`) done in two passes
over the vocabulary in ``BLOCK_V`` tiles: the first finds the total weight, the second
counts the CDF entries at or below ``u * total``. Probabilities and uniforms are fp64
from the accept test on, as the CPU rule computes them.

Batch invariance: every quantity is per lane; the only reductions run along the
vocabulary in a fixed tile order (``BLOCK_V`` depends on the vocabulary size only), so
a request's tokens do not depend on which or how many requests share its program.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _argmax_rows(logits_ptr, rows, rmask, V, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """First index of each row's maximum (torch's tie rule; NaN is not ranked)."""
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    arg = tl.zeros([BLOCK_R], tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = rmask[:, None] & (cols[None, :] < V)
        x = tl.load(logits_ptr + rows[:, None] * V + cols[None, :], mask=mask,
                    other=float("-inf"))
        m = tl.max(x, axis=1)
        a = tl.argmax(x, axis=1).to(tl.int64) + v0
        better = m > best
        arg = tl.where(better, a, arg)
        best = tl.where(better, m, best)
    return arg


@triton.jit
def _weights(probs_ptr, q_ptr, rows, qrows, x, cols, mask, use_p,
             V, HAS_Q: tl.constexpr):
    """One tile of the weights a final token is drawn from: p where ``use_p`` (bonus, or
    an empty residual), else the residual max(p - q, 0) (one-hot q: p without x)."""
    p = tl.load(probs_ptr + rows[:, None] * V + cols[None, :], mask=mask,
                other=0.0).to(tl.float64)
    if HAS_Q:
        q = tl.load(q_ptr + qrows[:, None] * V + cols[None, :], mask=mask & ~use_p[:, None],
                    other=0.0).to(tl.float64)
        resid = tl.maximum(p - q, 0.0)
    else:
        resid = tl.where(cols[None, :] == x[:, None], 0.0, p)
    return tl.where(use_p[:, None], p, resid)


@triton.jit
def verify_kernel(
    logits_ptr, probs_ptr, q_ptr,  # [T, V] fp32, [T, V] fp32, [D, V] fp32 (HAS_Q)
    drafts_ptr, num_draft_ptr, cu_logits_ptr, cu_draft_ptr, greedy_ptr,  # [D] [B] [B+1] x2 [B]
    u_ptr,  # [T] fp64: a random request's num_draft + 1 uniforms at its logits rows
    out_ptr, num_acc_ptr,  # [B, W] int64 (placeholder-filled), [B] int64
    B, V, max_k, out_stride,
    HAS_Q: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < B
    nd = tl.load(num_draft_ptr + r, mask=rmask, other=0)
    cl = tl.load(cu_logits_ptr + r, mask=rmask, other=0)
    cd = tl.load(cu_draft_ptr + r, mask=rmask, other=0)
    greedy = tl.load(greedy_ptr + r, mask=rmask, other=1) != 0
    rand = rmask & ~greedy
    acc = tl.zeros([BLOCK_R], tl.int64)
    going = rmask
    for j in range(0, max_k):
        live = going & (j < nd)
        x = tl.load(drafts_ptr + cd + j, mask=live, other=0)
        top = _argmax_rows(logits_ptr, cl + j, live & greedy, V, BLOCK_R, BLOCK_V)
        lr = live & ~greedy
        px = tl.load(probs_ptr + (cl + j) * V + x, mask=lr, other=0.0).to(tl.float64)
        if HAS_Q:
            qx = tl.load(q_ptr + (cd + j) * V + x, mask=lr, other=0.0).to(tl.float64)
        else:
            qx = tl.full([BLOCK_R], 1.0, tl.float64)
        uj = tl.load(u_ptr + cl + j, mask=lr, other=1.0)
        ratio = tl.minimum(px / tl.where(qx > 0, qx, 1.0), 1.0)
        ok = tl.where(greedy, x == top, (qx > 0) & (uj < ratio))
        step = live & ok
        tl.store(out_ptr + r * out_stride + j, x, mask=step)
        acc += step.to(tl.int64)
        going = step
    f = cl + acc  # each request's final logits row: recovered (acc < nd) or bonus
    rej = acc < nd
    xr = tl.load(drafts_ptr + cd + acc, mask=rand & rej, other=0)
    qrow = cd + acc
    # pass 1: total weight of p and of the residual, as the CDF's last entry
    tot_p = tl.zeros([BLOCK_R], tl.float64)
    tot_w = tl.zeros([BLOCK_R], tl.float64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = rand[:, None] & (cols[None, :] < V)
        p = _weights(probs_ptr, q_ptr, f, qrow, xr, cols, mask, rmask, V, HAS_Q)
        w = _weights(probs_ptr, q_ptr, f, qrow, xr, cols, mask, ~rmask, V, HAS_Q)
        tot_p = tl.max(tot_p[:, None] + tl.cumsum(p, axis=1), axis=1)
        tot_w = tl.max(tot_w[:, None] + tl.cumsum(w, axis=1), axis=1)
    use_p = ~rej | (tot_w <= 0)
    total = tl.where(use_p, tot_p, tot_w)
    target = tl.load(u_ptr + cl + nd, mask=rand, other=0.0) * total
    # pass 2: the draw is the count of CDF entries <= u * total (searchsorted, right)
    carry = tl.zeros([BLOCK_R], tl.float64)
    count = tl.zeros([BLOCK_R], tl.int64)
    last = tl.zeros([BLOCK_R], tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = rand[:, None] & (cols[None, :] < V)
        w = _weights(probs_ptr, q_ptr, f, qrow, xr, cols, mask, use_p, V, HAS_Q)
        cdf = carry[:, None] + tl.cumsum(w, axis=1)
        count += tl.sum((mask & (cdf <= target[:, None])).to(tl.int64), axis=1)
        pos = tl.where(mask & (w > 0), cols[None, :].to(tl.int64), 0)
        last = tl.maximum(last, tl.max(pos, axis=1))
        carry = tl.max(cdf, axis=1)
    drawn = tl.where(count >= V, last, count)  # u * total rounded up to total
    gtok = _argmax_rows(logits_ptr, f, rmask & greedy, V, BLOCK_R, BLOCK_V)
    tl.store(out_ptr + r * out_stride + acc, tl.where(greedy, gtok, drawn), mask=rmask)
    tl.store(num_acc_ptr + r, acc, mask=rmask)


def next_power_of_2(n: int) -> int:
    """triton's helper, re-exported so the launcher needs no triton import of its own."""
    return int(triton.next_power_of_2(n))
