"""NVFP4 llama-family targets (``models.nvfp4_weights``): ModelOpt's and compressed-tensors'
layouts load with the weights kept packed, agree with each other and with their
dequantized twin, decode greedily (speculation on = off), and every broken checkpoint is
refused by name before a weight is read.

Fixtures (``tests/nvfp4_checkpoints.py``) quantize a tiny random llama the way ModelOpt
does, pack the codes with compressed-tensors' own packer, and write each tool's layout
and declaration. ``lm_head`` and layer 1's MLP are excluded, as real exports exclude
the head.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from spec_sampling import fixed_depth
from draftwise import LLM, SamplingParams
from draftwise.formats.errors import ModelFormatError
from draftwise.models.backend import gemm_kind
from draftwise.models.linear import BlockedWeight
from draftwise.models.loader import load_model
from draftwise.models.quant import QuantWeight, quant_kernels_available
from nvfp4_checkpoints import export_nvfp4
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="C kernels not built")
pytest.importorskip("compressed_tensors")

EXCLUDE = ("lm_head", "model.layers.1.mlp")
CONVENTIONS = ("modelopt", "compressed-tensors")
PROMPTS = [[5, 9, 13, 2, 7], list(range(20, 45)), [42, 17] * 6]


@pytest.fixture(scope="module")
def nvfp4_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> dict[str, Path]:
    """``modelopt``, ``compressed-tensors`` and ``twin`` (the dequantized bf16 weights)."""
    root = tmp_path_factory.mktemp("nvfp4")
    src = tiny_checkpoint("llama")
    out = {"modelopt": export_nvfp4(src, root / "mo", "modelopt", EXCLUDE, twin=root / "twin")}
    out["compressed-tensors"] = export_nvfp4(src, root / "ct", "compressed-tensors", EXCLUDE)
    out["twin"] = root / "twin"
    return out


def logits_of(path: Path, prompt: list[int]) -> torch.Tensor:  # [len(prompt), vocab]
    from draftwise.models.batch import KVCache, build_forward_batch

    model = load_model(str(path)).model
    kv = KVCache.allocate(model.num_layers, 16, 4, model.num_kv_heads, model.head_dim,
                          model.dtype)
    batch = build_forward_batch([prompt], [0], [list(range(-(-len(prompt) // 4)))], 4,
                                [list(range(len(prompt)))])
    return model(batch, kv).logits


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_loads_packed_and_says_so(nvfp4_dirs, convention: str) -> None:
    loaded = load_model(str(nvfp4_dirs[convention]))
    model = loaded.model
    layers = model.decoder_layers()
    assert isinstance(layers[0].qkv_weight, QuantWeight)
    assert layers[0].qkv_weight.qtypes == ("NVFP4",)
    assert isinstance(layers[1].o_weight, QuantWeight)
    # excluded modules stay in their stored float dtype (bf16, natively packed)
    assert not isinstance(layers[1].gate_up_weight, QuantWeight)
    assert not isinstance(layers[1].down_weight, QuantWeight)
    assert isinstance(model.lm_head_weight, torch.Tensor)
    assert loaded.notices == ()
    line = model.backend.finish(model.gemm_kinds(), 1).line()
    assert f"NVFP4=quant-{gemm_kind(layers[0].qkv_weight)[1].split('-', 1)[1]}" in line
    # 4.5 bits per packed weight: q|k|v 256 x 128 in tiles (+ 8 multipliers per tile)
    assert layers[0].qkv_weight.nbytes == 256 // 8 * (32 + 128 // 32 * 144)
    assert isinstance(layers[1].down_weight, (BlockedWeight, torch.Tensor))


def test_both_layouts_give_the_same_logits(nvfp4_dirs) -> None:
    """Same weights, two layouts (the global scale a power of two: CT's divisor exact)."""
    for prompt in PROMPTS:
        assert torch.equal(logits_of(nvfp4_dirs["modelopt"], prompt),
                           logits_of(nvfp4_dirs["compressed-tensors"], prompt))


def test_close_to_the_dequantized_twin(nvfp4_dirs) -> None:
    """Against the dequantized weights in bf16 (exact: e2m1 x fp8 x 2^n fits bf16) run by
    the dense GEMM: only the accumulation order and bf16 activations differ."""
    for prompt in PROMPTS:
        got = logits_of(nvfp4_dirs["modelopt"], prompt)
        ref = logits_of(nvfp4_dirs["twin"], prompt)
        assert (got - ref).abs().max() <= 0.05 * ref.abs().max()
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_greedy_decode_speculation_on_equals_off(nvfp4_dirs, convention: str) -> None:
    path = str(nvfp4_dirs[convention])
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain = LLM(model=path, dtype="bfloat16")
    off = [o.outputs[0].token_ids for o in plain.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params)]
    spec = LLM(model=path, dtype="bfloat16", speculative_config=fixed_depth({
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}))
    on = [o.outputs[0].token_ids for o in spec.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params)]
    assert on == off and all(len(t) == 16 for t in off)
    assert spec.engine.spec.metrics.num_draft_tokens > 0


def test_fp32_dequantizes_with_a_notice(nvfp4_dirs, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="draftwise"):
        loaded = load_model(str(nvfp4_dirs["modelopt"]), dtype="float32")
    assert not isinstance(loaded.model.decoder_layers()[0].qkv_weight, QuantWeight)
    (notice,) = loaded.notices
    assert "NVFP4 weights dequantized to float32" in notice and "dtype float32" in notice
    assert notice in caplog.text


# -- refusals, each by name, before any weight is read ------------------------------------
def _copy(nvfp4_dirs, tmp_path: Path, convention: str) -> tuple[Path, dict[str, torch.Tensor]]:
    import shutil

    dst = tmp_path / convention
    shutil.copytree(nvfp4_dirs[convention], dst)
    return dst, load_file(str(dst / "model.safetensors"))


def _save(dst: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_a_truncated_tensor_is_refused_by_name(nvfp4_dirs, tmp_path, convention) -> None:
    dst, _ = _copy(nvfp4_dirs, tmp_path, convention)
    f = dst / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match="file is truncated: tensor 'model[.]layers"):
        load_model(str(dst))


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_a_wrong_scale_shape_is_refused_by_name(nvfp4_dirs, tmp_path, convention) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, convention)
    name = "model.layers.0.self_attn.k_proj.weight_scale"
    t[name] = t[name][:, :-1].contiguous()
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"{name} has shape"):
        load_model(str(dst))


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_a_declared_module_missing_its_tensors_is_refused(nvfp4_dirs, tmp_path,
                                                          convention) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, convention)
    scale2 = "weight_scale_2" if convention == "modelopt" else "weight_global_scale"
    del t[f"model.layers.2.mlp.up_proj.{scale2}"]
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"model.layers.2.mlp.up_proj.{scale2} is missing"):
        load_model(str(dst))


def test_a_declared_module_stored_plain_is_refused(nvfp4_dirs, tmp_path) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, "compressed-tensors")
    m = "model.layers.0.mlp.down_proj"
    for sfx in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
        del t[f"{m}.{sfx}"]
    t[f"{m}.weight"] = torch.zeros(128, 256, dtype=torch.bfloat16)
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"{m} is declared NVFP4 .* no packed"):
        load_model(str(dst))


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_a_packed_tensor_not_declared_is_refused(nvfp4_dirs, tmp_path, convention) -> None:
    """Layer 0's MLP added to the exclusions while its tensors stay packed."""
    dst, _ = _copy(nvfp4_dirs, tmp_path, convention)
    if convention == "modelopt":
        side = json.loads((dst / "hf_quant_config.json").read_text())
        side["quantization"]["exclude_modules"].append("model.layers.0.mlp")
        (dst / "hf_quant_config.json").write_text(json.dumps(side))
    else:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"]["ignore"].append("re:model\\.layers\\.0\\.mlp\\..*")
        (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="model.layers.0.mlp.gate_proj is excluded "
                                               "from quantization by the declaration"):
        load_model(str(dst))


def test_a_stray_packed_tensor_is_refused_by_name(nvfp4_dirs, tmp_path) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, "compressed-tensors")
    t["model.layers.0.input_layernorm.weight_packed"] = torch.zeros(128, 64, dtype=torch.uint8)
    _save(dst, t)
    with pytest.raises(ModelFormatError, match="input_layernorm.weight_packed"):
        load_model(str(dst))


def test_a_scale_in_the_wrong_dtype_is_refused(nvfp4_dirs, tmp_path) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, "modelopt")
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    t[name] = t[name].to(torch.float32)
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"{name} is stored as F32, expected F8_E4M3"):
        load_model(str(dst))


def test_nan_scales_are_refused(nvfp4_dirs, tmp_path) -> None:
    dst, t = _copy(nvfp4_dirs, tmp_path, "modelopt")
    name = "model.layers.2.self_attn.o_proj.weight_scale"
    raw = t[name].view(torch.uint8).clone()
    raw[0, 0] = 0x7F
    t[name] = raw.view(torch.float8_e4m3fn)
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"{name} holds NaN"):
        load_model(str(dst))


@pytest.mark.parametrize("value", [0.0, float("inf"), float("nan"), -2.0])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_a_global_scale_that_is_not_a_positive_number_is_refused(nvfp4_dirs, tmp_path,
                                                                 convention, value) -> None:
    """A zero compressed-tensors divisor made every weight of the module inf (and a NaN or
    inf scale NaN), which loaded and decoded garbage: refused by name instead."""
    dst, t = _copy(nvfp4_dirs, tmp_path, convention)
    scale2 = "weight_scale_2" if convention == "modelopt" else "weight_global_scale"
    name = f"model.layers.0.self_attn.v_proj.{scale2}"
    t[name] = torch.full_like(t[name], value)
    _save(dst, t)
    with pytest.raises(ModelFormatError, match=f"{name} is .*not a positive finite"):
        load_model(str(dst))


def test_an_algorithm_without_quant_method_is_refused(nvfp4_dirs, tmp_path) -> None:
    dst, _ = _copy(nvfp4_dirs, tmp_path, "compressed-tensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_algo": "NVFP4"}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="no quant_method"):
        load_model(str(dst))


def test_a_partly_excluded_fused_weight_is_dequantized_with_a_notice(
        nvfp4_dirs, tiny_checkpoint, tmp_path) -> None:
    """q excluded, k and v packed: q|k|v runs fused, so k and v are dequantized (said)."""
    path = export_nvfp4(tiny_checkpoint("llama"), tmp_path / "q-out", "compressed-tensors",
                        (*EXCLUDE, "model.layers.0.self_attn.q_proj"))
    loaded = load_model(str(path))
    layers = loaded.model.decoder_layers()
    assert not isinstance(layers[0].qkv_weight, QuantWeight)
    assert isinstance(layers[0].o_weight, QuantWeight)
    (notice,) = loaded.notices
    assert "2 modules" in notice and "part of the fused weight is excluded" in notice
    # the dequantized k|v are exactly the exported weights (the twin holds the same)
    qkv = layers[0].qkv_weight
    dense = qkv.unpack() if isinstance(qkv, BlockedWeight) else qkv
    twin = load_file(str(nvfp4_dirs["twin"] / "model.safetensors"))
    kv = torch.cat([twin[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "kv"])
    assert torch.equal(dense[-kv.shape[0]:], kv)
