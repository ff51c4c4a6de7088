"""HF checkpoint directories: ``config.json`` plus one or many ``*.safetensors`` files.

Headers are parsed and checked (:mod:`draftwise.formats.safetensors_header`) before any
data is read, so a truncated or corrupt shard is reported with the tensor at fault, and
shapes can be checked against the config without loading anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import torch
from safetensors import safe_open

from draftwise import jsontext
from draftwise.formats.errors import ModelFormatError
from draftwise.formats.jsonfile import read_json
from draftwise.formats.safetensors_header import FLOAT_WEIGHT_DTYPES, StoredTensor, read_header

INDEX_FILE = "model.safetensors.index.json"

__all__ = ["INDEX_FILE", "SafetensorsCheckpoint", "StoredTensor", "read_header", "read_json"]


class SafetensorsCheckpoint:
    """An HF model directory; tensors are read lazily, grouped by shard."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = str(directory)
        if not os.path.isdir(self.path):
            raise ModelFormatError(self.path, "not a directory")
        self.config = read_json(os.path.join(self.path, "config.json"))
        self.tensors: dict[str, StoredTensor] = {}
        for file in self._shard_files():
            for name, tensor in read_header(file).items():
                if name in self.tensors:
                    raise ModelFormatError(
                        file,
                        f"tensor {name!r} is also in {os.path.basename(self.tensors[name].file)}"
                        ": which copy to load is ambiguous",
                        key=name,
                    )
                self.tensors[name] = tensor

    def _shard_files(self) -> list[str]:
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.exists(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelFormatError(index, "no 'weight_map' object", key="weight_map")
            bad = next(
                (v for v in weight_map.values()
                 if not isinstance(v, str) or os.path.basename(v) != v or v in ("", ".", "..")),
                None,
            )
            if not weight_map:
                raise ModelFormatError(index, "'weight_map' is empty", key="weight_map")
            if bad is not None:
                raise ModelFormatError(
                    index,
                    f"'weight_map' maps to {jsontext.show(bad)}, expected shard file names "
                    "in this directory",
                    key="weight_map",
                )
            files = sorted(set(weight_map.values()))
            for f in files:
                if not os.path.isfile(os.path.join(self.path, f)):
                    raise ModelFormatError(index, f"lists shard {f!r}, which is missing")
            return [os.path.join(self.path, f) for f in files]
        files = sorted(f for f in os.listdir(self.path) if f.endswith(".safetensors"))
        if not files:
            raise ModelFormatError(self.path, "no *.safetensors files")
        return [os.path.join(self.path, f) for f in files]

    def hf_shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """HF name -> (where it is stored, shape)."""
        return {
            name: (f"{os.path.basename(t.file)}:{name}", t.shape)
            for name, t in self.tensors.items()
        }

    def check_dtypes(self, names: Iterable[str]) -> None:
        """Refuse weights whose stored dtype is not a plain float (a silent cast otherwise)."""
        for name in names:
            tensor = self.tensors[name]
            if tensor.dtype not in FLOAT_WEIGHT_DTYPES:
                raise ModelFormatError(
                    tensor.file,
                    f"tensor {name!r} is stored as {tensor.dtype}; weights must be one of "
                    f"{', '.join(sorted(FLOAT_WEIGHT_DTYPES))} (draftwise does not cast "
                    "integers, nor fp8/fp4 without their scales, to the model dtype)",
                    key=name,
                )

    def iter_tensors(self, names: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors, opening each shard once (dtypes checked before any is read)."""
        names = list(names)
        self.check_dtypes(names)
        return self.iter_raw(names)

    def iter_raw(self, names: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors in their stored dtypes (quantized ones: ``formats.nvfp4``
        checked them), opening each shard once."""
        by_file: dict[str, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        for file, file_names in by_file.items():
            try:
                with safe_open(file, framework="pt") as fh:
                    for name in file_names:
                        yield name, fh.get_tensor(name)
            except Exception as exc:  # safetensors raises its own error type
                if isinstance(exc, ModelFormatError):
                    raise
                raise ModelFormatError(file, f"cannot read tensors: {exc}") from exc
