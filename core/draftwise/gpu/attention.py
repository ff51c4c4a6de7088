"""Paged causal attention for decode, verify and prefill on a CUDA device (Triton).

One kernel serves the three step shapes: a decode row is one query token, a verify row
is the k + 1 tokens of (last token, drafts) attending causally inside the block, a
prefill chunk is many; each query token sees its row's cached positions up to its own.
The layout is the CPU engine's (``draftwise.models.batch``, ``core/csrc/paged_attention.c``):
caches ``[num_blocks, block_size, kv_heads, head_dim]``, slot ``s`` = block
``s // block_size`` offset ``s % block_size``; ``query_start_loc [B + 1]``,
``seq_lens [B]`` (this step's tokens included), ``block_tables [B, W]``; row ``r``'s
query tokens are the last ``qlen`` of its ``seq_lens[r]`` positions. Query heads are
grouped over kv heads as the CPU paths group them (head ``h`` reads kv head
``h // (heads // kv_heads)``).

:func:`paged_attention_reference` is the readable definition (one token at a time, fp32
softmax); :func:`paged_attention` runs ``triton_attention.paged_attention_kernel`` and
is tested equal to it (and to the engine's own torch path) under the interpreter, and
bitwise batch-invariant (the kernel module says how).
"""

from __future__ import annotations

import torch

from draftwise.gpu.device import check_kernel_device
from draftwise.models.kv_slots import write_kv

#: key positions per tile of the kernel's walk (fixed: it is part of the reduction order)
BLOCK_N = 16


def token_rows(
    query_start_loc: torch.Tensor,  # [B + 1] int64
    seq_lens: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor]:  # row [T], position [T], int64
    """Each query token's row and absolute position (the last ``qlen`` of its row's
    ``seq_len`` positions), on the inputs' device, without a host sync."""
    qlens = query_start_loc[1:] - query_start_loc[:-1]
    total = int(query_start_loc[-1]) if query_start_loc.device.type == "cpu" else None
    row = torch.repeat_interleave(torch.arange(len(qlens), device=qlens.device), qlens,
                                  output_size=total)
    offset = torch.arange(row.numel(), device=row.device) - query_start_loc[row]
    return row, seq_lens[row] - qlens[row] + offset


def paged_attention_reference(
    q: torch.Tensor,  # [T, heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim], K/V written
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [B + 1]
    seq_lens: torch.Tensor,  # [B]
    block_tables: torch.Tensor,  # [B, W]
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [T, heads * head_dim] in q's dtype
    """One query token at a time: gather its visible keys, softmax in fp32, weight V."""
    t_all, h, d = q.shape
    block_size, kvh = k_cache.shape[1], k_cache.shape[2]
    rows, positions = token_rows(query_start_loc.cpu(), seq_lens.cpu())
    out = torch.empty(t_all, h, d, dtype=torch.float32, device=q.device)
    for t in range(t_all):
        row, pos = int(rows[t]), int(positions[t])
        first = 0 if window is None else max(0, pos - window + 1)
        keys = torch.arange(first, pos + 1)
        blocks = block_tables[row].cpu()[keys // block_size]
        slots = (blocks * block_size + keys % block_size).to(q.device)
        kk = k_cache.reshape(-1, kvh, d)[slots].float()  # [N, kv, d]
        vv = v_cache.reshape(-1, kvh, d)[slots].float()
        kk = kk.repeat_interleave(h // kvh, dim=1)  # [N, h, d]
        vv = vv.repeat_interleave(h // kvh, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[t].float(), kk) * scale
        out[t] = torch.einsum("hn,nhd->hd", scores.softmax(-1), vv)
    return out.to(q.dtype).reshape(t_all, h * d)


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,  # [T, kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T]
    query_start_loc: torch.Tensor,  # [B + 1]
    seq_lens: torch.Tensor,  # [B]
    block_tables: torch.Tensor,  # [B, W]
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [T, heads * head_dim] in q's dtype
    """Write this step's K/V at ``slot_mapping``, then attend (the module doc)."""
    from draftwise.gpu.triton_attention import next_power_of_2, paged_attention_kernel

    check_kernel_device(paged_attention_kernel, q, k_cache, v_cache, block_tables)
    t_all, h, d = q.shape
    _, block_size, kvh, dc = k_cache.shape
    if h % kvh or dc != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} "
                         f"(heads must be a multiple of kv heads, head sizes equal)")
    if k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("the caches must share one layout with contiguous head dims")
    if window is not None and window < 1:
        raise ValueError(f"window must be a positive number of positions, got {window}")
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    q = q.contiguous()
    rows, positions = token_rows(query_start_loc, seq_lens)
    tables = block_tables.contiguous()
    out = torch.empty_like(q)
    if t_all:
        rep = h // kvh
        paged_attention_kernel[(t_all, kvh)](
            q, k_cache, v_cache, out, tables, rows, positions,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            float(scale), 0 if window is None else int(window),
            BLOCK_SIZE=block_size, HEAD_DIM=d, D_PAD=next_power_of_2(d),
            REP=rep, REP_PAD=next_power_of_2(rep), BLOCK_N=BLOCK_N,
        )
    return out.reshape(t_all, h * d)
