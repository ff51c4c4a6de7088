"""Loading GGUF models with their weights kept quantized (``models.gguf_weights``).

Tiny files in the real layout (``tests/tiny_gguf.py``), Q4_K_M-style type mixes: the
bf16 model runs every projection, the embedding and the LM head from the stored blocks,
gives logits as close to the fp32 (dequantized) model as the dequantized bf16 model
does, never silently dequantizes a type, and refuses truncated or mis-typed tensors by
name.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from draftwise.formats.errors import (
    ModelFormatError,
    TruncatedFileError,
    UnsupportedTensorTypeError,
)
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.models import backend
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.loader import load_model
from draftwise.models.quant import QuantWeight, quant_kernels_available
from gguf import GGMLQuantizationType as Q
from tiny_gguf import retype

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")

#: what llama.cpp's Q4_K_M writes (attn_v and ffn_down one step up), at K-quant widths
Q4_K_M = {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K, "output": Q.Q6_K}
SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512}


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    kv = KVCache.allocate(model.num_layers, 16, 4, model.num_kv_heads, model.head_dim, model.dtype)
    batch = build_forward_batch([ids], [0], [list(range(15, -1, -1))], 4, [list(range(len(ids)))])
    return model(batch, kv).logits


IDS = [5, 40, 77, 200, 13, 9, 260, 100, 3, 1, 44, 61]


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen2", False)])
def test_q4_k_m_model_runs_quantized_and_as_close_as_bf16(tiny_gguf, monkeypatch, arch, tied):
    t = tiny_gguf(arch=arch, matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=tied,
                  tensor_types=Q4_K_M, **SHAPE)
    loaded = load_model(str(t.path))
    quant = loaded.model
    assert quant.weight_backend == "quant" and loaded.notices == ()
    assert isinstance(quant.embed_weight, QuantWeight)
    layer = quant.decoder_layers()[0]
    assert layer.qkv_weight.qtypes == ("Q4_K", "Q6_K") and layer.down_weight.qtypes == ("Q6_K",)
    if not tied:
        assert quant.lm_head_weight.qtypes == ("Q6_K",)
    ref = logits(load_model(str(t.path), dtype="float32").model, IDS)
    monkeypatch.setenv(backend.QUANT_ENV, "0")
    dense = load_model(str(t.path), dtype="bfloat16").model
    assert dense.weight_backend != "quant"
    dense_err = (logits(dense, IDS) - ref).abs().max().item()
    quant_err = (logits(quant, IDS) - ref).abs().max().item()
    # int8 activation blocks round ~4x coarser than bf16 (RMS amax/440 against 2^-9/sqrt(3)
    # of the value); a wrong row order, scale or type is O(1).
    # Q4_K and Q6_K take int8 activation blocks of 256 (llama.cpp's Q8_K, one scale per
    # super-block: coarser still where a block's values are small next to its largest):
    # measured 0.09 (qwen2) and 0.36 (llama) against the bf16 model's 0.06-0.07 (blocks
    # of 32 for every type measured 0.12-0.14); the kernels' own tests bound each type
    # to 1e-6 of its exact int8 arithmetic, so this guards the model's wiring
    assert quant_err < 7 * dense_err + 0.05, (quant_err, dense_err)


def test_quantized_embedding_is_the_dequantized_table(tiny_gguf) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, **SHAPE)
    model = load_model(str(t.path)).model
    ids = torch.tensor([3, 0, 270, 3])
    table = torch.from_numpy(t.hf["model.embed_tokens.weight"])  # Q8_0-quantized fp32
    stored = GGUFCheckpoint(t.path).load_hf("token_embd.weight", 4, 2)
    assert torch.equal(model.embed(ids), stored[ids].bfloat16())
    assert (stored - table).abs().max() < 5e-3
    assert model.lm_head_weight is model.embed_weight  # tied: one quantized table


def test_dequantized_types_are_named_with_their_share(tiny_gguf, caplog) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, tensor_types={"attn_output": Q.IQ4_NL},
                  **SHAPE)
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        loaded = load_model(str(t.path))
    assert len(loaded.notices) == 1 and "IQ4_NL" in loaded.notices[0]
    assert "% of the weight bytes" in loaded.notices[0]
    assert any("IQ4_NL" in r.getMessage() for r in caplog.records)
    layer = loaded.model.decoder_layers()[0]
    assert isinstance(layer.qkv_weight, QuantWeight) and not isinstance(layer.o_weight, QuantWeight)
    assert "quant" in loaded.model.weight_backend and "+" in loaded.model.weight_backend


def test_quant_env_and_dtype_choices(tiny_gguf, monkeypatch) -> None:
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q8_0)
    fp32 = load_model(str(t.path), dtype="float32")
    assert fp32.model.weight_backend == "dense" and "dtype float32" in fp32.notices[0]
    monkeypatch.setenv(backend.QUANT_ENV, "native")
    # Q8_0 projections quantized; the tied F16 embedding is bf16, its LM head packed for
    # the bf16 GEMM where the C kernels are built (else dense)
    from draftwise.models import linear as lin

    head = "native" if lin.native_available() else "dense"
    assert load_model(str(t.path)).model.weight_backend == f"quant+{head}"
    with pytest.raises(ValueError, match="native cannot run: dtype float32"):
        load_model(str(t.path), dtype="float32")
    monkeypatch.setenv(backend.QUANT_ENV, "fast")
    with pytest.raises(ValueError, match="auto, native or 0"):
        load_model(str(t.path))


def test_truncated_quantized_tensor_names_the_tensor(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q4_K, **SHAPE)
    info = GGUFCheckpoint(t.path)._tensors["blk.1.ffn_up.weight"]
    cut = tmp_path / "cut.gguf"
    shutil.copy(t.path, cut)
    with open(cut, "r+b") as fh:
        fh.truncate(info.offset + info.nbytes // 2)
    with pytest.raises(TruncatedFileError, match="blk.1.ffn_up.weight") as err:
        load_model(str(cut))
    assert err.value.expected_end == info.offset + info.nbytes


def _retype(src: Path, dst: Path, tensor: str, type_id: int) -> None:
    """Copy a GGUF, changing one tensor's declared type id in its tensor info."""
    retype(src, dst, [tensor], type_id)


def test_mistyped_quantized_tensor_is_a_named_error(tiny_gguf, tmp_path: Path) -> None:
    t = tiny_gguf(arch="llama", matrix_type=Q.Q8_0)  # rows of 64: not whole K-quant blocks
    bad = tmp_path / "bad.gguf"
    _retype(t.path, bad, "blk.0.attn_q.weight", int(Q.Q4_K))
    with pytest.raises(ModelFormatError, match=r"'blk.0.attn_q.weight' is Q4_K.*not a multiple of the block"):
        load_model(str(bad))
    _retype(t.path, bad, "blk.0.attn_q.weight", 99)
    with pytest.raises(UnsupportedTensorTypeError, match="blk.0.attn_q.weight"):
        load_model(str(bad))


def test_packed_bytes_are_the_stored_bytes(tiny_gguf) -> None:
    """Nothing is widened: the arena holds the file's blocks (tiles pad rows to 8)."""
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False,
                  tensor_types=Q4_K_M, **SHAPE)
    ckpt = GGUFCheckpoint(t.path)
    names = [n for n in ckpt.tensor_names
             if len(ckpt.info(n).shape) == 2 and n != "token_embd.weight"]
    stored = sum(ckpt.nbytes(n) for n in names)
    padding = sum(7 * ckpt.nbytes(n) // ckpt.info(n).shape[0] for n in names)
    model = load_model(str(t.path)).model
    assert stored <= model.weight_bytes <= stored + padding
