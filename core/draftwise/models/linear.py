"""Linear layers for CPU decode: oneDNN-prepacked weights, rows that never depend on M.

Decode on CPU streams every weight from memory once per step, so the GEMM's bandwidth
is the step time. ``F.linear`` on a plain ``[out, in]`` bf16 weight reaches ~13 GB/s on
one core here; the same oneDNN kernel on a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing pass does) reaches
~22 GB/s, and gives bitwise the same results as ``F.linear`` (measured for M = 1..700).

Batch invariance: a row's output must not depend on how many rows share the GEMM, or
a decode row would round differently from the same row verified with drafts after it.
oneDNN's M >= 2 kernel is invariant; its M == 1 path (a GEMV) reduces long K in a
different order, so a single bf16/fp16 row is run as two. fp32 weights stay dense and
use MKL, which is accurate but not batch-invariant at any M (fp32 models are the
oracle dtype, not the speculative one).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

#: set to ``0`` to keep dense weights (debugging, or to compare against the packed path)
PACK_ENV = "DRAFTWISE_PACK_WEIGHTS"


def can_pack(weight: torch.Tensor) -> bool:
    """Whether :func:`pack_weight` would reorder ``weight`` (CPU bf16/fp16 with oneDNN)."""
    if os.environ.get(PACK_ENV, "1") == "0" or weight.dim() != 2 or weight.device.type != "cpu":
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if weight.dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:  # [out, in] -> packed [out, in]
    """The weight in oneDNN's blocked layout when that is faster here, else unchanged."""
    if not can_pack(weight):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def is_packed(weight: torch.Tensor) -> bool:
    """A weight :func:`pack_weight` reordered (it only works with :func:`linear`)."""
    return weight.is_mkldnn


def linear(
    x: torch.Tensor,  # [T, in]
    weight: torch.Tensor,  # [out, in], dense or packed
    bias: torch.Tensor | None = None,  # [out]
) -> torch.Tensor:  # [T, out]
    """``x @ weight.T + bias`` whose rows do not depend on T (bf16/fp16; see module doc)."""
    single = x.shape[0] == 1 and x.dtype != torch.float32
    if single:
        x = x.expand(2, x.shape[1])
    if weight.is_mkldnn:
        out = torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    else:
        out = F.linear(x, weight, bias)
    return out[:1] if single else out
