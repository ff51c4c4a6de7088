"""NVFP4 safetensors checkpoints (targets and drafters): the two published conventions.

``shared/reference/drafter-formats.md`` §6a. Declarations:

1. **ModelOpt**: ``hf_quant_config.json`` ``{"producer": {"name": "modelopt"},
   "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}}``
   or ``config.json`` ``quantization_config`` ``{"quant_method": "modelopt", "quant_algo":
   "NVFP4", "ignore": [...]}``. Per quantized Linear: ``weight`` uint8 ``[N, K/2]``,
   ``weight_scale`` fp8 e4m3 ``[N, K/16]``, ``weight_scale_2`` fp32 scalar (a
   MULTIPLIER), optional ``input_scale``.
2. **compressed-tensors**: ``quantization_config`` ``{"quant_method":
   "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": [...]}``. Per
   Linear: ``weight_packed`` uint8 ``[N, K/2]``, ``weight_scale`` fp8 ``[N, K/16]``,
   ``weight_global_scale`` fp32 (a DIVISOR: "1 / runtime scale", vLLM), optional
   ``input_global_scale``.

Dequantization: byte j holds element 2j in its low nibble and 2j+1 in its high one;
nibble -> ``(-1)^bit3 * [0, .5, 1, 1.5, 2, 3, 4, 6][bits 0-2]``; ``W[n, k] = e2m1 *
fp8(scale[n, k // 16]) * weight_scale_2`` (ModelOpt) or ``/ weight_global_scale`` (CT).

The declaration is cross-checked against the tensors both ways: every Linear not
excluded (``exclude_modules`` / ``ignore``: module or parent-module names, ``*`` globs,
``re:`` regexes) must carry the quantized set, in its stored dtypes (``U8``, ``F8_E4M3``,
``F32``) and shapes, and every excluded one a plain weight. A ``quant_algo`` without
``quant_method``, another algorithm (FP8, MIXED_PRECISION) or another compressed-tensors
format is refused by name with the modules it covers.

This module holds the format's facts only. The target loader keeps packed modules packed
for the native kernel (``models.nvfp4_weights``, ``core/csrc/gemm_nvfp4.c``); the DFlash
drafter loader dequantizes them once with :func:`dequantize` (exact up to the model
dtype's rounding of ``e2m1 * scale * global``).
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from draftwise.formats.errors import ModelFormatError
from draftwise.formats.jsonfile import read_json

MODELOPT = "modelopt"
CT = "compressed-tensors"
GROUP = 16
#: e2m1 magnitudes by the nibble's low three bits
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: the packed tensors per convention: (weight, block scale, global scale, input scale)
SUFFIXES = {
    MODELOPT: ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    CT: ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"),
}


#: stored dtype of each tensor role (safetensors names): codes, block scale, global scale
DTYPES = ("U8", "F8_E4M3", "F32")


class NvFp4Error(ModelFormatError):
    """An NVFP4 checkpoint this loader cannot read; says which module or key and what works."""


@dataclass(frozen=True, slots=True)
class NvFp4Declaration:
    """What the drafter declares: the convention and the excluded module patterns."""

    convention: str
    excluded: tuple[str, ...]

    def is_excluded(self, module: str) -> bool:
        """Rule 3 of the module doc: names, globs and ``re:`` patterns, with or without
        a ``model.`` prefix."""
        for pattern in self.excluded:
            for name in (module, f"model.{module}"):
                if pattern.startswith("re:"):
                    if re.fullmatch(pattern[3:], name):
                        return True
                elif fnmatch.fnmatchcase(name, pattern) or name == pattern or (
                        name.startswith(pattern + ".")):  # a parent module's name
                    return True
        return False


def declaration(path: str, config: dict[str, Any], runs: str,
                what: str = "quantized DFlash safetensors") -> NvFp4Declaration | None:
    """The checkpoint's NVFP4 declaration (None: not quantized), or a named refusal;
    ``runs`` says what works instead, ``what`` names the checkpoint kind in messages."""
    side = os.path.join(path, "hf_quant_config.json")
    quant = config.get("quantization_config")
    if os.path.isfile(side):
        q = read_json(side).get("quantization") or {}
        algo = q.get("quant_algo")
        if algo != "NVFP4":
            raise NvFp4Error(path, f"hf_quant_config.json quant_algo={algo!r}: only ModelOpt "
                             f"NVFP4 is read here. Instead: {runs}.", key="quant_algo")
        _group(path, q.get("group_size", GROUP))
        return NvFp4Declaration(MODELOPT, tuple(q.get("exclude_modules") or ()))
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    if method is None and "quant_algo" in quant:
        raise NvFp4Error(path, f"quantization_config has quant_algo={quant['quant_algo']!r} "
                         "but no quant_method, so its convention is unknown (vLLM reads such "
                         "a file as unquantized). Instead: declare quant_method.",
                         key="quantization_config")
    if method == MODELOPT:
        if quant.get("quant_algo") != "NVFP4":
            raise NvFp4Error(path, f"ModelOpt quant_algo={quant.get('quant_algo')!r}: no "
                             f"implementation for it here (only NVFP4). Instead: {runs}.",
                             key="quant_algo")
        _group(path, _ct_group(quant))
        return NvFp4Declaration(MODELOPT, tuple(quant.get("ignore") or ()))
    if method == CT:
        fmt = quant.get("format")
        if fmt != "nvfp4-pack-quantized":
            raise NvFp4Error(path, f"compressed-tensors format={fmt!r}: only "
                             f"nvfp4-pack-quantized is read here. Instead: {runs}.",
                             key="format")
        _group(path, _ct_group(quant))
        return NvFp4Declaration(CT, tuple(quant.get("ignore") or ()))
    raise NvFp4Error(path, f"quantization_config.quant_method={method!r}: {what} are read "
                     f"only as NVFP4 (modelopt, compressed-tensors). Instead: {runs}.",
                     key="quantization_config")


def _ct_group(quant: dict[str, Any]) -> Any:
    """The group size in ``config_groups`` (16 when not stated)."""
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and "group_size" in weights:
            return weights["group_size"]
    return GROUP


def _group(path: str, size: Any) -> None:
    if size != GROUP:
        raise NvFp4Error(path, f"NVFP4 group_size={size!r}; the format's group is 16",
                         key="group_size")


def plan(decl: NvFp4Declaration, stored: dict[str, Any], linears: dict[str, tuple[int, int]],
         path: str) -> dict[str, str]:
    """Rule 3: module -> "packed" or "plain", every Linear checked both ways against the
    tensors (``stored``: name -> header entry with ``dtype`` and ``shape``)."""
    w, s, g, _ = SUFFIXES[decl.convention]
    out = {}
    for module, (n, k) in linears.items():
        packed = f"{module}.{w}" in stored and (
            decl.convention == CT or stored[f"{module}.{w}"].dtype == "U8")
        excluded = decl.is_excluded(module)
        if excluded and packed:
            raise NvFp4Error(path, f"{module} is excluded from quantization by the "
                             "declaration but stored packed. Instead: fix the declaration.",
                             key=module)
        if not excluded and not packed:
            raise NvFp4Error(path, f"{module} is declared NVFP4 ({decl.convention}) but has "
                             f"no packed {module}.{w}. Instead: add it to the declaration's "
                             "exclusions, or re-export the drafter.", key=module)
        if not packed:
            out[module] = "plain"
            continue
        if k % GROUP:
            raise NvFp4Error(path, f"{module} has {k} inputs, not a multiple of the NVFP4 "
                             f"group of {GROUP}", key=module)
        want = {f"{module}.{w}": (n, k // 2), f"{module}.{s}": (n, k // GROUP),
                f"{module}.{g}": ()}
        for (name, shape), dtype in zip(want.items(), DTYPES):
            if name not in stored:
                raise NvFp4Error(path, f"{name} is missing (NVFP4 {decl.convention})", key=name)
            if tuple(stored[name].shape) not in (shape, (1,) if shape == () else shape):
                raise NvFp4Error(path, f"{name} has shape {list(stored[name].shape)}, expected "
                                 f"{list(shape)}", key=name)
            if stored[name].dtype != dtype:
                raise NvFp4Error(path, f"{name} is stored as {stored[name].dtype}, expected "
                                 f"{dtype} (NVFP4 {decl.convention})", key=name)
        out[module] = "packed"
    return out


def side_tensors(decl: NvFp4Declaration, modules: Iterable[str]) -> set[str]:
    """Every tensor name an NVFP4 module may carry (to tell extra tensors from these)."""
    return {f"{m}.{sfx}" for m in modules for sfx in SUFFIXES[decl.convention]}


def check_scales(name: str, scale: torch.Tensor, path: str) -> None:
    """Refuse NaN block scales (e4m3fn 0x7f / 0xff) by name: no weight they scale is a number."""
    raw = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    if bool(((raw & 0x7F) == 0x7F).any()):
        raise NvFp4Error(path, f"{name} holds NaN fp8 scales (0x7f/0xff); re-export the "
                         "checkpoint", key=name)


def check_global_scale(name: str, scale: torch.Tensor, path: str) -> None:
    """Refuse a global scale that is not a positive finite number, by name: both conventions
    define it from the module's amax as a positive ratio, and a zero divisor (or a NaN or
    inf) turns every weight of the module into inf or NaN."""
    value = float(scale.to(torch.float32).reshape(-1)[0])
    if not (value > 0.0 and math.isfinite(value)):
        raise NvFp4Error(path, f"{name} is {value!r}, not a positive finite global scale; "
                         "re-export the checkpoint", key=name)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
               convention: str) -> torch.Tensor:  # -> [N, K] float32
    """The module doc's formula: nibbles low then high, e2m1, block scale, global scale."""
    lut = torch.tensor(E2M1, dtype=torch.float32)
    b = packed.to(torch.int64)
    nib = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(b.shape[0], -1)  # [N, K]
    vals = lut[nib & 0x7] * torch.where(nib & 0x8 > 0, -1.0, 1.0)
    blocks = scale.to(torch.float32).repeat_interleave(GROUP, dim=1)
    g = global_scale.to(torch.float32).reshape(())
    w = vals * blocks
    return w * g if convention == MODELOPT else w / g


__all__ = ["CT", "DTYPES", "E2M1", "GROUP", "MODELOPT", "SUFFIXES", "NvFp4Declaration",
           "NvFp4Error", "check_global_scale", "check_scales", "declaration", "dequantize",
           "plan", "side_tensors"]
