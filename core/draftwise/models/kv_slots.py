"""Writing a step's keys and values into the paged cache: the one store every attention
path uses (the torch path and the C kernel's callers in ``models.attention``, the Triton
kernels' launcher in ``draftwise.gpu.attention``), in a module of its own so both import it
without importing each other."""

from __future__ import annotations

import torch


def write_kv(
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,  # [T, kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    """Store this step's keys and values in their slots (before any query reads them), in
    the caches' dtype: a no-op cast when they match, as in the engine; the Triton kernels'
    tests hand fp32 K/V to fp16 caches."""
    kv, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kv, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
