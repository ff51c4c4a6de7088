"""The torch-free packing plan (``models.pack_plan``): what an early start streams into
the cache file is byte for byte what ``pack_quant`` packs into memory."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from draftwise.models import quant as q
from draftwise.models.pack_plan import QuantPart, pack_quant_stream, plan_bytes
from gguf import GGMLQuantizationType as Q

from tests.core.models.test_models_quant import blocks

pytestmark = pytest.mark.skipif(not q.quant_kernels_available(), reason="C kernels not built")


def test_streamed_pack_writes_the_bytes_of_the_arena_pack() -> None:
    """``pack_quant_stream`` (a first start packing into the cache file): every call's
    bytes at their offset give exactly ``pack_quant``'s arena, fused mixed types and a
    row order included, with a scratch of a few tiles (several calls a segment), and
    ``rows_done`` counts over the weight's rows as ``pack_quant``'s does."""
    k = 256
    order = np.random.default_rng(3).permutation(40)
    parts = [QuantPart(Q.Q4_K, blocks(Q.Q4_K, 40, k, seed=1), order),
             QuantPart(Q.Q4_K, blocks(Q.Q4_K, 16, k, seed=2)),
             QuantPart(Q.Q6_K, blocks(Q.Q6_K, 21, k, seed=3))]
    whole = q.pack_quant(parts, k)
    want = torch.cat([s.data for s in whole.segments])
    got = np.full(plan_bytes(parts, k), 0xA5, dtype=np.uint8)
    calls: list[tuple[int, int]] = []
    seen: list[int] = []

    def write(offset: int, chunk: np.ndarray) -> None:
        calls.append((offset, chunk.size))
        got[offset : offset + chunk.size] = chunk

    scratch = np.empty(2 * 8 * 210 + 7, dtype=np.uint8)  # two Q6_K tiles, or 2 Q4_K
    assert pack_quant_stream(parts, k, scratch, write, seen.append) == want.numel()
    assert np.array_equal(got, want.numpy())
    assert len(calls) == 4 + 2 and seen == [16, 32, 48, 56, 72, 77]
    with pytest.raises(ValueError, match="holds no tile"):
        pack_quant_stream(parts, k, np.empty(100, dtype=np.uint8), write)


def test_the_plan_and_the_header_need_no_torch() -> None:
    """An early start (``models.early_pack``) plans and packs before torch is imported:
    the modules it runs import none (checked in a fresh interpreter)."""
    import subprocess

    code = ("import sys; import draftwise.models.prefault, draftwise.models.pack_plan, "
            "draftwise.formats.gguf; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
