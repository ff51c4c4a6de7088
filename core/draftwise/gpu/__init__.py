"""GPU kernels: Triton versions of the step's hot kernels, each beside a torch reference.

One idea: what a decode or verify step computes on a CUDA device, written in Triton
(paged attention, GGUF quantized GEMM, the verify step), each kernel paired with a
readable plain-torch reference it is tested equal to. The engine runs on them where
``models.backend.decide_backend`` decides ``Backend.kernels == "triton"`` (``--device
cuda``; ``docs/gpu.md``). The CPU engine never imports this package's kernels, and nothing here imports triton at module level except the
``triton_*`` modules, which the launchers import when first called: a CPU-only install
without triton runs everything else.

Without a GPU the kernels run under Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set before a ``triton_*`` module is imported): that is how CI
tests them. Interpreter limits (no bf16 arithmetic, ``tl.dot`` in bf16 wrong, no loads
through loaded pointers) shape the kernels: inputs are fp32/fp16, products are
broadcast-and-sum or fp32 ``tl.dot``, and every address is computed from loaded
integers, never loaded pointers. ``docs/gpu.md`` says what has run on a GPU and what
has only run here.
"""

from __future__ import annotations

from draftwise.gpu.device import (
    DeviceUnavailableError,
    KernelDeviceError,
    check_kernel_device,
    cuda_unavailable_reason,
    triton_available,
)

__all__ = [
    "DeviceUnavailableError",
    "KernelDeviceError",
    "check_kernel_device",
    "cuda_unavailable_reason",
    "triton_available",
]
