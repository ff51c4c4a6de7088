"""GGUF quantized GEMM/GEMV on device (Q4_K, Q6_K, Q8_0), reading the file's block bytes.

Why: a decode step's time on a GPU is the weights' bytes over memory bandwidth; keeping
a Q4_K matrix at its 4.5 bits a weight reads ~3.6x fewer bytes than bf16. The same GGUF
file therefore runs on both devices without widening: the CPU engine's C kernels
(``core/csrc/gemm_quant.c``) and this Triton kernel read the same bytes.

Layout: a weight ``[N, K]`` is ``N`` rows of ``K / block`` consecutive GGUF blocks, as a
``uint8`` tensor ``[N, row_bytes]`` (what ``gguf`` reads from the file). The blocks
(ggml's ``block_q8_0``, ``block_q4_K``, ``block_q6_K``):

- Q8_0, 32 weights in 34 bytes: fp16 ``d``, 32 int8 ``q``; ``w = d * q``.
- Q4_K, 256 in 144: fp16 ``d``, fp16 ``dmin``, 12 bytes packing eight 6-bit scales and
  mins (one per 32 weights), 128 bytes of nibbles (bytes ``32c .. 32c + 31`` hold
  weights ``64c .. 64c + 31`` low and ``64c + 32 ..`` high); ``w = d * sc * q - dmin * m``.
- Q6_K, 256 in 210: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales
  (one per 16 weights), fp16 ``d``; ``w = d * sc * (q - 32)``.

:func:`dequantize_reference` decodes the same bytes in plain torch (tested equal to the
``gguf`` package's own ``dequantize``); :func:`quant_matmul_reference` is ``x @ W.T`` over
it, and :func:`quant_matmul` (``triton_quant.quant_matmul_kernel``) is tested equal to
that under the interpreter and bitwise batch-invariant. :class:`DeviceQuantWeight` is
how the engine holds such a weight on the device (``models.linear.linear`` runs it).
"""

from __future__ import annotations

import torch

from draftwise.formats.weight_types import weight_type
from draftwise.gpu.device import check_kernel_device, is_interpreted

#: the GGML types ``triton_quant._dequant`` decodes (its own switch); their layouts and
#: names are the types' records (``formats.weight_types``)
_DEVICE_TYPES = (weight_type(8), weight_type(12), weight_type(14))
#: ggml type number -> (weights per block, bytes per block)
BLOCKS = {int(t): (t.block_k, t.block_bytes) for t in _DEVICE_TYPES}
NAMES = {int(t): t.name for t in _DEVICE_TYPES}
#: the kernel's tile (constants: part of the reduction order, hence of batch invariance)
BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 64
#: the tile under the interpreter, which runs programs one after another in Python (~0.1 s
#: each at the GPU tile: an engine test's forward launched ~100): fewer, larger programs.
#: Still constants, so a row's bits there do not depend on the batch either
INTERPRETER_BLOCKS = (16, 256, 256)


class QuantTypeError(ValueError):
    """A weight type or shape the device kernel does not decode."""


def check_weight(raw: torch.Tensor, qtype: int, k: int) -> None:
    """Raise :class:`QuantTypeError` unless ``raw`` holds rows of ``k`` weights of ``qtype``."""
    if qtype not in BLOCKS:
        raise QuantTypeError(f"GGML type {qtype} has no device kernel; these do: "
                             + ", ".join(NAMES.values()))
    per, size = BLOCKS[qtype]
    if raw.dtype != torch.uint8 or raw.ndim != 2 or k % per or raw.shape[1] != k // per * size:
        raise QuantTypeError(f"{NAMES[qtype]} rows of {k} weights are uint8 [N, "
                             f"{k // per * size}] (K a multiple of {per}); got "
                             f"{raw.dtype} {tuple(raw.shape)}")


def _u16(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Two byte columns -> the fp16 they encode, as fp32."""
    bits = lo.to(torch.int32) | (hi.to(torch.int32) << 8)
    return torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16).view(
        torch.float16).float()


def _i8(b: torch.Tensor) -> torch.Tensor:
    """Bytes (as int32 0..255) read as int8, in fp32."""
    return torch.where(b >= 128, b - 256, b).float()


def dequantize_reference(raw: torch.Tensor, qtype: int, k: int) -> torch.Tensor:  # [N, K] fp32
    """The weights of ``raw`` (``[N, row_bytes]`` uint8), one block layout at a time."""
    check_weight(raw, qtype, k)
    per, size = BLOCKS[qtype]
    b = raw.reshape(-1, size).to(torch.int32)  # [N * blocks, size]
    if qtype == 8:
        return (_u16(b[:, 0], b[:, 1])[:, None] * _i8(b[:, 2:])).reshape(-1, k)
    if qtype == 12:
        d, dmin = _u16(b[:, 0], b[:, 1]), _u16(b[:, 2], b[:, 3])
        s = b[:, 4:16]
        sc = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], 1)
        mn = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
        qs = b[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 32 bytes, each two sub-blocks
        q = torch.stack([qs & 15, qs >> 4], 2).reshape(-1, 8, 32).float()  # [blocks, 8, 32]
        w = d[:, None, None] * sc[:, :, None] * q - dmin[:, None, None] * mn[:, :, None]
        return w.reshape(-1, k)
    ql, qh = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    sc = _i8(b[:, 192:208]).reshape(-1, 2, 8)
    d = _u16(b[:, 208], b[:, 209])
    quarters = []
    for g in range(4):  # within each half of 128: four runs of 32 weights
        low = ql[:, :, (g % 2) * 32:(g % 2) * 32 + 32]
        low = low >> 4 if g >= 2 else low & 15
        q = (low | (((qh >> (2 * g)) & 3) << 4)) - 32  # [blocks, 2, 32]
        scale = sc[:, :, 2 * g:2 * g + 2].repeat_interleave(16, 2)  # [blocks, 2, 32]
        quarters.append(d[:, None, None] * scale * q.float())
    return torch.stack(quarters, 2).reshape(-1, k)


def quant_matmul_reference(
    x: torch.Tensor,  # [M, K]
    raw: torch.Tensor,  # [N, row_bytes] uint8
    qtype: int,
) -> torch.Tensor:  # [M, N] in x's dtype
    """``x @ W.T`` in fp32 over :func:`dequantize_reference`'s weights."""
    w = dequantize_reference(raw.cpu(), qtype, x.shape[1]).to(x.device)
    return (x.float() @ w.T).to(x.dtype)


def quant_matmul(
    x: torch.Tensor,  # [M, K] fp32 or fp16
    raw: torch.Tensor,  # [N, row_bytes] uint8, GGUF blocks
    qtype: int,
) -> torch.Tensor:  # [M, N] in x's dtype
    """``x @ W.T`` with ``W`` dequantized in registers (the module doc)."""
    from draftwise.gpu.triton_quant import quant_matmul_kernel

    check_kernel_device(quant_matmul_kernel, x, raw)
    m, k = x.shape
    check_weight(raw, qtype, k)
    n = raw.shape[0]
    x = x.contiguous()
    raw = raw.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm, bn, bk = (INTERPRETER_BLOCKS if is_interpreted(quant_matmul_kernel)
                  else (BLOCK_M, BLOCK_N, BLOCK_K))
    if m and n:
        grid = (-(-m // bm), -(-n // bn))
        quant_matmul_kernel[grid](
            x, raw, out, m, n, k, raw.shape[1], x.stride(0), out.stride(0),
            QTYPE=qtype, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        )
    return out


class DeviceQuantWeight:
    """A ``[out, in]`` weight kept as the file's GGUF blocks on the kernels' device: what
    ``models.linear.linear`` runs through :func:`quant_matmul` when the backend decides the
    Triton kernels (the CPU engine's :class:`~draftwise.models.quant.QuantWeight` is the
    same bytes repacked for the C kernel).

    A fused projection (q|k|v, gate|up) may mix types: each run of output rows in one
    type is a segment ``(qtype, raw [rows, row_bytes])``, multiplied by its own launch and
    concatenated in column order. Nothing is widened: ``nbytes`` is the file's bytes.
    """

    __slots__ = ("in_features", "out_features", "segments")

    def __init__(self, segments: list[tuple[int, torch.Tensor]], in_features: int) -> None:
        """Checked here, once, so a call checks only its activations."""
        if not segments:
            raise QuantTypeError("a device quantized weight needs at least one segment")
        for qtype, raw in segments:
            check_weight(raw, qtype, in_features)
        self.segments = tuple((int(q), raw.contiguous()) for q, raw in segments)
        self.in_features = in_features
        self.out_features = sum(raw.shape[0] for _, raw in self.segments)

    @property
    def nbytes(self) -> int:
        """Bytes one call reads (the stored blocks)."""
        return sum(raw.numel() for _, raw in self.segments)

    @property
    def qtypes(self) -> tuple[str, ...]:
        """Type names of the segments, in column order."""
        return tuple(NAMES[q] for q, _ in self.segments)

    @property
    def device(self) -> torch.device:
        """Where the blocks live."""
        return self.segments[0][1].device

    def matmul(
        self,
        x: torch.Tensor,  # [T, in] fp32 or fp16
        bias: torch.Tensor | None = None,  # [out]
    ) -> torch.Tensor:  # [T, out] in x's dtype
        """``x @ W.T + bias``, each segment by :func:`quant_matmul`."""
        outs = [quant_matmul(x, raw, qtype) for qtype, raw in self.segments]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return out if bias is None else out + bias

    def rows(
        self,
        ids: torch.Tensor,  # [T] int64
        dtype: torch.dtype,
    ) -> torch.Tensor:  # [T, in]
        """Rows ``ids`` dequantized (an embedding lookup): only those rows' blocks are read."""
        if len(self.segments) == 1:
            qtype, raw = self.segments[0]
            return dequantize_reference(raw[ids], qtype, self.in_features).to(dtype)
        out = torch.empty(ids.numel(), self.in_features, dtype=dtype, device=ids.device)
        start = 0
        for qtype, raw in self.segments:
            inside = (ids >= start) & (ids < start + raw.shape[0])
            which = inside.nonzero().reshape(-1)
            if which.numel():
                out[which] = dequantize_reference(raw[ids[which] - start], qtype,
                                                  self.in_features).to(dtype)
            start += raw.shape[0]
        return out
