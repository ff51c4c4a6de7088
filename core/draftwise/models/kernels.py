"""The hand-written C kernels (``core/csrc``): the one module that calls them (with
``models.markov_kernel``, DSpark's Markov pass, which shares its lookup and checks).

``KERNELS`` is the extension module or None (no C compiler at install); which kernels a
model runs is decided once, in :func:`draftwise.models.backend.decide_backend`, from
:func:`available` here. Every entry point is wrapped below as a typed function over
tensors. The C side takes raw data pointers and integers and trusts them (a wrong shape
is a wild read), so each wrapper checks dtype, contiguity and sizes and raises
:class:`KernelInputError` (never ``assert``, which ``python -O`` removes); a missing
kernel raises :class:`KernelUnavailableError`. Floats cross as their float32 bit
patterns (:func:`f32_bits`).

Each input is checked once, where it is made, and carried as a typed value: a packed
weight checks its layout when it is built (``linear.BlockedWeight``,
``quant.QuantWeight``: their ``__post_init__``), a step's attention indices when the
metadata is built (:func:`attention_index`), each layer's caches once per cache
(:func:`paged_cache`, kept by ``batch.KVCache.paged``) and the step's RoPE rows once per
forward (:func:`rope_rows`). A call then checks only the activations, with attribute
reads and integer compares against those values: the wrappers run ~200 times per decode
step of the default model, where a full check per call (~1 us each) had cost ~5% of the
step.

Threads: the native GEMM runs on its own worker pool (``core/csrc/threadpool.c``), sized
by :func:`set_kernel_threads` (default: torch's intra-op count). An engine whose weights
use it gives torch's own pool one thread (``bootstrap.apply_threads``): torch's OpenMP
workers spin between ops on the very cores the GEMM workers need.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from draftwise.errors import DraftwiseError
from draftwise.formats.weight_types import NVFP4

if TYPE_CHECKING:  # protocols: the typed weights themselves import this module
    from draftwise.models.packed_types import PackedBf16, PackedQuant, StackCacheSet, StackPlan

BF16 = torch.bfloat16


def _load() -> ModuleType | None:
    try:
        from draftwise import _cpu_kernels
    except ImportError:
        return None
    return _cpu_kernels


KERNELS: ModuleType | None = _load()


class KernelInputError(DraftwiseError, ValueError):
    """A tensor a C kernel cannot take (dtype, layout or size); nothing was computed."""


class KernelUnavailableError(DraftwiseError, RuntimeError):
    """A C kernel this install did not build was called."""


def available(name: str) -> bool:
    """Whether this install built the C entry point ``name``."""
    return KERNELS is not None and hasattr(KERNELS, name)


#: the entry points this build has, read once: ``_kernel`` runs before every C call
_BUILT = frozenset(dir(KERNELS)) if KERNELS is not None else frozenset()


def _kernel(name: str) -> ModuleType:
    if name not in _BUILT:
        raise KernelUnavailableError(
            f"the C kernel {name} is not built in this install (no C compiler at install time)")
    return KERNELS


def bf16_isa() -> str:
    """The instruction path ``linear_bf16`` was built with (``none`` without the kernels)."""
    return str(getattr(KERNELS, "linear_bf16_isa", "none"))


#: The tile-kernel paths of :func:`linear_quant` (``core/csrc/quant.h``, ``DW_PATH_*``):
#: ``auto`` runs the best the CPU has for the weight's type (``avx512vnni`` for Q4_0, Q4_1,
#: Q5_0, Q5_1, Q8_0, Q4_K and Q6_K where the CPU has avx512f/bw/vl/vnni, else ``avx2``,
#: else ``scalar``); the others force one (refused where the CPU lacks it). Every path
#: gives the same bits. The environment variable ``DRAFTWISE_QUANT_SIMD`` (``avx2``,
#: ``scalar`` or ``auto``, read by the C dispatch at each call) turns ``auto`` into a
#: forced path for a whole process: the A/B switch of the benchmarks.
QUANT_PATHS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512vnni": 3}


def quant_simd(qtype: int | None = None, path: str = "auto") -> str:
    """The tile kernel the quantized GEMM runs (``avx512vnni``, ``avx2`` or ``scalar``)
    for GGML type ``qtype`` (256: NVFP4), or with no type the machine's best; ``none``:
    not built. ``ValueError`` where ``path`` (or ``DRAFTWISE_QUANT_SIMD``) is refused."""
    if KERNELS is None or not hasattr(KERNELS, "quant_simd"):
        return "none"
    if qtype is None:
        return str(KERNELS.quant_simd(-1, QUANT_PATHS[path]))
    return str(KERNELS.quant_simd(int(qtype), QUANT_PATHS[path]))


def quant_act_block(qtype: int) -> int:
    """Values per int8 activation block (one fp32 scale) the quantized GEMM takes for the
    GGML type ``qtype``: 256 for Q4_K and Q6_K, else 32."""
    return int(_kernel("quant_act_block").quant_act_block(int(qtype)))


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


def _bf16_rows(what: str, x: torch.Tensor, dim: int | None = None) -> None:
    # the cheapest properties first (``x.device`` builds an object: ~0.4 us of a ~1 us
    # elementwise call, ~180 of these per decode step)
    if x.dtype != BF16 or not x.is_contiguous() or not x.is_cpu:
        raise KernelInputError(f"{what} must be a contiguous bf16 CPU tensor, got {x.dtype} "
                               f"{list(x.shape)} on {x.device}")
    if dim is not None and (x.dim() == 0 or x.shape[-1] != dim):
        raise KernelInputError(f"{what} must have rows of {dim}, got {list(x.shape)}")


# -- elementwise (core/csrc/elementwise.c) -------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm over the last dim (``x``: [..., dim], ``weight``: [dim])."""
    return _norm("rms_norm", x, weight, eps)


def rms_norm_zc(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN hybrids' zero-centred RMSNorm, ``x̂ · (1 + w)`` in fp32 rounded once
    (``x``: [..., dim], ``weight``: [dim])."""
    return _norm("rms_norm_zc", x, weight, eps)


def _norm(name: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The row norms' one call shape: ``name``(x, w, out, rows, dim, eps bits)."""
    entry = getattr(_kernel(name), name)
    dim = weight.shape[0] if weight.dim() == 1 else -1
    _bf16_rows(f"{name} weight", weight, dim)
    _bf16_rows(f"{name} input", x, dim)
    out = torch.empty_like(x)
    entry(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, f32_bits(eps))
    return out


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h + delta, rms_norm(h + delta))``; the sum is written into ``delta``'s storage."""
    k = _kernel("add_rms_norm")
    dim = weight.shape[0] if weight.dim() == 1 else -1
    _bf16_rows("add_rms_norm weight", weight, dim)
    _bf16_rows("add_rms_norm residual", h, dim)
    if h.shape != delta.shape or delta.dtype != BF16 or not delta.is_contiguous():
        raise KernelInputError(f"add_rms_norm: delta must be contiguous bf16 of the "
                               f"residual's shape {list(h.shape)}, got {delta.dtype} "
                               f"{list(delta.shape)}")
    out = torch.empty_like(delta)
    k.add_rms_norm(h.data_ptr(), delta.data_ptr(), weight.data_ptr(), out.data_ptr(),
                   h.numel() // dim, dim, f32_bits(eps))
    return delta, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """``silu(gate) * up`` of a fused ``[gate | up]`` projection output."""
    k = _kernel("silu_mul")
    _bf16_rows("silu_mul input", gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise KernelInputError(f"silu_mul takes [T, 2 * I], got {list(gate_up.shape)}")
    inter = gate_up.shape[1] // 2
    out = torch.empty((gate_up.shape[0], inter), dtype=BF16)
    k.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], inter, kernel_threads())
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          positions: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE in place on ``x`` [T, heads, head_dim] (rows may be strided views), with each
    token's ``cos`` and sign-folded ``sin`` rows [T, 1, head_dim]; or, with ``positions``
    (int64 [T]), the whole tables [P, head_dim] and row t rotated by row ``positions[t]``."""
    if x.dim() != 3 or x.dtype != BF16:
        raise KernelInputError(f"rope takes bf16 [T, heads, head_dim], got {x.dtype} "
                               f"{list(x.shape)}")
    t, h, d = x.shape
    if x.stride(2) != 1 or (h > 1 and x.stride(1) != d):
        raise KernelInputError("rope: each token's heads must be contiguous")
    if positions is None:
        _rope(x.data_ptr(), x.stride(0), h, rope_rows(cos, sin, t, d))
        return x
    rows = cos.shape[0]
    for name, table in (("cos", cos), ("sin", sin)):
        if (table.dtype != BF16 or not table.is_contiguous() or table.numel() != rows * d
                or table.shape[-1] != d):
            raise KernelInputError(f"rope {name} must be contiguous bf16 [{rows}, {d}], got "
                                   f"{table.dtype} {list(table.shape)}")
    if (positions.dtype != torch.int64 or not positions.is_contiguous()
            or positions.numel() != t):
        raise KernelInputError(f"rope positions must be contiguous int64 [{t}]")
    if t and (int(positions.min()) < 0 or int(positions.max()) >= rows):
        raise KernelInputError(f"rope position outside the {rows}-row tables")
    _kernel("rope").rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                         t, h, d, x.stride(0))
    return x


@dataclass(frozen=True, slots=True)
class RopeRows:
    """A step's cos and sign-folded sin rows [T, 1, head_dim], checked by :func:`rope_rows`
    (once per forward: every layer rotates with the same rows)."""

    cos: torch.Tensor
    sin: torch.Tensor
    addresses: tuple[int, int]
    tokens: int
    head_dim: int


def rope_rows(cos: torch.Tensor, sin: torch.Tensor, tokens: int, head_dim: int) -> RopeRows:
    """Check the RoPE rows of ``tokens`` tokens of ``head_dim``."""
    for name, table in (("cos", cos), ("sin", sin)):
        if (table.dtype != BF16 or not table.is_contiguous() or not table.is_cpu
                or table.numel() != tokens * head_dim):
            raise KernelInputError(f"rope {name} must be contiguous bf16 [{tokens}, 1, "
                                   f"{head_dim}], got {table.dtype} {list(table.shape)}")
    return RopeRows(cos, sin, (cos.data_ptr(), sin.data_ptr()), tokens, head_dim)


def rope_qkv_(qkv: torch.Tensor, heads: int, rows: RopeRows) -> torch.Tensor:
    """RoPE in place on the first ``heads`` heads of each row of a fused projection output
    ``qkv`` [T, width] (q and k side by side, then v), without views."""
    d = rows.head_dim
    if (qkv.dtype != BF16 or qkv.dim() != 2 or qkv.stride(1) != 1
            or qkv.shape[0] != rows.tokens or qkv.shape[1] < heads * d):
        raise KernelInputError(f"rope takes bf16 [{rows.tokens}, >= {heads * d}] with "
                               f"contiguous rows, got {qkv.dtype} {list(qkv.shape)}")
    _rope(qkv.data_ptr(), qkv.stride(0), heads, rows)
    return qkv


def _rope(x: int, stride: int, heads: int, rows: RopeRows) -> None:
    _kernel("rope").rope(x, rows.addresses[0], rows.addresses[1], 0, rows.tokens, heads,
                         rows.head_dim, stride)


def argmax_f32(logits: torch.Tensor) -> torch.Tensor:  # [N, V] fp32 -> [N] int64
    """``logits.argmax(-1)`` of contiguous fp32 rows (first maximum; a NaN wins)."""
    k = _kernel("argmax_f32")
    if (logits.dtype != torch.float32 or logits.dim() != 2 or not logits.is_contiguous()
            or not logits.is_cpu or logits.shape[1] == 0):
        raise KernelInputError(f"argmax takes contiguous fp32 [N, V > 0] on the CPU, got "
                               f"{logits.dtype} {list(logits.shape)}")
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    k.argmax_f32(logits.data_ptr(), out.data_ptr(), logits.shape[0], logits.shape[1])
    return out


# -- GEMMs (gemm_bf16.c, gemm_quant*.c, quant_pack.c) -------------------------------------
# The weight is a typed object checked once when it was packed (``BlockedWeight``,
# ``QuantWeight``: their ``__post_init__``), so a call checks only the activations: a few
# attribute reads, ~120 calls per decode step.
def _gemm_io(what: str, x: torch.Tensor, k: int, n: int, bias: torch.Tensor | None,
             out_f32: bool = False) -> tuple[torch.Tensor, int, torch.Tensor]:
    """The checked input (made row-contiguous), its row stride and a fresh output."""
    shape, strides = x.shape, x.stride()
    if x.dtype != BF16 or len(shape) != 2 or shape[1] != k:
        raise KernelInputError(f"{what} takes bf16 [T, {k}], got {x.dtype} {list(shape)}")
    if strides[1] != 1 or strides[0] < k:
        x = x.contiguous()
        strides = x.stride()
    if bias is not None and (bias.dtype != BF16 or not bias.is_contiguous()
                             or bias.shape != (n,)):
        raise KernelInputError(f"{what} bias must be contiguous bf16 [{n}]")
    out = torch.empty(shape[0], n, dtype=torch.float32 if out_f32 else BF16)
    return x, strides[0], out


def linear_bf16(
    x: torch.Tensor,  # [T, in] bf16
    weight: PackedBf16,
    bias: torch.Tensor | None = None,  # [out] bf16
) -> torch.Tensor:  # [T, out] bf16
    """``x @ W^T + b`` with W in ``models.linear.BlockedWeight``'s layout (checked there)."""
    kern = _kernel("linear_bf16")
    k, n = weight.in_features, weight.out_features
    x, stride, out = _gemm_io("linear_bf16", x, k, n, bias)
    if out.shape[0]:
        kern.linear_bf16(x.data_ptr(), weight.address, 0 if bias is None else bias.data_ptr(),
                         out.data_ptr(), out.shape[0], k, n, stride, n, kernel_threads())
    return out


def linear_quant(
    x: torch.Tensor,  # [T, in] bf16
    weight: PackedQuant,
    bias: torch.Tensor | None = None,  # [out] bf16
    out_f32: bool = False,
    scalar: bool = False,
    path: str = "auto",
) -> torch.Tensor:  # [T, out] bf16 (fp32 when out_f32)
    """``x @ W^T + b`` on a GGUF-quantized weight packed in tiles (``models.quant``): the
    weight's segment table was checked when it was packed, ``x`` and ``bias`` are here.
    ``scalar`` is ``path="scalar"``; ``path``: :data:`QUANT_PATHS`."""
    kern = _kernel("linear_quant")
    code = QUANT_PATHS["scalar"] if scalar else QUANT_PATHS[path]
    k, n = weight.in_features, weight.out_features
    x, stride, out = _gemm_io("quantized linear", x, k, n, bias, out_f32)
    if out.shape[0]:
        kern.linear_quant(x.data_ptr(), weight.table_address,
                          0 if bias is None else bias.data_ptr(), out.data_ptr(),
                          weight.num_segments, out.shape[0], k, n, stride, n, int(out_f32),
                          kernel_threads(), code)
    return out


def quant_pack(qtype: int, row_addresses: torch.Tensor | int, rows: int, k: int,
               out: torch.Tensor, nbytes: int, threads: int) -> None:
    """Stored GGUF rows (int64 addresses, 0 = zero padding) into tiles at ``out``."""
    kern = _kernel("quant_pack")
    if out.dtype != torch.uint8 or not out.is_contiguous() or out.numel() != nbytes:
        raise KernelInputError(f"quant_pack needs {nbytes} contiguous uint8 bytes, got "
                               f"{out.dtype} {out.numel()}")
    if rows < 1 or k < 1 or threads < 1:
        raise KernelInputError(f"quant_pack: rows {rows}, k {k}, threads {threads} must be >= 1")
    address = row_addresses if isinstance(row_addresses, int) else row_addresses.data_ptr()
    kern.quant_pack(qtype, address, out.data_ptr(), rows, k, threads)


def quant_dequant_rows(qtype: int, packed: torch.Tensor, ids: torch.Tensor, rows: int,
                       k: int, out: torch.Tensor) -> None:
    """Rows ``ids`` (int64, each < ``rows``) of a packed weight into ``out`` [len(ids), k]."""
    kern = _kernel("quant_dequant_rows")
    if ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous():
        raise KernelInputError(f"row ids must be contiguous int64 [N], got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise KernelInputError(f"row id out of range [0, {rows})")
    if out.dtype not in (BF16, torch.float32) or not out.is_contiguous() \
            or tuple(out.shape) != (ids.numel(), k):
        raise KernelInputError(f"dequantized rows go to contiguous bf16/fp32 [{ids.numel()}, {k}]")
    if packed.dtype != torch.uint8 or not packed.is_contiguous():
        raise KernelInputError("packed weight bytes must be contiguous uint8")
    kern.quant_dequant_rows(qtype, packed.data_ptr(), ids.data_ptr(), out.data_ptr(),
                            ids.numel(), k, int(out.dtype == torch.float32))


def nvfp4_pack(code_rows: torch.Tensor, scale_rows: torch.Tensor, multipliers: torch.Tensor,
               out: torch.Tensor, rows: int, k: int, threads: int) -> None:
    """NVFP4 rows (int64 addresses of their code and scale bytes, fp32 multipliers) into
    tiles at ``out`` (``NVFP4.packed_bytes(rows, k)`` bytes, ``formats.weight_types``)."""
    kern = _kernel("nvfp4_pack")
    need = NVFP4.packed_bytes(rows, k)
    if out.dtype != torch.uint8 or not out.is_contiguous() or out.numel() != need:
        raise KernelInputError(f"nvfp4_pack needs {need} contiguous uint8 bytes, got "
                               f"{out.dtype} {out.numel()}")
    if rows < 1 or k < 1 or k % 32 or threads < 1:
        raise KernelInputError(f"nvfp4_pack: rows {rows}, k {k} (a multiple of 32), threads "
                               f"{threads} must be >= 1")
    for name, t, dtype in (("code rows", code_rows, torch.int64), ("scale rows", scale_rows,
                           torch.int64), ("multipliers", multipliers, torch.float32)):
        if t.dtype != dtype or not t.is_contiguous() or t.numel() != rows:
            raise KernelInputError(f"nvfp4_pack: {name} must be contiguous {dtype} [{rows}]")
    kern.nvfp4_pack(code_rows.data_ptr(), scale_rows.data_ptr(), multipliers.data_ptr(),
                    out.data_ptr(), rows, k, threads)


# -- attention (paged_attention.c) ---------------------------------------------------------
# What every layer of a step shares is checked once: the index tensors per forward
# (:func:`attention_index`, from ``AttentionMetadata.build``), each layer's cache once per
# cache (:func:`paged_cache`, kept by ``KVCache.paged``). A layer's call then checks its
# q/k/v against those with integer compares.
@dataclass(frozen=True, slots=True)
class AttentionIndex:
    """One step's attention indices, checked by :func:`attention_index`."""

    #: slot_mapping [T], query_start_loc [rows + 1], seq_lens [rows], block_tables
    #: [rows, width]: int64, contiguous (kept alive: the addresses below are theirs)
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    addresses: tuple[int, int, int, int]
    tokens: int  # T: the K/V tokens this step writes
    rows: int
    width: int  # block-table entries per row
    #: cache blocks the indices were bounds-checked against (None: not checked)
    num_blocks: int | None


def attention_index(
    slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    block_tables: torch.Tensor, num_blocks: int | None = None,
) -> AttentionIndex:
    """Check a step's index tensors for the native attention (dtype, layout, sizes).

    ``num_blocks``: the cache size the caller bounds-checked every block id and slot
    against (``attention._check_native_bounds``); a call on a smaller cache is refused.
    """
    tensors = (slot_mapping, query_start_loc, seq_lens, block_tables)
    for name, index in zip(("slot_mapping", "query_start_loc", "seq_lens", "block_tables"),
                           tensors):
        if index.dtype != torch.int64 or not index.is_contiguous() or not index.is_cpu:
            raise KernelInputError(f"native attention: {name} must be contiguous int64 on the "
                                   f"CPU, got {index.dtype} on {index.device}")
    rows = seq_lens.numel()
    if (block_tables.dim() != 2 or block_tables.shape[0] != rows or slot_mapping.dim() != 1
            or query_start_loc.numel() != rows + 1 or seq_lens.dim() != 1):
        raise KernelInputError(
            f"native attention: {rows} rows need query_start_loc [rows + 1], seq_lens [rows] "
            f"and block_tables [rows, width], got {list(query_start_loc.shape)}, "
            f"{list(seq_lens.shape)}, {list(block_tables.shape)}")
    return AttentionIndex(tensors, tuple(t.data_ptr() for t in tensors),  # type: ignore[arg-type]
                          slot_mapping.numel(), rows, block_tables.shape[1], num_blocks)


@dataclass(frozen=True, slots=True)
class PagedCache:
    """One layer's K and V caches, checked by :func:`paged_cache`."""

    k: torch.Tensor  # [blocks, block_size, kv_heads, head_dim] bf16, contiguous
    v: torch.Tensor  # same shape
    addresses: tuple[int, int]
    blocks: int
    block_size: int
    kv_heads: int
    head_dim: int


def paged_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> PagedCache:
    """Check one layer's caches for the native attention."""
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.shape == v_cache.shape and k_cache.dim() == 4
            and k_cache.dtype == v_cache.dtype == BF16 and k_cache.is_cpu and v_cache.is_cpu):
        raise KernelInputError("native attention: K/V caches must be contiguous bf16 CPU "
                               "[blocks, block_size, kv_heads, head_dim] of one shape, got "
                               f"{k_cache.dtype} {list(k_cache.shape)}, {v_cache.dtype} "
                               f"{list(v_cache.shape)}")
    blocks, block_size, kv_heads, head_dim = k_cache.shape
    return PagedCache(k_cache, v_cache, (k_cache.data_ptr(), v_cache.data_ptr()), blocks,
                      block_size, kv_heads, head_dim)


def _fits(cache: PagedCache, index: AttentionIndex) -> None:
    if index.num_blocks is not None and index.num_blocks > cache.blocks:
        raise KernelInputError(f"native attention: the indices were checked against "
                               f"{index.num_blocks} blocks, the cache has {cache.blocks}")


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # [T, heads | kv_heads, d], rows strided
    cache: PagedCache, index: AttentionIndex, window: int | None, scale: float,
) -> torch.Tensor:  # [queries, heads * d]
    """Write this step's K/V into the paged caches, then attend over them (in place).

    ``q`` holds T queries, or one per row whose block of queries rides as extra heads
    (the non-causal block layout, ``attention.py``).
    """
    kern = _kernel("paged_attention")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise KernelInputError("native attention: q, k, v must be [tokens, heads, head_dim]")
    nq, h, d = q.shape  # nq: T, or one query per row whose queries ride as heads
    t = k.shape[0]
    if (k.shape[1] != cache.kv_heads or d != cache.head_dim or k.shape != v.shape
            or t != index.tokens or nq not in (t, index.rows)):
        raise KernelInputError(f"native attention: q {list(q.shape)}, k {list(k.shape)}, "
                               f"v {list(v.shape)} do not fit the cache {list(cache.k.shape)} "
                               f"and {index.tokens} indexed tokens")
    _fits(cache, index)
    (q, qs), (k, ks), (v, vs) = _rows(q), _rows(k), _rows(v)
    out = torch.empty((nq, h * d), dtype=BF16)
    _attend(kern, q.data_ptr(), k.data_ptr(), v.data_ptr(), out, qs, ks, vs, h, cache, index,
            window, scale)
    return out


def paged_attention_qkv(
    qkv: torch.Tensor,  # [T, (heads + 2 * kv_heads) * d] bf16, rows contiguous
    heads: int, cache: PagedCache, index: AttentionIndex, window: int | None, scale: float,
) -> torch.Tensor:  # [T, heads * d]
    """:func:`paged_attention` straight on a fused q|k|v projection output: q, k and v are
    offsets into each row, so no views are made (a decode layer's six torch ops)."""
    kern = _kernel("paged_attention")
    kvh, d = cache.kv_heads, cache.head_dim
    width = (heads + 2 * kvh) * d
    if (qkv.dtype != BF16 or qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1
            or qkv.shape[0] != index.tokens):
        raise KernelInputError(f"native attention: qkv must be bf16 [{index.tokens}, {width}] "
                               f"with contiguous rows, got {qkv.dtype} {list(qkv.shape)}")
    _fits(cache, index)
    base, stride = qkv.data_ptr(), qkv.stride(0)
    out = torch.empty((index.tokens, heads * d), dtype=BF16)
    _attend(kern, base, base + 2 * heads * d, base + 2 * (heads + kvh) * d, out, stride,
            stride, stride, heads, cache, index, window, scale)
    return out


def _attend(kern: ModuleType, q: int, k: int, v: int, out: torch.Tensor, qs: int, ks: int,
            vs: int, heads: int, cache: PagedCache, index: AttentionIndex,
            window: int | None, scale: float) -> None:
    slots, starts, lens, tables = index.addresses
    kern.paged_attention(
        q, k, v, out.data_ptr(), cache.addresses[0], cache.addresses[1], slots, starts, lens,
        tables, qs, ks, vs, index.tokens, index.width, index.rows, heads, cache.kv_heads,
        cache.head_dim, cache.block_size, window or 0, f32_bits(scale), kernel_threads())


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` [T, heads, d] with each token's heads contiguous, and its token stride."""
    if x.dtype != BF16:
        raise KernelInputError(f"the native attention takes bf16 q/k/v, got {x.dtype}")
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    return x, x.stride(0)


# -- decoder layers in one call (decoder_stack.c) ------------------------------------------
# The plan (every layer's weights) is checked once at load and the caches once per cache
# (``models.stack``); a call checks the step's activations here.
def decoder_layers(
    plan: StackPlan, caches: StackCacheSet,
    h: torch.Tensor,  # [T, hidden] bf16, the residual stream (read only)
    delta: torch.Tensor | None,  # [T, hidden] the previous layer's output, not added (None: layer 0)
    first: int, last: int, rope: RopeRows, index: AttentionIndex,
) -> tuple[torch.Tensor, torch.Tensor]:  # (residual, the last layer's delta), [T, hidden] each
    """Layers ``[first, last)`` in one C call: ``models.llama.DecoderLayer._run_native``'s
    kernels in its order, so the same bits (decoder_stack.c). ``delta``'s memory receives
    ``h + delta``, as ``add_rms_norm`` does."""
    kern = _kernel("decoder_layers")
    t = index.tokens
    _bf16_rows("decoder_layers input", h, plan.hidden)
    if h.dim() != 2 or h.shape[0] != t or rope.tokens != t or rope.head_dim != plan.head_dim:
        raise KernelInputError(f"decoder_layers: h {list(h.shape)} must be [{t}, "
                               f"{plan.hidden}] with RoPE rows for its {t} tokens")
    if delta is not None and (delta.shape != h.shape or delta.dtype != BF16
                              or not delta.is_contiguous()):
        raise KernelInputError("decoder_layers: delta must be contiguous bf16 like h")
    if not 0 <= first < last <= len(plan.layers):
        raise KernelInputError(f"decoder_layers: layers [{first}, {last}) of "
                               f"{len(plan.layers)}")
    if index.num_blocks is not None and index.num_blocks > caches.blocks:
        raise KernelInputError(f"native attention: the indices were checked against "
                               f"{index.num_blocks} blocks, the cache has {caches.blocks}")
    out_h, out_d = torch.empty_like(h), torch.empty_like(h)
    slots, starts, lens, tables = index.addresses
    kern.decoder_layers(
        plan.address, caches.address, h.data_ptr(), 0 if delta is None else delta.data_ptr(),
        out_h.data_ptr(), out_d.data_ptr(), rope.addresses[0], rope.addresses[1], slots,
        starts, lens, tables, first, last, t, index.width, index.rows, plan.hidden,
        plan.heads, plan.kv_heads, plan.head_dim, plan.inter, caches.block_size,
        plan.eps_bits, plan.scale_bits, kernel_threads(), QUANT_PATHS["auto"])
    return out_h, out_d
