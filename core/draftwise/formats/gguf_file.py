"""A GGUF file read directly: header, metadata and tensor infos parsed once, tensor bytes
left in the memory map until a loader asks for them.

Why not gguf-py's ``GGUFReader``: it builds a numpy view for every element of every
metadata array, and a vocabulary is two arrays of ~50-150k strings; on the default model
that is 2.7 s of a 4.4 s start-up (measured), and ~2 s more per 100k tokens on bigger
vocabularies. Here each string array is decoded in one pass over ``bytes`` (tens of ms),
and nothing else is touched. gguf-py still supplies the type tables
(``GGML_QUANT_SIZES``), dequantization, and the writer the tests use.

Format (GGUF v2 and v3, little-endian): magic ``GGUF``, version u32, tensor count u64,
metadata count u64; each metadata entry is a key string (u64 length + UTF-8), a value
type u32 and the value (arrays: element type u32, count u64, elements); then per tensor
a name, n_dims u32, dims u64 (ggml order: fastest first), type u32 and an offset u64 into
the data section, which starts at the next multiple of ``general.alignment`` (32).

Checks happen in :func:`check_tensor_infos` (one place, called once the infos are read):
an unknown type or a tensor past the end of the file is a named error before any
tensor byte is read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from draftwise.formats.errors import (
    ModelFormatError,
    TruncatedFileError,
    UnsupportedTensorTypeError,
)

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUFValueType numbers -> struct format of a scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as the file declares it."""

    name: str
    qtype: GGMLQuantizationType
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch order (``[out, in]`` for matrices)."""
        return tuple(reversed(self.dims))

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (``dims[0]`` weights)."""
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.dims[0] // block * size


class _Cursor:
    """Reads little-endian values from the mapped file, raising ``EOFError`` past its end."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise EOFError(f"needs {n:,} bytes at offset {self.pos:,}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > self.end:
            raise EOFError(f"needs {size} bytes at offset {self.pos:,}")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        return self.take(self.scalar("Q")).decode("utf-8", "replace")

    def strings(self, count: int) -> list[str]:
        """``count`` strings in one tight loop (the vocabulary arrays)."""
        buf, at, end = self.buf, self.pos, self.end
        length = struct.Struct("<Q").unpack_from
        out = []
        for _ in range(count):
            if at + 8 > end:
                raise EOFError(f"string array runs past the end ({end:,} bytes)")
            (n,) = length(buf, at)
            if at + 8 + n > end:
                raise EOFError(f"string array runs past the end ({end:,} bytes)")
            out.append(buf[at + 8 : at + 8 + n].decode("utf-8", "replace"))
            at += 8 + n
        self.pos = at
        return out

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype == _STRING:
                return self.strings(count)
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            if etype not in _NUMPY:
                raise ValueError(f"unknown array element type {etype}")
            dtype = np.dtype(_NUMPY[etype])
            return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).tolist()
        if vtype not in _SCALARS:
            raise ValueError(f"unknown metadata value type {vtype}")
        return self.scalar(_SCALARS[vtype])


class GGUFFile:
    """An opened ``.gguf``: ``metadata``, ``tensors`` (file order) and zero-copy bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as fh:
            try:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise ModelFormatError(path, "not a GGUF file (empty)") from None
        self.size = len(self._map)
        self.metadata, self.tensors, self.data_start = self._parse()
        check_tensor_infos(path, self.tensors.values(), self.size)

    def _parse(self) -> tuple[dict[str, Any], dict[str, TensorInfo], int]:
        cur = _Cursor(self._map)
        magic = self._map[:4]
        cur.pos = len(magic)
        if magic != MAGIC:
            raise ModelFormatError(self.path, f"not a GGUF file (magic {magic!r})")
        try:
            version = cur.scalar("I")
            if version not in (2, 3):
                why = "big-endian or unknown" if version > 0xFFFF else "unsupported"
                raise ModelFormatError(self.path, f"GGUF version {version} is {why} (2 and 3 read)")
            n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
            # the header fields gguf-py's reader also lists among the metadata
            metadata: dict[str, Any] = {
                "GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv
            }
            for _ in range(n_kv):
                key = cur.string()
                metadata[key] = cur.value(cur.scalar("I"))
            raw = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.scalar("I")
                if n_dims > 8:
                    raise ValueError(f"tensor {name!r} claims {n_dims} dimensions")
                dims = tuple(cur.scalar("Q") for _ in range(n_dims))
                raw.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
        except (EOFError, ValueError, UnicodeDecodeError, struct.error) as exc:
            raise ModelFormatError(
                self.path,
                f"GGUF header or metadata is truncated or corrupt ({self.size:,} bytes): {exc}",
            ) from None
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
        data_start = -(-cur.pos // align) * align
        tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in raw:
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError:
                raise UnsupportedTensorTypeError(self.path, name, f"#{type_id} (unknown)") from None
            if qtype not in GGML_QUANT_SIZES:
                raise UnsupportedTensorTypeError(self.path, name, qtype.name)
            block, type_size = GGML_QUANT_SIZES[qtype]
            if dims and dims[0] % block:
                raise ModelFormatError(
                    self.path, f"tensor {name!r}: row of {dims[0]} is not whole {qtype.name} blocks"
                )
            nbytes = int(np.prod(dims, dtype=np.int64)) * type_size // block
            tensors[name] = TensorInfo(name, qtype, dims, data_start + offset, nbytes)
        return metadata, tensors, data_start

    def raw(self, name: str) -> np.ndarray:  # [rows, row_bytes] uint8, read-only view
        """The stored bytes of a tensor, one row per line (no copy: pages load on use)."""
        t = self.tensors[name]
        flat = np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return flat.reshape(-1, t.row_bytes) if t.dims else flat

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process (after copying them elsewhere): the
        page cache keeps them, the resident set no longer counts them."""
        t = self.tensors[name]
        start = t.offset - t.offset % mmap.PAGESIZE
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self._map.madvise(mmap.MADV_DONTNEED, start, t.offset + t.nbytes - start)
            except OSError:  # advice only
                pass


def check_tensor_infos(path: str, infos: Any, file_size: int) -> None:
    """Every tensor's bytes lie inside the file (a truncated download names its tensor)."""
    for t in infos:
        end = t.offset + t.nbytes
        if end > file_size:
            raise TruncatedFileError(path, t.name, end, file_size)
