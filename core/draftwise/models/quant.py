"""GGUF-quantized weights kept quantized: repacked once at load, multiplied natively.

A decode step streams every weight once, so bytes per weight are the step time: a
Q4_K_M file is ~4.8 bits per weight where a bf16 copy is 16. :class:`QuantWeight` holds a
projection in its stored GGUF type(s), repacked into the C kernel's tiles
(``core/csrc/quant.h``: eight output rows interleaved block by block, the same bytes as
the file) in huge-page memory; :func:`linear_quant` runs ``x @ W^T`` on it
(``core/csrc/gemm_quant.c``), and :func:`dequant_rows` serves embedding lookups.

Activations are quantized to int8 inside the call, per block of 32 with an fp32 scale,
or of 256 for Q4_K and Q6_K (llama.cpp's Q8_0 and Q8_K schemes, with fp32 instead of
fp16 scales; :func:`activation_block`), which is what makes the dot products integer
``vpmaddubsw`` work; the error this adds is measured by
``tests/core/models/test_models_quant.py`` against gguf-py's dequantization and an fp32
matmul. Every output is one fp32 accumulation over K in a fixed order, so a row's bits do
not depend on the batch, its position or the thread count (bitwise batch invariance).

A fused projection (q|k|v, gate|up) may mix types (Q4_K_M stores ``attn_v`` in Q6_K):
each part is a *segment* of output columns with its own type, all in one call.

Which types run, their block layouts and packed sizes are the types' own records
(``formats.weight_types.WeightType``, one per type): a part or segment carries its
record, the kernel table its :attr:`~WeightType.kernel` number, so nothing here switches
on a type. NVFP4 (safetensors, ``formats.nvfp4``) is one more type of the family,
:data:`NVFP4` (not a GGML type): :func:`pack_nvfp4` repacks the e2m1 codes and fp8 block scales
(``core/csrc/quant.h``, "NVFP4 (W4A16)"), each row carrying its global multiplier, and
the same :func:`linear_quant` runs it with bf16 activations widened to fp32 (W4A16: no
activation quantization), one fixed-order fp32 accumulation per output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftwise.formats.weight_types import NVFP4, TILE, WeightType, weight_type
from draftwise.models import kernels
from draftwise.models.hugepages import huge_page_tensor
from draftwise.models.kernels import KernelInputError, kernel_threads
from draftwise.models.pack_plan import (  # noqa: F401 (re-exported: the parts are planned there)
    MAX_SEGMENTS,
    PACK_CALL_BYTES,
    QuantPart,
    pack_quant_stream,
    plan_bytes,
)
from draftwise.models.pack_plan import (
    row_addresses as _row_addresses,
)
from draftwise.models.pack_plan import (
    segments as _segments,
)


def quant_kernels_available() -> bool:
    """Whether this install built the quantized GEMM (any C compiler: it has a scalar path)."""
    return kernels.available("linear_quant")


def quant_simd(qtype: int | None = None, path: str = "auto") -> str:
    """``avx512vnni``, ``avx2`` or ``scalar``: the kernel this build runs for ``qtype``
    (no type: the machine's best; ``none`` without the C kernels): ``kernels.quant_simd``."""
    return kernels.quant_simd(None if qtype is None else _kernel_of(qtype), path)


def activation_block(qtype: int) -> int:
    """Values per int8 activation block (one fp32 scale) the kernel of ``qtype`` takes:
    256 for Q4_K and Q6_K (integer sums to the end of a super-block), else 32. (NVFP4 has
    none: its activations stay bf16.)"""
    if not quant_kernels_available():
        raise RuntimeError("the quantized GEMM is not built (no C compiler at install)")
    return kernels.quant_act_block(_kernel_of(qtype))


def _kernel_of(qtype: int) -> int:
    """The C kernels' number for a registered type (refused by name where none runs it)."""
    wtype = weight_type(qtype)
    if wtype.kernel is None:
        raise KernelInputError(f"{wtype.name} has no native kernel")
    return wtype.kernel


@dataclass(frozen=True)
class QuantSegment:
    """Output columns ``[start, start + rows)`` of a :class:`QuantWeight`, in one type."""

    qtype: WeightType
    start: int
    rows: int
    data: torch.Tensor  # uint8, qtype.packed_bytes(rows, in_features)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qtype", weight_type(self.qtype))


@dataclass(frozen=True)
class QuantWeight:
    """A ``[out, in]`` weight in stored GGUF types, packed for ``linear_quant``."""

    segments: tuple[QuantSegment, ...]
    out_features: int
    in_features: int
    #: int64 [segments, 4] (kernel number, data address, start, rows): the kernel's argument
    table: torch.Tensor
    #: ``table.data_ptr()``, read once (the weight keeps the tensor alive)
    table_address: int = field(init=False, repr=False, compare=False)
    num_segments: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Checked here, once (the table is what the C kernel follows), so a GEMM call
        checks only its activations; a malformed weight is a ``KernelInputError``."""
        k, segments = self.in_features, self.segments
        if not 1 <= len(segments) <= MAX_SEGMENTS or k < 1:
            raise KernelInputError(f"a quantized weight has 1..{MAX_SEGMENTS} segments and "
                                   f"in_features >= 1, got {len(segments)}, {k}")
        start = 0
        for seg in segments:
            if not seg.qtype.native or k % seg.qtype.block_k:
                raise KernelInputError(f"{seg.qtype.name} with {k} columns has no native kernel")
            need = seg.qtype.packed_bytes(seg.rows, k)
            if (seg.start != start or seg.rows < 1 or seg.data.dtype != torch.uint8
                    or not seg.data.is_contiguous() or seg.data.numel() != need):
                raise KernelInputError(
                    f"{seg.qtype.name} segment at column {seg.start} ({seg.rows} rows) needs "
                    f"{need} contiguous uint8 bytes from column {start}, got "
                    f"{seg.data.dtype} {seg.data.numel()}")
            start += seg.rows
        table = self.table
        expected = [[s.qtype.kernel, s.data.data_ptr(), s.start, s.rows] for s in segments]
        if (start != self.out_features or table.dtype != torch.int64
                or not table.is_contiguous() or table.tolist() != expected):
            raise KernelInputError(f"a quantized weight's table must list its segments "
                                   f"(int64 [{len(segments)}, 4]) covering "
                                   f"{self.out_features} outputs")
        object.__setattr__(self, "table_address", table.data_ptr())
        object.__setattr__(self, "num_segments", len(segments))

    @property
    def nbytes(self) -> int:
        """Bytes streamed per call (what decode bandwidth is measured against)."""
        return sum(s.data.numel() for s in self.segments)

    @property
    def qtypes(self) -> tuple[str, ...]:
        """Type names of the segments, in column order."""
        return tuple(s.qtype.name for s in self.segments)


def pack_quant(
    parts: Sequence[QuantPart],
    k: int,
    out: torch.Tensor | None = None,
    threads: int | None = None,
    rows_done: Callable[[int], None] | None = None,
    packed: bool = False,
) -> QuantWeight:
    """Repack stored GGUF rows (fused parts in column order) into the kernel's tiles.

    :param parts: the tensors, each ``[rows, row_bytes]`` in a native GGUF type
        (``WeightType.native``).
    :param k: weights per row (``in_features``).
    :param out: uint8 memory of :func:`plan_bytes` bytes (an arena slice), or None.
    :param threads: for the copy (default: the kernels' thread count).
    :param rows_done: called with the number of the weight's rows (over its parts, in
        column order) packed so far, after each kernel call of about
        :data:`PACK_CALL_BYTES` of stored rows, so a loader can give the stored pages
        behind back as it goes; None packs each segment in one call. A tile is eight
        rows, written whole by one call, so the bytes are the same either way.
    :param packed: ``out`` holds these parts' packed bytes already (a file of a previous
        start, ``models.packed_cache``): the weight is built over it, nothing is copied
        and no stored row is read.
    """
    if not quant_kernels_available():
        raise RuntimeError("the quantized GEMM is not built (no C compiler at install)")
    groups = _segments(parts)
    if len(groups) > MAX_SEGMENTS:
        raise ValueError(f"at most {MAX_SEGMENTS} type segments per weight, got {len(groups)}")
    total = plan_bytes(parts, k)
    if out is None:
        out = huge_page_tensor(total, torch.uint8)
    if out.numel() != total or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"pack_quant needs {total} contiguous uint8 bytes, got {out.numel()}")
    segments, offset, start = [], 0, 0
    for group in groups:
        qtype = group[0].qtype
        rows = _row_addresses(group, k)
        nbytes = qtype.packed_bytes(len(rows), k)
        data = out[offset : offset + nbytes]
        row_bytes = qtype.row_bytes(k)
        step = len(rows)
        if rows_done is not None:
            step = max(TILE, PACK_CALL_BYTES // row_bytes // TILE * TILE)
        for first in range(0, 0 if packed else len(rows), step):  # each call: whole tiles
            n = min(step, len(rows) - first)
            part_bytes = qtype.packed_bytes(n, k)
            at = first * row_bytes  # ``first`` is a multiple of TILE
            kernels.quant_pack(qtype.kernel, rows.ctypes.data + rows.itemsize * first, n, k,
                               data[at : at + part_bytes], part_bytes, threads or kernel_threads())
            if rows_done is not None:
                rows_done(start + first + n)
        segments.append(QuantSegment(qtype, start, len(rows), data))
        offset += nbytes
        start += len(rows)
    table = torch.tensor(
        [[s.qtype.kernel, s.data.data_ptr(), s.start, s.rows] for s in segments], dtype=torch.int64
    )
    return QuantWeight(tuple(segments), start, k, table)


@dataclass(frozen=True)
class NvFp4Part:
    """One stored NVFP4 tensor set to pack: ``codes`` ``[rows, k / 2]`` uint8 (two e2m1
    codes a byte, low nibble first), ``scales`` ``[rows, k / 16]`` fp8-e4m3 (or its bytes),
    and ``multiplier``: ModelOpt's ``weight_scale_2``, or 1 / compressed-tensors'
    ``weight_global_scale`` (a divisor), as fp32."""

    codes: torch.Tensor  # [rows, k / 2] uint8
    scales: torch.Tensor  # [rows, k / 16] float8_e4m3fn or uint8
    multiplier: float


def nvfp4_bytes(parts: Sequence[NvFp4Part], k: int) -> int:
    """Bytes :func:`pack_nvfp4` will need for ``parts`` (one segment, rows padded to 8)."""
    return NVFP4.packed_bytes(sum(p.codes.shape[0] for p in parts), k)


def pack_nvfp4(
    parts: Sequence[NvFp4Part],
    k: int,
    out: torch.Tensor | None = None,
    threads: int | None = None,
) -> QuantWeight:
    """Repack NVFP4 tensors (fused parts in output order: one segment, each row with its
    part's multiplier) into the kernel's tiles; the stored bits, nothing widened.

    :param parts: the tensors, checked against ``k`` here.
    :param k: inputs per row, a multiple of 32 (the kernel's block).
    :param out: uint8 memory of :func:`nvfp4_bytes` bytes (an arena slice), or None.
    :param threads: for the copy (default: the kernels' thread count).
    """
    if not quant_kernels_available():
        raise RuntimeError("the quantized GEMM is not built (no C compiler at install)")
    if k % NVFP4.block_k:
        raise ValueError(f"NVFP4 with {k} inputs cannot be packed natively (a multiple of "
                         f"{NVFP4.block_k})")
    codes, scales, mults = [], [], []
    alive = []  # the contiguous copies the row addresses point into, until the copy is done
    for part in parts:
        c = part.codes
        sc = part.scales.view(torch.uint8) if part.scales.dtype != torch.uint8 else part.scales
        rows = c.shape[0]
        if (c.dtype != torch.uint8 or tuple(c.shape) != (rows, k // 2)
                or tuple(sc.shape) != (rows, k // 16)):
            raise ValueError(f"NVFP4 parts must be uint8 [rows, {k // 2}] codes and "
                             f"[rows, {k // 16}] fp8 scales, got {list(c.shape)} {c.dtype} "
                             f"and {list(sc.shape)}")
        c, sc = c.contiguous(), sc.contiguous()
        alive += [c, sc]
        codes.append(c.data_ptr() + torch.arange(rows, dtype=torch.int64) * (k // 2))
        scales.append(sc.data_ptr() + torch.arange(rows, dtype=torch.int64) * (k // 16))
        mults.append(torch.full((rows,), part.multiplier, dtype=torch.float32))
    code_rows, scale_rows = torch.cat(codes), torch.cat(scales)
    mult = torch.cat(mults)
    total = NVFP4.packed_bytes(code_rows.numel(), k)
    if out is None:
        out = huge_page_tensor(total, torch.uint8)
    if out.numel() != total or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"pack_nvfp4 needs {total} contiguous uint8 bytes, got {out.numel()}")
    kernels.nvfp4_pack(code_rows, scale_rows, mult, out, code_rows.numel(), k,
                       threads or kernel_threads())
    del alive
    seg = QuantSegment(NVFP4, 0, code_rows.numel(), out)
    table = torch.tensor([[NVFP4.kernel, out.data_ptr(), 0, seg.rows]], dtype=torch.int64)
    return QuantWeight((seg,), seg.rows, k, table)


def linear_quant(
    x: torch.Tensor,  # [T, in] bf16
    weight: QuantWeight,
    bias: torch.Tensor | None = None,  # [out] bf16
    out_f32: bool = False,
    scalar: bool = False,
    path: str = "auto",
) -> torch.Tensor:  # [T, out] bf16 (fp32 when out_f32)
    """``x @ W^T + b`` on the packed weight; ``scalar`` runs the portable reference kernel,
    ``path`` forces a tile kernel (``kernels.QUANT_PATHS``: the A/B of the SIMD paths)."""
    return kernels.linear_quant(x, weight, bias, out_f32, scalar, path)


def dequant_rows(
    weight: QuantWeight,
    ids: torch.Tensor,  # [T] int64
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # [T, in]
    """Rows ``ids`` of the weight, dequantized (the embedding lookup of a quantized table)."""
    if ids.dim() != 1:
        ids = ids.reshape(-1)
    ids = ids.to(torch.int64).contiguous()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.out_features):
        raise IndexError(f"row id out of range [0, {weight.out_features})")  # an embedding's
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dequant_rows gives bf16 or fp32, not {dtype}")
    out = torch.empty(ids.numel(), weight.in_features, dtype=dtype)
    if len(weight.segments) == 1:  # an embedding table is one type: no masks (per step)
        seg = weight.segments[0]
        kernels.quant_dequant_rows(seg.qtype.kernel, seg.data, ids, seg.rows,
                                   weight.in_features, out)
        return out
    for seg in weight.segments:
        inside = (ids >= seg.start) & (ids < seg.start + seg.rows)
        if not bool(inside.any()):
            continue
        which = inside.nonzero().reshape(-1)
        local = (ids[which] - seg.start).contiguous()
        part = torch.empty(local.numel(), weight.in_features, dtype=dtype)
        kernels.quant_dequant_rows(seg.qtype.kernel, seg.data, local, seg.rows,
                                   weight.in_features, part)
        out[which] = part
    return out
