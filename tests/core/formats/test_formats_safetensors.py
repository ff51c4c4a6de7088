"""HF safetensors directories: sharded and not, and the typed errors for broken ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from draftwise.formats.errors import (
    MissingTensorError,
    ModelFormatError,
    TensorShapeError,
    TruncatedFileError,
    UnexpectedTensorError,
    UnsupportedArchitectureError,
)
from draftwise.formats.safetensors_dir import SafetensorsCheckpoint, read_header
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.loader import load_model
from safetensors.torch import load_file, save_file


def save_tiny_llama(directory: Path, shard: str | None = None) -> Path:
    """A random tiny Llama saved by transformers (optionally sharded)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(directory, **kwargs)
    return directory


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("sharded"), shard="40KB")


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    kv = KVCache.allocate(model.num_layers, 8, 4, model.num_kv_heads, model.head_dim, model.dtype)
    batch = build_forward_batch([ids], [0], [list(range(8))], 4, [list(range(len(ids)))])
    return model(batch, kv).logits


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_sharded_and_plain_read_the_same_tensors(plain_dir: Path, sharded_dir: Path) -> None:
    assert (sharded_dir / "model.safetensors.index.json").exists()
    assert len(list(sharded_dir.glob("*.safetensors"))) > 1
    plain, sharded = SafetensorsCheckpoint(plain_dir), SafetensorsCheckpoint(sharded_dir)
    assert {n: t.shape for n, t in plain.tensors.items()} == {
        n: t.shape for n, t in sharded.tensors.items()
    }
    a = dict(plain.iter_tensors(sorted(plain.tensors)))
    b = dict(sharded.iter_tensors(sorted(sharded.tensors)))
    assert all(torch.equal(a[n], b[n]) for n in a)
    ids = [3, 17, 99, 5, 64]
    la = logits(load_model(str(plain_dir), dtype="float32").model, ids)
    lb = logits(load_model(str(sharded_dir), dtype="float32").model, ids)
    assert torch.equal(la, lb)


def test_misshaped_tensor(plain_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(plain_dir, tmp_path / "bad")
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.zeros(16, 64)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TensorShapeError) as err:
        load_model(str(d))
    msg = str(err.value)
    assert f"model.safetensors:{name}" in msg and "[16, 64]" in msg and "[32, 64]" in msg
    assert str(d) in msg


def test_missing_and_unexpected_tensors(plain_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(plain_dir, tmp_path / "missing")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(MissingTensorError, match="model.layers.0.mlp.up_proj.weight"):
        load_model(str(d))
    d2 = copy_dir(plain_dir, tmp_path / "extra")
    tensors = load_file(d2 / "model.safetensors")
    tensors["model.layers.0.mlp.experts.0.weight"] = torch.zeros(2)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # tolerated
    save_file(tensors, d2 / "model.safetensors")
    with pytest.raises(UnexpectedTensorError) as err:
        load_model(str(d2))
    assert err.value.tensors == ["model.layers.0.mlp.experts.0.weight"]


def test_truncated_shard_names_the_tensor(sharded_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(sharded_dir, tmp_path / "cut")
    shard = max(d.glob("*.safetensors"))
    last = max(read_header(str(shard)).values(), key=lambda t: t.end)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(TruncatedFileError) as err:
        load_model(str(d))
    assert str(shard) in str(err.value) and repr(last.name) in str(err.value)
    assert err.value.tensor == last.name


def test_index_pointing_at_missing_shard(sharded_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(sharded_dir, tmp_path / "lost")
    min(d.glob("*.safetensors")).unlink()
    with pytest.raises(ModelFormatError, match="missing"):
        load_model(str(d))


@pytest.mark.parametrize(
    ("arch", "match"),
    [
        ("GPTNeoXForCausalLM", "unknown architecture"),
        ("MixtralForCausalLM", "mixture-of-experts"),
        ("Qwen3_5MoeForCausalLM", "mixture-of-experts"),
    ],
)
def test_unsupported_architecture_before_reading_weights(
    plain_dir: Path, tmp_path: Path, arch: str, match: str
) -> None:
    d = tmp_path / arch
    d.mkdir()
    config = json.loads((plain_dir / "config.json").read_text())
    config["architectures"] = [arch]
    (d / "config.json").write_text(json.dumps(config))  # and no weights at all
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(str(d))
    msg = str(err.value)
    assert repr(arch) in msg and match in msg
    assert "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="exactly one .gguf"):
        load_model(str(tmp_path))
    with pytest.raises(ModelFormatError, match="no such"):
        load_model(str(tmp_path / "nope.gguf"))
