"""What the C kernels' wrappers read of the objects that carry packed data, declared.

Why its own module: ``kernels.py`` wraps the C entry points, and the typed weights and
plans it is handed (``linear.BlockedWeight``, ``quant.QuantWeight``,
``stack.DecoderPlan``, ``stack.StackCaches``) are built by modules that call those very
wrappers. Annotating the wrappers with the classes made the modules import each other;
annotating them with these protocols (each the handful of checked fields a wrapper
passes to C) keeps ``kernels.py`` at the bottom. The classes satisfy them structurally;
their ``__post_init__`` checks are what make the fields safe to trust.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol


class PackedBf16(Protocol):
    """A bf16 ``[out, in]`` weight in the native GEMM's block layout (``BlockedWeight``)."""

    @property
    def out_features(self) -> int: ...

    @property
    def in_features(self) -> int: ...

    @property
    def address(self) -> int:
        """The packed data's address (checked at packing)."""
        ...


class PackedQuant(Protocol):
    """A GGUF-quantized weight packed in tiles (``QuantWeight``): its segment table."""

    @property
    def out_features(self) -> int: ...

    @property
    def in_features(self) -> int: ...

    @property
    def table_address(self) -> int:
        """The segment table's address (checked at packing)."""
        ...

    @property
    def num_segments(self) -> int: ...


class StackPlan(Protocol):
    """Every decoder layer's packed weights and shapes for one C call (``DecoderPlan``)."""

    @property
    def address(self) -> int: ...

    @property
    def layers(self) -> Sized: ...

    @property
    def hidden(self) -> int: ...

    @property
    def heads(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def inter(self) -> int: ...

    @property
    def eps_bits(self) -> int: ...

    @property
    def scale_bits(self) -> int: ...


class StackCacheSet(Protocol):
    """Every layer's paged K/V caches for that call (``StackCaches``)."""

    @property
    def address(self) -> int: ...

    @property
    def blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...


__all__ = ["PackedBf16", "PackedQuant", "StackCacheSet", "StackPlan"]
