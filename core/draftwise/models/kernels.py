"""The hand-written C kernels (``core/csrc``), when the install could build them.

``KERNELS`` is the extension module or None; callers keep a torch path for None (see
``models.attention.choose_backend``). The kernels take raw data pointers and integers,
so floats cross as their float32 bit patterns (:func:`f32_bits`).

Threads: the native GEMM runs on its own worker pool (``core/csrc/threadpool.c``), sized
by :func:`set_kernel_threads` (default: torch's intra-op count). An engine whose weights
use it gives torch's own pool one thread (``bootstrap.apply_threads``): torch's OpenMP
workers spin between ops on the very cores the GEMM workers need.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from types import ModuleType

import torch


def _load() -> ModuleType | None:
    try:
        from draftwise import _cpu_kernels
    except ImportError:
        return None
    return _cpu_kernels


KERNELS: ModuleType | None = _load()


@lru_cache(maxsize=64)
def f32_bits(x: float) -> int:
    """The float32 bit pattern of ``x`` as an unsigned int (scales and epsilons)."""
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


_threads: int | None = None


def set_kernel_threads(n: int | None) -> None:
    """Threads for the C kernels that use several (None: follow ``torch.get_num_threads()``)."""
    global _threads
    if n is not None and n < 1:
        raise ValueError(f"kernel threads must be at least 1, got {n}")
    _threads = n


def kernel_threads() -> int:
    """Threads the C kernels use now."""
    return _threads if _threads is not None else torch.get_num_threads()
