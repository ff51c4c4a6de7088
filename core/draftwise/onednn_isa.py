"""oneDNN kept below AMX, so its bf16/fp16 GEMM rows never depend on the row count.

Greedy speculation is token-identical to speculation off only if a verify row rounds
exactly like the same token decoded alone (see :mod:`draftwise.models.linear`). The
native kernels guarantee that by construction; oneDNN (behind ``F.linear`` for bf16 and
fp16, and the ``onednn`` weight layout) kept it on AVX512-BF16 and AVX2 machines, but on
a CPU with AMX tiles (Sapphire Rapids and later) it picks AMX kernels whose blocking
follows M: measured here, 5 rows of a 1536 -> 576 bf16 linear taken at offset 20 round
differently from the same rows inside a 40-row call (``tests/core/models/
test_models_linear.py``), which would let a draft's verify diverge from plain decoding
wherever a dense or oneDNN-packed weight is used (fp16 weights, ``DRAFTWISE_PACK_WEIGHTS=
onednn`` or ``0``, torch-path drafters feeding a target). With the ISA capped at
AVX512_CORE_BF16 every row is bitwise the same at every M again.

oneDNN reads ``ONEDNN_MAX_CPU_ISA`` once, when it creates its first primitive, so the cap
is put in the environment when draftwise is imported (before any engine runs a GEMM). A
value the user set is kept: capping it lower is harmless, and allowing AMX is their
explicit choice. On CPUs below the cap it changes nothing (the cap is a maximum).
"""

from __future__ import annotations

import os

#: the variable oneDNN reads (once) for the highest instruction set it may use
ENV = "ONEDNN_MAX_CPU_ISA"
#: the highest ISA whose bf16/fp16 GEMMs were measured batch-invariant
CAP = "AVX512_CORE_BF16"


def cap_isa() -> str:
    """Set the cap unless the environment already names one; returns the value in force."""
    return os.environ.setdefault(ENV, CAP)


__all__ = ["CAP", "ENV", "cap_isa"]
