"""The Triton paged attention equals its torch reference and the engine's own torch path,
for decode, verify (k + 1 causal rows) and prefill rows, with GQA and a sliding window,
and a row's output bits do not depend on the batch it is in."""

from __future__ import annotations

import pytest
import torch

from draftwise.gpu.attention import paged_attention, paged_attention_reference
from draftwise.models.attention import AttentionMetadata
from draftwise.models.attention import paged_attention as engine_paged_attention
from draftwise.models.batch import build_forward_batch

BLOCK = 4
HEADS, KV_HEADS, DIM = 4, 2, 16
NUM_BLOCKS = 24


def make_cache(device: torch.device, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, BLOCK, KV_HEADS, DIM)
    return (torch.randn(shape, generator=g).to(device, dtype),
            torch.randn(shape, generator=g).to(device, dtype))


def make_batch(rows: list[tuple[int, int]], device: torch.device, dtype: torch.dtype,
               seed: int = 1):
    """rows: (context already cached, new query tokens). Blocks are handed out in a
    scrambled order so the block table matters."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(NUM_BLOCKS - 1, generator=g).add(1).tolist()  # block 0: null
    tables, starts, ids = [], [], []
    for ctx, new in rows:
        need = -(-(ctx + new) // BLOCK)
        tables.append(order[:need])
        order = order[need:]
        starts.append(ctx)
        ids.append([0] * new)
    batch = build_forward_batch(ids, starts, tables, BLOCK, [[] for _ in rows], device=device)
    t = len(batch.input_ids)
    q = torch.randn(t, HEADS, DIM, generator=g).to(device, dtype)
    k = torch.randn(t, KV_HEADS, DIM, generator=g).to(device, dtype)
    v = torch.randn(t, KV_HEADS, DIM, generator=g).to(device, dtype)
    return batch, q, k, v


def run(batch, q, k, v, caches, window=None):
    kc, vc = caches
    return paged_attention(q, k, v, kc, vc, batch.slot_mapping, batch.query_start_loc,
                           batch.seq_lens, batch.block_tables, DIM ** -0.5, window)


# decode rows (1 token), verify rows (k + 1 = 4), a prefill chunk, a row starting at 0
SHAPES = [(9, 1), (30, 4), (0, 7), (17, 1), (5, 4)]


@pytest.mark.parametrize(("dtype", "window"), [(torch.float32, None), (torch.float16, None),
                                               (torch.float32, 6)])
def test_equals_reference(device, dtype, window):
    batch, q, k, v = make_batch(SHAPES, device, dtype)
    caches = make_cache(device, dtype)
    out = run(batch, q, k, v, caches, window)
    ref = paged_attention_reference(q, *caches, batch.query_start_loc, batch.seq_lens,
                                    batch.block_tables, DIM ** -0.5, window)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def test_equals_the_engine_torch_path(device):
    """Same cache layout and row semantics as ``models.attention`` (fp32, GQA, causal)."""
    batch, q, k, v = make_batch(SHAPES, device, torch.float32)
    mine = make_cache(device, torch.float32)
    theirs = tuple(c.clone() for c in mine)
    out = run(batch, q, k, v, mine)
    meta = AttentionMetadata.build(batch, BLOCK)
    ref = engine_paged_attention(q, k, v, *theirs, meta, DIM ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine[0], theirs[0], atol=0, rtol=0)  # K/V written alike


def test_verify_rows_are_causal_inside_the_block(device):
    """A verify row's j-th query sees drafts up to j only: changing the last draft's K/V
    leaves the earlier queries' outputs unchanged, bit for bit."""
    batch, q, k, v = make_batch([(10, 4)], device, torch.float32)
    a = run(batch, q, k, v, make_cache(device, torch.float32))
    k2, v2 = k.clone(), v.clone()
    k2[-1] += 1.0
    v2[-1] -= 1.0
    b = run(batch, q, k2, v2, make_cache(device, torch.float32))
    assert torch.equal(a[:3], b[:3]) and not torch.equal(a[3], b[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_row_is_bitwise_batch_invariant(device, dtype):
    """One verify row alone, then at two positions among rows of other lengths."""
    row = (13, 4)
    others = [(3, 1), (29, 4), (0, 6)]
    outs = []
    for rows in ([row], [*others, row], [row, *others[:2]]):
        batch, q, k, v = make_batch(rows, device, dtype, seed=2)
        # the row under test gets the same q/k/v/context in every batch
        gen = torch.Generator().manual_seed(7)
        qr = torch.randn(4, HEADS, DIM, generator=gen).to(device, dtype)
        kr = torch.randn(4, KV_HEADS, DIM, generator=gen).to(device, dtype)
        vr = torch.randn(4, KV_HEADS, DIM, generator=gen).to(device, dtype)
        at = rows.index(row)
        s = int(batch.query_start_loc[at])
        q[s:s + 4], k[s:s + 4], v[s:s + 4] = qr, kr, vr
        kc, vc = make_cache(device, dtype, seed=3)
        ctx = torch.randn(13, KV_HEADS, DIM, generator=gen).to(device, dtype)
        table = batch.block_tables[at]
        for p in range(13):  # the row's cached context, at its own blocks
            kc[table[p // BLOCK], p % BLOCK] = ctx[p]
            vc[table[p // BLOCK], p % BLOCK] = -ctx[p]
        out = run(batch, q, k, v, (kc, vc))
        outs.append(out[s:s + 4])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_cpu_tensors_without_the_interpreter_are_refused_by_name():
    from draftwise.gpu.device import KernelDeviceError, check_kernel_device

    def compiled() -> None:  # anything that is not an InterpretedFunction
        pass

    with pytest.raises(KernelDeviceError, match="TRITON_INTERPRET=1"):
        check_kernel_device(compiled, torch.zeros(1))
