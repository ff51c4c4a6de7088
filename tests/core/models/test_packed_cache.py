"""The packed-weights file cache (``models.packed_cache``): a second load maps the bytes
the first one packed, and a file that is not exactly those bytes is never used."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from draftwise.models import packed_cache
from draftwise.models.early_pack import EarlyPack
from draftwise.models.loader import load_model
from draftwise.models.prefault import prefault_for_gguf
from draftwise.models.quant import quant_kernels_available
from gguf import GGMLQuantizationType as Q

from tests.core.models.test_models_gguf_weights import IDS, Q4_K_M, SHAPE, logits

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")


@pytest.fixture
def cache_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(packed_cache.ENV, "1")
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "packed"


def _load_and_wait(path: str) -> torch.nn.Module:
    return load_model(path).model  # (the file is written, and in place, once it returns)


def _packed_bytes(model: torch.nn.Module) -> list[bytes]:
    layer = model.decoder_layers()[0]
    return [bytes(s.data.numpy()) for w in (layer.qkv_weight, layer.down_weight)
            for s in w.segments]


def test_second_load_maps_the_same_bytes(tiny_gguf, cache_on: Path, monkeypatch,
                                         caplog) -> None:
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False,
                  tensor_types=Q4_K_M, **SHAPE)
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        first = _load_and_wait(str(t.path))
    # the disk it takes is said once, with the switch, by the load itself
    assert "writing packed weights to" in caplog.text and packed_cache.ENV in caplog.text
    files = sorted(p.name for p in cache_on.iterdir())
    assert len(files) == 2 and files[0].endswith(".bin") and files[1].endswith(".json")
    assert packed_cache.cached_for(str(t.path))
    mapped: list[torch.Tensor] = []
    load = packed_cache.load

    def spy(key, nbytes):
        got = load(key, nbytes)
        mapped.append(got)
        return got

    monkeypatch.setattr(packed_cache, "load", spy)
    second = load_model(str(t.path)).model
    # the second model's weights live in the file's mapping (2 MB-aligned), nothing packed
    assert len(mapped) == 1 and mapped[0] is not None and mapped[0].data_ptr() % (2 << 20) == 0
    first_byte = mapped[0].data_ptr()
    seg = second.decoder_layers()[0].qkv_weight.segments[0]
    assert first_byte <= seg.data.data_ptr() < first_byte + mapped[0].numel()
    assert _packed_bytes(second) == _packed_bytes(first)
    assert torch.equal(logits(second, IDS), logits(first, IDS))
    # nothing to fault ahead for a model whose packed weights are cached
    assert prefault_for_gguf(str(t.path)) is None


def test_changed_or_truncated_file_is_packed_again(tiny_gguf, cache_on: Path, caplog) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True,
                  tensor_types=Q4_K_M, **SHAPE)
    want = logits(_load_and_wait(str(t.path)), IDS)
    data = next(cache_on.glob("*.bin"))
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # inside the first sample
    data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        again = _load_and_wait(str(t.path))
    assert "not used (its contents changed" in caplog.text
    assert torch.equal(logits(again, IDS), want)
    data.write_bytes(data.read_bytes()[:-1])  # (rewritten whole by the load above first)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        third = load_model(str(t.path)).model
    assert "not used (its key or size does not match)" in caplog.text
    assert torch.equal(logits(third, IDS), want)


def test_switched_off_reads_and_writes_nothing(tiny_gguf, cache_on: Path, monkeypatch) -> None:
    monkeypatch.setenv(packed_cache.ENV, "0")
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    _load_and_wait(str(t.path))
    assert not cache_on.exists() and not packed_cache.cached_for(str(t.path))


def test_files_of_gone_or_changed_models_are_evicted(tiny_gguf, cache_on: Path) -> None:
    a = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    _load_and_wait(str(a.path))
    side = next(cache_on.glob("*.json"))
    meta = json.loads(side.read_text())
    meta["key"]["model"]["mtime"] += 1  # as if the model file changed since
    side.write_text(json.dumps(meta))
    gone = packed_cache.evict_stale(cache_on)
    assert sorted(p.suffix for p in gone) == [".bin", ".json"] and not any(cache_on.iterdir())


def test_another_builds_file_of_the_same_model_is_replaced(tiny_gguf, cache_on: Path,
                                                           monkeypatch) -> None:
    a = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    _load_and_wait(str(a.path))
    old = sorted(cache_on.iterdir())
    import draftwise.disk_cache as disk_cache

    code = disk_cache.code_identity()
    monkeypatch.setattr(disk_cache, "code_identity", lambda: {**code, "version": "next"})
    _load_and_wait(str(a.path))  # a rebuilt install: its own file, the old one deleted
    new = sorted(cache_on.iterdir())
    assert len(new) == 2 and not set(new) & set(old)


def test_first_start_runs_on_the_file_it_writes_with_the_bits_of_the_arena(
        tiny_gguf, cache_on: Path, monkeypatch) -> None:
    """A first start packs into the cache file and runs on its mapping: the same packed
    bytes and the same logits as packing into memory with the cache off, and as a later
    start mapping the file; no arena is faulted ahead, no temporary file is left."""
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False,
                  tensor_types=Q4_K_M, **SHAPE)
    monkeypatch.setenv(packed_cache.ENV, "0")
    in_memory = load_model(str(t.path)).model
    monkeypatch.setenv(packed_cache.ENV, "1")
    created = []
    create = packed_cache.PackedFile.create
    monkeypatch.setattr(packed_cache.PackedFile, "create",
                        classmethod(lambda cls, key, n: created.append(key) or create(key, n)))
    ahead = prefault_for_gguf(str(t.path))  # the first start fills no arena: it packs the file
    assert isinstance(ahead, EarlyPack)
    first = load_model(str(t.path), reserved=ahead).model
    assert len(created) == 1  # the early packing's file, taken: the loader packed nothing
    data = next(cache_on.glob("*.bin"))
    seg = first.decoder_layers()[0].qkv_weight.segments[0]
    with open("/proc/self/maps") as maps:  # the weights are the file's mapping, not memory
        mapped = [line for line in maps if line.rstrip().endswith(str(data))]
    assert mapped and any(int(r.split()[0].split("-")[0], 16) <= seg.data.data_ptr()
                          < int(r.split()[0].split("-")[1], 16) for r in mapped)
    second = load_model(str(t.path)).model
    assert _packed_bytes(first) == _packed_bytes(in_memory) == _packed_bytes(second)
    want = logits(in_memory, IDS)
    assert torch.equal(logits(first, IDS), want) and torch.equal(logits(second, IDS), want)
    assert sorted(p.suffix for p in cache_on.iterdir()) == [".bin", ".json"]


def test_a_write_that_fails_leaves_no_file_and_loads_the_same_model(
        tiny_gguf, cache_on: Path, monkeypatch, caplog) -> None:
    """A disk that fills up mid-write: a warning, the weights packed into memory instead
    (the same logits), and nothing a later start could map (no data file, no sidecar, no
    temporary file); that later start packs again and writes the file whole."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True,
                  tensor_types=Q4_K_M, **SHAPE)
    write = packed_cache.PackedFile.write
    calls = []

    def full_disk(self, offset, chunk):
        calls.append(offset)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        write(self, offset, chunk)

    monkeypatch.setattr(packed_cache.PackedFile, "write", full_disk)
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        model = load_model(str(t.path)).model
    assert "not cached" in caplog.text and "No space left" in caplog.text
    assert len(calls) >= 4 and not list(cache_on.iterdir())
    assert not packed_cache.cached_for(str(t.path))
    monkeypatch.setattr(packed_cache.PackedFile, "write", write)
    again = load_model(str(t.path)).model
    assert packed_cache.cached_for(str(t.path))
    assert torch.equal(logits(again, IDS), logits(model, IDS))


def test_a_disk_without_room_refuses_before_packing(tiny_gguf, cache_on: Path, monkeypatch,
                                                    caplog) -> None:
    """The file is reserved whole before any packing: without room, nothing is packed
    twice and nothing is left, and the model loads from memory."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)

    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(packed_cache.os, "posix_fallocate", no_room)
    streamed = []
    monkeypatch.setattr(packed_cache.PackedFile, "write",
                        lambda self, offset, chunk: streamed.append(offset))
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        load_model(str(t.path))
    assert "not cached" in caplog.text and not streamed
    assert not list(cache_on.iterdir())


def test_two_loads_at_once_write_one_whole_file(tiny_gguf, cache_on: Path, monkeypatch) -> None:
    """Two loads of one model writing at the same time (two processes starting together,
    here two threads: each its own temporary file) leave one data file and its sidecar,
    which a third load maps, and both run the same bits."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True,
                  tensor_types=Q4_K_M, **SHAPE)
    both_writing = threading.Barrier(2, timeout=20)
    finish = packed_cache.PackedFile.finish

    def together(self):
        both_writing.wait()  # breaks (and the test fails) unless both are mid-write
        return finish(self)

    monkeypatch.setattr(packed_cache.PackedFile, "finish", together)
    with ThreadPoolExecutor(2) as pool:
        models = list(pool.map(lambda _: load_model(str(t.path)).model, range(2)))
    monkeypatch.setattr(packed_cache.PackedFile, "finish", finish)
    assert sorted(p.suffix for p in cache_on.iterdir()) == [".bin", ".json"]
    mapped: list[torch.Tensor | None] = []
    load = packed_cache.load
    monkeypatch.setattr(packed_cache, "load", lambda key, n: mapped.append(load(key, n))
                        or mapped[-1])
    third = load_model(str(t.path)).model
    assert len(mapped) == 1 and mapped[0] is not None
    want = logits(third, IDS)
    assert all(torch.equal(logits(m, IDS), want) for m in models)


def test_a_first_start_hands_the_ggufs_page_cache_to_the_file_it_writes(
        tiny_gguf, cache_on: Path, monkeypatch) -> None:
    """Writing the cache file, the packer drops each packed tensor's GGUF pages from the
    page cache (their memory becomes the file's, ``GGUFFile.release(evict=True)``): every
    quantized tensor's whole pages are advised away, and nothing outside the tensors. A
    start that maps the file, or runs without the cache, drops nothing (it would make the
    next start without a cache read the GGUF from disk)."""
    import mmap
    import os

    from draftwise.formats.gguf_file import GGUFFile

    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False,
                  tensor_types=Q4_K_M, **SHAPE)
    dropped: list[tuple[int, int]] = []
    advise = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            dropped.append((offset, offset + length))
        advise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    want = logits(_load_and_wait(str(t.path)), IDS)
    file = GGUFFile(str(t.path))
    quantized = [i for i in file.tensors.values() if i.qtype not in (Q.F32, Q.F16)]
    assert quantized and dropped
    page = mmap.PAGESIZE
    for info in quantized:  # each quantized tensor's whole pages are dropped
        first = -(-info.offset // page) * page
        last = (info.offset + info.nbytes) // page * page
        covered = sorted(r for r in dropped if r[1] > first and r[0] < last)
        at = first
        for lo, hi in covered:
            assert lo <= at, f"{info.name}: bytes {at}..{lo} kept"
            at = max(at, hi)
        assert at >= last, f"{info.name}: bytes {at}..{last} kept"
    header_end = min(i.offset for i in file.tensors.values())
    assert all(lo >= header_end - header_end % page for lo, _ in dropped)  # never the header
    dropped.clear()
    again = logits(_load_and_wait(str(t.path)), IDS)  # maps the file: reads nothing, drops nothing
    assert dropped == [] and torch.equal(want, again)
    monkeypatch.setenv(packed_cache.ENV, "0")
    off = logits(_load_and_wait(str(t.path)), IDS)  # packs in memory, every start: drops nothing
    assert dropped == [] and torch.equal(want, off)


def test_an_early_packing_under_another_key_is_not_taken(tiny_gguf, cache_on: Path,
                                                          monkeypatch) -> None:
    """The loader takes an early start's file only under its own cache key (here the
    build changed between the two: another plan would do the same); the early file is
    deleted, the loader writes its own, and the model runs the bits of one packed in
    memory."""
    from draftwise import disk_cache

    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True,
                  tensor_types=Q4_K_M, **SHAPE)
    monkeypatch.setenv(packed_cache.ENV, "0")
    want = logits(load_model(str(t.path)).model, IDS)
    monkeypatch.setenv(packed_cache.ENV, "1")
    ahead = prefault_for_gguf(str(t.path))
    assert isinstance(ahead, EarlyPack)
    code = disk_cache.code_identity()
    for _ in range(2000):  # its key made (it does not read the build again after that)
        if ahead.key is not None:
            break
        time.sleep(0.005)
    monkeypatch.setattr(disk_cache, "code_identity", lambda: {**code, "version": "next"})
    model = load_model(str(t.path), reserved=ahead).model
    assert ahead.key is not None and ahead.key["code"] == code
    assert sorted(p.suffix for p in cache_on.iterdir()) == [".bin", ".json"]
    side = next(cache_on.glob("*.json"))
    assert json.loads(side.read_text())["key"]["code"]["version"] == "next"
    assert torch.equal(logits(model, IDS), want)


def test_an_early_packing_nobody_takes_leaves_nothing(tiny_gguf, cache_on: Path) -> None:
    """Handed back untaken (the command's options differed, or it failed first), an early
    start's file is deleted and the GIL switch interval is what it was."""
    import os
    import sys

    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    before = sys.getswitchinterval()
    ahead = prefault_for_gguf(str(t.path))
    assert isinstance(ahead, EarlyPack) and sys.getswitchinterval() <= 1e-4
    assert ahead.take({}) is None and ahead.tried  # written whole, under another key
    assert [p.suffix.startswith(f".tmp{os.getpid()}-") for p in cache_on.iterdir()] == [True]
    ahead.finish()
    ahead.finish()
    assert sys.getswitchinterval() == before
    assert not list(cache_on.iterdir()) and not packed_cache.cached_for(str(t.path))


def test_an_early_packing_on_a_full_disk_warns_once_and_packs_in_memory(
        tiny_gguf, cache_on: Path, monkeypatch, caplog) -> None:
    """A disk without room refuses the early start's file (one warning); the loader does
    not try again under the same key, packs into memory, and leaves nothing."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True,
                  tensor_types=Q4_K_M, **SHAPE)
    monkeypatch.setenv(packed_cache.ENV, "0")
    want = logits(load_model(str(t.path)).model, IDS)
    monkeypatch.setenv(packed_cache.ENV, "1")

    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(packed_cache.os, "posix_fallocate", no_room)
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        model = load_model(str(t.path), reserved=prefault_for_gguf(str(t.path))).model
    assert caplog.text.count("not cached") == 1 and "No space left" in caplog.text
    assert not list(cache_on.iterdir())
    assert torch.equal(logits(model, IDS), want)


def test_a_cached_model_begins_nothing_ahead(tiny_gguf, cache_on: Path) -> None:
    """Once the file is there, a start maps it: nothing is packed or faulted ahead."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    ahead = prefault_for_gguf(str(t.path))
    load_model(str(t.path), reserved=ahead)
    assert packed_cache.cached_for(str(t.path)) and prefault_for_gguf(str(t.path)) is None


def test_a_command_that_fails_before_its_load_leaves_no_early_file(tiny_gguf, cache_on: Path,
                                                                   monkeypatch) -> None:
    """``draftwise generate`` begins the early packing before it parses its options; one
    that then refuses them (no prompt) never loads, and at exit the file it began is
    deleted (``EarlyPack.finish`` at exit), not left for the next write to find."""
    import os
    import subprocess
    import sys

    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    env = {**os.environ, packed_cache.ENV: "1"}
    script = "import sys; from draftwise.cli import main; sys.argv[0] = 'draftwise'; main()"
    run = subprocess.run([sys.executable, "-c", script, "generate", "--model", str(t.path)],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode != 0 and "--prompt" in run.stderr
    assert not cache_on.exists() or not list(cache_on.iterdir())
