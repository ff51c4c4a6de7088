"""Tiny NVFP4 target checkpoints in the two published layouts, from a tiny bf16 one.

Quantization follows ModelOpt's recipe (global ``amax / (6 * 448)``, block scale
``amax_16 / 6`` in fp8-e4m3 relative to it, nearest e2m1 code), with the global scale
rounded to a power of two so that compressed-tensors' divisor (its reciprocal) is exact
and the two layouts hold the very same weights. The codes are packed by
``compressed_tensors``' own ``pack_fp4_to_uint8`` (the layout's reference implementation).
Tensors and declarations are those the tools write:

- ModelOpt: ``<m>.weight`` uint8, ``<m>.weight_scale`` F8_E4M3, ``<m>.weight_scale_2`` and
  ``<m>.input_scale`` F32 scalars; ``hf_quant_config.json`` with ``exclude_modules``.
- compressed-tensors: ``<m>.weight_packed``, ``<m>.weight_scale``,
  ``<m>.weight_global_scale`` and ``<m>.input_global_scale`` ([1]); ``config.json``
  ``quantization_config`` (format ``nvfp4-pack-quantized``) with ``ignore``.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor]:
    """(codes uint8 [N, K/2], fp8 scales [N, K/16], global multiplier, dequantized fp32)."""
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8

    n, k = w.shape
    amax = float(w.abs().max().clamp_min(1e-12))
    glob = 2.0 ** math.floor(math.log2(amax / (6.0 * 448.0)))
    groups = w.float().reshape(n, k // 16, 16)
    block = (groups.abs().amax(-1) / 6.0 / glob).clamp(max=448.0).to(torch.float8_e4m3fn)
    scale = block.float() * glob
    x = groups / scale.clamp_min(1e-30).unsqueeze(-1)
    idx = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    values = E2M1[idx] * torch.where(x < 0, -1.0, 1.0)  # [N, K/16, 16]
    codes = pack_fp4_to_uint8(values.reshape(n, k))
    return codes, block, glob, (values * scale.unsqueeze(-1)).reshape(n, k)


def is_excluded(module: str, exclude: tuple[str, ...]) -> bool:
    """The fixture's own exclusion rule: a module is excluded under a listed prefix."""
    return any(module == e or module.startswith(e + ".") for e in exclude)


def is_target_linear(name: str) -> bool:
    """A llama-family target's Linear weight: ``*_proj`` and an untied ``lm_head``."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def export_nvfp4(src: Path, dst: Path, convention: str, exclude: tuple[str, ...] = (),
                 twin: Path | None = None,
                 linear: Callable[[str], bool] = is_target_linear) -> Path:
    """Write ``src``'s every Linear (``linear``: which weights are; a target's by
    default) not under ``exclude`` as NVFP4 in ``convention``'s layout; ``twin``: the
    dequantized weights as a bf16 checkpoint (the oracle model)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if twin is not None:
        shutil.copytree(src, twin)
    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        module = name.removesuffix(".weight")
        if not linear(name) or is_excluded(module, exclude):
            out[name] = dense[name] = t
            continue
        codes, block, glob, deq = quantize(t)
        one = torch.ones(())
        if convention == "modelopt":
            out |= {f"{module}.weight": codes, f"{module}.weight_scale": block,
                    f"{module}.weight_scale_2": torch.tensor(glob), f"{module}.input_scale": one}
        else:
            out |= {f"{module}.weight_packed": codes, f"{module}.weight_scale": block,
                    f"{module}.weight_global_scale": torch.tensor([1.0 / glob]),
                    f"{module}.input_global_scale": one.reshape(1)}
        dense[name] = deq.to(t.dtype)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if twin is not None:
        save_file(dense, str(twin / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    if convention == "modelopt":
        (dst / "hf_quant_config.json").write_text(json.dumps({
            "producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                             "group_size": 16, "exclude_modules": list(exclude)}}))
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                "symmetric": True, "dynamic": False}, "input_activations": None}},
            "ignore": list(exclude)}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
