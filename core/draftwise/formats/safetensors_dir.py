"""HF checkpoint directories: ``config.json`` plus one or many ``*.safetensors`` files.

Headers are parsed here (8-byte length + JSON) before any data is read, so a truncated
shard is reported with the tensor whose bytes are missing, and shapes can be checked
against the config without loading anything.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

from draftwise.formats.errors import ModelFormatError, TruncatedFileError

INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """Where a tensor lives and its shape, from the shard header."""

    file: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    end: int  # byte offset in the file where the tensor's data ends


def read_json(path: str) -> dict[str, Any]:
    """A JSON object file, with a typed error naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ModelFormatError(path, "file not found") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelFormatError(path, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(path, "expected a JSON object")
    return data


def read_header(path: str) -> dict[str, StoredTensor]:
    """Tensor table of one ``.safetensors`` file, checking every tensor's bytes exist."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise TruncatedFileError(path, None, 8, size)
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise TruncatedFileError(path, None, 8 + n, size)
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFormatError(path, f"corrupt safetensors header: {exc}") from None
    out: dict[str, StoredTensor] = {}
    try:
        entries = sorted(
            ((k, v) for k, v in header.items() if k != "__metadata__"),
            key=lambda kv: int(kv[1]["data_offsets"][0]),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(path, f"corrupt safetensors header: {exc!r}") from None
    for name, entry in entries:  # in file order: the first cut tensor is reported
        end = 8 + n + int(entry["data_offsets"][1])
        if end > size:
            raise TruncatedFileError(path, name, end, size)
        out[name] = StoredTensor(path, name, str(entry["dtype"]), tuple(entry["shape"]), end)
    return out


class SafetensorsCheckpoint:
    """An HF model directory; tensors are read lazily, grouped by shard."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = str(directory)
        if not os.path.isdir(self.path):
            raise ModelFormatError(self.path, "not a directory")
        self.config = read_json(os.path.join(self.path, "config.json"))
        self.tensors: dict[str, StoredTensor] = {}
        for file in self._shard_files():
            self.tensors.update(read_header(file))

    def _shard_files(self) -> list[str]:
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.exists(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelFormatError(index, "no 'weight_map' object")
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

    def iter_tensors(self, names: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors, opening each shard once."""
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
