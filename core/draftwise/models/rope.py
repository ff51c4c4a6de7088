"""Rotary position embeddings: tables computed at load and grown on demand, applied with
four ops.

The tables reproduce transformers' numerics exactly (fp32 ``pos * inv_freq``, cos/sin
in fp32, then cast to the model dtype), so RoPE is never a source of drift against the
oracle. Scaling types: default, linear, llama3, yarn; others are refused by name.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from draftwise.formats.errors import ConfigError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: RoPE table rows a model builds when it is made; a batch reaching past them grows the
#: tables (at least doubling). 4096 rows cost 50-300 ms of start-up on a 2-core machine
#: (torch's cos/sin over 262k values, on the critical path before the weights pack) for a
#: first prompt of a few dozen tokens; a row's values do not depend on the table's size
#: (element-wise fp32 ops: tests/core/models/test_rope_tables.py)
INITIAL_ROPE_POSITIONS = 256


def inv_frequencies(
    head_dim: int,
    theta: float,
    scaling: dict[str, Any] | None,
    max_position_embeddings: int,
    path: str = "config",
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim // 2]`` (fp32) and the cos/sin scale (yarn)."""
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    scaling = scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return base, 1.0
    factor = float(scaling.get("factor") or 1.0)
    if kind == "linear":
        return base / factor, 1.0
    if kind == "llama3":
        return _llama3(base, factor, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, factor, scaling, max_position_embeddings)
    raise ConfigError(
        path, f"rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
    )


def _llama3(inv_freq: torch.Tensor, factor: float, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency smoothing, as transformers computes it."""
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    dim: int, base: float, factor: float, s: dict[str, Any], max_pos: int
) -> tuple[torch.Tensor, float]:
    """YaRN ramp between interpolated and extrapolated frequencies (transformers' formula)."""
    original = float(s.get("original_max_position_embeddings") or max_pos)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attn)


def rope_tables(
    inv_freq: torch.Tensor,  # [head_dim // 2] fp32
    max_positions: int,
    attention_scaling: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and sign-folded ``sin`` tables ``[max_positions, head_dim]`` in ``dtype``.

    The sin table holds ``cat(-sin, sin)`` so that ``rotate_half(x) * sin`` becomes
    ``swap_halves(x) * sin_signed``: negation is exact, so this is bitwise transformers'.
    """
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attention_scaling).to(dtype)
    sin = (emb.sin() * attention_scaling).to(dtype)
    half = inv_freq.shape[0]
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.contiguous(), sin_signed.contiguous()


def apply_rope(
    x: torch.Tensor,  # [T, heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin_signed: torch.Tensor,  # [T, 1, head_dim]
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with the halves swapped by a flip (one copy)."""
    t, h, d = x.shape
    swapped = x.reshape(t, h, 2, d // 2).flip(2).reshape(t, h, d)
    return x * cos + swapped * sin_signed
