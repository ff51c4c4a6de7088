"""A llama model's decoder layers as one C call (``core/csrc/decoder_stack.c``): the plan.

A decode step of a 28-layer model made ~10 Python -> C calls a layer, each checking its
inputs and allocating its output: ~100 us a layer around ~1 ms of GEMM. Where every
projection is GGUF-quantized, :func:`run_layers` hands a run of layers to ONE C call
(``kernels.decoder_layers``) that runs ``DecoderLayer._run_native``'s kernels in its order,
so the bits are the same. What the C side trusts is checked once here: every layer's
weights when the model is packed (:func:`decoder_plan`), the KV cache's layers once per
cache (:func:`stack_caches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from draftwise.models import kernels
from draftwise.models.quant import QuantWeight


@dataclass(frozen=True, slots=True)
class StackLayer:
    """One decoder layer's weights as :func:`decoder_plan` takes them (bf16 norms [hidden],
    GGUF-quantized projections, bf16 biases or None; ``window``: sliding or None)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: QuantWeight
    qkv_bias: torch.Tensor | None
    o: QuantWeight
    o_bias: torch.Tensor | None
    gate_up: QuantWeight
    gate_up_bias: torch.Tensor | None
    down: QuantWeight
    down_bias: torch.Tensor | None
    window: int | None


@dataclass(frozen=True, slots=True)
class DecoderPlan:
    """A model's decoder layers checked for :func:`decoder_layers` (by :func:`decoder_plan`)."""

    table: torch.Tensor  # int64 [layers, 15]: the fields of decoder_stack.c's enum, in order
    address: int
    layers: tuple[StackLayer, ...]  # kept alive: the table holds their addresses
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps_bits: int
    scale_bits: int


def _ptr(t: torch.Tensor | None) -> int:
    """A tensor's address for the C table, 0 for an absent bias."""
    return 0 if t is None else t.data_ptr()


def decoder_plan(layers: list[StackLayer], heads: int, kv_heads: int, head_dim: int,
                 eps: float, scale: float) -> DecoderPlan:
    """Check every layer's weights against the model's sizes and lay out the C table."""
    if not kernels.available("decoder_layers"):
        raise kernels.KernelUnavailableError("the C kernel decoder_layers is not built in this install")
    if not layers or head_dim % 16 or head_dim > 512 or kv_heads < 1 or heads % kv_heads:
        raise kernels.KernelInputError(f"decoder_layers: {len(layers)} layers of {heads} heads "
                                       f"over {kv_heads} kv heads of {head_dim}: not a shape it "
                                       "runs")
    hidden, inter = layers[0].input_norm.shape[0], layers[0].down.in_features
    q, width = heads * head_dim, (heads + 2 * kv_heads) * head_dim
    rows = []
    for i, ly in enumerate(layers):
        shapes = ((ly.qkv, hidden, width), (ly.o, q, hidden), (ly.gate_up, hidden, 2 * inter),
                  (ly.down, inter, hidden))
        if any(w.in_features != k or w.out_features != n for w, k, n in shapes):
            raise kernels.KernelInputError(f"decoder_layers: layer {i}'s projections do not "
                                           f"fit hidden {hidden}, inter {inter}, qkv {width}")
        vectors = (("input_norm", ly.input_norm, hidden), ("post_norm", ly.post_norm, hidden),
                   ("qkv bias", ly.qkv_bias, width), ("o bias", ly.o_bias, hidden),
                   ("gate_up bias", ly.gate_up_bias, 2 * inter), ("down bias", ly.down_bias, hidden))
        for name, t, n in vectors:
            if t is not None and (t.dtype != torch.bfloat16 or not t.is_contiguous()
                                  or not t.is_cpu or tuple(t.shape) != (n,)):
                raise kernels.KernelInputError(f"decoder_layers: layer {i}'s {name} must be "
                                               f"contiguous bf16 [{n}], got {t.dtype} "
                                               f"{list(t.shape)}")
        rows.append([ly.input_norm.data_ptr(), ly.post_norm.data_ptr(),
                     ly.qkv.table_address, ly.qkv.num_segments, _ptr(ly.qkv_bias),
                     ly.o.table_address, ly.o.num_segments, _ptr(ly.o_bias),
                     ly.gate_up.table_address, ly.gate_up.num_segments, _ptr(ly.gate_up_bias),
                     ly.down.table_address, ly.down.num_segments, _ptr(ly.down_bias),
                     ly.window or 0])
    table = torch.tensor(rows, dtype=torch.int64)
    return DecoderPlan(table, table.data_ptr(), tuple(layers), hidden, heads, kv_heads,
                       head_dim, inter, kernels.f32_bits(eps), kernels.f32_bits(scale))


@dataclass(frozen=True, slots=True)
class StackCaches:
    """Every layer's K/V caches for :func:`decoder_layers`, checked by :func:`stack_caches`."""

    caches: tuple[kernels.PagedCache, ...]
    table: torch.Tensor  # int64 [layers, 2]: K and V addresses
    address: int
    blocks: int
    block_size: int


def stack_caches(plan: DecoderPlan, caches: tuple[kernels.PagedCache, ...]) -> StackCaches:
    """Check a KV cache's layers (``batch.KVCache.paged``) against the plan, once per cache."""
    first = caches[0] if caches else None
    if first is None or len(caches) != len(plan.layers) or any(
            (c.blocks, c.block_size, c.kv_heads, c.head_dim) != (first.blocks, first.block_size,
                                                                  plan.kv_heads, plan.head_dim)
            for c in caches):
        raise kernels.KernelInputError(f"decoder_layers: {len(plan.layers)} layers need caches "
                                       f"of {plan.kv_heads} kv heads of {plan.head_dim}, all "
                                       "one shape")
    table = torch.tensor([list(c.addresses) for c in caches], dtype=torch.int64)
    return StackCaches(caches, table, table.data_ptr(), first.blocks, first.block_size)


def run_layers(
    plan: DecoderPlan, caches: StackCaches,
    h: torch.Tensor,  # [T, hidden] the embeddings
    wanted: set[int], rope: kernels.RopeRows, index: kernels.AttentionIndex,
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Every layer: (residual, the last layer's delta, hidden states of ``wanted`` layers:
    each ``h + delta`` after that layer, as the per-op loop gives them). The stack is cut
    only after a wanted layer."""
    n = len(plan.layers)
    hidden: dict[int, torch.Tensor] = {}
    delta: torch.Tensor | None = None
    first = 0
    for last in sorted({i + 1 for i in wanted if 0 <= i < n} | {n}):
        h, delta = kernels.decoder_layers(plan, caches, h, delta, first, last, rope, index)
        first = last
        if last - 1 in wanted:
            hidden[last - 1] = h + delta
    return h, cast(torch.Tensor, delta), hidden  # n >= 1 (decoder_plan): set
