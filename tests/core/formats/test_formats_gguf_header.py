"""The GGUF header check: it reads what gguf-py reads, and refuses each broken field by name.

Broken files are made from tiny checkpoints (``conftest.write_tiny_gguf``) by patching the
bytes of one field, located with gguf-py's own reader, so every case is one field wrong.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from draftwise.formats.errors import (
    ConfigError,
    ModelFormatError,
    TokenizerError,
    UnsupportedTensorTypeError,
)
from draftwise.formats.gguf_header import read_gguf_header
from draftwise.models.loader import load_model, plan_gguf
from gguf import GGMLQuantizationType as Q


def part_offset(field: Any, index: int) -> int:
    """Byte offset of ``field.parts[index]`` (parts are contiguous from ``field.offset``)."""
    return field.offset + sum(int(p.nbytes) for p in field.parts[:index])


def patched(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[offset : offset + len(data)] = data
    dst.write_bytes(bytes(raw))
    return dst


def tensor_field(reader: gguf.GGUFReader, name: str) -> Any:
    return next(t.field for t in reader.tensors if t.name == name)


@pytest.fixture
def tiny(tiny_gguf) -> tuple[Path, gguf.GGUFReader]:
    path = tiny_gguf(arch="llama", matrix_type=Q.Q8_0).path
    return path, gguf.GGUFReader(path)


@pytest.mark.parametrize(
    ("arch", "matrix_type", "embed_type"),
    [("llama", Q.Q8_0, Q.F16), ("qwen2", Q.Q4_1, Q.Q8_0), ("qwen3", Q.BF16, Q.F32)],
)
def test_header_reads_what_gguf_py_reads(tiny_gguf, arch: str, matrix_type: Q, embed_type: Q):
    path = tiny_gguf(
        arch=arch, matrix_type=matrix_type, embed_type=embed_type, tied=arch != "qwen2"
    ).path
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(path)
    assert header.metadata == {
        k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }
    assert [(t.name, t.qtype, t.offset, t.nbytes, t.dims) for t in header.tensors.values()] == [
        (t.name, t.tensor_type, t.data_offset, int(t.n_bytes), tuple(int(d) for d in t.shape))
        for t in reader.tensors
    ]
    assert header.data_offset == reader.data_offset and header.alignment == reader.alignment


# --- tensor infos -------------------------------------------------------------------------


def test_unknown_tensor_type(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = tensor_field(reader, "blk.0.attn_q.weight")
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 4), struct.pack("<I", 99))
    with pytest.raises(UnsupportedTensorTypeError, match=r"'blk.0.attn_q.weight'.*#99"):
        read_gguf_header(bad)


@pytest.mark.parametrize("n_dims", [0, 5, 2**31])
def test_dimension_count(tiny, tmp_path: Path, n_dims: int) -> None:
    path, reader = tiny
    field = tensor_field(reader, "blk.0.attn_k.weight")
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 2), struct.pack("<I", n_dims))
    with pytest.raises(ModelFormatError, match="dimensions, expected 1 to 4") as err:
        read_gguf_header(bad)
    assert err.value.key == "blk.0.attn_k.weight"


@pytest.mark.parametrize(
    ("dims", "fragment"),
    [
        ((0, 64), "each must be >= 1"),
        ((2**40, 2**40), "more elements than int64"),
        # numpy's uint64 product wraps to the original 64*64: gguf-py would map these bytes
        ((64, 64 + 2**58), "more elements than int64"),
        ((48, 64 * 64 // 48 + 1), "not a multiple of the block"),
        ((64, 65), "expected"),  # one more row: the next tensor's offset no longer fits
    ],
)
def test_bad_dimensions(tiny, tmp_path: Path, dims: tuple[int, int], fragment: str) -> None:
    path, reader = tiny
    field = tensor_field(reader, "blk.0.attn_q.weight")  # Q8_0, dims (64, 64)
    assert [int(d) for d in field.parts[3]] == [64, 64]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 3), struct.pack("<2Q", *dims))
    with pytest.raises(ModelFormatError, match=fragment):
        read_gguf_header(bad)


@pytest.mark.parametrize("delta", [1, 32, -32, 2**40])
def test_offsets_must_pack(tiny, tmp_path: Path, delta: int) -> None:
    path, reader = tiny
    victim = reader.tensors[4]
    offset = int(victim.field.parts[5][0]) + delta
    bad = patched(path, tmp_path / "b.gguf", part_offset(victim.field, 5), struct.pack("<Q", offset))
    if delta in (32, -32):  # aligned and inside the file: gguf-py maps a neighbour's bytes
        moved = next(t for t in gguf.GGUFReader(bad).tensors if t.name == victim.name)
        assert moved.data_offset == victim.data_offset + delta
    with pytest.raises(ModelFormatError, match=rf"{victim.name!r} has data offset .* expected"):
        read_gguf_header(bad)


def test_overlapping_tensors(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    first, second = reader.tensors[2], reader.tensors[3]
    same = struct.pack("<Q", int(first.field.parts[5][0]))  # second maps first's bytes
    bad = patched(path, tmp_path / "b.gguf", part_offset(second.field, 5), same)
    with pytest.raises(ModelFormatError, match="expected"):
        read_gguf_header(bad)


def test_last_tensor_type_change_leaves_trailing_bytes(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    last = reader.tensors[-1]
    assert last.tensor_type == Q.F32
    f16 = struct.pack("<I", int(Q.F16))  # half the bytes: nothing after it to shift
    bad = patched(path, tmp_path / "b.gguf", part_offset(last.field, 4), f16)
    with pytest.raises(ModelFormatError, match="bytes after the padding of its last tensor"):
        read_gguf_header(bad)
    grown = tmp_path / "grown.gguf"
    grown.write_bytes(path.read_bytes() + bytes(64))
    with pytest.raises(ModelFormatError, match="64 bytes after"):
        read_gguf_header(grown)


def test_duplicate_tensor_name(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = tensor_field(reader, "blk.1.attn_q.weight")
    at = part_offset(field, 1) + len("blk.")
    bad = patched(path, tmp_path / "b.gguf", at, b"0")
    with pytest.raises(ModelFormatError, match="'blk.0.attn_q.weight' appears twice"):
        read_gguf_header(bad)


def test_integer_weights_are_refused_not_cast(tmp_path: Path) -> None:
    path = tmp_path / "int.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.int32).reshape(8, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gguf.GGUFReader(path).tensors[0].tensor_type == Q.I32  # gguf-py would read it
    with pytest.raises(ModelFormatError, match="'token_embd.weight' is stored as I32") as err:
        read_gguf_header(path)
    assert err.value.key == "token_embd.weight"


def test_long_tensor_name(tmp_path: Path) -> None:
    path = tmp_path / "long.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x" * 64, np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="64-byte name"):
        read_gguf_header(path)


# --- header and metadata ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "data", "fragment"),
    [
        (0, b"GGUG", "not a GGUF file"),
        (4, struct.pack("<I", 1), "version 1 is not supported"),
        (4, struct.pack(">I", 3), "big-endian"),
        (8, struct.pack("<Q", 2**60), "cannot fit"),
        (16, struct.pack("<Q", 2**40), "cannot fit"),
    ],
)
def test_fixed_header(tiny, tmp_path, offset: int, data: bytes, fragment: str) -> None:
    path, _ = tiny
    with pytest.raises(ModelFormatError, match=fragment):
        read_gguf_header(patched(path, tmp_path / "b.gguf", offset, data))


def test_invalid_utf8_in_a_token_string(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.ggml.tokens"]
    index = 10
    part = field.data[index]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, part), b"\xff")
    with pytest.raises(ModelFormatError, match=r"'tokenizer.ggml.tokens'\[10\] is not UTF-8") as e:
        read_gguf_header(bad)
    assert e.value.key == "tokenizer.ggml.tokens"


def test_bool_must_be_0_or_1(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.ggml.add_bos_token"]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 3), b"\x02")
    with pytest.raises(ModelFormatError, match="a bool stored as 2"):
        read_gguf_header(bad)


def test_unknown_value_type(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["llama.block_count"]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 2), struct.pack("<I", 13))
    with pytest.raises(ModelFormatError, match="'llama.block_count' has unknown GGUF value type"):
        read_gguf_header(bad)


def test_string_length_past_the_end(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.chat_template"]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 3), struct.pack("<Q", 2**50))
    with pytest.raises(ModelFormatError, match="truncated or corrupt.*tokenizer.chat_template"):
        read_gguf_header(bad)


def test_duplicate_key(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.ggml.bos_token_id"]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 1) + len("tokenizer.ggml."), b"e")
    with pytest.raises(ModelFormatError, match="'tokenizer.ggml.eos_token_id' appears twice"):
        read_gguf_header(bad)


def test_corrupted_key_name_is_not_silently_a_default(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["llama.rope.freq_base"]
    at = part_offset(field, 1) + len("llama.rope.freq_bas")
    bad = patched(path, tmp_path / "b.gguf", at, b"f")
    with pytest.raises(ModelFormatError, match="'llama.rope.freq_basf' is not a GGUF key") as e:
        read_gguf_header(bad)
    assert "'llama.rope.freq_base'" in str(e.value)


def test_alignment(tiny, tmp_path: Path) -> None:
    assert "general.alignment" not in tiny[1].fields  # the default, 32
    assert read_gguf_header(tiny[0]).alignment == 32
    path = tmp_path / "al.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert read_gguf_header(path).alignment == 64
    field = gguf.GGUFReader(path).fields["general.alignment"]
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 3), struct.pack("<I", 48))
    with pytest.raises(ModelFormatError, match="non-zero power of two"):
        read_gguf_header(bad)


def test_nested_arrays_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "n.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("llama.nested", [[1, 2], [3, 4]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="an array of arrays"):
        read_gguf_header(path)


# --- what the loader checks after the header: config, tokenizer ------------------------------


def kv_patch(tiny, tmp_path: Path, key: str, part: int, data: bytes) -> Path:
    path, reader = tiny
    return patched(path, tmp_path / "b.gguf", part_offset(reader.fields[key], part), data)


@pytest.mark.parametrize(
    ("key", "data", "error", "fragment"),
    [
        ("llama.attention.head_count", struct.pack("<I", 0), ConfigError, "from 1 to"),
        ("llama.attention.head_count", struct.pack("<I", 3), ConfigError, "multiple of 2 KV"),
        ("llama.attention.head_count_kv", struct.pack("<I", 3), ConfigError, "multiple of 3 KV"),
        ("llama.block_count", struct.pack("<I", 3), ConfigError, "declares 3 layers"),
        ("llama.embedding_length", struct.pack("<f", 64.0), ConfigError, "expected an integer"),
        ("llama.rope.dimension_count", struct.pack("<I", 8), ConfigError, "other widths"),
        ("tokenizer.ggml.bos_token_id", struct.pack("<I", 10**6), ModelFormatError, "token id"),
        ("llama.rope.freq_base", struct.pack("<f", float("nan")), ConfigError, "finite"),
    ],
)
def test_metadata_values_are_checked(tiny, tmp_path, key, data, error, fragment) -> None:
    if key == "llama.embedding_length":  # the value type, not the value: UINT32 -> FLOAT32
        bad = kv_patch(tiny, tmp_path, key, 2, struct.pack("<I", 6))
        bad = patched(bad, bad, part_offset(tiny[1].fields[key], 3), data)
    else:
        bad = kv_patch(tiny, tmp_path, key, 3, data)
    with pytest.raises(error, match=fragment):
        plan_gguf(str(bad))


def test_merge_of_tokens_not_in_the_vocabulary(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.ggml.merges"]
    merge = field.contents(0)
    assert " " in merge and merge[0] != "Z"
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, field.data[0]), b"Z")
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.merges\[0\]"):
        plan_gguf(str(bad))


def test_duplicate_tokens_and_types(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = tokens.contents()
    bang, quote = vocab.index("!"), vocab.index('"')  # bytes 33 and 34: make 34 a second "!"
    bad = patched(path, tmp_path / "b.gguf", part_offset(tokens, tokens.data[quote]), b"!")
    with pytest.raises(TokenizerError, match=f"tokens {bang} and {quote} are both '!'"):
        plan_gguf(str(bad))
    types = reader.fields["tokenizer.ggml.token_type"]
    bad = patched(path, tmp_path / "c.gguf", part_offset(types, types.data[7]),
                  struct.pack("<i", 9))
    with pytest.raises(TokenizerError, match=r"token_type\[7\] is 9"):
        plan_gguf(str(bad))


def test_unknown_pre_tokenizer_is_refused(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    field = reader.fields["tokenizer.ggml.pre"]
    assert field.contents() == "smollm"
    bad = patched(path, tmp_path / "b.gguf", part_offset(field, 4) + 5, b"x")
    with pytest.raises(TokenizerError, match="pre-tokenizer 'smollx'"):
        plan_gguf(str(bad))


def test_a_good_file_plans_and_loads(tiny, tmp_path: Path) -> None:
    path, reader = tiny
    plan = plan_gguf(str(path))
    assert plan.config.num_hidden_layers == 2 and len(plan.names) == len(plan.available)
    ref = load_model(str(path), dtype="float32")
    assert ref.config == plan.config
    # a flipped padding byte (between the tensor infos and the data) changes nothing
    end_of_infos = max(part_offset(t.field, 6) for t in reader.tensors)
    assert reader.data_offset > end_of_infos
    raw = bytearray(path.read_bytes())
    raw[end_of_infos] ^= 0xFF
    flipped = tmp_path / "pad.gguf"
    flipped.write_bytes(bytes(raw))
    got = load_model(str(flipped), dtype="float32")
    ref_state, got_state = ref.model.state_dict(), got.model.state_dict()
    assert ref_state.keys() == got_state.keys()
    assert all(torch.equal(ref_state[k], got_state[k]) for k in ref_state)
