"""One ``.safetensors`` file's header (8-byte length + JSON), checked as the format's own
library checks it, before any tensor byte is read.

The rules are those of the safetensors crate (``Metadata::validate``, ``read_metadata``),
so what passes here is what ``safe_open`` will map; they are checked here first so each
refusal names the file and the tensor and says what was expected:

- the header length fits the file and the format's 100,000,000-byte limit; the header
  is UTF-8 JSON (:mod:`draftwise.jsontext`'s limits) and an object;
- ``__metadata__``, if present, maps strings to strings;
- each tensor has ``dtype`` (a known name), ``shape`` (a list of integers >= 0)
  and ``data_offsets`` (``[begin, end]``, integers, ``begin <= end``);
- ``end - begin`` is exactly the shape's element count times the dtype's size;
- the tensors, in offset order, tile the data section: the first starts at 0, each
  starts where the previous ended (no gap, no overlap), and the last ends at the end of
  the file (a truncated file names the first tensor whose bytes are missing).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from draftwise import jsontext
from draftwise.formats.errors import ModelFormatError, TruncatedFileError

#: the safetensors crate's MAX_HEADER_SIZE
MAX_HEADER_BYTES = 100_000_000

#: dtype name -> size in bits (the safetensors crate's ``Dtype::bitsize``)
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
#: dtypes a weight may have: floats that cast to the model dtype as a plain float cast
#: (fp8 and fp4/fp6 need scales draftwise does not read; integers are not weights)
FLOAT_WEIGHT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})

_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """Where a tensor lives and its shape, from the shard header."""

    file: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    end: int  # byte offset in the file where the tensor's data ends


def read_header(path: str) -> dict[str, StoredTensor]:
    """Tensor table of one ``.safetensors`` file, every entry checked (module docstring)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise TruncatedFileError(path, None, 8, size)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise ModelFormatError(
                    path,
                    f"safetensors header claims {n:,} bytes, over the format's limit of "
                    f"{MAX_HEADER_BYTES:,}: not a safetensors file, or corrupt",
                )
            if 8 + n > size:
                raise TruncatedFileError(path, None, 8 + n, size)
            raw = fh.read(n)
    except OSError as exc:
        raise ModelFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if not raw.startswith(b"{"):
        raise ModelFormatError(path, "the safetensors header does not start with '{'")
    try:
        header = jsontext.loads(raw, max_chars=MAX_HEADER_BYTES)
    except jsontext.JSONTextError as exc:
        raise ModelFormatError(path, f"corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):  # pragma: no cover - starts with "{"
        raise ModelFormatError(path, "the safetensors header is not a JSON object")
    _check_metadata(path, header.get("__metadata__"))
    entries = [
        _entry(path, name, entry, 8 + n)
        for name, entry in header.items()
        if name != "__metadata__"
    ]
    return _tile(path, entries, 8 + n, size)


def _check_metadata(path: str, meta: Any) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelFormatError(
            path, f"'__metadata__' is {jsontext.show(meta)}, expected an object of strings",
            key="__metadata__",
        )


def _entry(
    path: str, name: str, entry: Any, data_start: int
) -> tuple[int, int, StoredTensor]:
    """(begin, end) relative to the data section, and the tensor, after its own checks."""
    what = f"tensor {name!r}"

    def bad(message: str) -> ModelFormatError:
        return ModelFormatError(path, f"{what}: {message}", key=name)

    if not isinstance(entry, dict) or not _ENTRY_KEYS <= set(entry):
        keys = sorted(entry) if isinstance(entry, dict) else jsontext.show(entry)
        raise bad(f"has {keys}, expected dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise bad(f"dtype {jsontext.show(dtype)} is not a safetensors dtype "
                  f"({', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"shape {jsontext.show(shape)} is not a list of integers >= 0")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad(f"data_offsets {jsontext.show(offsets)} is not [begin, end] with "
                  "0 <= begin <= end")
    elements = 1
    for d in shape:
        elements *= d
    bits = elements * DTYPE_BITS[dtype]
    begin, end = offsets
    if bits % 8 or end - begin != bits // 8:
        raise bad(
            f"shape {shape} of {dtype} needs {bits / 8:,g} bytes but data_offsets "
            f"{offsets} span {end - begin:,}"
        )
    return begin, end, StoredTensor(path, name, dtype, tuple(shape), data_start + end)


def _tile(
    path: str, entries: list[tuple[int, int, StoredTensor]], data_start: int, size: int
) -> dict[str, StoredTensor]:
    """The tensors in file order, refusing gaps, overlaps, truncation and trailing bytes."""
    entries.sort(key=lambda e: (e[0], e[1]))
    expected = 0
    for begin, end, tensor in entries:
        if begin != expected:
            relation = "overlaps the previous tensor" if begin < expected else "leaves a gap"
            raise ModelFormatError(
                path,
                f"tensor {tensor.name!r}: data_offsets begin at {begin:,} but the previous "
                f"tensor ends at {expected:,} ({relation}): the header is corrupt",
                key=tensor.name,
            )
        if data_start + end > size:
            raise TruncatedFileError(path, tensor.name, data_start + end, size)
        expected = end
    if data_start + expected != size:
        raise ModelFormatError(
            path,
            f"the tensors end at byte {data_start + expected:,} but the file has {size:,}: "
            "the header does not describe this file",
        )
    return {t.name: t for _, _, t in entries}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


__all__ = ["DTYPE_BITS", "FLOAT_WEIGHT_DTYPES", "MAX_HEADER_BYTES", "StoredTensor", "read_header"]
