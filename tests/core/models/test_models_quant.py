"""The quantized GEMM (``models.quant``, ``core/csrc/gemm_quant*.c``) against gguf-py.

Reference: ``gguf.quants.dequantize`` of the very blocks packed, then an fp64 matmul.
Tolerances, per output n (all measured far inside them):

- against the reference fed the kernel's own int8 activations (each block of 32 as
  q * amax/127, emulated here in fp32): ``|y - ref| <= 1e-6 * sum_k |x_k| |W_nk|``, i.e.
  fp32 accumulation noise only (measured <= ~1e-7); a lost lane, scale or offset is O(1);
- against the exact activations: the int8 rounding bound,
  ``sum_blocks (amax/254) sum_k |W_nk|`` on top of the above.

The SIMD kernel and the scalar reference (the portable build's path, compiled into every
build) must agree bitwise, and a row's bits must not depend on the rows beside it, its
position or the thread count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from draftwise.formats.weight_types import weight_types
from draftwise.models import kernels
from draftwise.models import quant as q
from draftwise.models.kernels import KERNELS
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tiny_gguf import FP16_FIELDS, QUANTIZABLE, random_blocks

pytestmark = pytest.mark.skipif(not q.quant_kernels_available(), reason="C kernels not built")

TYPES = [t for t in weight_types() if t.native and t.container == "gguf"]
#: fp16 scales at the ends of the range: zero, smallest subnormal, smallest normal, largest
EXTREME_HALVES = np.array([0.0, 2.0**-24, 2.0**-14, 65504.0, -65504.0, 1.0, -3.0, 1e-3],
                          dtype=np.float16)


def blocks(qtype: Q, rows: int, k: int, seed: int, extreme: bool = False) -> np.ndarray:
    """Stored rows of ``qtype``: quantized normal weights where gguf-py can, random
    blocks otherwise; ``extreme`` puts every fp16 scale at a range end."""
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZABLE and not extreme:
        w = (rng.standard_normal((rows, k)) * 0.05).astype(np.float32)
        return quantize(w, qtype).reshape(rows, -1)
    raw = random_blocks(qtype, rows, k, rng)
    if extreme:
        block, size = GGML_QUANT_SIZES[qtype]
        view = raw.reshape(rows, k // block, size)
        for o in FP16_FIELDS[qtype]:
            pick = rng.choice(EXTREME_HALVES, size=(rows, k // block))
            view[:, :, o : o + 2] = pick.view(np.uint8).reshape(rows, k // block, 2)
    return raw


def activations(rows: int, k: int, seed: int) -> torch.Tensor:  # [rows, k] bf16
    """Normal rows plus the awkward ones: zero, tiny, huge, one outlier per block, constant."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    if rows >= 6:
        x[1] = 0.0
        x[2] *= 1e-30
        x[3] *= 1e20
        x[4, ::32] = 300.0
        x[5] = 0.75
    return x.bfloat16()


def int8_view(x: torch.Tensor, block: int = 32) -> np.ndarray:  # [rows, k] float64
    """The kernel's activations: per ``block`` values (32, or 256 for the super-block
    types), round(x * 127/amax) * (amax/127), in fp32."""
    xb = x.float().numpy().reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    codes = np.clip(np.rint((xb * inv).astype(np.float32)), -127, 127)
    return (codes * d).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme-scales"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kernel_matches_gguf_dequantization(qtype: Q, extreme: bool) -> None:
    k, n = 512, 44  # 44 outputs: five full tiles and a partial one
    raw = blocks(qtype, n, k, seed=int(qtype), extreme=extreme)
    w = q.pack_quant([q.QuantPart(qtype, raw)], k)
    dense = dequantize(raw, qtype).reshape(n, k).astype(np.float64)
    x = activations(9, k, seed=1)
    got = q.linear_quant(x, w, out_f32=True)
    assert torch.equal(got, q.linear_quant(x, w, out_f32=True, scalar=True))
    ab = q.activation_block(qtype)
    assert ab == (256 if qtype in (Q.Q4_K, Q.Q6_K) else 32)
    xq = int8_view(x, ab)
    scale = np.abs(xq) @ np.abs(dense).T
    err = np.abs(got.double().numpy() - xq @ dense.T)
    assert (err <= 1e-6 * scale + 1e-35).all(), (err / (scale + 1e-300)).max()
    # against the exact activations: within the int8 rounding of each block
    xe = x.double().numpy()
    half_step = np.abs(xe).reshape(9, -1, ab).max(-1) / 254 * 1.0001  # [rows, blocks]
    bound = half_step @ np.abs(dense).reshape(n, -1, ab).sum(-1).T + 1e-6 * scale + 1e-35
    assert (np.abs(got.double().numpy() - xe @ dense.T) <= bound).all()
    # bf16 output: the fp32 result rounded once
    assert torch.equal(q.linear_quant(x, w), got.bfloat16())


def test_int8_activations_cost_about_half_a_percent() -> None:
    """The accuracy price of int8 activations on normal data, stated in the docs."""
    k, n = 1536, 256
    raw = blocks(Q.Q4_1, n, k, seed=3)
    w = q.pack_quant([q.QuantPart(Q.Q4_1, raw)], k)
    dense = dequantize(raw, Q.Q4_1).reshape(n, k).astype(np.float64)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.double().numpy() @ dense.T
    err = q.linear_quant(x, w, out_f32=True).double().numpy() - ref
    rel = np.linalg.norm(err) / np.linalg.norm(ref)
    assert 1e-4 < rel < 1e-2, rel  # measured ~0.45% (nonzero: the rounding is real)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequant_rows_are_gguf_dequantization(qtype: Q) -> None:
    k, n = 512, 21
    raw = blocks(qtype, n, k, seed=7)
    w = q.pack_quant([q.QuantPart(qtype, raw)], k)
    ref = dequantize(raw, qtype).reshape(n, k)
    ids = torch.tensor([20, 0, 7, 7, 13])
    got = q.dequant_rows(w, ids, torch.float32).numpy()
    # same products, summed in another order at most: within an ulp of the row's largest
    tol = 2.0**-22 * np.abs(ref[ids]).max(-1, keepdims=True)
    assert (np.abs(got - ref[ids]) <= tol).all()
    assert torch.equal(q.dequant_rows(w, ids), torch.from_numpy(got).bfloat16())
    with pytest.raises(IndexError):
        q.dequant_rows(w, torch.tensor([n]))


def _fused() -> tuple[q.QuantWeight, list[q.QuantWeight], torch.Tensor]:
    """A fused weight of mixed types (q|k|v of Q4_K_M), plus each part packed alone."""
    k = 512
    spec = [(Q.Q4_K, 24), (Q.Q4_K, 16), (Q.Q6_K, 20), (Q.Q8_0, 12), (Q.Q8_0, 9)]
    raws = [blocks(t, rows, k, seed=i) for i, (t, rows) in enumerate(spec)]
    parts = [q.QuantPart(t, r) for (t, _), r in zip(spec, raws)]
    return q.pack_quant(parts, k), [q.pack_quant([p], k) for p in parts], activations(70, k, 2)


def test_fused_segments_equal_their_parts_bitwise() -> None:
    fused, alone, x = _fused()
    # Q4_K 24 + 16 share a segment; Q6_K's 20 rows end mid-tile, so Q8_0 starts its own
    assert fused.qtypes == ("Q4_K", "Q6_K", "Q8_0", "Q8_0")
    assert torch.equal(q.linear_quant(x, fused), torch.cat([q.linear_quant(x, a) for a in alone], 1))
    assert fused.nbytes == q.plan_bytes(
        [q.QuantPart(s.qtype, np.zeros((s.rows, 1), np.uint8)) for s in fused.segments], 512)


def test_row_order_packs_rows_as_reordered() -> None:
    k, n = 256, 16
    raw = blocks(Q.Q5_K, n, k, seed=5)
    order = np.random.default_rng(0).permutation(n)
    x = activations(3, k, 4)
    reordered = q.pack_quant([q.QuantPart(Q.Q5_K, raw, order)], k)
    direct = q.pack_quant([q.QuantPart(Q.Q5_K, np.ascontiguousarray(raw[order]))], k)
    assert torch.equal(q.linear_quant(x, reordered), q.linear_quant(x, direct))


def test_packing_in_calls_that_report_progress_gives_the_same_bytes(monkeypatch) -> None:
    """``rows_done``: whole tiles per call, every row reported once, in order, bitwise the
    one-call pack (fused segments too: the count runs over the weight's rows)."""
    monkeypatch.setattr(q, "PACK_CALL_BYTES", 3 * 8 * 144 + 5)  # 24 Q4_K rows of k=256
    k = 256
    parts = [q.QuantPart(Q.Q4_K, blocks(Q.Q4_K, 60, k, seed=1)),
             q.QuantPart(Q.Q6_K, blocks(Q.Q6_K, 21, k, seed=2))]
    seen: list[int] = []
    stepped = q.pack_quant(parts, k, rows_done=seen.append)
    whole = q.pack_quant(parts, k)
    assert seen == [24, 48, 60, 60 + 16, 81]  # Q6_K: 210 bytes a row, 16 rows a call
    assert stepped.qtypes == whole.qtypes == ("Q4_K", "Q6_K")
    assert all(torch.equal(a.data, b.data) for a, b in zip(stepped.segments, whole.segments))


@pytest.mark.parametrize("scalar", [False, True], ids=["simd", "scalar"])
def test_rows_never_depend_on_the_batch(scalar: bool) -> None:
    """Alone, as any slice of a batch (across the passes of up to five rows, split evenly,
    and the 32-row blocks), with a bias, in bf16 and fp32: the same bits."""
    fused, _, x = _fused()
    bias = torch.randn(fused.out_features).bfloat16()
    for out_f32 in (False, True):
        full = q.linear_quant(x, fused, bias, out_f32, scalar)
        for m in (1, 2, 3, 4, 5, 7, 9, 17, 33, 50):
            for start in (0, 3, 20):
                part = q.linear_quant(x[start : start + m], fused, bias, out_f32, scalar)
                assert torch.equal(part, full[start : start + m]), (m, start, out_f32)


def test_bits_do_not_depend_on_threads() -> None:
    fused, _, x = _fused()
    before = kernels._threads
    try:
        kernels.set_kernel_threads(1)
        alone = q.linear_quant(x[:9], fused)
        for threads in (2, 3, 7):
            kernels.set_kernel_threads(threads)
            for _ in range(10):  # back-to-back jobs on the pool
                assert torch.equal(q.linear_quant(x[:9], fused), alone), threads
    finally:
        kernels.set_kernel_threads(before)


def test_bad_inputs_are_named_errors() -> None:
    k = 256
    w = q.pack_quant([q.QuantPart(Q.Q4_K, blocks(Q.Q4_K, 8, k, 0))], k)
    with pytest.raises(ValueError, match=r"bf16 \[T, 256\]"):
        q.linear_quant(torch.randn(2, k), w)
    with pytest.raises(ValueError, match=r"bf16 \[T, 256\]"):
        q.linear_quant(torch.randn(2, 255).bfloat16(), w)
    with pytest.raises(ValueError, match="bias"):
        q.linear_quant(torch.randn(2, k).bfloat16(), w, torch.randn(7).bfloat16())
    x = torch.randn(3, 2 * k).bfloat16()  # a strided view is copied, not misread
    assert torch.equal(q.linear_quant(x[:, ::2], w), q.linear_quant(x[:, ::2].contiguous(), w))
    with pytest.raises(ValueError, match="rows must be uint8"):
        q.pack_quant([q.QuantPart(Q.Q4_K, np.zeros((8, 100), np.uint8))], k)
    with pytest.raises(ValueError, match="cannot be packed natively"):
        q.pack_quant([q.QuantPart(Q.IQ4_NL, np.zeros((8, 8 * 18), np.uint8))], k)
    with pytest.raises(ValueError, match="cannot be packed natively"):  # K not whole blocks
        q.pack_quant([q.QuantPart(Q.Q4_K, np.zeros((8, 144), np.uint8))], 288)
    many = [q.QuantPart(t, blocks(t, 3, k, 0)) for t in (Q.Q4_K, Q.Q6_K) * 5]
    with pytest.raises(ValueError, match="at most 8 type segments"):
        q.pack_quant(many, k)
    # the C entry point checks what it is handed, too
    y = torch.empty(1, 8, dtype=torch.bfloat16)
    bad = torch.tensor([[99, w.segments[0].data.data_ptr(), 0, 8]], dtype=torch.int64)
    xr = torch.randn(1, k).bfloat16()
    with pytest.raises(ValueError, match="bad segment"):
        KERNELS.linear_quant(xr.data_ptr(), bad.data_ptr(), 0, y.data_ptr(), 1, 1, k, 8, k, 8,
                             0, 1, 0)
    with pytest.raises(ValueError, match="do not cover"):
        KERNELS.linear_quant(xr.data_ptr(), w.table.data_ptr(), 0, y.data_ptr(), 1, 1, k, 9, k,
                             9, 0, 1, 0)


def test_concurrent_callers_and_changing_thread_counts() -> None:
    """The worker pool under load: four Python threads call at once (one gets the pool,
    the others run inline) while the thread count changes between jobs; every result is
    the bits it has alone. Exercises the pool's chunk claiming and its job slots."""
    import threading

    fused, _, x = _fused()
    before = kernels._threads
    try:
        kernels.set_kernel_threads(1)
        expected = [q.linear_quant(x[i : i + 5], fused) for i in range(4)]
        failures: list[int] = []

        def work(i: int) -> None:
            for step in range(60):
                kernels.set_kernel_threads((2, 3, 7)[(i + step) % 3])
                if not torch.equal(q.linear_quant(x[i : i + 5], fused), expected[i]):
                    failures.append(i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures
    finally:
        kernels.set_kernel_threads(before)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_inf_or_nan_in_a_row_makes_that_row_nan_in_both_paths(qtype: Q) -> None:
    """Both activation schemes (blocks of 32 and 256), SIMD and scalar quantizers: a
    non-finite value poisons its own row, as a float GEMM would, and no other."""
    k, n = 512, 16
    w = q.pack_quant([q.QuantPart(qtype, blocks(qtype, n, k, seed=11))], k)
    x = activations(4, k, seed=5)
    x[1, 40] = float("inf")
    x[2, 300] = float("nan")
    for scalar in (False, True):
        got = q.linear_quant(x, w, out_f32=True, scalar=scalar)
        assert got[1:3].isnan().all()
        assert torch.equal(got[[0, 3]], q.linear_quant(x[[0, 3]], w, out_f32=True, scalar=scalar))
        assert torch.equal(got[[0, 3]], q.linear_quant(x[[0, 3]], w, out_f32=True, scalar=not scalar))


# ---- the SIMD paths against each other (kernels.QUANT_PATHS) ----

#: the types the AVX512-VNNI kernel covers (core/csrc/gemm_quant_avx512.c); the rest run AVX2
VNNI_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q6_K]


def _has_path(path: str) -> bool:
    try:
        return q.quant_simd(int(Q.Q4_K), path) == path
    except ValueError:  # refused: the CPU lacks it
        return False


needs_vnni = pytest.mark.skipif(not _has_path("avx512vnni"),
                                reason="the CPU has no avx512f/bw/vl/vnni (the AVX2 kernel runs)")


@needs_vnni
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme-scales"])
@pytest.mark.parametrize("qtype", VNNI_TYPES, ids=lambda t: t.name)
def test_vnni_kernel_equals_scalar_and_avx2_bitwise(qtype: Q, extreme: bool) -> None:
    """Every row count 1..17 (passes of one to five rows, and the even split of more),
    a partial last tile (44 outputs: three pairs of tiles, the 512-bit kernel), a lone
    tile (8: the 256-bit one) and a pair and a lone tile (20), K of one and of several
    blocks, one thread and two: the three kernels give the same bits, in fp32 and with a
    bias in bf16."""
    before = kernels._threads
    try:
        for threads, (k, n) in ((1, (512, 44)), (2, (512, 44)), (1, (256, 8)), (2, (1024, 20))):
            kernels.set_kernel_threads(threads)
            raw = blocks(qtype, n, k, seed=int(qtype) + k, extreme=extreme)
            w = q.pack_quant([q.QuantPart(qtype, raw)], k)
            bias = torch.randn(n, generator=torch.Generator().manual_seed(k)).bfloat16()
            x = activations(17, k, seed=k)
            for rows in range(1, 18):
                xs = x[:rows]
                vnni = q.linear_quant(xs, w, out_f32=True, path="avx512vnni")
                scalar = q.linear_quant(xs, w, out_f32=True, scalar=True)
                assert torch.equal(vnni, scalar), (threads, k, rows)
                assert torch.equal(vnni, q.linear_quant(xs, w, out_f32=True, path="avx2")), rows
            assert torch.equal(q.linear_quant(x, w, bias, path="avx512vnni"),
                               q.linear_quant(x, w, bias, scalar=True))
    finally:
        kernels.set_kernel_threads(before)


@needs_vnni
def test_vnni_kernel_bits_do_not_depend_on_threads() -> None:
    """Threads split whole tiles; a fused weight mixes covered types (Q4_K, Q6_K) with one
    that runs AVX2 (Q5_K) in one call."""
    k = 512
    parts = [q.QuantPart(t, blocks(t, rows, k, seed=rows)) for t, rows in
             ((Q.Q4_K, 40), (Q.Q6_K, 24), (Q.Q5_K, 16), (Q.Q8_0, 13))]
    w = q.pack_quant(parts, k)
    x = activations(17, k, seed=2)
    ref = q.linear_quant(x, w, out_f32=True, scalar=True)
    before = kernels._threads
    try:
        for threads in (1, 2, 3, 7):
            kernels.set_kernel_threads(threads)
            for rows in (1, 2, 5, 8, 16, 17):
                assert torch.equal(q.linear_quant(x[:rows], w, out_f32=True), ref[:rows]), threads
    finally:
        kernels.set_kernel_threads(before)


@needs_vnni
def test_auto_runs_vnni_where_it_covers_the_type_and_names_it() -> None:
    for t in TYPES:
        assert q.quant_simd(int(t)) == ("avx512vnni" if t in VNNI_TYPES else "avx2"), t.name
    assert q.quant_simd() == "avx512vnni"
    with pytest.raises(ValueError, match="does not cover"):
        q.quant_simd(int(Q.Q5_K), "avx512vnni")
    w = q.pack_quant([q.QuantPart(Q.Q5_K, blocks(Q.Q5_K, 8, 256, 0))], 256)
    with pytest.raises(ValueError, match="does not cover"):
        q.linear_quant(activations(1, 256, 0), w, path="avx512vnni")


@pytest.mark.skipif(not _has_path("avx2"), reason="the CPU has no avx2/fma/f16c")
def test_environment_forces_a_path_for_the_ab(monkeypatch) -> None:
    """DRAFTWISE_QUANT_SIMD turns ``auto`` into the named path (the benchmarks' A/B);
    a value it does not know is refused, naming what works."""
    k = 256
    w = q.pack_quant([q.QuantPart(Q.Q4_1, blocks(Q.Q4_1, 16, k, 1))], k)
    x = activations(5, k, seed=3)
    ref = q.linear_quant(x, w, out_f32=True, scalar=True)
    monkeypatch.setenv("DRAFTWISE_QUANT_SIMD", "avx2")
    assert q.quant_simd() == "avx2" and q.quant_simd(int(Q.Q4_1)) == "avx2"
    assert torch.equal(q.linear_quant(x, w, out_f32=True), ref)
    monkeypatch.setenv("DRAFTWISE_QUANT_SIMD", "scalar")
    assert q.quant_simd(int(Q.Q4_1)) == "scalar"
    monkeypatch.setenv("DRAFTWISE_QUANT_SIMD", "avx9")
    with pytest.raises(ValueError, match="auto, avx2 or scalar"):
        q.linear_quant(x, w)
    with pytest.raises(ValueError, match="auto, avx2 or scalar"):
        q.quant_simd()
    monkeypatch.setenv("DRAFTWISE_QUANT_SIMD", "auto")
    assert q.quant_simd(int(Q.Q4_1)) == ("avx512vnni" if _has_path("avx512vnni") else "avx2")
