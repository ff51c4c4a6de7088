"""What start-up begins ahead of the load, before its imports, for a GGUF's packed weights.

With the packed-weights cache off (``models.packed_cache``), an arena to pack them into,
faulting in (``models/arena.py``: the memory). With the cache on, a model whose packed
weights are cached is mapped from that file and needs nothing ahead; on a first start
(no file yet) the packing into that file itself begins here (``models/early_pack.py``),
on the core the imports leave idle.
"""

from __future__ import annotations

import os
from typing import TypeAlias

from draftwise.models.arena import PrefaultedArena, available_memory, libc_madvise
from draftwise.models.early_pack import EarlyPack
from draftwise.models.packed_cache import cached_for, enabled

#: what :func:`prefault_for_gguf` begins; the loader takes either (``models.loader``)
Ahead: TypeAlias = PrefaultedArena | EarlyPack


def prefault_for_gguf(path: str) -> Ahead | None:
    """What to begin ahead of the load for the quantized weights of the GGUF file at
    ``path``: with the cache on, the cache file's packing (:class:`EarlyPack`) when there
    is no file yet, else nothing; with it off, an arena sized by the file, faulting in
    already. None also where the file is not a GGUF, ``DRAFTWISE_QUANT=0`` dequantizes
    every weight, there is no ``madvise`` to call (an arena), or the arena would take
    more than half the memory available now (the load itself then decides what fits)."""
    if os.environ.get("DRAFTWISE_QUANT", "auto") == "0":
        return None
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if enabled():  # packed weights live in a cache file: no arena to fill
        return None if cached_for(path) else EarlyPack(path)
    if libc_madvise() is None:
        return None
    available = available_memory()
    if available is not None and size > available // 2:
        return None
    return PrefaultedArena(size)


__all__ = ["Ahead", "prefault_for_gguf"]
