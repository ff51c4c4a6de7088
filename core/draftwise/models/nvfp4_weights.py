"""NVFP4 targets (safetensors): which weights stay packed, and packing them.

A llama-family checkpoint in ModelOpt's or compressed-tensors' NVFP4 layout
(``formats.nvfp4``) is planned before any weight is read: the declaration, then every
Linear checked against the shipped tensors both ways (a declared module missing its
tensors, a packed tensor the declaration excludes, a wrong dtype or shape: each refused by
name), and the stored names mapped to the model's (:meth:`NvFp4Plan.available`: a packed
module's tensors stand for its ``weight`` at the logical ``[out, in]``), so the loader's
usual name and shape checks run over the rest.

A fused projection (q|k|v, gate|up, o, down, an untied LM head) stays packed
(``models.quant.pack_nvfp4``; each part keeps its own global scale as a per-row
multiplier) when all its parts are packed, the kernels run here (the same rule as GGUF's,
``backend.keep_quantized``, decided once in ``models.backend``) and its inputs are a
multiple of 32. Otherwise its packed parts are dequantized to the model dtype, with one
notice naming the modules' share of the weight bytes and why. Excluded modules stay in
their stored float dtype, cast to the model dtype like any dense weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from draftwise.formats.nvfp4 import (
    MODELOPT,
    SUFFIXES,
    NvFp4Declaration,
    check_global_scale,
    check_scales,
    declaration,
    dequantize,
    plan,
    side_tensors,
)
from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
from draftwise.formats.safetensors_header import DTYPE_BITS
from draftwise.formats.weight_types import NVFP4
from draftwise.models.config import ModelConfig
from draftwise.models.pack_plan import quantizable_groups
from draftwise.models.quant import NvFp4Part, QuantWeight, pack_nvfp4

if TYPE_CHECKING:
    from draftwise.models.backend import Backend

#: what works instead, for refusals
_RUNS = "a bf16/fp16/fp32 safetensors export, or a GGUF of the model"


@dataclass(frozen=True)
class NvFp4Plan:
    """The checked declaration: module -> logical ``(out, in)`` for every packed one."""

    decl: NvFp4Declaration
    packed: dict[str, tuple[int, int]]

    def available(self, ckpt: SafetensorsCheckpoint) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The checkpoint's HF name -> (where, shape) with each packed module's tensors
        standing for its ``weight`` at ``[out, in]`` (for the loader's name checks)."""
        side = side_tensors(self.decl, self.packed)
        out = {n: v for n, v in ckpt.hf_shapes().items() if n not in side}
        w = SUFFIXES[self.decl.convention][0]
        for module, shape in self.packed.items():
            out[f"{module}.weight"] = (f"{module}.{w}", shape)
        return out

    def weight_names(self) -> frozenset[str]:
        """HF ``weight`` names whose tensors are stored packed."""
        return frozenset(f"{m}.weight" for m in self.packed)


def plan_nvfp4(ckpt: SafetensorsCheckpoint, config: ModelConfig, raw: dict[str, Any],
               expected: Mapping[str, tuple[int, ...]]) -> NvFp4Plan | None:
    """The checkpoint's NVFP4 plan (None: not quantized), or a named refusal."""
    decl = declaration(ckpt.path, raw, _RUNS, what="quantized safetensors models")
    if decl is None:
        return None
    linears = {n.removesuffix(".weight"): (s[0], s[1]) for n, s in expected.items()
               if len(s) == 2 and n != "model.embed_tokens.weight"}
    kinds = plan(decl, ckpt.tensors, linears, ckpt.path)
    return NvFp4Plan(decl, {m: linears[m] for m, kind in kinds.items() if kind == "packed"})


@dataclass(frozen=True)
class NvFp4Groups:
    """What stays packed (model weight name -> HF weight names, fused order) and which
    packed modules are dequantized instead (with the notice saying so)."""

    groups: dict[str, tuple[str, ...]]
    dequantized: frozenset[str]
    notices: tuple[str, ...] = ()


def group_nvfp4(ckpt: SafetensorsCheckpoint, config: ModelConfig, nv: NvFp4Plan,
                dtype: torch.dtype, backend: Backend) -> NvFp4Groups:
    """Decide per fused weight: packed, or its packed parts dequantized (module doc)."""
    packed = nv.weight_names()
    groups: dict[str, tuple[str, ...]] = {}
    dense: set[str] = set()
    reasons: set[str] = set()
    for target, hf in quantizable_groups(config).items():
        inside = [n for n in hf if n in packed]
        if not inside:
            continue
        why = backend.quantized_why_not if not backend.quantized else (
            "part of the fused weight is excluded from quantization" if len(inside) < len(hf)
            else f"inputs not a multiple of {NVFP4.block_k}"
            if nv.packed[hf[0].removesuffix(".weight")][1] % NVFP4.block_k
            else "")
        if why:
            dense.update(inside)
            reasons.add(why)
        else:
            groups[target] = hf
    notices = []
    if dense:
        total = sum(_nbytes(ckpt, n) for n in ckpt.tensors)
        share = sum(_nbytes(ckpt, n) for m in dense for n in _stored(nv, m.removesuffix(".weight")))
        notices.append(f"NVFP4 weights dequantized to {str(dtype).removeprefix('torch.')} at "
                       f"load: {len(dense)} modules ({100 * share / max(total, 1):.1f}% of the "
                       f"weight bytes); {'; '.join(sorted(reasons))}")
    return NvFp4Groups(groups, frozenset(dense), tuple(notices))


def _stored(nv: NvFp4Plan, module: str) -> list[str]:
    return [f"{module}.{s}" for s in SUFFIXES[nv.decl.convention][:3]]


def _nbytes(ckpt: SafetensorsCheckpoint, name: str) -> int:
    t = ckpt.tensors[name]
    return math.prod(t.shape) * DTYPE_BITS[t.dtype] // 8


def _read(ckpt: SafetensorsCheckpoint, nv: NvFp4Plan, weight: str) -> tuple[torch.Tensor, ...]:
    """A packed module's codes, block scales and global scale (NaN block scales and a
    global scale that is not a positive number refused)."""
    module = weight.removesuffix(".weight")
    names = _stored(nv, module)
    got = dict(ckpt.iter_raw(names))
    check_scales(names[1], got[names[1]], ckpt.path)
    check_global_scale(names[2], got[names[2]], ckpt.path)
    return got[names[0]], got[names[1]], got[names[2]]


def load_packed(ckpt: SafetensorsCheckpoint, nv: NvFp4Plan, groups: NvFp4Groups,
                install: Callable[[str, QuantWeight], None],
                progress: Callable[[str], None] | None = None) -> None:
    """Pack every group and ``install(model weight name, weight)`` it."""
    for target, hf in groups.groups.items():
        parts = []
        for name in hf:
            codes, scales, g = _read(ckpt, nv, name)
            g32 = g.to(torch.float32).reshape(())
            # ModelOpt's weight_scale_2 multiplies; compressed-tensors' global scale divides
            mult = g32 if nv.decl.convention == MODELOPT else torch.reciprocal(g32)
            parts.append(NvFp4Part(codes, scales, float(mult)))
        install(target, pack_nvfp4(parts, nv.packed[hf[0].removesuffix(".weight")][1]))
        for name in hf:
            if progress is not None:
                progress(name)


def dequantized(ckpt: SafetensorsCheckpoint, nv: NvFp4Plan,
                names: frozenset[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The packed modules the plan dequantizes, as fp32 ``[out, in]`` weights."""
    for name in sorted(names):
        codes, scales, g = _read(ckpt, nv, name)
        yield name, dequantize(codes, scales, g, nv.decl.convention)
