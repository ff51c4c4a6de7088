"""Whether the Triton kernels can run here, decided from facts, with named refusals.

Two questions, asked in two places: at engine start-up (``--device cuda``: is there a
CUDA device and triton?) and at each kernel launch (are these tensors somewhere the
kernel can run: a CUDA device, or CPU under the interpreter?). Both answers are a
reason string or None, so the caller raises its own named error quoting it.
"""

from __future__ import annotations

import importlib.util

import torch

from draftwise.errors import EngineConfigError

#: the environment variable that makes ``triton.jit`` build interpreted kernels
INTERPRET_ENV = "TRITON_INTERPRET"


class DeviceUnavailableError(EngineConfigError):
    """``--device cuda`` asked for on a machine that cannot run it (refused at start-up,
    before any weights are read; the message says what would work)."""


class KernelDeviceError(ValueError):
    """A Triton kernel was handed tensors it cannot run on (CPU tensors without the
    interpreter, tensors on two devices)."""


def triton_available() -> bool:
    """Whether triton is installed (without importing it: it costs ~0.3 s)."""
    return importlib.util.find_spec("triton") is not None


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA engine cannot run here, or None when torch sees a CUDA device and
    triton is installed."""
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else \
            f"torch built for CUDA {torch.version.cuda}, but no CUDA device is visible"
        return f"no CUDA device ({build})"
    if not triton_available():
        return "triton is not installed (pip install 'draftwise[gpu]')"
    return None


def is_interpreted(kernel: object) -> bool:
    """Whether a ``triton.jit`` kernel was built for the interpreter (the environment is
    read when the kernel module is imported, so the kernel object is what decides)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_kernel_device(kernel: object, *tensors: torch.Tensor) -> None:
    """Raise :class:`KernelDeviceError` unless every tensor is on one device ``kernel``
    can run on: CUDA for a compiled kernel, CPU for an interpreted one."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise KernelDeviceError(f"tensors on several devices: {sorted(map(str, devices))}")
    (device,) = devices
    if device.type == "cpu" and not is_interpreted(kernel):
        raise KernelDeviceError(
            "CPU tensors run the Triton kernels only under the interpreter: set "
            f"{INTERPRET_ENV}=1 before draftwise.gpu's kernels are imported, or use the "
            "CPU engine's own kernels"
        )
    if device.type == "cuda" and is_interpreted(kernel):
        raise KernelDeviceError(f"{INTERPRET_ENV} is set: the kernels were built for the "
                                "interpreter and take CPU tensors; unset it for CUDA")
    if device.type not in ("cpu", "cuda"):
        raise KernelDeviceError(f"device {device.type}: the Triton kernels run on CUDA")
