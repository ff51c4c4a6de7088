"""The decoder layer's small per-token ops: one C call each where the kernels are built.

At decode sizes (a few tokens of width 576) every torch op costs its dispatch overhead,
not its arithmetic: RMSNorm is 8 ops (~14 us), RoPE 5, SiLU-and-multiply 3. The C
versions (``core/csrc/elementwise.c``) keep transformers' bf16 rounding points and run
in ~1 us. Each function here is also the torch reference for its kernel, chosen per call
by ``native`` (the model's :class:`~draftwise.models.backend.Backend` decides, once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftwise.models import kernels

BF16 = torch.bfloat16


def rms_norm(
    x: torch.Tensor,  # [..., dim]
    weight: torch.Tensor,  # [dim] or broadcastable to x
    eps: float,
    native: bool = False,
) -> torch.Tensor:  # same shape and dtype as x
    """transformers' RMSNorm: normalise in fp32, cast back, then scale."""
    if native and weight.dim() == 1 and x.is_contiguous() and x.dtype == weight.dtype == BF16:
        return kernels.rms_norm(x, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    h: torch.Tensor,  # [T, dim] the residual stream
    delta: torch.Tensor,  # [T, dim] what the sublayer adds (a fresh tensor the caller owns)
    weight: torch.Tensor,  # [dim]
    eps: float,
    native: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (h + delta, rms_norm(h + delta))
    """Residual add then RMSNorm; the C path writes the sum into ``delta``'s storage."""
    if (
        native
        and h.is_contiguous()
        and delta.is_contiguous()
        and h.shape == delta.shape
        and h.dtype == delta.dtype == weight.dtype == BF16
        and weight.dim() == 1
    ):
        return kernels.add_rms_norm(h, delta, weight, eps)
    h = h + delta
    return h, rms_norm(h, weight, eps)


def silu_mul(gate_up: torch.Tensor, native: bool = False) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """``silu(gate) * up`` for a fused ``[gate | up]`` projection output."""
    inter = gate_up.shape[-1] // 2
    if native and gate_up.is_contiguous() and gate_up.dtype == BF16:
        return kernels.silu_mul(gate_up)
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


def apply_rope_(
    x: torch.Tensor,  # [T, heads, head_dim], rows may be strided views of a wider tensor
    cos: torch.Tensor,  # [T, 1, head_dim] each token's row of the cos table
    sin: torch.Tensor,  # [T, 1, head_dim] sign-folded sin (see models.rope)
) -> torch.Tensor:  # x, rotated in place
    """RoPE in place with the C kernel (bitwise ``models.rope.apply_rope``)."""
    return kernels.rope_(x, cos, sin)
