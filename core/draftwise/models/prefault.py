"""What start-up faults in ahead of the load: an arena for a GGUF's packed weights.

Its own module because the decision reads both the arena (``models/arena.py``: the
memory) and the packed-weights cache (``models/packed_cache.py``: a model whose packed
weights are cached is mapped from that file, so there is no arena to fill), and the
cache itself maps its file with the arena's helpers.
"""

from __future__ import annotations

import os

from draftwise.models.arena import PrefaultedArena, available_memory, libc_madvise
from draftwise.models.packed_cache import enabled


def prefault_for_gguf(path: str) -> PrefaultedArena | None:
    """An arena for the quantized weights of the GGUF file at ``path``, faulting in
    already, sized by the file; None where faulting ahead is not possible here (no
    ``madvise`` to call), the file is not a GGUF, or it would take more than half the
    memory available now (the load itself then decides what fits), or the packed-weights
    cache is on (``models.packed_cache``): the load then maps a file, the one an earlier
    start wrote or the one it packs into itself, and fills no arena."""
    if libc_madvise() is None:
        return None
    if enabled():  # packed weights live in a cache file: no arena to fill
        return None
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    available = available_memory()
    if available is not None and size > available // 2:
        return None
    return PrefaultedArena(size)


__all__ = ["prefault_for_gguf"]
