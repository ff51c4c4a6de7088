"""The device GGUF matmul: the torch reference decodes blocks exactly as the ``gguf``
package does; the Triton kernel equals ``x @ W.T`` over it (GEMV and GEMM, fp32 and fp16
activations); an output row's bits do not depend on the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.gpu.quant import (
    BLOCKS,
    QuantTypeError,
    dequantize_reference,
    quant_matmul,
    quant_matmul_reference,
)

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

TYPES = {"Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
#: byte offsets of each block's fp16 scale fields (random bytes there could be inf/NaN)
F16_FIELDS = {8: (0,), 12: (0, 2), 14: (208,)}


def random_weight(qtype: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random GGUF blocks (every bit pattern of quants and scales) with sane fp16 fields."""
    rng = np.random.default_rng(seed)
    per, size = BLOCKS[qtype]
    raw = rng.integers(0, 256, (n * k // per, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = rng.uniform(-0.02, 0.02, len(raw)).astype(np.float16).view(
            np.uint8).reshape(-1, 2)
    return torch.from_numpy(raw.reshape(n, -1))


@pytest.mark.parametrize("name", sorted(TYPES))
def test_reference_equals_the_gguf_package(name):
    qtype, n, k = TYPES[name], 3, 512
    raw = random_weight(qtype, n, k)
    oracle = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType(qtype))
    torch.testing.assert_close(dequantize_reference(raw, qtype, k),
                               torch.from_numpy(np.asarray(oracle, np.float32)).reshape(n, k),
                               atol=0, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize(("m", "dtype"), [(1, torch.float32), (19, torch.float16)])
def test_kernel_equals_reference(device, name, m, dtype):
    qtype, n, k = TYPES[name], 40, 512
    raw = random_weight(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    out = quant_matmul(x.to(device), raw.to(device), qtype)
    ref = quant_matmul_reference(x, raw, qtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-3
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_row_is_bitwise_batch_invariant(device, name):
    qtype, n, k = TYPES[name], 33, 256
    raw = random_weight(qtype, n, k).to(device)
    g = torch.Generator().manual_seed(3)
    row = torch.randn(1, k, generator=g)
    alone = quant_matmul(row.to(device), raw, qtype)
    for size, at in ((7, 3), (20, 17)):
        batch = torch.randn(size, k, generator=g)
        batch[at] = row[0]
        out = quant_matmul(batch.to(device), raw, qtype)
        assert torch.equal(out[at], alone[0])


def test_unsupported_type_and_shape_are_refused_by_name(device):
    with pytest.raises(QuantTypeError, match="Q4_K"):
        quant_matmul(torch.zeros(1, 32, device=device), torch.zeros(1, 18, dtype=torch.uint8,
                                                                     device=device), 2)
    with pytest.raises(QuantTypeError, match="multiple of 256"):
        quant_matmul(torch.zeros(1, 100, device=device),
                     torch.zeros(1, 144, dtype=torch.uint8, device=device), 12)
