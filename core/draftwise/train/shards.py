"""Training data on disk: shards of sequences, their taps, and a manifest that resumes.

Layout of ``DIR``::

    manifest.json          taps, hidden size, dtype, prompts done, tokens, shard list
    shard-00000/           one shard, written whole then renamed into place
        tokens.npy         int32 [T]      every sequence's ids, concatenated
        offsets.npy        int64 [N + 1]  sequence i is tokens[offsets[i]:offsets[i+1]]
        response.npy       int64 [N]      where each sequence's response starts
        tap<L>.npy         float16 [T, H] the target's hidden states at tap L
        final.npy          float16 [T, H] the last layer's post-norm state (LM-head input)

Why this shape: numpy's ``.npy`` opens memory-mapped (``np.load(mmap_mode="r")``), so a
trainer reads any sequence without loading a shard; float16 halves the bytes of float32
(the states' range fits it: post-norm and residual values of these models stay far below
65504). A shard is renamed into place only when complete and the manifest is replaced
atomically after it, so an interrupted run leaves either the old manifest or the new one,
never a shard the manifest names that is half written; the next run resumes from the
manifest's ``prompts_done``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError

MANIFEST = "manifest.json"
#: what a manifest from another layout version means changes: then it is refused
FORMAT = 1


class DataFolderError(DraftwiseError, ValueError):
    """A data folder this run cannot add to or read (another layout, other taps)."""


@dataclass(slots=True)
class Sequence:
    """One recorded sequence, as a reader sees it (arrays are memory-mapped views)."""

    token_ids: np.ndarray  # [T] int32
    response_start: int
    states: dict[str, np.ndarray]  # name -> [T, H] float16


@dataclass(slots=True)
class ShardWriter:
    """Buffers sequences and writes a shard every ``shard_tokens`` tokens, or once the
    oldest buffered sequence is ``shard_seconds`` old: a resumed run starts from the last
    shard, and the 1.5B target records ~15 tokens/s on one thread, so a token count alone
    (2^18) would keep five hours of work in memory, lost to an interruption."""

    root: Path
    names: tuple[str, ...]  # "tap<L>" ..., "final"
    hidden_size: int
    shard_tokens: int = 1 << 18
    meta: dict[str, Any] = field(default_factory=dict)
    shard_seconds: float | None = 600.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _since: float | None = None  # when the oldest buffered sequence was added
    _tokens: list[np.ndarray] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)
    _states: dict[str, list[np.ndarray]] = field(default_factory=dict)
    _pending_prompts: int = 0
    manifest: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(self.root)
        if manifest is None:
            manifest = {"format": FORMAT, "names": list(self.names),
                        "hidden_size": self.hidden_size, "dtype": "float16",
                        "prompts_done": 0, "sequences": 0, "tokens": 0, "bytes": 0,
                        "shards": [], **self.meta}
        elif (manifest.get("names") != list(self.names)
              or manifest.get("hidden_size") != self.hidden_size):
            raise DataFolderError(f"{self.root}: its manifest records {manifest.get('names')} of "
                             f"width {manifest.get('hidden_size')}, not {list(self.names)} of "
                             f"{self.hidden_size}: use another --out or the same taps")
        self.manifest = manifest
        for stale in self.root.glob("shard-*.partial"):  # a write that died
            shutil.rmtree(stale, ignore_errors=True)
        self._states = {n: [] for n in self.names}

    @property
    def prompts_done(self) -> int:
        """Prompts whose sequences are on disk (the resume point)."""
        return int(self.manifest["prompts_done"])

    @property
    def bytes_written(self) -> int:
        return int(self.manifest["bytes"])

    def add(self, token_ids: list[int], response_start: int,
            states: dict[str, np.ndarray]) -> None:
        """One sequence (flushed with :meth:`prompts_finished`)."""
        if self._since is None:
            self._since = self.clock()
        self._tokens.append(np.asarray(token_ids, dtype=np.int32))
        self._starts.append(int(response_start))
        for name in self.names:
            self._states[name].append(np.asarray(states[name], dtype=np.float16))

    def prompts_finished(self, n: int, force: bool = False) -> None:
        """``n`` more prompts are fully added; write a shard when enough is buffered (or
        ``force``, or when the oldest buffered sequence is ``shard_seconds`` old), and only
        then advance the manifest's ``prompts_done``."""
        self._pending_prompts += n
        buffered = sum(len(t) for t in self._tokens)
        stale = (self.shard_seconds is not None and self._since is not None
                 and self.clock() - self._since >= self.shard_seconds)
        if buffered and (force or stale or buffered >= self.shard_tokens):
            self._flush()
        elif force and not buffered and self._pending_prompts:  # prompts that made nothing
            self.manifest["prompts_done"] += self._pending_prompts
            self._pending_prompts = 0
            _write_json(self.root / MANIFEST, self.manifest)

    def _flush(self) -> None:
        index = len(self.manifest["shards"])
        name = f"shard-{index:05d}"
        tmp = self.root / f"{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        tokens = np.concatenate(self._tokens)
        offsets = np.zeros(len(self._tokens) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(t) for t in self._tokens])
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "offsets.npy", offsets)
        np.save(tmp / "response.npy", np.asarray(self._starts, dtype=np.int64))
        for state in self.names:
            np.save(tmp / f"{state}.npy", np.concatenate(self._states[state]))
        size = sum(f.stat().st_size for f in tmp.iterdir())
        os.replace(tmp, self.root / name)
        m = self.manifest
        m["shards"].append({"name": name, "sequences": len(self._tokens),
                            "tokens": int(len(tokens)), "bytes": size})
        m["sequences"] += len(self._tokens)
        m["tokens"] += int(len(tokens))
        m["bytes"] += size
        m["prompts_done"] += self._pending_prompts
        _write_json(self.root / MANIFEST, m)
        self._tokens, self._starts = [], []
        self._states = {n: [] for n in self.names}
        self._pending_prompts = 0
        self._since = None


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest, None when there is none yet; another layout version is refused."""
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataFolderError(f"{path}: unreadable ({exc}); it is replaced atomically, so "
                              "this is not a run that stopped: use another --out") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise DataFolderError(f"{path}: not a draftwise data manifest")
    if manifest.get("format") != FORMAT:
        raise DataFolderError(f"{path}: layout version {manifest.get('format')}, this build "
                         f"writes and reads {FORMAT}")
    return manifest


def read_sequences(root: str | Path) -> Iterator[Sequence]:
    """Every recorded sequence, in order, memory-mapped."""
    root = Path(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise DataFolderError(f"{root}: no {MANIFEST} (not a draftwise training data folder)")
    for shard in manifest["shards"]:
        d = root / shard["name"]
        tokens = np.load(d / "tokens.npy", mmap_mode="r")
        offsets = np.load(d / "offsets.npy")
        starts = np.load(d / "response.npy")
        states = {n: np.load(d / f"{n}.npy", mmap_mode="r") for n in manifest["names"]}
        for i in range(len(starts)):
            a, b = int(offsets[i]), int(offsets[i + 1])
            yield Sequence(tokens[a:b], int(starts[i]), {n: s[a:b] for n, s in states.items()})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


__all__ = ["FORMAT", "MANIFEST", "DataFolderError", "Sequence", "ShardWriter", "read_manifest", "read_sequences"]
