"""NVFP4 drafters in both published conventions, packed by the test as each exporter does.

The test quantizes a drafter itself (groups of 16, e2m1 nibbles low-then-high, fp8 e4m3
block scales, an fp32 global scale that ModelOpt multiplies by and compressed-tensors
divides by) and writes the dequantized weights as a dense twin: the NVFP4 drafter must
draft exactly what its twin drafts (a swapped convention, nibble order or scale layout
drafts other tokens), and near what its bf16 source drafts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftwise import LLM
from draftwise.formats.errors import ModelFormatError
from draftwise.formats.nvfp4 import E2M1

from .conftest import TRAIN_PROMPTS
from .test_containers import agreement, drafts_of, spec

LUT = torch.tensor(E2M1)


def quantize(w: torch.Tensor, convention: str):
    """(packed uint8 [N, K/2], fp8 scales [N, K/16], global fp32, dequantized [N, K])."""
    n, k = w.shape
    amax = w.abs().max().clamp_min(1e-12)
    runtime = amax / (6.0 * 448.0)  # ModelOpt's weight_scale_2
    groups = w.reshape(n, k // 16, 16)
    block = (groups.abs().amax(-1) / 6.0 / runtime).clamp(max=448.0).to(torch.float8_e4m3fn)
    scale = block.float() * runtime
    x = groups / scale.clamp_min(1e-12).unsqueeze(-1)
    idx = (x.abs().unsqueeze(-1) - LUT).abs().argmin(-1)  # nearest magnitude
    nib = (idx | torch.where(x < 0, 8, 0)).reshape(n, k).to(torch.uint8)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    deq = (LUT[idx] * torch.where(x < 0, -1.0, 1.0) * scale.unsqueeze(-1)).reshape(n, k)
    glob = runtime if convention == "modelopt" else 1.0 / runtime
    return packed, block, glob.reshape(()).float(), deq


def export(src: Path, dst: Path, twin: Path, convention: str, exclude: tuple[str, ...] = ()):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    shutil.copytree(src, twin)
    tensors = load_file(str(src / "model.safetensors"))
    out, dense = {}, {}
    for name, t in tensors.items():
        module = name.removesuffix(".weight")
        linear = name == "fc.weight" or name.endswith("_proj.weight")
        if not linear or any(module.startswith(e) for e in exclude):
            out[name] = dense[name] = t
            continue
        packed, block, glob, deq = quantize(t.float(), convention)
        if convention == "modelopt":
            out |= {f"{module}.weight": packed, f"{module}.weight_scale": block,
                    f"{module}.weight_scale_2": glob, f"{module}.input_scale": torch.ones(())}
        else:
            out |= {f"{module}.weight_packed": packed, f"{module}.weight_scale": block,
                    f"{module}.weight_global_scale": glob,
                    f"{module}.input_global_scale": torch.ones(())}
        dense[name] = deq.to(t.dtype)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    save_file(dense, str(twin / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    if convention == "modelopt":
        (dst / "hf_quant_config.json").write_text(json.dumps({
            "producer": {"name": "modelopt", "version": "0.29"},
            "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                             "exclude_modules": list(exclude)}}))
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group",
                "group_size": 16}}},
            "ignore": [f"re:{e}.*" for e in exclude]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors"])
def test_nvfp4_drafts_its_dequantized_twin_exactly(target_dir, trained_dir, tmp_path,
                                                   convention: str) -> None:
    nv = export(trained_dir, tmp_path / "nv", tmp_path / "twin", convention,
                exclude=("layers.1.mlp",))
    twin, out_twin, _ = drafts_of(target_dir, tmp_path / "twin", TRAIN_PROMPTS[:2])
    got, out, llm = drafts_of(target_dir, nv, TRAIN_PROMPTS[:2])
    src, _, _ = drafts_of(target_dir, trained_dir, TRAIN_PROMPTS[:2])
    assert got == twin and out == out_twin
    assert agreement(got, src) >= 0.5
    assert llm.engine.spec.metrics.num_accepted_tokens > 0


def test_a_swapped_convention_drafts_other_tokens(target_dir, trained_dir, tmp_path) -> None:
    """A compressed-tensors file declared as ModelOpt: the divisor read as a multiplier."""
    nv = export(trained_dir, tmp_path / "nv", tmp_path / "twin", "compressed-tensors")
    from safetensors.torch import load_file, save_file

    t = load_file(str(nv / "model.safetensors"))
    renamed = {k.replace("weight_packed", "weight").replace("weight_global_scale",
                                                              "weight_scale_2")
               .replace("input_global_scale", "input_scale"): v for k, v in t.items()}
    save_file(renamed, str(nv / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((nv / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (nv / "config.json").write_text(json.dumps(cfg))
    twin, _, _ = drafts_of(target_dir, tmp_path / "twin", TRAIN_PROMPTS[:2])
    got, _, _ = drafts_of(target_dir, nv, TRAIN_PROMPTS[:2])
    assert agreement(got, twin) < 0.5


def test_declaration_checked_against_tensors_both_ways(target_dir, drafter_dir, tmp_path):
    nv = export(drafter_dir, tmp_path / "nv", tmp_path / "twin", "modelopt")
    side = json.loads((nv / "hf_quant_config.json").read_text())
    side["quantization"]["exclude_modules"] = ["layers.0.self_attn.q_proj"]
    (nv / "hf_quant_config.json").write_text(json.dumps(side))
    with pytest.raises(ModelFormatError, match="layers.0.self_attn.q_proj is excluded from "
                       "quantization by the declaration but stored packed"):
        LLM(model=str(target_dir), speculative_config=spec(nv))
    part = export(drafter_dir, tmp_path / "part", tmp_path / "twin2", "compressed-tensors",
                  exclude=("fc",))
    cfg = json.loads((part / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = []
    (part / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="fc is declared NVFP4 \\(compressed-tensors\\) "
                       "but has no packed fc.weight_packed"):
        LLM(model=str(target_dir), speculative_config=spec(part))
    algo = tmp_path / "algo"
    shutil.copytree(drafter_dir, algo)
    cfg = json.loads((algo / "config.json").read_text())
    cfg["quantization_config"] = {"quant_algo": "NVFP4"}
    (algo / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="quant_algo='NVFP4' but no quant_method"):
        LLM(model=str(target_dir), speculative_config=spec(algo))
    fp8 = tmp_path / "fp8"
    shutil.copytree(drafter_dir, fp8)
    (fp8 / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(ModelFormatError, match="quant_algo='FP8': only ModelOpt NVFP4"):
        LLM(model=str(target_dir), speculative_config=spec(fp8))
