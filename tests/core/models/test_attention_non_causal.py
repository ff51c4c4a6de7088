"""Non-causal paged attention (a block drafter's block): every query sees its row's whole
context, on both backends, against plain softmax attention."""

from __future__ import annotations

import pytest
import torch
from draftwise.models.attention import AttentionMetadata, _kernels, paged_attention
from draftwise.models.batch import build_forward_batch

BLOCK = 4
KV, HEADS, D = 2, 4, 32


def reference(q, keys, values, scale):  # q [M, H, D], keys/values [N, KV, D]
    rep = HEADS // KV
    k = keys.repeat_interleave(rep, dim=1).float()
    v = values.repeat_interleave(rep, dim=1).float()
    s = torch.einsum("mhd,nhd->hmn", q.float(), k) * scale
    return torch.einsum("hmn,nhd->mhd", s.softmax(-1), v).reshape(q.shape[0], -1)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_every_query_sees_the_whole_row(backend: str) -> None:
    if backend == "native" and _kernels is None:
        pytest.skip("C kernels not built")
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    # two rows: contexts of 9 and 3 cached positions, blocks of 5 and 5 queries
    ctx, qlen = [9, 3], 5
    tables = [[0, 1, 2, 3], [4, 5]]
    kc = torch.zeros(8, BLOCK, KV, D, dtype=dtype)
    vc = torch.zeros_like(kc)
    cached_k = [torch.randn(n, KV, D, generator=gen).to(dtype) for n in ctx]
    cached_v = [torch.randn(n, KV, D, generator=gen).to(dtype) for n in ctx]
    for table, k, v in zip(tables, cached_k, cached_v):
        for p in range(k.shape[0]):
            kc[table[p // BLOCK], p % BLOCK] = k[p]
            vc[table[p // BLOCK], p % BLOCK] = v[p]
    batch = build_forward_batch(
        [[1] * qlen, [1] * qlen], ctx, tables, BLOCK, [[0], [0]]
    )
    t = 2 * qlen
    q = torch.randn(t, HEADS, D, generator=gen).to(dtype)
    k = torch.randn(t, KV, D, generator=gen).to(dtype)
    v = torch.randn(t, KV, D, generator=gen).to(dtype)
    meta = AttentionMetadata.build(
        batch, BLOCK, backend=backend, num_blocks=8, causal=False
    )
    out = paged_attention(q, k, v, kc, vc, meta, D**-0.5)
    for r in range(2):
        rows = slice(r * qlen, (r + 1) * qlen)
        keys = torch.cat([cached_k[r], k[rows]])
        values = torch.cat([cached_v[r], v[rows]])
        want = reference(q[rows], keys, values, D**-0.5)
        torch.testing.assert_close(out[rows].float(), want, atol=3e-2, rtol=3e-2)
        # and it is not the causal answer: the first query sees the last block key
        causal = reference(q[rows][:1], keys[: ctx[r] + 1], values[: ctx[r] + 1], D**-0.5)
        assert (out[rows][:1].float() - causal).abs().max() > 5e-2


def test_non_causal_refuses_a_window() -> None:
    batch = build_forward_batch([[1, 2]], [0], [[0]], BLOCK, [[1]])
    with pytest.raises(ValueError, match="no sliding window"):
        AttentionMetadata.build(batch, BLOCK, {4}, causal=False)


def _query_per_row(batch, meta: AttentionMetadata) -> AttentionMetadata:
    """The native non-causal layout before queries rode as heads: every query its own
    causal row of length one over its row's whole context (the bits to keep)."""
    row_of = torch.repeat_interleave(torch.arange(len(batch.query_lens_cpu)),
                                     torch.tensor(batch.query_lens_cpu))
    t = int(row_of.numel())
    tables = batch.block_tables.index_select(0, row_of).contiguous()
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping.contiguous(), block_ids=tables, num_rows=t,
        max_query_len=1, ctx_len=meta.ctx_len, chunk=meta.chunk, pad_index=None,
        unpad_index=None, masks={}, backend="native",
        query_start_loc=torch.arange(t + 1), seq_lens=batch.seq_lens.index_select(0, row_of),
        block_tables=tables)


@pytest.mark.skipif(_kernels is None, reason="C kernels not built")
@pytest.mark.parametrize("qlens", [[5, 5], [7, 2, 4], [16]])
def test_queries_as_heads_keeps_every_bit(qlens: list[int]) -> None:
    """Rows of equal and unequal block lengths: the same bits as a row per query."""
    gen = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16
    ctx = [37, 3, 20][: len(qlens)]
    width = 16
    tables = [[r * width + i for i in range(width)] for r in range(len(qlens))]
    kc = torch.randn(width * len(qlens), BLOCK, KV, D, generator=gen).to(dtype)
    vc = torch.randn_like(kc.float(), ).to(dtype)
    batch = build_forward_batch([[1] * q for q in qlens], ctx, tables, BLOCK,
                                [[0] for _ in qlens])
    t = sum(qlens)
    q = torch.randn(t, HEADS, D, generator=gen).to(dtype)
    k = torch.randn(t, KV, D, generator=gen).to(dtype)
    v = torch.randn(t, KV, D, generator=gen).to(dtype)
    meta = AttentionMetadata.build(batch, BLOCK, backend="native",
                                   num_blocks=kc.shape[0], causal=False)
    assert meta.queries_as_heads
    got = paged_attention(q, k, v, kc.clone(), vc.clone(), meta, D**-0.5)
    want = paged_attention(q, k, v, kc.clone(), vc.clone(), _query_per_row(batch, meta),
                           D**-0.5)
    assert torch.equal(got, want)
