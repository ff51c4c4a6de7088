"""GGUF checkpoints: metadata, stored tensor bytes and dequantized tensors under HF names.

The header is parsed and checked by ``formats.gguf_header`` (gguf-py's reader is seconds
slower on vocabularies) and the data memory-mapped by ``formats.gguf_file``. A loader either takes a tensor's stored bytes
(:meth:`GGUFCheckpoint.raw`, for the quantized kernels) or dequantizes it
(``gguf.quants.dequantize``), one tensor at a time, so peak memory stays near one fp32
tensor above the model.
llama.cpp stores Q/K of llama-family models permuted for its adjacent-pair RoPE; that
permutation is undone here (and only for those archs: qwen2/qwen3 use NEOX RoPE and are
stored as HF has them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from draftwise.formats.errors import (
    ModelFormatError,
    UnexpectedTensorError,
    UnsupportedTensorTypeError,
)
from draftwise.formats.gguf_file import GGUFFile, TensorInfo
from draftwise.formats.weight_types import NoDequantizationError, WeightType

if TYPE_CHECKING:
    import torch

#: archs whose Q/K llama.cpp's converter permutes (rope type NORM)
PERMUTED_QK_ARCHS = frozenset({"llama"})

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_down.bias": "mlp.down_proj.bias",
}

#: GGUF tensors that carry no weights the HF layout has (handled elsewhere or unused)
SIDE_TENSORS = frozenset({"rope_freqs.weight"})


def hf_name(gguf_name: str) -> str | None:
    """HF tensor name for a GGUF one, or None when it has no HF counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:  # [out, in] or [out]
    """Inverse of llama.cpp's ``permute``: adjacent RoPE pairs back to HF's halves."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """One tensor as stored: name, GGML type and PyTorch-order shape."""

    name: str
    qtype: str
    shape: tuple[int, ...]


class GGUFCheckpoint:
    """An opened ``.gguf`` file: decoded metadata, stored bytes, dequantized tensors."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._file = _open(self.path)
        self.header = self._file.header
        self.metadata: dict[str, Any] = self._file.metadata
        self._tensors: dict[str, TensorInfo] = self._file.tensors

    @property
    def architecture(self) -> str:
        """``general.architecture`` (e.g. ``llama``, ``qwen2``)."""
        return str(self.metadata.get("general.architecture", "<missing>"))

    @property
    def tensor_names(self) -> list[str]:
        """Stored tensor names, in file order."""
        return list(self._tensors)

    def info(self, name: str) -> GGUFTensorInfo:
        """Type and PyTorch-order shape of a stored tensor."""
        t = self._tensors[name]
        return GGUFTensorInfo(name, t.qtype.name, t.shape)

    def qtype(self, name: str) -> WeightType:
        """The stored GGML type of a tensor."""
        return self._tensors[name].qtype

    def nbytes(self, name: str) -> int:
        """Stored bytes of a tensor."""
        return self._tensors[name].nbytes

    def raw(self, name: str) -> np.ndarray:  # [rows, row_bytes] uint8
        """The stored bytes, one row per line, as a read-only view of the mapped file."""
        return self._file.raw(name)

    def release(self, name: str, rows: int | None = None, evict: bool = False) -> None:
        """Drop a tensor's mapped pages from the process once its bytes were copied
        (``rows``: only those of its first ``rows`` rows; ``evict``: from the page cache
        too, :meth:`GGUFFile.release`)."""
        self._file.release(name, rows, evict)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch layout (``[out, in]`` for matrices)."""
        t = self._tensors[name]
        raw = self._file.raw(name)
        try:  # the type's own (``formats.weight_types``): floats are numpy views
            arr = t.qtype.dequantize(raw)
        except NoDequantizationError:
            raise UnsupportedTensorTypeError(self.path, name, t.qtype.name) from None
        return arr.reshape(t.shape)

    def row_order(self, gguf_name: str, num_heads: int, num_kv_heads: int) -> np.ndarray | None:
        """The stored row each HF row comes from, where llama.cpp permuted Q/K (else None)."""
        if self.architecture not in PERMUTED_QK_ARCHS or not gguf_name.startswith("blk."):
            return None
        kind = gguf_name.split(".")[-2]
        heads = {"attn_q": num_heads, "attn_k": num_kv_heads}.get(kind)
        if heads is None:
            return None
        return unpermute_qk(np.arange(self._tensors[gguf_name].shape[0]), heads)

    def rope_freq_factors(self) -> tuple[float, ...] | None:
        """llama3.1-style RoPE frequency factors, when the file carries them."""
        if "rope_freqs.weight" not in self._tensors:
            return None
        return tuple(float(x) for x in self.dequantize("rope_freqs.weight").reshape(-1))

    def hf_shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """HF name -> (GGUF name, shape) for every weight tensor; unknown names refused."""
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        unknown = []
        for name in self._tensors:
            target = hf_name(name)
            if target is None:
                if name not in SIDE_TENSORS:
                    unknown.append(name)
                continue
            out[target] = (name, self.info(name).shape)
        if unknown:
            raise UnexpectedTensorError(self.path, unknown)
        return out

    def load_hf(self, gguf_name: str, num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """Dequantize one tensor and undo llama.cpp's Q/K permutation where it applies."""
        arr = self.dequantize(gguf_name)
        order = self.row_order(gguf_name, num_heads, num_kv_heads)
        if order is not None:
            arr = arr[order]
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr).copy()
        import torch  # here: the header and raw rows are read before torch is imported

        return torch.from_numpy(arr)

    def iter_hf(self, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight as (HF name, fp32 tensor), one at a time."""
        for target, (name, _) in self.hf_shapes().items():
            yield target, self.load_hf(name, num_heads, num_kv_heads)


def _open(path: str) -> GGUFFile:
    """Open with typed errors: missing, not GGUF, truncated header or tensor, unknown type."""
    if not os.path.isfile(path):
        raise ModelFormatError(path, "no such GGUF file")
    return GGUFFile(path)
