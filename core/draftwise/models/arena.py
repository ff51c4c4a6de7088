"""Huge-page regions for weights, and faulting one in while the process still imports.

A region is private anonymous memory, 2 MB-aligned and advised for transparent huge
pages (``models.hugepages`` says why decode wants them); :func:`huge_page_region` makes
one and is the only place that does, as :func:`huge_page_file_view` is for a file mapped
the same way (a packed-weights file, ``models.packed_cache``). Nothing here imports torch.

Why fault ahead (:class:`PrefaultedArena`): packing a GGUF's quantized weights writes
every byte of a fresh arena once, and each first write to a 2 MB page is a fault in
which the kernel finds (compacting where memory is fragmented) and zeroes a huge page;
on a VM with free page reporting the page comes from the host too. That is system time
on the load's critical path: packing Qwen2.5-Coder-1.5B Q4_K_M (a 1.06 GB arena) on the
2-core VM took 3.7 s of system time against ~0.2 s of user time (load average ~6; on a
quiet machine its whole start-up had 2.2 s of system time in 2.5 s to the first token).
``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14) faults a range in one call, entirely in
the kernel, and called through ctypes it releases the GIL; so a thread started before
torch is imported faults the arena on the second core while the main thread spends ~1 s
importing (Python, holding the GIL).

The CLI reserves the region before it knows the weights' exact size: the GGUF file's
size bounds it (packed bytes are the stored bytes with rows padded to tiles of 8, and
the header and dense tensors are part of the file). The loader takes what it needs
(:meth:`PrefaultedArena.take`): from then on the thread faults no further, and the pages
past it go back to the OS at once (and once more by :meth:`PrefaultedArena.finish`,
after the thread, for a chunk that was in flight), before the loader allocates anything
else, so the peak resident set does not grow by the unused part.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable

#: a transparent huge page (x86-64, arm64 with 4 KB base pages)
HUGE_PAGE = 2 << 20
#: ``<linux/mman.h>`` since Linux 5.14: fault a range in as writes would (zeroed, writable)
MADV_POPULATE_WRITE = 23
#: bytes per populate call: small enough that :meth:`PrefaultedArena.take` stops the
#: thread within a few ms, large enough that GIL hand-offs between calls stay rare
_CHUNK = 64 << 20

#: madvise(address, length, advice) -> 0 or -1, the GIL released during the call
Madvise = Callable[[int, int, int], int]


def region_address(region: mmap.mmap) -> int:
    """The address of a writable mapping's first byte (the export is released at once)."""
    anchor = ctypes.c_char.from_buffer(region)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def huge_page_region(nbytes: int) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of ``nbytes`` + 2 MB and the offset of its first 2 MB
    boundary, from which ``nbytes`` are advised for huge pages (where the OS has them).

    Private: a shared anonymous mapping is shmem, which THP's ``madvise`` mode ignores.
    Nothing is resident until written.
    """
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -region_address(region) % HUGE_PAGE  # a multiple of the 4 KB page size
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
        except OSError:  # THP unsupported here: ordinary pages, same results
            pass
    return region, start


#: ``<sys/mman.h>`` (Linux; Python's ``mmap`` module does not export it): map exactly there
_MAP_FIXED = 0x10


def huge_page_file_view(path: str | os.PathLike[str], nbytes: int) -> object:
    """A file's first ``nbytes`` mapped copy-on-write at a 2 MB-aligned address and advised
    for huge pages, as a writable buffer whose collection unmaps it (``models.packed_cache``
    maps its files so). Raises ``OSError`` where the mapping cannot be made.

    Why aligned: the page cache holds a file in large folios (ext4 on Linux 6.x), and a
    folio is mapped by one page-table entry only at an address aligned like its offset;
    Python's ``mmap`` leaves the address to the kernel, which gave 4 KB entries here, and
    decode then ran 25-30% slower (1.5B, 2 threads: 30.8-35.0 ms a token against 24.0-26.8
    on a huge-page arena) for the TLB misses. Aligned and advised, the whole file was
    PMD-mapped (``FilePmdMapped`` in ``/proc/self/smaps_rollup``). Where libc cannot be
    called (not Linux), a plain ``mmap.mmap``.
    """
    calls = _libc_mapping()
    with open(path, "rb") as f:
        if calls is None:
            return mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_PRIVATE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        map_, unmap, madvise = calls
        failed = ctypes.c_void_p(-1).value
        # reserve room for an aligned start (no access, nothing resident), map the file
        # over its aligned part, then give the rest of the reservation back
        span = nbytes + HUGE_PAGE
        reserve = map_(None, span, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if reserve in (None, failed):
            raise OSError(ctypes.get_errno(), "cannot reserve address space for the file")
        base = -(-reserve // HUGE_PAGE) * HUGE_PAGE
        got = map_(base, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                   mmap.MAP_PRIVATE | _MAP_FIXED, f.fileno(), 0)
        if got != base:
            unmap(reserve, span)
            raise OSError(ctypes.get_errno(), "cannot map the file")
    if base > reserve:
        unmap(reserve, base - reserve)
    tail = base + -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    if reserve + span > tail:
        unmap(tail, reserve + span - tail)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        madvise(base, nbytes, mmap.MADV_HUGEPAGE)  # advice: 4 KB entries where refused
    buffer = (ctypes.c_uint8 * nbytes).from_address(base)
    weakref.finalize(buffer, unmap, base, nbytes)
    return buffer


@functools.cache
def _libc_mapping() -> tuple[Callable[..., int], Callable[[int, int], int], Madvise] | None:
    """libc's ``mmap``, ``munmap`` and ``madvise`` through ctypes, or None (not Linux)."""
    madvise, libc = libc_madvise(), _libc()
    if madvise is None or libc is None:
        return None
    map_, unmap = libc.mmap, libc.munmap
    map_.restype = ctypes.c_void_p
    map_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                     ctypes.c_int, ctypes.c_long]
    unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    unmap.restype = ctypes.c_int
    return map_, unmap, madvise


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The process's libc through ctypes, errno kept, opened once (None: not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@functools.cache
def libc_madvise() -> Madvise | None:
    """libc's ``madvise`` through ctypes (which releases the GIL while it runs), or None
    where there is no such call to make (not Linux)."""
    libc = _libc()
    try:
        call = libc.madvise if libc is not None else None
    except AttributeError:
        call = None
    if call is None:
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


class PrefaultedArena:
    """A huge-page region of ``capacity`` bytes that a daemon thread faults in, front to
    back, until a loader takes it (see the module doc).

    Faulting is advice: where ``MADV_POPULATE_WRITE`` is refused (a kernel before 5.14,
    no memory) the thread stops and the packing threads fault the rest as they write, as
    they do with a fresh arena. The bytes are the same either way (zeroes).
    """

    def __init__(self, capacity: int, madvise: Madvise | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"an arena of {capacity} bytes")
        self.capacity = capacity
        self.region, self.start = huge_page_region(capacity)
        self._base = region_address(self.region) + self.start
        self._madvise = madvise or libc_madvise()
        self._lock = threading.Lock()
        self._limit = capacity if self._madvise is not None else 0
        #: bytes from the start known to be faulted in (the thread's progress)
        self.populated = 0
        #: bytes a loader took (0: none yet, or nothing fitted)
        self.taken = 0
        self._asked = self._finished = False
        self._thread = threading.Thread(target=self._populate, name="draftwise-prefault",
                                        daemon=True)
        self._thread.start()

    def _populate(self) -> None:
        pos = 0
        while True:
            with self._lock:
                end = min(pos + _CHUNK, self._limit)
            if end <= pos or self._madvise is None:
                return
            if self._madvise(self._base + pos, end - pos, MADV_POPULATE_WRITE) != 0:
                return  # EINVAL before Linux 5.14, ENOMEM: the packers fault the rest
            pos = self.populated = end

    def take(self, nbytes: int) -> tuple[mmap.mmap, int] | None:
        """The region and the offset of its first ``nbytes`` for the caller to fill
        (None when they do not fit: then nothing is taken); the thread faults no further
        than ``nbytes`` from now on, and what it faulted past them goes back to the OS
        now, before the caller allocates anything. Once per arena."""
        if self._asked or self._finished:
            raise RuntimeError("a prefaulted arena is taken once")
        self._asked = True
        fits = 0 < nbytes <= self.capacity
        with self._lock:
            self._limit = min(self._limit, nbytes if fits else 0)
        self.taken = nbytes if fits else 0
        self._release_past(self.taken)  # a chunk in flight may fault some again: finish
        return (self.region, self.start) if fits else None

    def finish(self) -> None:
        """Wait for the thread and give the pages past the taken bytes back to the OS (all
        of them when nothing was taken). Safe to call more than once."""
        if self._finished:
            return
        self._finished = True
        with self._lock:
            self._limit = min(self._limit, self.taken)
        self._thread.join()
        self._release_past(self.taken)

    def _release_past(self, nbytes: int) -> None:
        """Give back the region's pages past its first ``nbytes`` (whole huge pages kept)."""
        keep = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        if keep < self.capacity and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self.region.madvise(mmap.MADV_DONTNEED, self.start + keep, self.capacity - keep)
            except OSError:  # advice only
                pass


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
