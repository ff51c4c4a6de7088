"""The KV arena: lazily zeroed anonymous memory, resident only where written."""

from __future__ import annotations

import torch
from draftwise.models.batch import KVCache
from draftwise.models.hugepages import lazy_zeroed_tensor


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


def test_lazy_zeroed_tensor_is_zero_writable_and_not_resident_until_written() -> None:
    t = lazy_zeroed_tensor(64 << 20, torch.bfloat16)  # 128 MiB
    before = _rss_kib()
    assert t.shape == (64 << 20,) and t.dtype == torch.bfloat16
    t[:8] = 1.0
    assert _rss_kib() - before < 32 << 10  # a page or so, not 128 MiB
    assert t[:8].eq(1).all() and not t[8:4096].any() and not t[-4096:].any()
    assert lazy_zeroed_tensor(0, torch.float32).numel() == 0


def test_kv_cache_views_are_zeroed_and_disjoint() -> None:
    kv = KVCache.allocate(3, 4, 2, 2, 8, torch.bfloat16)
    assert len(kv.k) == len(kv.v) == 3 and kv.num_blocks == 4
    assert all(t.shape == (4, 2, 2, 8) and t.is_contiguous() and not t.any() for t in kv.k + kv.v)
    kv.k[1].fill_(2.0)
    assert not kv.k[0].any() and not kv.k[2].any() and not any(t.any() for t in kv.v)
