"""A file cache of a GGUF's packed quantized weights: a later start maps it, packing nothing.

Why: a start-up that packs the weights into fresh anonymous memory pays a page fault for
every page of it, and on a VM with free page reporting (the 2-core sandbox: "Free page
reporting enabled" in ``dmesg``) that memory was handed back to the host, which supplies
it again page by page: the Qwen2.5-Coder-1.5B Q4_K_M load spent 4.3-4.7 s of system time
in a 6.6-7.1 s start-up, huge pages or not, where ``llama-simple``, which maps the file,
spent 1.2 s in 2.1-2.4 s. Page-cache pages are not free memory, so a file mapped from a
warm page cache costs only the mapping. This module keeps the packed arena (exactly the
bytes :func:`~draftwise.models.quant.pack_quant` writes) in one file per model, and the
loader maps it copy-on-write (nothing ever writes it, so it stays shared with the page
cache) and builds the weights over it.

The file is named by a hash of what decides its bytes: the model file (resolved path, size,
modification time), the compiled kernels (their packing code: ``disk_cache.code_identity``),
the plan (each weight's name and packed size, in order) and :data:`FORMAT`. A sidecar JSON
holds that key, the size and CRC-32s of 64 KB samples every 16 MB, all checked before the
file is used: a truncated, resized or overwritten file (or one from another build) is
never mapped; it is packed again and rewritten, with a warning naming it.

A first start packs straight into the file (:class:`PackedFile`) and runs on it as later
starts do: page-cache pages are fresh memory too, but they are then the only copy (the
packed bytes used to be made in an anonymous arena and written here afterwards, twice
the fresh memory); the CLI begins that packing before its imports
(``models.early_pack``), and the loader takes the file. It costs disk the size of the
packed weights (1.11 GB for the 1.5B Q4_K_M: the GGUF's own size again);
``DRAFTWISE_PACKED_CACHE=0`` turns the cache off (no
file read or written), and ``$DRAFTWISE_CACHE_DIR`` (else ``$XDG_CACHE_HOME/draftwise``,
else ``~/.cache/draftwise``) says where it lives.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

logger = logging.getLogger("draftwise")

#: bumped when what a cached file means changes (old files are then simply not found)
FORMAT = 1
#: sample ``SAMPLE`` bytes every ``STRIDE`` for the integrity check (64 samples a GB)
SAMPLE = 64 << 10
STRIDE = 16 << 20
#: a temporary file older than this is a write that died, deleted by the next write
_ABANDONED_S = 3600.0
#: the environment switch (``0``: no cache)
ENV = "DRAFTWISE_PACKED_CACHE"


def enabled() -> bool:
    """Whether the cache is on (``DRAFTWISE_PACKED_CACHE`` unset, or not ``0``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def file_key(model_path: str) -> dict[str, Any]:
    """What names the file: the model file and the code (one file per model and build)."""
    from draftwise.disk_cache import code_identity, model_identity

    return {"format": FORMAT, "model": model_identity(model_path), "code": code_identity()}


def cache_key(model_path: str, sizes: Mapping[str, int]) -> dict[str, Any]:
    """What decides the cached bytes (see the module doc): the file's key and the plan."""
    return {**file_key(model_path), "plan": [[name, int(size)] for name, size in sizes.items()]}


def paths(key: Mapping[str, Any]) -> tuple[Path, Path]:
    """The data file and its sidecar for ``key`` (named by its file key: a plan that
    changed, say another dtype's, replaces the file rather than adding one)."""
    from draftwise.disk_cache import cache_dir

    named = {k: key[k] for k in ("format", "model", "code")}
    digest = hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode()).hexdigest()
    base = cache_dir() / "packed" / digest[:24]
    return base.with_suffix(".bin"), base.with_suffix(".json")


def cached_for(model_path: str) -> bool:
    """Whether a packed file for this model and build is there (a cheap check before the
    load, which decides whether faulting an arena ahead is worth it: ``models.arena``);
    the load still checks it whole."""
    if not enabled():
        return False
    data, side = paths(file_key(model_path))
    return data.is_file() and side.is_file()


def evict_stale(folder: Path, replacing: Mapping[str, Any] | None = None) -> list[Path]:
    """Delete the cached files whose model file is gone or changed (size or modification
    time), and, given the key about to be written (``replacing``), the other files of the
    same model file (another build of the kernels: each is the size of its model, and a
    developer rebuilding would collect one per build). Called before each write, so the
    folder holds one file per model file in use. A process still mapping a deleted file
    keeps its pages (deletion unlinks; the inode lives until it is unmapped). Returns
    what it deleted."""
    from draftwise.disk_cache import model_identity

    gone = []
    mine = replacing["model"].get("path") if replacing is not None else None
    mine_side = paths(replacing)[1] if replacing is not None else None
    for side in folder.glob("*.json"):
        try:
            key = json.loads(side.read_text())["key"]
            model = key["model"]
            stale = model_identity(model["path"]) != model or (
                mine is not None and model["path"] == mine and side != mine_side)
        except (OSError, ValueError, KeyError, TypeError):
            stale = True  # unreadable: nothing can map its file
        if stale:
            for path in (side.with_suffix(".bin"), side):
                path.unlink(missing_ok=True)
                gone.append(path)
    for tmp in folder.glob("*.tmp*"):  # a write that died (another process's is younger)
        try:
            if time.time() - tmp.stat().st_mtime > _ABANDONED_S:
                tmp.unlink()
                gone.append(tmp)
        except OSError:
            pass
    return gone


def _samples(view: memoryview) -> list[int]:
    """CRC-32 of ``SAMPLE`` bytes at every ``STRIDE``, and of the last ``SAMPLE``."""
    n = len(view)
    starts = list(range(0, n, STRIDE)) + ([max(0, n - SAMPLE)] if n else [])
    return [zlib.crc32(view[s : s + SAMPLE]) for s in starts]


def load(key: Mapping[str, Any], nbytes: int) -> torch.Tensor | None:
    """The cached arena for ``key`` as a uint8 tensor over a copy-on-write mapping of the
    file, or None (no cache, no file, or one that fails a check: then a warning)."""
    import torch

    from draftwise.models.arena import huge_page_file_view

    if not enabled() or nbytes <= 0:
        return None
    data, side = paths(key)
    if not data.is_file() or not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text())
        if meta.get("key") != json.loads(json.dumps(key, default=str)) or meta.get(
                "nbytes") != nbytes or data.stat().st_size != nbytes:
            raise ValueError("its key or size does not match")
        region = huge_page_file_view(data, nbytes)
        if _samples(memoryview(region)) != meta.get("samples"):
            raise ValueError("its contents changed since it was written")
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("draftwise: packed weights cache %s not used (%s); packing again", data,
                       exc)
        return None
    return torch.frombuffer(region, dtype=torch.uint8)


class PackedFile:
    """A cache file written in place by the load itself: the packing threads hand it their
    bytes (:meth:`write`, at any offset, from any thread), and :meth:`finish` maps it and
    puts it in place for later starts.

    Why: packing into an anonymous arena and then writing that arena here allocated the
    1.5B's 1.1 GB twice on a first start, once as anonymous memory and once as page cache,
    each page of both a fault that this VM's host supplies. Written here directly, the
    bytes are page cache once, and the first start then runs on the same mapping later
    starts make (:func:`load`). The file is reserved whole up front (``posix_fallocate``),
    so a full disk refuses before any packing, and the loader packs into memory instead.
    A reader never sees it before :meth:`finish`: it has a temporary name of this process
    and thread until its bytes are all written and their samples taken, and the sidecar
    comes after the rename."""

    def __init__(self, key: Mapping[str, Any], nbytes: int) -> None:
        self.key, self.nbytes = key, nbytes
        self.data, self.side = paths(key)
        self._own = f"{os.getpid()}-{threading.get_ident()}"
        self._fd = -1
        self.tmp = self.data.with_suffix(f".tmp{self._own}")
        self.data.parent.mkdir(parents=True, exist_ok=True)
        evict_stale(self.data.parent, key)
        self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self._fd, 0, nbytes)
            else:
                os.ftruncate(self._fd, nbytes)
        except OSError:
            self.abandon()
            raise

    @classmethod
    def create(cls, key: Mapping[str, Any], nbytes: int) -> PackedFile | None:
        """A new file for ``key``, or None (the cache is off, or the file cannot be made:
        then a warning, and the loader packs into memory)."""
        if not enabled() or nbytes <= 0:
            return None
        try:
            made = cls(key, nbytes)
        except OSError as exc:
            logger.warning("draftwise: packed weights not cached at %s: %s (%s=0: do not try)",
                           paths(key)[0], exc, ENV)
            return None
        # said here, on the loading thread, before any text streams
        logger.warning("draftwise: writing packed weights to %s (%.2f GB) for later starts "
                       "to map (%s=0 turns this off)", made.data, nbytes / 1e9, ENV)
        return made

    def write(self, offset: int, chunk: np.ndarray) -> None:
        """Write ``chunk`` (uint8, contiguous) at ``offset`` (``os.pwrite`` releases the GIL
        and takes no file position: packing threads write side by side)."""
        view = chunk.data.cast("B")
        if offset < 0 or offset + len(view) > self.nbytes:
            raise ValueError(f"{len(view)} bytes at {offset} do not fit {self.nbytes}")
        while view:
            done = os.pwrite(self._fd, view, offset)
            view, offset = view[done:], offset + done

    def finish(self) -> torch.Tensor | None:
        """Map the written file (as :func:`load` maps one), take its samples, rename it into
        place and write its sidecar; the uint8 tensor over the mapping, or None (it could
        not be mapped: a warning, the file deleted, and the loader packs into memory)."""
        import torch

        from draftwise.models.arena import huge_page_file_view

        try:
            os.close(self._fd)
            self._fd = -1
            region = huge_page_file_view(self.tmp, self.nbytes)
            meta = {"key": self.key, "nbytes": self.nbytes,
                    "samples": _samples(memoryview(region))}
            os.replace(self.tmp, self.data)
            side_tmp = self.side.with_suffix(f".tmp{self._own}j")
            side_tmp.write_text(json.dumps(meta, default=str))
            os.replace(side_tmp, self.side)
        except OSError as exc:
            logger.warning("draftwise: packed weights not cached at %s: %s (%s=0: do not try)",
                           self.data, exc, ENV)
            self.abandon()
            return None
        return torch.frombuffer(region, dtype=torch.uint8)

    def abandon(self) -> None:
        """Delete the temporary file (a failed write: nothing is put in place)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.tmp.unlink(missing_ok=True)


__all__ = ["ENV", "FORMAT", "PackedFile", "cache_key", "cached_for", "enabled", "evict_stale", "file_key",
           "load", "paths"]
