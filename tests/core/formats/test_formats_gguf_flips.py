"""One flipped byte in the default GGUF's header or tensor infos never loads silently wrong.

A deterministic sample of byte offsets, stratified by what the byte is (located with
gguf-py's reader, independent of the code under test), is flipped in a copy of the
header; the tensor data is a sparse hole of the right size, since nothing before the
weights reads it. Each case must end one of these ways:

- refused: :class:`ModelFormatError` (or :class:`ChatTemplateError`) from the header
  check or from :func:`plan_gguf` (every check ``load_model`` makes before weights);
- identical: the same metadata and tensor infos as the original (a value type changed
  to one that reads the same value, say);
- for a flip inside a tensor info, a length, a type tag, a key name or the fixed header:
  nothing else. If it plans, the tensor infos, the model config, every tokenizer key and
  the chat template must equal the original's (an unused key may read differently);
- for a flip inside a value's own bytes (a token string, a number): that key alone
  differs, the tensor infos are the original's, and it plans or is refused by name. GGUF
  has no checksum, so a still-valid different value (``"the"`` -> ``"thf"``) cannot be
  told from the author's; these are counted, not hidden.

Two whole-file cases go through ``load_model`` itself.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest
from draftwise.formats.errors import ChatTemplateError, ModelFormatError
from draftwise.formats.gguf_header import GGUFHeader, read_gguf_header
from draftwise.models.loader import GGUFPlan, load_model, plan_gguf

pytestmark = pytest.mark.default_model

#: how many flips per kind of byte (deterministic: seeded)
SAMPLE = {"fixed": 8, "kv-structure": 20, "kv-value": 20, "tensor-info": 50, "padding": 2}
MASKS = (0x01, 0x02, 0x10, 0x80, 0xFF)


@dataclass(frozen=True, slots=True)
class Region:
    start: int
    end: int
    kind: str  # fixed, kv-structure, kv-value, tensor-info, padding
    key: str  # the metadata key or tensor name ("" for the fixed header)
    part: int = -1  # index in gguf-py's ReaderField.parts


@dataclass
class Original:
    path: str
    size: int
    head: bytes  # everything before the tensor data
    header: GGUFHeader
    plan: GGUFPlan
    regions: dict[str, list[Region]]


def field_regions(field: Any, kind_of_part: Any) -> list[Region]:
    out = []
    pos = field.offset
    for i, part in enumerate(field.parts):
        n = int(part.nbytes)
        if n:
            out.append(Region(pos, pos + n, kind_of_part(i), field.name, i))
        pos += n
    return out


def layout(reader: gguf.GGUFReader, data_offset: int) -> dict[str, list[Region]]:
    regions: dict[str, list[Region]] = {kind: [] for kind in SAMPLE}
    regions["fixed"].append(Region(0, 24, "fixed", ""))
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        values = set(field.data)
        regions_of = field_regions(
            field, lambda i, v=values: "kv-value" if i in v else "kv-structure"
        )
        for r in regions_of:
            regions[r.kind].append(r)
    for tensor in reader.tensors:
        regions["tensor-info"] += field_regions(tensor.field, lambda _i: "tensor-info")
    end_of_infos = max(r.end for r in regions["tensor-info"])
    if data_offset > end_of_infos:
        regions["padding"].append(Region(end_of_infos, data_offset, "padding", ""))
    return regions


@pytest.fixture(scope="module")
def original() -> Original:
    from draftwise.formats.default_model import default_model_path

    path = default_model_path()
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(path)  # the independent reader, for the layout only
    with open(path, "rb") as fh:
        head = fh.read(header.data_offset)
    return Original(
        path, header.file_size, head, header, plan_gguf(path), layout(reader, header.data_offset)
    )


def sample_flips(original: Original) -> list[tuple[int, int, Region]]:
    rng = random.Random(11)
    flips = []
    for kind, count in SAMPLE.items():
        pool = original.regions[kind]
        for _ in range(count if pool else 0):
            region = rng.choice(pool)
            offset = rng.randrange(region.start, region.end)
            mask = rng.choice(MASKS + (rng.randrange(1, 256),))
            flips.append((offset, mask, region))
    return flips


def write_flipped(original: Original, offset: int, mask: int, dst: Path) -> Path:
    head = bytearray(original.head)
    head[offset] ^= mask
    with open(dst, "wb") as fh:
        fh.write(head)
        fh.truncate(original.size)  # a sparse hole where the weights are
    return dst


def outcome(original: Original, path: Path, region: Region) -> str:
    """refused / identical / unused-key / different-value; raises AssertionError if wrong."""
    try:
        header = read_gguf_header(path)
    except ModelFormatError:
        return "refused"
    same_tensors = header.tensors == original.header.tensors
    if same_tensors and header.metadata == original.header.metadata:
        return "identical"
    try:
        plan = plan_gguf(str(path))
    except (ModelFormatError, ChatTemplateError):
        return "refused"
    where = f"flip in {region.kind} of {region.key!r}"
    assert same_tensors, f"{where}: loads with different tensor infos"
    meta, orig = header.metadata, original.header.metadata
    changed = {k for k in {*meta, *orig} if meta.get(k, ...) != orig.get(k, ...)}
    if region.kind == "kv-value":
        assert changed == {region.key}, f"{where}: changed {sorted(changed)}"
        return "different-value"
    assert plan.config == original.plan.config, f"{where}: a different model config"
    tokenizer_keys = {k for k in changed if k.startswith("tokenizer.")}
    assert not tokenizer_keys, f"{where}: tokenizer keys {sorted(tokenizer_keys)} differ"
    return "unused-key"


def test_byte_flips_never_load_silently_wrong(original: Original, tmp_path: Path) -> None:
    seen: Counter[tuple[str, str]] = Counter()
    flips = sample_flips(original)
    assert len(flips) >= 95  # the default model has no padding after its tensor infos
    for offset, mask, region in flips:
        path = write_flipped(original, offset, mask, tmp_path / "flip.gguf")
        result = outcome(original, path, region)
        if region.kind in ("fixed", "tensor-info", "padding"):
            assert result in ("refused", "identical"), (offset, mask, region, result)
        seen[(region.kind, result)] += 1
    assert sum(seen.values()) == len(flips)
    # the sample reaches what it is meant to: most tensor-info flips are refusals by name
    assert seen[("tensor-info", "refused")] == SAMPLE["tensor-info"], seen
    assert seen[("fixed", "refused")] == SAMPLE["fixed"], seen
    print(dict(seen))  # -s shows the spread


def test_flips_inside_token_strings_are_named(original: Original, tmp_path: Path) -> None:
    """The issue's case: 12 of 20 such flips were a UnicodeDecodeError traceback."""
    rng = random.Random(20)
    pool = [r for r in original.regions["kv-value"] if r.key == "tokenizer.ggml.tokens"]
    results = Counter()
    for _ in range(20):
        region = rng.choice(pool)
        path = write_flipped(
            original, rng.randrange(region.start, region.end), rng.choice(MASKS),
            tmp_path / "tok.gguf",
        )
        results[outcome(original, path, region)] += 1
    assert set(results) <= {"refused", "different-value"}, results
    assert results["refused"] >= 15, results  # merges pin nearly every token's spelling


def test_a_shifted_offset_is_refused_by_load_model(original: Original, tmp_path: Path) -> None:
    """The issue's wrong-weights case: an offset moved by a multiple of the alignment.

    It stays inside the file, so the old end-of-file check and gguf-py both mapped the
    neighbour's bytes as this norm's weights; now the packing rule refuses it by name.
    """
    name = "blk.0.attn_norm.weight"
    region = next(
        r for r in original.regions["tensor-info"] if r.key == name and r.part == 5
    )  # the offset field
    path = tmp_path / "shifted.gguf"
    shutil.copyfile(original.path, path)
    with open(path, "r+b") as fh:
        fh.seek(region.start)
        low = fh.read(1)[0]
        fh.seek(region.start)
        fh.write(bytes([low ^ 0x20]))  # +-32 bytes: still aligned, still inside the file
    with pytest.raises(ModelFormatError, match="has data offset") as err:
        load_model(str(path))
    assert err.value.key == name
