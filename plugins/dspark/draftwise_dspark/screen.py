"""A quantized screen of the Markov head's ``W2``: an approximate bias and a proven
interval around the exact one, for :meth:`~draftwise_dspark.markov.MarkovHead.certified_argmax`.

``W2`` (bf16 ``[V, r]``) is quantized once at load to Q8_0 (gguf-py's ``quantize``, the
GGUF layout; 34 bytes per 32 weights) and packed for the core's quantized GEMM
(``draftwise.models.quant``), which quantizes each row of ``u`` to int8 per block of 32
with scale ``d_b = amax_b / 127`` (rounded to nearest, so ``|u_i - Q8(u)_i| <= d_b / 2``;
the bound takes ``d_b``) and accumulates in fp32. With ``Wq`` the dequantized copy,
``E = W2 - Wq``, ``a_v = Wq[v] . Q8(u)`` (the kernel's fp32 output) and ``y_v`` the bf16
kernel's rounded ``W2[v] . u``:

    |y_v - a_v| <= |E[v]| |u| + |Wq[v]| |u - Q8(u)|                 (the quantizations)
                 + 2^-16 |Wq[v]| (|u| + |u - Q8(u)|)               (a's fp32 sums, r <= 4096)
                 + (2^-12 + 2^-8) |W2[v]| |u|                      (y's fp32 sums, bf16 rounding)

widened by ``_WIDEN``. Both terms are per-token constants times per-row scalars, so the
whole ``[R, V]`` bound is one ``[R, 2] @ [2, V]`` product (fused into the adds that
make the interval's ends). On a random ``[49152, 256]`` head Q8_0's ``|E[v]|`` is ~0.5%
of ``|W2[v]|`` (Q4_0's ~8.6%: a window ~16 times wider, hundreds of surviving blocks on
the benchmark's drafter, for a product ~1.3 times cheaper), and the product ~1/3 of the
bf16 one's time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from draftwise.models.quant import QuantPart, QuantWeight, linear_quant, pack_quant, \
    quant_kernels_available

#: the relative widening of the bound (as markov's: past every rounding not itemised)
_WIDEN = 1.0 + 2.0**-6
#: activation block of the quantized GEMM for Q8_0 (``models.quant.activation_block``)
ACT_BLOCK = 32


@dataclass(frozen=True, slots=True)
class Screen:
    """The quantized ``W2`` and the per-token constants of the bound (module doc)."""

    weight: QuantWeight
    #: [2, V] fp32: the coefficients of ``|u|`` and of ``|u - Q8(u)|``
    norms: torch.Tensor
    #: [2]: their maxima over the vocabulary (the largest bound, for rounding slack)
    norms_max: torch.Tensor

    def approx(self, u: torch.Tensor  # [R, r] bf16
               ) -> tuple[torch.Tensor, torch.Tensor]:  # a [R, V] fp32, coef [R, 2]
        """``a`` and the per-row scalars ``coef`` with ``|y - a| <= coef @ norms`` for
        every token (module doc)."""
        uf = u.float()
        r = uf.shape[1]
        d = uf.view(-1, r // ACT_BLOCK, ACT_BLOCK).abs().amax(dim=2) / 127.0  # [R, r/32]
        err = (d.square().sum(dim=1) * ACT_BLOCK).sqrt()  # [R]: |u - Q8(u)| <= this
        coef = torch.stack([uf.norm(dim=1), err], dim=1)  # [R, 2]
        return linear_quant(u, self.weight, out_f32=True), coef


def build_screen(w2: torch.Tensor) -> Screen | None:  # [V, r] bf16
    """The Q8_0 screen of ``w2``; None without the quantized GEMM or when ``r`` is not a
    whole number of 32-blocks (the pick then has interval 1 only)."""
    from gguf import GGMLQuantizationType, quants

    v, r = w2.shape
    if not quant_kernels_available() or r % ACT_BLOCK or r > 4096:
        return None
    qtype = GGMLQuantizationType.Q8_0
    w = w2.float()
    raw = quants.quantize(w.numpy(), qtype)  # [V, r / 32 * 18] uint8
    wq = torch.from_numpy(quants.dequantize(raw, qtype)).reshape(v, r)
    e, nq, n = (w - wq).norm(dim=1), wq.norm(dim=1), w.norm(dim=1)
    norms = torch.stack([e + 2.0**-16 * nq + (2.0**-12 + 2.0**-8) * n,
                         nq * (1.0 + 2.0**-16)]) * _WIDEN
    return Screen(pack_quant([QuantPart(qtype, raw)], r), norms.contiguous(),
                  norms.amax(dim=1))


__all__ = ["Screen", "build_screen"]
