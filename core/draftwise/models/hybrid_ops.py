"""The GDN hybrid's own small ops: the zero-centred RMSNorm and the partial RoPE.

Each is the torch reference (transformers' op order) and, for bf16 rows on the CPU, one
C call (``core/csrc/elementwise.c``) chosen by the model's backend, as ``models.fused``
does for the llama family's ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftwise.models import kernels
from draftwise.models.pointwise import lanewise
from draftwise.models.rope import apply_rope


def zc_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, native: bool = False
) -> torch.Tensor:  # [..., d]
    """Zero-centred RMSNorm, transformers' op order: ``(x̂_fp32 · (1 + w)).to(dtype)``;
    ``native``: one C call (``rms_norm_zc``, same rounding point) for bf16 rows."""
    if native and x.dtype == weight.dtype == torch.bfloat16 and x.is_contiguous():
        return kernels.rms_norm_zc(x, weight, eps)
    xf = x.float()
    xf = xf * lanewise(torch.rsqrt, xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).type_as(x)


@dataclass(frozen=True, slots=True)
class PartialRope:
    """RoPE on the first ``rotary_dim`` of every head, set up once per forward.

    torch: ``cos``/``sin`` are each token's rows ``[T, 1, r]`` (``models.rope.apply_rope`` on
    a copy of the rotated slice). native: they are the whole tables ``[P, r]`` and
    ``positions`` gives each (token, head) row its position, so the C kernel rotates the
    slice in place through a strided view, bitwise the torch path.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    rotary_dim: int
    positions: torch.Tensor | None = None  # native: [T * heads] int64, heads = q + k heads

    def apply(self, x: torch.Tensor) -> torch.Tensor:  # [T, heads, d] contiguous
        """``x`` with its first ``rotary_dim`` channels of every head rotated."""
        r = self.rotary_dim
        if self.positions is not None:
            t, heads, d = x.shape
            kernels.rope_(x.view(t * heads, d)[:, :r].unsqueeze(1), self.cos, self.sin,
                          self.positions)
            return x
        return torch.cat((apply_rope(x[..., :r].contiguous(), self.cos, self.sin), x[..., r:]),
                         dim=-1)
