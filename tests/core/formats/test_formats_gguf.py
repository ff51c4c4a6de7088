"""GGUF reading: metadata, dequantization, Q/K un-permutation, typed errors, and an
end-to-end check against transformers loading the same file."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from draftwise.formats.errors import (
    ModelFormatError,
    TensorShapeError,
    TruncatedFileError,
    UnexpectedTensorError,
    UnsupportedArchitectureError,
)
from draftwise.formats.gguf import GGUFCheckpoint, hf_name, unpermute_qk
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.config import ModelConfig
from draftwise.models.loader import load_model
from gguf import GGMLQuantizationType as Q


def prefill_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logits of every position from one prefill over a scattered block table."""
    kv = KVCache.allocate(model.num_layers, 16, 4, model.num_kv_heads, model.head_dim, model.dtype)
    table = list(range(15, -1, -1))
    batch = build_forward_batch([ids], [0], [table], 4, [list(range(len(ids)))])
    return model(batch, kv).logits


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation, written out independently of the code under test."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(8 * 64 * 3, dtype=np.float32).reshape(8 * 64, 3)
    for heads in (1, 2, 8):
        assert np.array_equal(unpermute_qk(permute_qk(w, heads), heads), w)
    bias = np.arange(128, dtype=np.float32)
    assert np.array_equal(unpermute_qk(permute_qk(bias, 4), 4), bias)
    assert not np.array_equal(permute_qk(w, 8), w)


def test_names_map_to_hf() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.attn_k.bias") == "model.layers.12.self_attn.k_proj.bias"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("blk.0.attn_q_norm.weight") == "model.layers.0.self_attn.q_norm.weight"
    assert hf_name("blk.0.ffn_gate_exps.weight") is None


@pytest.mark.parametrize("matrix_type", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.BF16, Q.F16, Q.F32])
def test_dequantize_and_unpermute_match_reference(tiny_gguf, matrix_type: Q) -> None:
    t = tiny_gguf(arch="llama", matrix_type=matrix_type, embed_type=Q.Q8_0)
    ckpt = GGUFCheckpoint(t.path)
    reader = gguf.GGUFReader(t.path)
    for rt in reader.tensors:
        target = hf_name(rt.name)
        ref = np.asarray(gguf.quants.dequantize(rt.data, rt.tensor_type), dtype=np.float32)
        ref = ref.reshape(ckpt.info(rt.name).shape)
        kind = rt.name.split(".")[-2]
        if kind == "attn_q":
            ref = unpermute_qk(ref, 4)
        elif kind == "attn_k":
            ref = unpermute_qk(ref, 2)
        got = ckpt.load_hf(rt.name, num_heads=4, num_kv_heads=2).numpy()
        assert got.dtype == np.float32 and np.array_equal(got, ref), rt.name
        # and the reference is the original HF weight up to quantization error
        original = t.hf[target]
        tol = {Q.F32: 0, Q.F16: 1e-3, Q.BF16: 3e-3, Q.Q8_0: 5e-3, Q.Q5_1: 3e-2}.get(
            t.qtype[rt.name], 6e-2
        )
        assert np.abs(got - original).max() <= tol, (rt.name, t.qtype[rt.name])


def test_qwen2_is_not_unpermuted(tiny_gguf) -> None:
    t = tiny_gguf(arch="qwen2", matrix_type=Q.F32, tied=False)
    ckpt = GGUFCheckpoint(t.path)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.1.attn_q.bias"):
        got = ckpt.load_hf(name, num_heads=4, num_kv_heads=2).numpy()
        assert np.array_equal(got, t.hf[hf_name(name)]), name


def test_config_from_metadata(tiny_gguf) -> None:
    t = tiny_gguf(arch="qwen2", tied=False)
    ckpt = GGUFCheckpoint(t.path)
    cfg = ModelConfig.from_gguf_metadata(ckpt.metadata, ckpt.tensor_names, str(t.path))
    assert cfg.architecture == "Qwen2ForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (2, 16, 128)
    assert cfg.attention_bias and not cfg.o_proj_bias and not cfg.tie_word_embeddings
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    tied = GGUFCheckpoint(tiny_gguf(arch="llama", tied=True).path)
    assert ModelConfig.from_gguf_metadata(tied.metadata, tied.tensor_names).tie_word_embeddings


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_loaded_gguf_matches_transformers(tiny_gguf, arch: str) -> None:
    from transformers import AutoModelForCausalLM

    # transformers' qwen3 GGUF config ignores key_length and assumes head_dim 128
    shape = {"hidden": 512, "heads": 4, "kv_heads": 2} if arch == "qwen3" else {}
    t = tiny_gguf(arch=arch, matrix_type=Q.Q8_0, embed_type=Q.Q8_0, tied=arch != "qwen2", **shape)
    ours = load_model(str(t.path), dtype="float32")
    assert ours.format == "gguf" and ours.config.model_type == arch
    hf = AutoModelForCausalLM.from_pretrained(
        t.path.parent, gguf_file=t.path.name, dtype=torch.float32
    ).eval()
    ids = [5, 40, 77, 200, 13, 9, 260, 100, 3, 1]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = prefill_logits(ours.model, ids)
    assert (got - ref).abs().max().item() < 1e-4


def test_truncated_file_names_the_tensor(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.F32)
    reader = gguf.GGUFReader(t.path)
    victim = reader.tensors[5]
    cut = tmp_path / "cut.gguf"
    shutil.copy(t.path, cut)
    with open(cut, "r+b") as fh:
        fh.truncate(victim.data_offset + victim.n_bytes // 2)
    with pytest.raises(TruncatedFileError) as err:
        load_model(str(cut))
    msg = str(err.value)
    assert str(cut) in msg and repr(victim.name) in msg and "truncated" in msg
    assert err.value.expected_end == victim.data_offset + victim.n_bytes


def test_truncated_header_and_not_gguf(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf()
    cut = tmp_path / "head.gguf"
    cut.write_bytes(t.path.read_bytes()[:200])
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        GGUFCheckpoint(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        GGUFCheckpoint(junk)


def test_unknown_and_refused_architectures(tiny_gguf) -> None:
    path = tiny_gguf(arch="mamba").path
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(str(path))
    assert "'mamba'" in str(err.value) and "LlamaForCausalLM" in str(err.value)
    assert "gguf:qwen2" in str(err.value)
    with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts"):
        load_model(str(tiny_gguf(arch="qwen3moe").path))
    moe = tiny_gguf(arch="llama", extra_kv={"llama.expert_count": 8})
    with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts"):
        load_model(str(moe.path))


def test_misshaped_tensor_names_gguf_tensor(tiny_gguf) -> None:
    t = tiny_gguf(arch="llama", declared_ffn=96)  # tensors are 128 wide
    with pytest.raises(TensorShapeError) as err:
        load_model(str(t.path))
    msg = str(err.value)
    assert str(t.path) in msg and "'blk.0." in msg and "[96, 64]" in msg and "[128, 64]" in msg


def test_unexpected_tensor_is_refused(tiny_gguf) -> None:
    t = tiny_gguf(arch="llama", extra_tensor="blk.0.ffn_gate_inp.weight")
    with pytest.raises(UnexpectedTensorError, match="ffn_gate_inp"):
        load_model(str(t.path))


def test_progress_callback_sees_every_tensor(tiny_gguf) -> None:
    t = tiny_gguf()
    seen: list[tuple[int, int, str]] = []
    load_model(str(t.path), progress=lambda done, total, name: seen.append((done, total, name)))
    assert seen and seen[-1][0] == seen[-1][1] == len(t.hf)
    assert [s[0] for s in seen] == list(range(1, len(t.hf) + 1))


@pytest.mark.default_model
def test_default_model_file_layout(tmp_path: Path) -> None:
    from draftwise.formats.default_model import default_model_path

    path = default_model_path()
    ckpt = GGUFCheckpoint(path)
    types = [ckpt.info(n).qtype for n in ckpt.tensor_names]
    assert types.count("Q4_1") == 210 and types.count("F32") == 61 and types.count("Q8_0") == 1
    assert ckpt.info("token_embd.weight").qtype == "Q8_0"
    assert "output.weight" not in ckpt.tensor_names
    cut = tmp_path / "cut.gguf"
    with open(path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(50_000_000))
    with pytest.raises(TruncatedFileError, match="blk"):
        GGUFCheckpoint(cut)
