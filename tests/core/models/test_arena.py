"""The quantized weights' arena faulted in ahead of the load (``models.arena``).

The region a thread faults in is the one the weights are packed into, byte for byte
the model a fresh arena gives; what the load does not take goes back to the OS before
it returns; a refused ``madvise`` or an arena too small only costs the head start.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest
import torch
from draftwise.cli.common import prefault_weights
from draftwise.models import arena as arena_mod
from draftwise.models.arena import HUGE_PAGE, PrefaultedArena, libc_madvise
from draftwise.models.loader import load_model
from draftwise.models.prefault import prefault_for_gguf
from draftwise.models.quant import QuantWeight, quant_kernels_available
from gguf import GGMLQuantizationType as Q

linux = pytest.mark.skipif(libc_madvise() is None, reason="madvise through libc (Linux)")
SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512}
MIB = 1 << 20


def resident_pages(region: mmap.mmap, offset: int, length: int) -> int:
    """Pages of ``[offset, offset + length)`` of a mapping that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    address = arena_mod.region_address(region) + offset
    assert address % page == 0 and length % page == 0
    vec = (ctypes.c_ubyte * (length // page))()
    assert libc.mincore(address, length, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec)


class Recorder:
    """A madvise that records its calls (and succeeds, or refuses with ``result``)."""

    def __init__(self, result: int = 0) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.result = result

    def __call__(self, address: int, length: int, advice: int) -> int:
        self.calls.append((address, length, advice))
        return self.result


def test_the_thread_faults_the_whole_region_in_chunks_from_its_huge_page_start() -> None:
    rec = Recorder()
    arena = PrefaultedArena(150 * MIB + 4096, madvise=rec)
    assert arena.take(150 * MIB + 4096) is not None
    arena.finish()
    base = arena_mod.region_address(arena.region) + arena.start
    assert base % HUGE_PAGE == 0
    assert [c[2] for c in rec.calls] == [arena_mod.MADV_POPULATE_WRITE] * 3
    assert [c[0] - base for c in rec.calls] == [0, 64 * MIB, 128 * MIB]
    assert sum(c[1] for c in rec.calls) == arena.populated == 150 * MIB + 4096


def test_a_refused_populate_stops_the_thread_and_the_region_still_serves() -> None:
    rec = Recorder(result=-1)  # a kernel before 5.14: EINVAL
    arena = PrefaultedArena(100 * MIB, madvise=rec)
    region, start = arena.take(10 * MIB)
    arena.finish()
    assert len(rec.calls) == 1 and arena.populated == 0
    view = memoryview(region)[start : start + 10 * MIB]
    assert view[0] == 0 and view[-1] == 0  # zeroed anonymous memory, faulted on use


def test_take_bounds_the_thread_and_is_once_only() -> None:
    rec = Recorder()
    arena = PrefaultedArena(8 * MIB, madvise=rec)
    assert arena.take(9 * MIB) is None  # does not fit: nothing taken
    with pytest.raises(RuntimeError, match="taken once"):
        arena.take(MIB)
    arena.finish()
    arena.finish()  # idempotent
    assert arena.taken == 0


@linux
def test_take_hands_back_the_pages_past_what_it_takes() -> None:
    arena = PrefaultedArena(16 * MIB)
    arena._thread.join()  # let it fault all 16 MiB first, as it does while torch imports
    if arena.populated < 16 * MIB:
        pytest.skip("MADV_POPULATE_WRITE refused here (Linux < 5.14)")
    pages = 16 * MIB // mmap.PAGESIZE
    assert resident_pages(arena.region, arena.start, 16 * MIB) == pages
    region, start = arena.take(5 * MIB)
    kept = -(-5 * MIB // HUGE_PAGE) * HUGE_PAGE  # 6 MiB: whole huge pages
    assert resident_pages(region, start + kept, 16 * MIB - kept) == 0  # at once
    arena.finish()
    assert resident_pages(region, start, kept) == kept // mmap.PAGESIZE
    assert resident_pages(region, start + kept, 16 * MIB - kept) == 0


@linux
def test_nothing_taken_leaves_nothing_resident() -> None:
    arena = PrefaultedArena(8 * MIB)
    arena.finish()
    assert resident_pages(arena.region, arena.start, 8 * MIB) == 0


def quantized_weights(model: torch.nn.Module) -> list[QuantWeight]:
    """The embedding, an untied LM head and every projection, in a fixed order."""
    head = [] if model.lm_head_weight is model.embed_weight else [model.lm_head_weight]
    layers = [getattr(layer, n) for layer in model.decoder_layers() for n in layer._LINEARS]
    return [model.embed_weight, *head, *layers]


@pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")
@linux
def test_a_model_packed_into_the_prefaulted_arena_is_the_model(tiny_gguf) -> None:
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False, **SHAPE)
    fresh = load_model(str(t.path)).model
    reserved = prefault_for_gguf(str(t.path))
    assert reserved is not None and reserved.capacity == Path(t.path).stat().st_size
    model = load_model(str(t.path), reserved=reserved).model
    weights = quantized_weights(model)
    assert all(isinstance(w, QuantWeight) for w in weights)
    assert reserved.taken == sum(w.nbytes for w in weights) > 0
    base = arena_mod.region_address(reserved.region) + reserved.start
    for w, w_fresh in zip(weights, quantized_weights(fresh)):
        assert w.qtypes == w_fresh.qtypes
        for seg, seg_fresh in zip(w.segments, w_fresh.segments):
            assert base <= seg.data.data_ptr() < base + reserved.taken
            assert torch.equal(seg.data, seg_fresh.data)
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")
def test_an_arena_too_small_is_handed_back_and_the_load_allocates(tiny_gguf) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, **SHAPE)
    reserved = PrefaultedArena(4096, madvise=Recorder())
    model = load_model(str(t.path), reserved=reserved).model
    assert reserved.taken == 0 and model.weight_bytes > 4096
    assert model.weight_backend == "quant"


def test_the_cli_prefaults_only_what_stays_quantized(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, **SHAPE)
    assert prefault_weights(str(t.path), "float32") is None  # dequantized: no arena
    assert prefault_weights(str(tmp_path / "missing.gguf"), "auto") is None  # refused later
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"\0" * 4096)
    assert prefault_weights(str(not_gguf), "auto") is None
    reserved = prefault_weights(str(t.path), "auto")
    if libc_madvise() is None or not quant_kernels_available():
        assert reserved is None
        return
    assert reserved is not None and reserved.capacity == Path(t.path).stat().st_size
    reserved.finish()


@linux
def test_no_arena_larger_than_half_the_available_memory(tiny_gguf, monkeypatch) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, **SHAPE)
    size = Path(t.path).stat().st_size
    import draftwise.models.prefault as prefault_mod

    monkeypatch.setattr(prefault_mod, "available_memory", lambda: 2 * size - 2)
    assert prefault_for_gguf(str(t.path)) is None
    monkeypatch.setattr(prefault_mod, "available_memory", lambda: 2 * size)
    reserved = prefault_for_gguf(str(t.path))
    assert reserved is not None
    reserved.finish()


def test_the_module_does_not_import_torch() -> None:
    import subprocess

    code = ("import sys, draftwise.models.arena, draftwise.formats.default_model; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env()).stdout
    assert out.strip() == "False"


def _env() -> dict[str, str]:
    import os

    core = Path(__file__).resolve().parents[3] / "core"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(core), env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")
def test_the_packers_give_stored_pages_back_as_they_read_them(tiny_gguf, monkeypatch) -> None:
    """With the arena resident before the first weight packs, stored pages not yet given
    back are what a load adds to the peak: a tensor in stored order is given back a call
    at a time, by the thread that packed it, and every tensor whole once packed."""
    from draftwise.formats.gguf_file import GGUFFile
    from draftwise.models import quant

    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_0, embed_type=Q.Q8_0, tied=False, **SHAPE)
    monkeypatch.setattr(quant, "PACK_CALL_BYTES", 4096)
    calls: list[tuple[str, int | None]] = []
    release = GGUFFile.release

    def spy(self: GGUFFile, name: str, rows: int | None = None, evict: bool = False) -> None:
        calls.append((name, rows))
        release(self, name, rows, evict)

    monkeypatch.setattr(GGUFFile, "release", spy)
    load_model(str(t.path))
    embed = [rows for name, rows in calls if name == "token_embd.weight"]
    assert len(embed) > 2 and embed[-1] is None and embed[:-1] == sorted(embed[:-1])
    packed = {name for name, rows in calls if rows is None}
    assert {"token_embd.weight", "output.weight", "blk.0.attn_q.weight"} <= packed
