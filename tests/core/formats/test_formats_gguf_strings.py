"""The C reader of GGUF string arrays (``core/csrc/gguf_strings.c``) against the Python
loop it stands in for, and the refusals it leaves to that loop; plus the float views and
the gguf-py constants that keep a quantized load from importing gguf-py's package."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest
from draftwise.formats import gguf_header
from draftwise.formats.default_model import default_model_path
from draftwise.formats.errors import ModelFormatError
from draftwise.formats.weight_types import weight_type
from draftwise.formats.gguf_header import _Cursor, _python_strings, _strings
from hypothesis import given, settings
from hypothesis import strategies as st

native = pytest.mark.skipif(gguf_header._NATIVE_STRINGS is None,
                            reason="built without the C extension")


def packed(strings: list[bytes], lead: bytes = b"\x07" * 5, tail: bytes = b"") -> bytes:
    """``strings`` as a GGUF string array's items, after ``lead`` and before ``tail``."""
    return lead + b"".join(struct.pack("<Q", len(s)) + s for s in strings) + tail


def _at(buf: bytes, pos: int) -> _Cursor:
    """A cursor over ``buf`` at ``pos``."""
    cur = _Cursor(buf, "x.gguf")
    cur.pos = pos
    return cur


def both(buf: bytes, start: int, count: int) -> tuple[list[str], int, list[str], int]:
    """(C strings, C end, Python strings, Python end) for one array."""
    c, p = _at(buf, start), _at(buf, start)
    out_c = _strings(c, count, "k")
    out_p = _python_strings(p, count, "k")
    return out_c, c.pos, out_p, p.pos


@native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=40), st.binary(max_size=9))
def test_the_c_reader_reads_what_python_reads(texts: list[str], tail: bytes) -> None:
    raw = [t.encode("utf-8") for t in texts]
    out_c, end_c, out_p, end_p = both(packed(raw, tail=tail), 5, len(raw))
    assert out_c == out_p == texts and end_c == end_p


@native
def test_the_default_header_reads_the_same_without_c(monkeypatch) -> None:
    """Every value of the default model's header, the vocabulary and merges among them."""
    path = default_model_path()
    fast = gguf_header.read_gguf_header(path)
    monkeypatch.setattr(gguf_header, "_NATIVE_STRINGS", None)
    slow = gguf_header.read_gguf_header(path)
    assert len(fast.metadata["tokenizer.ggml.tokens"]) == 49152
    assert fast == slow


@native
@pytest.mark.parametrize("items, count, fragment", [
    ([b"ok", b"\xff\xfe"], 2, r"key 'k'\[1\] is not UTF-8: byte 0xff"),
    ([b"ok", b"\xc3"], 2, r"key 'k'\[1\] is not UTF-8: byte 0xc3"),
    ([b"ok"], 2, r"the length of metadata key 'k'\[1\]"),
])
def test_what_c_cannot_read_python_names(items, count: int, fragment: str) -> None:
    """The C reader declines (None); the loop then raises the named error."""
    buf = packed(items)
    assert gguf_header._NATIVE_STRINGS(buf, 5, count) is None
    with pytest.raises(ModelFormatError, match=fragment):
        _strings(_at(buf, 5), count, "k")


@native
def test_a_length_past_the_end_is_declined_not_read() -> None:
    buf = packed([b"ab"]) + struct.pack("<Q", 2**63) + b"xyz"
    assert gguf_header._NATIVE_STRINGS(buf, 5, 2) is None
    with pytest.raises(ModelFormatError, match=r"\[1\] \(9,223,372,036,854,775,808 bytes\)"):
        _strings(_at(buf, 5), 2, "k")


@native
@pytest.mark.parametrize("offset, count", [(-1, 0), (10**6, 0), (0, -1)])
def test_bad_offsets_are_a_value_error(offset: int, count: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        gguf_header._NATIVE_STRINGS(b"12345678", offset, count)


@pytest.mark.parametrize("qtype, dtype", [(gguf.GGMLQuantizationType.F32, np.float32),
                                          (gguf.GGMLQuantizationType.F16, np.float16)])
def test_float_views_equal_gguf_py(qtype, dtype) -> None:
    values = np.random.default_rng(0).standard_normal((3, 32)).astype(dtype)
    raw = values.view(np.uint8).reshape(3, -1)
    ours = weight_type(qtype).dequantize(raw)
    theirs = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32)
    assert ours.tobytes() == theirs.tobytes()


def test_bf16_view_equals_gguf_py() -> None:
    import torch

    values = torch.randn(3, 32).to(torch.bfloat16)
    raw = values.view(torch.uint8).numpy().reshape(3, -1)
    q = gguf.GGMLQuantizationType.BF16
    ours = weight_type(q).dequantize(raw).reshape(3, -1)
    assert ours.tobytes() == np.asarray(gguf.quants.dequantize(raw, q), np.float32).tobytes()
    assert np.array_equal(ours, values.float().numpy())


def test_a_quantized_load_path_does_not_import_the_gguf_package() -> None:
    """formats.ggml runs gguf-py's constants alone; a later ``import gguf`` reuses them."""
    code = (
        "import sys, json\n"
        "from draftwise.formats.default_model import default_model_path\n"
        "from draftwise.formats.gguf import GGUFCheckpoint\n"
        "ck = GGUFCheckpoint(default_model_path())\n"
        "norm = next(n for n in ck.tensor_names if n.endswith('norm.weight'))\n"
        "ck.dequantize(norm)\n"
        "before = 'gguf' in sys.modules\n"
        "import gguf, draftwise.formats.ggml as g\n"
        "same = gguf.GGMLQuantizationType is g.GGMLQuantizationType and gguf.Keys is g.Keys\n"
        "print(json.dumps([before, same]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, True]
