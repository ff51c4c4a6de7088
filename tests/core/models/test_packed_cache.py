"""The packed-weights file cache (``models.packed_cache``): a second load maps the bytes
the first one packed, and a file that is not exactly those bytes is never used."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from draftwise.models import packed_cache
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
    model = load_model(path).model
    for thread in __import__("threading").enumerate():  # the background write
        if thread.name == "draftwise-packed-cache":
            thread.join()
    return model


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


def test_two_engines_loading_one_model_write_it_once(tiny_gguf, cache_on: Path, monkeypatch,
                                                     caplog) -> None:
    """A process that loads the same model twice before the first write ends (a benchmark
    building several engines) writes the file once: one notice, one file, no warning."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=True, **SHAPE)
    gate = __import__("threading").Event()
    store = packed_cache.store

    def slow_store(key, arena):
        gate.wait(10)
        return store(key, arena)

    monkeypatch.setattr(packed_cache, "store", slow_store)
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        load_model(str(t.path))
        load_model(str(t.path))  # the first write is still held at the gate
        gate.set()
        for thread in __import__("threading").enumerate():  # every writer, to its end
            if thread.name == "draftwise-packed-cache":
                thread.join()
    assert caplog.text.count("writing packed weights to") == 1
    assert "not cached" not in caplog.text
    assert len(list(cache_on.glob("*.bin"))) == 1 and not list(cache_on.glob("*.tmp*"))
