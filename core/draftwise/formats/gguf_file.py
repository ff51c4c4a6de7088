"""A GGUF file's tensor bytes, left in a read-only memory map until a loader asks for them.

The header, metadata and tensor infos are parsed and checked once, by
:func:`~draftwise.formats.gguf_header.read_gguf_header` (the one GGUF parser: every
bound checked against the file, vocabulary arrays decoded in one pass). Why not
gguf-py's ``GGUFReader``: it builds a numpy view for every element of every metadata
array, and a vocabulary is two arrays of ~50-150k strings; on the default model that was
2.7 s of a 4.4 s start-up (measured). gguf-py still supplies the type tables,
dequantization, and the writer the tests use.

This module only maps the data: :meth:`GGUFFile.raw` is a zero-copy view of one
tensor's stored bytes (pages load on use) for the quantized kernels' packing, and
:meth:`GGUFFile.release` drops them from the resident set once they were copied (a
packer following its progress gives them back a few MB at a time); asked to ``evict``,
it drops them from the page cache too (a first start writing the packed-weights cache
file: see :mod:`draftwise.models.packed_cache`).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from draftwise.formats.gguf_header import GGUFHeader, GGUFTensorEntry, read_gguf_header

#: a checked tensor info (name, qtype, ggml-order dims, absolute offset, nbytes)
TensorInfo = GGUFTensorEntry


def row_bytes(t: TensorInfo) -> int:
    """Bytes of one row (``dims[0]`` weights) of a stored tensor."""
    return t.qtype.row_bytes(t.dims[0])


class GGUFFile:
    """An opened ``.gguf``: ``metadata``, ``tensors`` (file order) and zero-copy bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.header: GGUFHeader = read_gguf_header(path)
        self.metadata: dict[str, Any] = self.header.metadata
        self.tensors: dict[str, TensorInfo] = self.header.tensors
        self.size = self.header.file_size
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

    def raw(self, name: str) -> np.ndarray:  # [rows, row_bytes] uint8, read-only view
        """The stored bytes of a tensor, one row per line (no copy: pages load on use)."""
        t = self.tensors[name]
        flat = np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return flat.reshape(-1, row_bytes(t)) if t.dims else flat

    def release(self, name: str, rows: int | None = None, evict: bool = False) -> None:
        """Drop a tensor's pages from this process (after copying them elsewhere): the
        page cache keeps them, the resident set no longer counts them. ``rows``: only the
        whole pages of its first ``rows`` rows (a packer giving back what it has read).
        ``evict``: drop them from the page cache as well (``POSIX_FADV_DONTNEED``), so the
        memory they held is what the next pages written are made of.

        Why evict: on a VM with free page reporting, a page the guest has never used (or
        handed back) is supplied by the host on first touch, and that cost ~3 s of
        system time per GB on this project's 2-core VM, while a page just freed inside the
        guest is reused for a fraction of it. A first start that packs the weights into
        the cache file turns the GGUF's page-cache copy into the packed file's, page for
        page, instead of asking for a second GB; later starts map the packed file and
        never read these bytes again. The kernel skips pages another process has mapped
        (a llama.cpp server on the same file keeps its copy)."""
        t = self.tensors[name]
        start = t.offset - t.offset % mmap.PAGESIZE
        end = t.offset + t.nbytes
        if rows is not None:
            end = t.offset + min(rows * row_bytes(t), t.nbytes)
            end -= end % mmap.PAGESIZE
        if end <= start or not hasattr(self._map, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
            if evict and hasattr(os, "posix_fadvise"):
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        except OSError:  # advice only
            pass
