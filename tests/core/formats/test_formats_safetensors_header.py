"""safetensors headers: each broken field is a named refusal; what passes, safetensors maps.

The generated cases mutate a valid header (field values, missing fields, offsets, the
length prefix, the data's length) and check one property: ``read_header`` either raises
:class:`ModelFormatError`, or the safetensors library itself (the independent reader)
opens the file and returns every tensor with the shape and dtype ``read_header`` gave.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise.formats.errors import ModelFormatError, TruncatedFileError
from draftwise.formats.safetensors_header import DTYPE_BITS, MAX_HEADER_BYTES, read_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

#: name -> (dtype, shape) of the valid file every case starts from
BASE = {"a": ("F32", [2, 3]), "b": ("BF16", [4]), "c": ("I8", [3]), "empty": ("F16", [0, 5])}
TORCH = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}


def base() -> tuple[dict[str, Any], bytes]:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (dtype, shape) in BASE.items():
        n = DTYPE_BITS[dtype] // 8
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) % 251 for i in range(n))
    return header, data


def write(path: Path, header: Any, data: bytes, length_delta: int = 0) -> Path:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(text) + length_delta) + text + data)
    return path


def test_the_base_file_reads_as_safetensors_does(tmp_path: Path) -> None:
    header, data = base()
    path = write(tmp_path / "ok.safetensors", header, data)
    got = read_header(str(path))
    assert {n: (t.dtype, list(t.shape)) for n, t in got.items()} == {
        n: (d, s) for n, (d, s) in BASE.items()
    }
    with safe_open(str(path), framework="pt") as fh:
        assert sorted(fh.keys()) == sorted(BASE)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda h: h["a"].update(shape=64), "shape 64 is not a list of integers"),
        (lambda h: h["a"].update(data_offsets=[0]), "data_offsets [0] is not [begin, end]"),
        (lambda h: h["a"].pop("dtype"), "expected dtype, shape and data_offsets"),
        (lambda h: h["a"].update(dtype="F33"), 'dtype "F33" is not a safetensors dtype'),
        (lambda h: h["a"].update(shape=[2, -3]), "not a list of integers >= 0"),
        (lambda h: h["a"].update(shape=[2, True]), "not a list of integers >= 0"),
        (lambda h: h["a"].update(shape=[3, 3]), "needs 36 bytes but data_offsets [0, 24] span 24"),
        (lambda h: h["b"].update(data_offsets=[16, 24]), "overlaps the previous tensor"),
        (lambda h: h["b"].update(data_offsets=[32, 40]), "leaves a gap"),
        (lambda h: h["c"].update(data_offsets=[32, 10**30]), "needs"),
        (lambda h: h["c"].update(data_offsets=[35, 32]), "0 <= begin <= end"),
        (lambda h: h.update(__metadata__={"format": 1}), "expected an object of strings"),
        (lambda h: h.update(x=[1, 2]), "tensor 'x'"),
    ],
)
def test_named_refusals(tmp_path: Path, mutate: Any, fragment: str) -> None:
    header, data = base()
    mutate(header)
    with pytest.raises(ModelFormatError) as err:
        read_header(str(write(tmp_path / "bad.safetensors", header, data)))
    assert fragment in str(err.value) and str(tmp_path) in str(err.value)


def test_offsets_out_of_the_file_and_trailing_bytes(tmp_path: Path) -> None:
    header, data = base()
    with pytest.raises(TruncatedFileError) as err:
        read_header(str(write(tmp_path / "cut.safetensors", header, data[:-2])))
    assert err.value.tensor == "c"
    with pytest.raises(ModelFormatError, match="the header does not describe this file"):
        read_header(str(write(tmp_path / "long.safetensors", header, data + b"xx")))


@pytest.mark.parametrize(
    ("raw", "delta", "fragment"),
    [
        (b'{"a": 1', 0, "corrupt safetensors header"),
        (b"[1, 2]", 0, "does not start with '{'"),
        ('{"a": "caf\xe9"}'.encode("latin-1"), 0, "not UTF-8 text: byte 0xe9"),
        (b'{"a": ' + b"9" * 5000 + b"}", 0, "5,000 digits"),
        (b"{" * 100 + b"}" * 100, 0, "nested deeper than 64"),
        (b'{"a": 1, "a": 2}', 0, "given twice"),
        (b"{}", MAX_HEADER_BYTES, "over the format's limit"),
        (b"{}", 10, "truncated"),
    ],
)
def test_header_text(tmp_path: Path, raw: bytes, delta: int, fragment: str) -> None:
    with pytest.raises(ModelFormatError, match=fragment):
        read_header(str(write(tmp_path / "bad.safetensors", raw, b"", delta)))


junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4),
    st.sampled_from(list(DTYPE_BITS)),
    st.lists(st.integers(-2, 2**65), max_size=3),
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[Any, bytes, int]:
    header, data = base()
    delta = 0
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["value", "drop", "entry", "shift", "data", "meta", "length"]))
        name = draw(st.sampled_from(sorted(BASE)))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        entry = header.get(name)
        if op == "value" and isinstance(entry, dict):
            entry[field] = draw(junk)
        elif op == "drop" and isinstance(entry, dict):
            entry.pop(field, None)
        elif op == "entry":
            header[name] = draw(junk)
        elif op == "shift" and isinstance(entry, dict):
            offsets = entry.get("data_offsets")
            if isinstance(offsets, list) and len(offsets) == 2:
                i = draw(st.integers(0, 1))
                if isinstance(offsets[i], int):
                    offsets[i] += draw(st.integers(-8, 8))
        elif op == "data":
            k = draw(st.integers(-6, 6))
            data = data[:k] if k < 0 else data + bytes(k)
        elif op == "meta":
            header["__metadata__"] = draw(junk)
        elif op == "length":
            delta = draw(st.integers(-4, 4))
    return header, data, delta


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated())
def test_generated_headers_are_refused_or_read_exactly(tmp_path: Path, case) -> None:
    header, data, delta = case
    path = write(tmp_path / "gen.safetensors", header, data, delta)
    try:
        tensors = read_header(str(path))
    except ModelFormatError:
        return
    # accepted: the format's own library must agree, tensor by tensor
    with safe_open(str(path), framework="pt") as fh:
        assert sorted(fh.keys()) == sorted(tensors)
        for name, stored in tensors.items():
            if stored.dtype not in TORCH:
                continue
            tensor = fh.get_tensor(name)
            assert tuple(tensor.shape) == stored.shape and tensor.dtype == TORCH[stored.dtype]
