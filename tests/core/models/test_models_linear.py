"""The packed linear layers (``models.linear``): each layout computes ``x @ W^T + b`` and a
row's bits never depend on how many rows share the call, the property greedy
speculation needs (a verify row must round like the same token decoded alone)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from draftwise.models import linear as lin
from draftwise.models.linear import BlockedWeight, is_packed, linear, pack_weight, weight_backend

SHAPES = ((1536, 576), (576, 960), (577, 100), (3, 5), (576, 49152))

needs_native = pytest.mark.skipif(not lin.native_available(), reason="C kernels not built")
needs_onednn = pytest.mark.skipif(
    not lin._onednn_available(torch.bfloat16), reason="no oneDNN bf16 here"
)


def _rows_never_depend_on_row_count(x: torch.Tensor, w: lin.Weight, b: torch.Tensor | None) -> torch.Tensor:
    full = linear(x, w, b)
    for m in (1, 2, 5, 6, 7, 13, 17):
        for start in (0, 3, 20):
            assert torch.equal(linear(x[start : start + m], w, b), full[start : start + m]), (m, start)
    return full


def test_dense_rows_do_not_depend_on_row_count() -> None:
    """K=1536 (SmolLM's down_proj) is where oneDNN's 1-row GEMV rounds differently."""
    torch.manual_seed(0)
    for k, n in ((1536, 576), (576, 960)):
        w = (torch.randn(n, k) * 0.05).bfloat16()
        _rows_never_depend_on_row_count(torch.randn(40, k).bfloat16(), w, None)
    assert torch.equal(linear(torch.ones(1, 576).bfloat16(), w), F.linear(torch.ones(2, 576).bfloat16(), w)[:1])


@needs_onednn
def test_onednn_packing_is_bitwise_the_dense_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN packing is a layout change only: same bits as F.linear at every row count."""
    monkeypatch.setenv(lin.PACK_ENV, "onednn")
    torch.manual_seed(0)
    for k, n in SHAPES[:3] + SHAPES[4:]:
        w = (torch.randn(n, k) * 0.05).bfloat16()
        b = torch.randn(n).bfloat16()
        packed = pack_weight(w)
        assert is_packed(packed) and not isinstance(packed, BlockedWeight)
        x = torch.randn(40, k).bfloat16()
        assert torch.equal(_rows_never_depend_on_row_count(x, packed, b), F.linear(x, w, b))


def test_blocked_layout_round_trips() -> None:
    """Packing is lossless: odd K and partial output blocks are zero padding only."""
    for k, n in SHAPES:
        w = torch.randn(n, k).bfloat16()
        packed = BlockedWeight.pack(w)
        assert packed.data.shape == (-(-n // 64), -(-k // 2), 64, 2)
        assert torch.equal(packed.unpack(), w)


@needs_native
@pytest.mark.parametrize("with_bias", [False, True])
def test_native_linear_is_as_accurate_as_torch_and_batch_invariant(
    monkeypatch: pytest.MonkeyPatch, with_bias: bool
) -> None:
    """Against an fp32 oracle the kernel is within bf16 output rounding, like F.linear;
    and a row's bits never depend on the rows beside it."""
    monkeypatch.setenv(lin.PACK_ENV, "native")
    torch.manual_seed(0)
    for k, n in SHAPES:
        w = (torch.randn(n, k) * 0.05).bfloat16()
        b = torch.randn(n).bfloat16() if with_bias else None
        packed = pack_weight(w)
        assert isinstance(packed, BlockedWeight) and is_packed(packed)
        x = torch.randn(40, k).bfloat16()
        out = _rows_never_depend_on_row_count(x, packed, b)
        oracle = F.linear(x.float(), w.float(), None if b is None else b.float())
        # fp32 accumulation then one bf16 rounding: at most half a bf16 ulp of the value,
        # plus fp32 summation noise far below it
        ulp = torch.finfo(torch.bfloat16).eps * oracle.abs().clamp_min(2.0**-100)
        assert ((out.float() - oracle).abs() <= 0.5 * ulp + 1e-5 * oracle.abs().max()).all(), (k, n)


@needs_native
def test_native_linear_sums_every_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-hot inputs pick single weight columns: a lost or misplaced pair would show."""
    torch.manual_seed(1)
    for k, n in ((577, 100), (64, 130)):
        w = torch.randn(n, k).bfloat16()
        packed = BlockedWeight.pack(w)
        eye = torch.eye(k).bfloat16()
        assert torch.equal(linear(eye, packed), w.T.contiguous())


@needs_native
def test_native_linear_refuses_wrong_inputs() -> None:
    packed = BlockedWeight.pack(torch.randn(64, 32).bfloat16())
    with pytest.raises(ValueError, match="bf16 \\[T, 32\\]"):
        linear(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="bf16 \\[T, 32\\]"):
        linear(torch.randn(2, 31).bfloat16(), packed)
    with pytest.raises(ValueError, match="bias"):
        linear(torch.randn(2, 32).bfloat16(), packed, torch.randn(63).bfloat16())
    # a strided view is copied, not misread
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(linear(x[:, ::2], packed), linear(x[:, ::2].contiguous(), packed))


def test_weight_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout that cannot run is an error naming why, never a quiet fallback."""
    monkeypatch.setenv(lin.PACK_ENV, "0")
    assert weight_backend(torch.bfloat16) == "dense"
    monkeypatch.setenv(lin.PACK_ENV, "auto")
    assert weight_backend(torch.float32) == "dense"
    expected = "native" if lin.native_available() else (
        "onednn" if lin._onednn_available(torch.bfloat16) else "dense")
    assert weight_backend(torch.bfloat16) == expected
    monkeypatch.setenv(lin.PACK_ENV, "fast")
    with pytest.raises(ValueError, match="auto, native, onednn or 0"):
        weight_backend(torch.bfloat16)
    monkeypatch.setenv(lin.PACK_ENV, "native")
    monkeypatch.setattr(lin, "native_available", lambda: False)
    with pytest.raises(ValueError, match="C kernels"):
        weight_backend(torch.bfloat16)
    monkeypatch.setattr(lin, "native_available", lambda: True)
    with pytest.raises(ValueError, match="bf16 weights"):
        weight_backend(torch.float16)


@needs_native
def test_native_linear_bits_do_not_depend_on_threads() -> None:
    """The worker pool splits output blocks between threads; no output changes."""
    from draftwise.models import kernels
    from draftwise.models.kernels import set_kernel_threads

    torch.manual_seed(2)
    w = BlockedWeight.pack((torch.randn(1000, 576) * 0.05).bfloat16())
    x = torch.randn(9, 576).bfloat16()
    before = kernels._threads
    try:
        set_kernel_threads(1)
        alone = linear(x, w)
        for threads in (2, 3, 7):
            set_kernel_threads(threads)
            for _ in range(20):  # many jobs back to back: none lost or run twice
                assert torch.equal(linear(x, w), alone), threads
    finally:
        set_kernel_threads(before)
    with pytest.raises(ValueError, match="at least 1"):
        set_kernel_threads(0)


def test_packed_weights_share_one_huge_page_arena() -> None:
    """pack_weights puts native weights in one 2 MB-aligned arena, values unchanged."""
    from draftwise.models.hugepages import HUGE_PAGE, huge_page_tensor

    t = huge_page_tensor(3 * HUGE_PAGE, torch.bfloat16)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.shape == (3 * HUGE_PAGE,)
    assert not t.any()  # zeroed, like the KV cache needs
    ws = [torch.randn(100, 577).bfloat16(), torch.randn(64, 32).bfloat16(), torch.randn(3, 3)]
    packed = lin.pack_weights(ws)
    assert isinstance(packed[2], torch.Tensor) and packed[2] is ws[2]  # fp32 stays dense
    if lin.native_available():
        assert all(isinstance(p, BlockedWeight) for p in packed[:2])
        assert torch.equal(packed[0].unpack(), ws[0]) and torch.equal(packed[1].unpack(), ws[1])
        assert packed[0].data.data_ptr() % HUGE_PAGE == 0
        assert packed[1].data.data_ptr() == packed[0].data.data_ptr() + packed[0].data.nbytes


@needs_native
def test_native_linear_from_several_python_threads_at_once() -> None:
    """The kernel releases the GIL; concurrent callers share one worker pool safely (a
    caller that finds it busy runs inline) and get the bits they get alone."""
    import threading

    from draftwise.models import kernels

    torch.manual_seed(3)
    w = BlockedWeight.pack((torch.randn(2048, 576) * 0.05).bfloat16())
    xs = [torch.randn(5, 576).bfloat16() for _ in range(4)]
    before = kernels._threads
    try:
        kernels.set_kernel_threads(2)
        expected = [linear(x, w) for x in xs]
        failures: list[int] = []

        def work(i: int) -> None:
            for _ in range(50):
                if not torch.equal(linear(xs[i], w), expected[i]):
                    failures.append(i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures
    finally:
        kernels.set_kernel_threads(before)
