"""The drafter's projections in the target's packed layout, for both containers.

Its own module because the safetensors reader (``loader.py``) and the GGUF reader
(``gguf_drafter.py``) both finish with it, and neither should import the other for it.
"""

from __future__ import annotations

from typing import Any

import torch
from draftwise.kit import DecoderLayer, pack_weights

from draftwise_dflash.conv import BlockConv, SelectorWeights


def pack_v2(convs: list[tuple[BlockConv, BlockConv]], selector: SelectorWeights | None) -> None:
    """DFlash2's dense projections (conv kernel projections, the selector's hidden
    projection) packed like the layers': the batch-invariant native GEMM instead of
    ``F.linear``; GGUF-quantized ones stay as they are. Codebooks are row gathers."""
    slots: list[tuple[Any, str]] = [(conv, "kernel_projection") for pair in convs for conv in pair]
    if selector is not None:
        slots.append((selector, "hidden_projection"))
    dense = [(o, n) for o, n in slots if isinstance(getattr(o, n), torch.Tensor)]
    for (o, n), w in zip(dense, pack_weights([getattr(o, n) for o, n in dense])):
        setattr(o, n, w)


def pack_layers(layers: list[DecoderLayer]) -> None:
    """The projections in the machine's packed layout (``models.linear``)."""
    slots = [(layer, n) for layer in layers for n in layer._LINEARS
             if isinstance(getattr(layer, n), torch.Tensor)]
    packed = pack_weights([getattr(layer, n) for layer, n in slots])
    for (layer, n), w in zip(slots, packed):
        layer.set_packed(n, w)


__all__ = ["pack_layers", "pack_v2"]
