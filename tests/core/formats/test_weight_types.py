"""The weight-type table (``formats.weight_types``): one record per type, read by the
GGUF header, the reader, the load plan, the packer and the backend line.

The end-to-end tests register a type in ONE place (a ``register`` call in the test) and
load a tiny GGUF whose tensors declare it, touching no other module: a copy of Q8_0
under a number no GGML type has, run by Q8_0's kernel (bitwise the Q8_0 model's logits;
greedy decode equal to the dequantized fp32 reference at fp32 and to the Q8_0 model on
the kernel), and one with no kernel (dequantized at load, with a notice that names it).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from draftwise import LLM, SamplingParams
from draftwise.formats.errors import ModelFormatError, UnsupportedTensorTypeError
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.formats.weight_types import (
    NVFP4,
    UnknownWeightTypeError,
    WeightType,
    WeightTypeError,
    register,
    registered,
    weight_type,
    weight_types,
)
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.loader import load_model
from draftwise.models.quant import QuantWeight, quant_kernels_available
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from tiny_gguf import retype

#: numbers no GGML type has (gguf-py's end below 64)
COPY, SLOW = 1000, 1001


def q8_0_copy(number: int = COPY, kernel: int | None = int(Q.Q8_0)) -> WeightType:
    """Q8_0's blocks under a new number: the one registration a new type needs."""
    q8 = weight_type(Q.Q8_0)
    return WeightType(number, "Q8_0_COPY" if kernel is not None else "Q8_0_SLOW",
                      block_k=q8.block_k, block_bytes=q8.block_bytes, kernel=kernel,
                      dequantize=q8.dequantize)


def test_builtin_types_are_gguf_py_layouts() -> None:
    known = {int(t): t for t in weight_types()}
    for member, (block, size) in GGML_QUANT_SIZES.items():
        t = known[int(member)]
        assert (t, t.name, t.block_k, t.block_bytes, t.container) == (
            member, member.name, block, size, "gguf")
    native = [t.name for t in weight_types() if t.native]
    assert native == ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                      "Q5_K", "Q6_K", "NVFP4"]
    assert all(t.kernel == int(t) for t in weight_types() if t.native)
    assert [t.name for t in weight_types() if t.dense] == ["F32", "F16", "F64", "BF16"]
    assert [t.name for t in weight_types() if t.refusal] == ["I8", "I16", "I32", "I64"]


def test_packed_sizes() -> None:
    # tiles of 8 rows: GGUF blocks as stored; NVFP4: 32 bytes of multipliers + 144 per 32
    assert weight_type(Q.Q4_K).packed_bytes(9, 512) == 2 * 8 * 2 * 144
    assert NVFP4.packed_bytes(9, 64) == 2 * (32 + 2 * 144)
    assert NVFP4.container == "safetensors" and NVFP4.kernel == 256


def test_registration_refuses_what_would_mean_two_things() -> None:
    with pytest.raises(WeightTypeError, match="registered under that number"):
        register(q8_0_copy(number=int(Q.Q4_K)))
    q4 = weight_type(Q.Q4_0)  # 32 in 18 bytes, not Q8_0's 34
    with pytest.raises(WeightTypeError, match="would read other bytes"):
        register(WeightType(COPY, "BAD", block_k=32, block_bytes=q4.block_bytes,
                            kernel=int(Q.Q8_0)))
    with pytest.raises(WeightTypeError, match="no registered type runs"):
        register(WeightType(COPY, "BAD", block_k=32, block_bytes=34, kernel=int(Q.IQ4_NL)))
    with pytest.raises(WeightTypeError, match="container"):
        WeightType(COPY, "BAD", block_k=32, block_bytes=34, container="onnx")
    with pytest.raises(UnknownWeightTypeError):
        weight_type(COPY)
    with pytest.raises(AttributeError, match="frozen"):
        weight_type(Q.Q8_0).kernel = 12  # type: ignore[misc]


def test_registered_is_scoped_and_pickles_as_its_number() -> None:
    with registered(q8_0_copy()) as t:
        assert weight_type(COPY) is t and pickle.loads(pickle.dumps(t)) is t
    with pytest.raises(UnknownWeightTypeError):
        weight_type(COPY)
    assert pickle.loads(pickle.dumps(weight_type(Q.Q4_K))) is weight_type(Q.Q4_K)


@pytest.fixture
def q8_file(tiny_gguf, tmp_path: Path) -> tuple[Path, Path]:
    """(a Q8_0 model, the same file with every Q8_0 tensor declared as number COPY)."""
    t = tiny_gguf(arch="llama", matrix_type=Q.Q8_0, embed_type=Q.Q8_0, tied=False,
                  hidden=64, heads=4, kv_heads=2, ffn=128)
    ckpt = GGUFCheckpoint(t.path)
    q8 = [n for n in ckpt.tensor_names if ckpt.qtype(n) == Q.Q8_0]
    assert len(q8) > 10
    other = tmp_path / "retyped.gguf"
    retype(t.path, other, q8, COPY)
    return t.path, other


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:  # [T, vocab]
    kv = KVCache.allocate(model.num_layers, 16, 4, model.num_kv_heads, model.head_dim, model.dtype)
    batch = build_forward_batch([ids], [0], [list(range(15, -1, -1))], 4, [list(range(len(ids)))])
    return model(batch, kv).logits


IDS = [5, 40, 77, 200, 13, 9, 260, 100, 3, 1, 44, 61]
PROMPTS = [[5, 40, 77, 200, 13, 9], [260, 100, 3, 1, 44, 61, 8, 8]]


def _greedy(path: Path, dtype: str) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(model=str(path), dtype=dtype)
    return [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params)]


def test_an_unregistered_number_is_refused_by_name(q8_file) -> None:
    with pytest.raises(UnsupportedTensorTypeError, match="#1000"):
        GGUFCheckpoint(q8_file[1])


@pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")
def test_a_type_registered_in_one_place_loads_and_runs_natively(q8_file) -> None:
    stock, retyped = q8_file
    reference = _greedy(stock, "float32")  # every weight dequantized to fp32
    with registered(q8_0_copy()):
        loaded = load_model(str(retyped))
        model = loaded.model
        assert loaded.notices == () and "quant" in model.weight_backend
        layer = model.decoder_layers()[0]
        assert isinstance(layer.qkv_weight, QuantWeight)
        assert layer.qkv_weight.qtypes == ("Q8_0_COPY",)
        assert model.lm_head_weight.qtypes == ("Q8_0_COPY",)
        # Q8_0's kernel on the same bytes: the Q8_0 model's logits, bit for bit
        assert torch.equal(_logits(model, IDS), _logits(load_model(str(stock)).model, IDS))
        # greedy: at fp32 (its dequantization) the dequantized-fp32 reference's tokens; at
        # bf16 (the kernel, int8 activations) the Q8_0 model's. The two differ from each
        # other on this random model (a near-tie in prompt 2), as the Q8_0 model's do
        assert _greedy(retyped, "float32") == reference
        assert _greedy(retyped, "bfloat16") == _greedy(stock, "bfloat16")
    with pytest.raises(UnsupportedTensorTypeError):
        load_model(str(retyped))


def test_a_type_with_no_kernel_is_dequantized_with_a_notice(q8_file, caplog) -> None:
    stock, retyped = q8_file
    with registered(q8_0_copy(kernel=None)), caplog.at_level(logging.WARNING, "draftwise"):
        loaded = load_model(str(retyped))
        assert len(loaded.notices) == 1 and "Q8_0_SLOW" in loaded.notices[0]
        assert not isinstance(loaded.model.decoder_layers()[0].qkv_weight, QuantWeight)
        fp32 = load_model(str(retyped), dtype="float32").model
        assert torch.equal(_logits(fp32, IDS), _logits(load_model(str(stock),
                                                                  dtype="float32").model, IDS))


def test_a_refused_type_names_its_reason(q8_file, tmp_path: Path) -> None:
    bad = tmp_path / "int.gguf"
    retype(q8_file[0], bad, ["blk.0.attn_q.weight"], int(Q.I8))
    with pytest.raises(ModelFormatError, match="'blk.0.attn_q.weight' is stored as I8"):
        GGUFCheckpoint(bad)
    assert np.array_equal(weight_type(Q.F32).dequantize(np.ones(8, np.uint8)),
                          np.ones(8, np.uint8).view(np.float32))
