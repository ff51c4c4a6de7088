"""The hand-written C kernels (``core/csrc``), when the install could build them.

``KERNELS`` is the extension module or None; callers keep a torch path for None (see
``models.attention.choose_backend``). The kernels take raw data pointers and integers,
so floats cross as their float32 bit patterns (:func:`f32_bits`).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from types import ModuleType


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
