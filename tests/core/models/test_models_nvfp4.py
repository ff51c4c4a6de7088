"""The NVFP4 GEMM (``models.quant.pack_nvfp4``, ``core/csrc/gemm_nvfp4*.c``) against
compressed-tensors.

Reference: ``compressed_tensors``' NVFP4 decompression (``unpack_fp4_from_uint8`` and its
``dequantize`` with the global scale as a divisor) of the very bytes packed, in fp32,
then an fp64 matmul. The kernel is W4A16: activations stay bf16, widened exactly, and
``2 e2m1 * x`` is exact in fp32, so the only error is the fp32 accumulation (and the one
rounding of ``1 / weight_global_scale``). Tolerance per output n:
``|y - ref| <= 4e-6 * sum_k |x_k| |W_nk| + tiny`` (measured <= 1.7e-7); a lost lane, nibble,
scale or multiplier is O(1).

The AVX2 kernel and the scalar reference must agree bitwise, and a row's bits must not
depend on the rows beside it, its position or the thread count.
"""

from __future__ import annotations

import pytest
import torch
from draftwise.models import kernels
from draftwise.models import quant as q

pytestmark = pytest.mark.skipif(not q.quant_kernels_available(), reason="C kernels not built")

ct_helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
ct_forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
ct_quant = pytest.importorskip("compressed_tensors.quantization")

#: every finite e4m3 byte (0x7f / 0xff are NaN): subnormals 0x01..0x07 and 448 included
FINITE_E4M3 = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)


def random_nvfp4(n: int, k: int, seed: int, extreme: bool = False):
    """(codes [n, k/2], fp8 scales [n, k/16], CT global scale): every code, and with
    ``extreme`` every finite scale byte and a global scale at either end of the range."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    if extreme:
        pick = torch.randint(0, FINITE_E4M3.numel(), (n, k // 16), generator=g)
        scales = FINITE_E4M3[pick].view(torch.float8_e4m3fn)
        glob = torch.tensor([2.0 ** -20 if seed % 2 else 3.0e6])
    else:
        scales = (torch.rand(n, k // 16, generator=g) * 2 + 0.05).to(torch.float8_e4m3fn)
        glob = torch.tensor([448.0 * 6.0 / 0.37])
    return codes, scales, glob


def ct_dequantize(codes: torch.Tensor, scales: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' decompression of an ``NVFP4A16`` weight, in fp32."""
    scheme = ct_quant.preset_name_to_scheme("NVFP4A16", ["Linear"])
    n, half = codes.shape
    unpacked = ct_helpers.unpack_fp4_from_uint8(codes, n, 2 * half, dtype=torch.float32)
    return ct_forward.dequantize(x_q=unpacked, scale=scales.to(torch.float32),
                                 args=scheme.weights, global_scale=glob, dtype=torch.float32)


def packed(codes, scales, glob) -> q.QuantWeight:
    mult = float(torch.reciprocal(glob.float().reshape(())))
    return q.pack_nvfp4([q.NvFp4Part(codes, scales, mult)], codes.shape[1] * 2)


def activations(rows: int, k: int, seed: int) -> torch.Tensor:  # [rows, k] bf16
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    if rows >= 5:
        x[1] = 0.0
        x[2] *= 1e-30
        x[3] *= 1e20
        x[4, ::16] = 300.0
    return x.bfloat16()


@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme-scales"])
@pytest.mark.parametrize("scalar", [False, True], ids=["simd", "scalar"])
def test_kernel_matches_compressed_tensors(extreme: bool, scalar: bool) -> None:
    n, k = 45, 256  # a partial last tile
    codes, scales, glob = random_nvfp4(n, k, seed=3 + extreme, extreme=extreme)
    w = ct_dequantize(codes, scales, glob).double()
    x = activations(7, k, seed=1)
    y = q.linear_quant(x, packed(codes, scales, glob), out_f32=True, scalar=scalar).double()
    ref = x.double() @ w.T
    bound = 4e-6 * (x.double().abs() @ w.abs().T) + 1e-30
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(y), finite)
    assert bool(((y - ref).abs()[finite] <= bound[finite]).all()), (y - ref).abs().max()


def test_dequantized_rows_are_compressed_tensors_bit_for_bit() -> None:
    """Repacking moved the bits, nothing else: every row decodes to CT's fp32 values (the
    global scale a power of two, so its reciprocal is exact)."""
    codes, scales, _ = random_nvfp4(19, 128, seed=5, extreme=True)
    glob = torch.tensor([2.0 ** -7])
    ids = torch.arange(19)
    got = q.dequant_rows(packed(codes, scales, glob), ids, torch.float32)
    assert torch.equal(got, ct_dequantize(codes, scales, glob))


def test_pack_matches_compressed_tensors_packing() -> None:
    """The oracle's own packer writes the codes the kernel reads (low nibble first)."""
    values = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    w = values.repeat(16, 2)  # [16, 32]
    codes = ct_helpers.pack_fp4_to_uint8(w)
    scales = torch.ones(16, 2).to(torch.float8_e4m3fn)
    got = q.dequant_rows(packed(codes, scales, torch.tensor([1.0])), torch.arange(16),
                         torch.float32)
    assert torch.equal(got, w.abs() * torch.sign(w))  # -0 decodes as 0


def test_simd_and_scalar_agree_bitwise() -> None:
    if q.quant_simd(q.NVFP4) != "avx2":  # NVFP4 has one SIMD kernel (AVX2)
        pytest.skip("no SIMD kernel on this machine")
    codes, scales, glob = random_nvfp4(64, 512, seed=9, extreme=True)
    w = packed(codes, scales, glob)
    for rows in (1, 2, 3, 4, 5, 6, 11):
        x = activations(rows, 512, seed=rows)
        assert torch.equal(q.linear_quant(x, w, out_f32=True),
                           q.linear_quant(x, w, out_f32=True, scalar=True)), rows


def test_batch_invariance_rows_positions_threads() -> None:
    codes, scales, glob = random_nvfp4(72, 384, seed=11)
    w = packed(codes, scales, glob)
    x = activations(37, 384, seed=2)
    alone = torch.cat([q.linear_quant(x[i : i + 1], w) for i in range(37)])
    old = kernels.kernel_threads()
    try:
        for threads in (1, 2, 3):
            kernels.set_kernel_threads(threads)
            for rows in (2, 3, 4, 5, 8, 16, 37):
                assert torch.equal(q.linear_quant(x[:rows], w), alone[:rows]), (threads, rows)
            perm = torch.randperm(37, generator=torch.Generator().manual_seed(threads))
            assert torch.equal(q.linear_quant(x[perm], w), alone[perm])
    finally:
        kernels.set_kernel_threads(old)


def test_fused_parts_keep_their_own_global_scale() -> None:
    """q|k|v with different global scales: one call equals the parts one by one."""
    parts = [random_nvfp4(n, 128, seed=20 + n) for n in (24, 8, 13)]
    fused = q.pack_nvfp4([q.NvFp4Part(c, s, float(1 / g)) for c, s, g in parts], 128)
    x = activations(5, 128, seed=4)
    one_by_one = torch.cat([q.linear_quant(x, packed(*p)) for p in parts], dim=1)
    assert torch.equal(q.linear_quant(x, fused), one_by_one)
    bias = torch.randn(45).bfloat16()
    assert torch.equal(q.linear_quant(x, fused, bias, out_f32=True),
                       q.linear_quant(x, fused, out_f32=True) + bias.float())


@pytest.mark.parametrize("bad", ["k", "codes", "scales"])
def test_bad_parts_are_refused(bad: str) -> None:
    codes, scales, _ = random_nvfp4(8, 64, seed=1)
    if bad == "k":
        with pytest.raises(ValueError, match="multiple of 32"):
            q.pack_nvfp4([q.NvFp4Part(codes[:, :8], scales[:, :1], 1.0)], 16)
        return
    if bad == "codes":
        codes = codes[:, :-1]
    else:
        scales = scales[:, :-1]
    with pytest.raises(ValueError, match="NVFP4 parts must be"):
        q.pack_nvfp4([q.NvFp4Part(codes, scales, 1.0)], 64)
