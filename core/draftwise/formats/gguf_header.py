"""A GGUF's header, metadata and tensor infos, read and checked before any tensor is mapped.

GGUF has no checksum, and gguf-py's reader trusts every length and offset: a flipped
byte in a string becomes a ``UnicodeDecodeError`` traceback, and a flipped byte in a
tensor info can make numpy wrap a dimension product (an overflow *warning*) and map the
wrong bytes as weights. This module is the one reader of that region. It parses with
``struct`` (no recursion, bounded by the file size, ~10x faster than gguf-py on a 49k-token
vocabulary) and refuses by name, with the key or tensor and what was expected:

- magic, version 2 or 3, little-endian; counts and every length bounded by the bytes left;
- keys: UTF-8, unique; values: a known type, strings UTF-8, bools 0 or 1, arrays of one
  scalar or string type (no nested arrays, as in llama.cpp's ``gguf.cpp``);
- a key one character away from a key gguf-py knows, that is not itself known: a
  corrupted name would otherwise make the engine silently use a default;
- ``general.alignment``: a UINT32, a non-zero power of two;
- tensor infos: a UTF-8 name under ggml's 64-byte limit, unique; 1..4 dimensions, each
  > 0, their product within int64; a known GGML type whose block divides the row;
  the offset exactly where llama.cpp expects it (tensors packed in order, each padded to
  the alignment: ``tensor 'x' has offset N, expected M`` in ``gguf.cpp``), so no two
  tensors overlap and a changed type or shape cannot shift one tensor onto another's
  bytes; every tensor inside the file and the file ending where the last one does
  (within its padding);
- integer tensor types (I8..I64): refused, since the engine would have to cast them to
  float, which no GGUF weight type declares.

Values come out as gguf-py's ``ReaderField.contents()`` gives them (``str``, ``int``,
``float``, ``bool``, lists of those), so :class:`~draftwise.formats.gguf.GGUFCheckpoint`
can hand them on unchanged.
"""

from __future__ import annotations

import inspect
import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from draftwise.formats.errors import (
    ModelFormatError,
    TruncatedFileError,
    UnsupportedTensorTypeError,
)
from draftwise.formats.ggml import GGUF_DEFAULT_ALIGNMENT, Keys
from draftwise.formats.ggml import GGUFValueType as V
from draftwise.formats.weight_types import UnknownWeightTypeError, WeightType, weight_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
#: ggml's GGML_MAX_DIMS and GGML_MAX_NAME (the name plus its NUL)
MAX_DIMS = 4
MAX_NAME_BYTES = 63
INT64_MAX = 2**63 - 1

_SCALARS: dict[V, tuple[str, int]] = {
    V.UINT8: ("B", 1), V.INT8: ("b", 1), V.UINT16: ("H", 2), V.INT16: ("h", 2),
    V.UINT32: ("I", 4), V.INT32: ("i", 4), V.FLOAT32: ("f", 4), V.BOOL: ("B", 1),
    V.UINT64: ("Q", 8), V.INT64: ("q", 8), V.FLOAT64: ("d", 8),
}
_NUMPY = {
    V.UINT8: "<u1", V.INT8: "<i1", V.UINT16: "<u2", V.INT16: "<i2", V.UINT32: "<u4",
    V.INT32: "<i4", V.FLOAT32: "<f4", V.UINT64: "<u8", V.INT64: "<i8", V.FLOAT64: "<f8",
}
#: fewest bytes one key/value pair and one tensor info can take (bounds the counts)
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8


@dataclass(frozen=True, slots=True)
class GGUFTensorEntry:
    """One tensor info, checked: where its bytes are and what they hold."""

    name: str
    qtype: WeightType  # the registered type of the stored number (``formats.weight_types``)
    dims: tuple[int, ...]  # ggml order: dims[0] is the contiguous row
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch-order shape (``[out, in]`` for a matrix)."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """Everything before a GGUF's tensor data, checked against the file."""

    path: str
    version: int
    alignment: int
    data_offset: int  # where the tensor data section starts
    file_size: int
    metadata: dict[str, Any]
    value_types: dict[str, tuple[V, ...]]  # (type,) or (ARRAY, item type)
    tensors: dict[str, GGUFTensorEntry]  # in file order


class _Cursor:
    """Reads little-endian fields from the mapped file, refusing any read past its end."""

    def __init__(self, buf: mmap.mmap | bytes, path: str) -> None:
        self.buf = buf
        self.path = path
        self.size = len(buf)
        self.pos = 0

    def need(self, n: int, what: str) -> int:
        end = self.pos + n
        if end > self.size:
            raise ModelFormatError(
                self.path,
                f"GGUF header is truncated or corrupt: {what} would end at byte {end:,}, "
                f"past the end of the file ({self.size:,} bytes)",
            )
        start, self.pos = self.pos, end
        return start

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        start = self.need(size, what)
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def raw_string(self, what: str) -> bytes:
        n = self.scalar("Q", 8, f"the length of {what}")
        start = self.need(n, f"{what} ({n:,} bytes)")
        return bytes(self.buf[start : start + n])

    def string(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(
                self.path,
                f"{what} is not UTF-8: byte 0x{raw[exc.start]:02x} at offset "
                f"{self.pos - len(raw) + exc.start:,} ({exc.reason}); the file is corrupt",
            ) from None


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and check a GGUF up to its tensor data; raises :class:`ModelFormatError`."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelFormatError(path, "no such GGUF file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFormatError(path, f"not a GGUF file (magic {magic!r})")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path))


def _parse(cur: _Cursor) -> GGUFHeader:
    path = cur.path
    cur.need(4, "the magic")
    version = cur.scalar("I", 4, "the version")
    if version & 0xFFFF == 0 and version != 0:
        raise ModelFormatError(path, "big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise ModelFormatError(
            path, f"GGUF version {version} is not supported (supported: 2, 3)"
        )
    n_tensors = cur.scalar("Q", 8, "the tensor count")
    n_kv = cur.scalar("Q", 8, "the metadata count")
    left = cur.size - cur.pos
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > left:
        raise ModelFormatError(
            path,
            f"GGUF header is truncated or corrupt: {n_kv:,} metadata entries and {n_tensors:,} tensors "
            f"cannot fit in the file's {cur.size:,} bytes",
        )
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[V, ...]] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise ModelFormatError(path, f"metadata key {key!r} appears twice", key=key)
        metadata[key], value_types[key] = _value(cur, key)
    _refuse_corrupted_key_names(path, metadata)
    alignment = _alignment(path, metadata, value_types)
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = _place_tensors(path, infos, data_offset, alignment, cur.size)
    return GGUFHeader(
        path, version, alignment, data_offset, cur.size, metadata, value_types, tensors
    )


def _value_type(cur: _Cursor, what: str) -> V:
    raw = cur.scalar("I", 4, f"the type of {what}")
    try:
        return V(raw)
    except ValueError:
        raise ModelFormatError(
            cur.path, f"{what} has unknown GGUF value type {raw} (known: 0..12)"
        ) from None


def _value(cur: _Cursor, key: str) -> tuple[Any, tuple[V, ...]]:
    what = f"metadata key {key!r}"
    vtype = _value_type(cur, what)
    if vtype is V.STRING:
        return cur.string(f"the value of {what}"), (vtype,)
    if vtype is not V.ARRAY:
        fmt, size = _SCALARS[vtype]
        value = cur.scalar(fmt, size, f"the value of {what}")
        return _check_scalar(cur.path, vtype, value, what), (vtype,)
    itype = _value_type(cur, f"the items of {what}")
    count = cur.scalar("Q", 8, f"the length of {what}")
    if itype is V.ARRAY:
        raise ModelFormatError(cur.path, f"{what} is an array of arrays, which GGUF readers refuse")
    if itype is V.STRING:
        if count * 8 > cur.size - cur.pos:
            raise ModelFormatError(
                cur.path, f"{what} claims {count:,} strings, more than the file can hold"
            )
        return _strings(cur, count, key), (vtype, itype)
    fmt, size = _SCALARS[itype]
    start = cur.need(count * size, f"the {count:,} items of {what}")
    if itype is V.BOOL:
        raw = np.frombuffer(cur.buf[start : cur.pos], "<u1")
        if count and int(raw.max()) > 1:
            bad = int(np.argmax(raw > 1))
            raise ModelFormatError(
                cur.path, f"{what}[{bad}] is a bool stored as {int(raw[bad])} (expected 0 or 1)"
            )
        return raw.astype(bool).tolist(), (vtype, itype)
    items = np.frombuffer(cur.buf[start : cur.pos], _NUMPY[itype])  # a copy: the map closes
    return items.tolist(), (vtype, itype)


_U64 = struct.Struct("<Q")


# The C reader of a string array (``core/csrc/gguf_strings.c``), None in a build without
# the extension. Imported here, not through ``models.kernels`` (the wrapper of every tensor
# kernel), so that reading a header does not import torch.
_NATIVE_STRINGS: Callable[[Any, int, int], tuple[list[str], int] | None] | None
try:
    from draftwise._cpu_kernels import gguf_strings as _NATIVE_STRINGS
except ImportError:
    _NATIVE_STRINGS = None


def _strings(cur: _Cursor, count: int, key: str) -> list[str]:
    """``count`` length-prefixed UTF-8 strings: the vocabulary's hot loop.

    The C reader takes the array when every string fits the file and is UTF-8 (the same
    decoder, so the same strings, ~8x faster); otherwise it returns None and the loop
    below reads it again and names the string at fault."""
    if _NATIVE_STRINGS is not None:
        read = _NATIVE_STRINGS(cur.buf, cur.pos, count)
        if read is not None:
            out, cur.pos = read
            return out
    return _python_strings(cur, count, key)


def _python_strings(cur: _Cursor, count: int, key: str) -> list[str]:
    """:func:`_strings` in Python, kept flat: the reference, and the one that explains."""
    what = f"metadata key {key!r}"
    buf, pos, size = cur.buf, cur.pos, cur.size
    unpack = _U64.unpack_from
    out: list[str] = []
    append = out.append
    for i in range(count):
        if pos + 8 > size:
            cur.pos = pos
            cur.need(8, f"the length of {what}[{i}]")
        (n,) = unpack(buf, pos)
        start, pos = pos + 8, pos + 8 + n
        if pos > size:
            cur.pos = start
            cur.need(n, f"{what}[{i}] ({n:,} bytes)")
        try:
            append(buf[start:pos].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ModelFormatError(
                cur.path,
                f"{what}[{i}] is not UTF-8: byte 0x{buf[start + exc.start]:02x} at offset "
                f"{start + exc.start:,} ({exc.reason}); the file is corrupt",
                key=key,
            ) from None
    cur.pos = pos
    return out


def _check_scalar(path: str, vtype: V, value: Any, what: str) -> Any:
    if vtype is V.BOOL:
        if value > 1:
            raise ModelFormatError(path, f"{what} is a bool stored as {value} (expected 0 or 1)")
        return bool(value)
    return value


@cache
def _standard_keys(arch: str) -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    """gguf-py's table of standard keys for ``arch``: the concrete ones, and patterns for
    the templated ones (``tokenizer.chat_template.{name}``: any name)."""
    concrete: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for group in vars(Keys).values():
        if not inspect.isclass(group):
            continue
        for attr, value in vars(group).items():
            if attr.startswith("_") or not isinstance(value, str):
                continue
            name = value.replace("{arch}", arch)
            if "{" not in name:
                concrete.add(name)
                continue
            parts = re.split(r"(\{[^}]*\})", name)
            patterns.append(re.compile("".join(
                "[^.]+" if part.startswith("{") else re.escape(part) for part in parts
            ) + r"\Z"))
    return frozenset(concrete), tuple(patterns)


def _refuse_corrupted_key_names(path: str, metadata: dict[str, Any]) -> None:
    """A key that is one character off a standard key, and not standard itself, is refused.

    Without this, ``llama.rope.freq_basf`` loads fine and the engine uses the default
    RoPE base: a silently different model.
    """
    arch = metadata.get("general.architecture")
    known, patterns = _standard_keys(arch if isinstance(arch, str) else "")
    by_length: dict[int, list[str]] = {}
    for name in known:
        by_length.setdefault(len(name), []).append(name)
    for key in metadata:
        if key in known or any(p.match(key) for p in patterns):
            continue
        for name in by_length.get(len(key), ()):
            if sum(a != b for a, b in zip(key, name)) == 1:
                raise ModelFormatError(
                    path,
                    f"metadata key {key!r} is not a GGUF key, but one character away from "
                    f"{name!r}: the file is corrupt (without {name!r} a default would apply)",
                    key=key,
                )


def _alignment(path: str, metadata: dict[str, Any], types: dict[str, tuple[V, ...]]) -> int:
    if "general.alignment" not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if types["general.alignment"] != (V.UINT32,) or value == 0 or value & (value - 1):
        raise ModelFormatError(
            path,
            f"general.alignment is {value!r} ({types['general.alignment'][0].name}), "
            "expected a UINT32 non-zero power of two",
        )
    return int(value)


def _tensor_info(cur: _Cursor, index: int) -> tuple[str, int, tuple[int, ...], int]:
    """(name, raw GGML type, ggml-order dims, offset in the data section), as stored."""
    raw_name = cur.raw_string(f"the name of tensor #{index}")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFormatError(
            cur.path, f"the name of tensor #{index} ({raw_name[:80]!r}) is not UTF-8"
        ) from None
    if len(raw_name) > MAX_NAME_BYTES:
        raise ModelFormatError(
            cur.path,
            f"tensor #{index} has a {len(raw_name):,}-byte name (ggml allows "
            f"{MAX_NAME_BYTES}): {name[:80]!r}",
            key=name,
        )
    what = f"tensor {name!r}"
    n_dims = cur.scalar("I", 4, f"the dimension count of {what}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ModelFormatError(
            cur.path, f"{what} has {n_dims:,} dimensions, expected 1 to {MAX_DIMS}", key=name
        )
    start = cur.need(8 * n_dims, f"the dimensions of {what}")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, start)
    raw_type = cur.scalar("I", 4, f"the type of {what}")
    offset = cur.scalar("Q", 8, f"the offset of {what}")
    return name, raw_type, tuple(int(d) for d in dims), offset


def _place_tensors(
    path: str,
    infos: list[tuple[str, int, tuple[int, ...], int]],
    data_offset: int,
    alignment: int,
    file_size: int,
) -> dict[str, GGUFTensorEntry]:
    """Check each tensor's type, shape and offset; return them with absolute offsets."""
    out: dict[str, GGUFTensorEntry] = {}
    expected = 0  # llama.cpp: each tensor starts where the previous one's padding ends
    for name, raw_type, dims, offset in infos:
        what = f"tensor {name!r}"
        if name in out:
            raise ModelFormatError(path, f"{what} appears twice", key=name)
        qtype = _ggml_type(path, name, raw_type)
        block, type_size = qtype.block_k, qtype.block_bytes
        if min(dims) < 1:
            raise ModelFormatError(
                path, f"{what} has dimensions {list(dims)}; each must be >= 1", key=name
            )
        elements = 1
        for d in dims:
            elements *= d
        if elements > INT64_MAX:
            raise ModelFormatError(
                path,
                f"{what} has dimensions {list(dims)}: more elements than int64 can count",
                key=name,
            )
        if dims[0] % block:
            raise ModelFormatError(
                path,
                f"{what} is {qtype.name} (blocks of {block}) but its rows have {dims[0]:,} "
                "elements, not a multiple of the block",
                key=name,
            )
        nbytes = elements // block * type_size
        if offset != expected:
            raise ModelFormatError(
                path,
                f"{what} has data offset {offset:,}, expected {expected:,} (tensors are packed "
                f"in order, each padded to {alignment} bytes): the header is corrupt",
                key=name,
            )
        end = data_offset + offset + nbytes
        if end > file_size:
            raise TruncatedFileError(path, name, end, file_size)
        out[name] = GGUFTensorEntry(name, qtype, dims, data_offset + offset, nbytes)
        expected = offset + -(-nbytes // alignment) * alignment
    if out:
        last = next(reversed(out.values()))
        if file_size > data_offset + expected:
            raise ModelFormatError(
                path,
                f"the file has {file_size - data_offset - expected:,} bytes after the padding "
                f"of its last tensor {last.name!r} (ending at {last.offset + last.nbytes:,}): "
                "the tensor infos do not describe this file",
                key=last.name,
            )
    return out


def _ggml_type(path: str, name: str, raw: int) -> WeightType:
    """The registered GGUF type of a tensor's stored number, or its refusal by name."""
    what = f"tensor {name!r}"
    try:
        qtype = weight_type(raw)
    except UnknownWeightTypeError:
        qtype = None
    if qtype is None or qtype.container != "gguf":
        raise UnsupportedTensorTypeError(path, name, f"#{raw} (unknown)")
    if qtype.refusal is not None:
        raise ModelFormatError(path, f"{what} is stored as {qtype.name} {qtype.refusal}",
                               key=name)
    return qtype


__all__ = [
    "GGUFHeader",
    "GGUFTensorEntry",
    "read_gguf_header",
]
