"""A first start's packing into the cache file, begun before the process imports torch.

Why: on a first start (no packed-weights file for this model and build yet,
``models.packed_cache``) the weights are packed into that file, ~2.6 s of CPU for the
Qwen2.5-Coder-1.5B Q4_K_M on 2 threads, most of it system time (the file's 1.1 GB of
fresh page-cache pages). Packed by the loader, that came after the imports (~1.5 s, torch
~1.1 s of it), which run on one core and leave the other idle. So the CLI starts this
where it starts its arena prefault (``cli.common.prefault_weights``, before the plugins'
imports): a daemon thread reads the GGUF's header, plans the packing exactly as the
loader will (``models.pack_plan``: the same functions, no torch) and streams the packed
bytes into the cache file's temporary name while the main thread imports. The loader
then plans again, and takes the written file only if its own cache key (which names the
plan: every weight's name and packed size, the model file, the kernels' build) is the
one this packed under (:meth:`EarlyPack.take`); otherwise, and whenever this failed, it
does what it did before (the errors that matter are its own, named). A file taken is
put in place by the loader (``PackedFile.finish``: mapped, sampled, renamed), as one it
wrote itself.

While it runs the GIL's switch interval is cut to 0.1 ms (the loader does so while its
tokenizer thread runs): the packing threads need the GIL for a moment between 8 MB
calls, and at the default 5 ms each wait behind the importing main thread would be up
to 5 ms. :meth:`EarlyPack.finish` (the loader's, or the CLI's when the options turned
out different) puts it back, stops the threads and deletes a file nobody took.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from draftwise.models import packed_cache

if TYPE_CHECKING:
    from draftwise.formats.gguf import GGUFCheckpoint

logger = logging.getLogger("draftwise")

#: GIL switch interval while the early packing runs beside the imports (see the module doc)
_SWITCH_S = 1e-4


class EarlyPack:
    """The packed-weights file of the GGUF at ``path``, being written on daemon threads.

    States, in order: running; then done with a written file (``take`` hands it over once)
    or with nothing (the cache could not be written: ``tried``; or the planning failed,
    which the loader, planning again, reports by name). Nothing here raises."""

    def __init__(self, path: str, workers: int | None = None) -> None:
        self.path = path
        self.workers = workers or os.cpu_count() or 1
        #: the cache key the file was packed under (None until the plan is made)
        self.key: dict[str, Any] | None = None
        #: a cache file was attempted (created, or refused with a warning): the loader
        #: does not try again under the same key
        self.tried = False
        self._file: packed_cache.PackedFile | None = None
        self._ckpt: GGUFCheckpoint | None = None
        self._opened = threading.Event()
        self._stop = threading.Event()
        #: the interval found (the loader restores this one too, ``models.loader``)
        self.switch_before = sys.getswitchinterval()
        self._switched = True
        sys.setswitchinterval(min(self.switch_before, _SWITCH_S))
        self._thread = threading.Thread(target=self._run, name="draftwise-early-pack",
                                        daemon=True)
        self._thread.start()
        # a command that fails before its load finishes this (its options, a refusal):
        # at exit, so a 1 GB temporary file is not left for the next write to delete
        atexit.register(self.finish)

    def _run(self) -> None:
        """Plan as the loader will, create the file, stream into it (see the module doc)."""
        from draftwise.formats.gguf import GGUFCheckpoint
        from draftwise.models.config import ModelConfig
        from draftwise.models.pack_plan import (
            StreamStopped,
            native_groups,
            plan_packing,
            stream_plan,
        )

        try:
            try:
                ckpt = self._ckpt = GGUFCheckpoint(self.path)
            finally:
                self._opened.set()
            config = ModelConfig.from_gguf_metadata(
                ckpt.metadata, ckpt.tensor_names, self.path,
                rope_freq_factors=ckpt.rope_freq_factors())
            available = ckpt.hf_shapes()
            plan = plan_packing(ckpt, config, native_groups(ckpt, config, available), available)
            key = packed_cache.cache_key(self.path, plan.sizes)
        except Exception as exc:  # noqa: BLE001 (the loader plans again and names it)
            logger.debug("draftwise: no early packing of %s: %r", self.path, exc)
            return
        if self._stop.is_set() or not plan.total:
            return
        self.key, self.tried = key, True
        writing = packed_cache.PackedFile.create(key, plan.total)
        if writing is None:  # refused with a warning (a full disk): the loader packs in memory
            return
        try:
            stream_plan(plan, ckpt, writing.write, self.workers, self._stop)
        except StreamStopped:
            writing.abandon()
            return
        except OSError as exc:  # a disk that filled up after all, an I/O error
            logger.warning("draftwise: packed weights not cached at %s: %s (%s=0: do not try)",
                           writing.data, exc, packed_cache.ENV)
            writing.abandon()
            return
        except BaseException:
            writing.abandon()
            raise
        self._file = writing

    def checkpoint(self) -> GGUFCheckpoint | None:
        """The GGUF's header as this read it (the loader's, so it is parsed once; None
        where it could not be read: the loader reads it again and names the error)."""
        self._opened.wait()
        return self._ckpt

    def take(self, key: dict[str, Any]) -> packed_cache.PackedFile | None:
        """Wait for the packing; the written file when it was packed under ``key`` (the
        caller finishes it: ``PackedFile.finish``), else None. Once."""
        self._thread.join()
        if self._file is None or self.key != key:
            return None
        written, self._file = self._file, None
        return written

    def finish(self) -> None:
        """Stop and wait for the threads, delete a file nobody took, and put the switch
        interval back. Safe to call more than once."""
        atexit.unregister(self.finish)
        self._stop.set()
        self._thread.join()
        if self._file is not None:
            self._file.abandon()
            self._file = None
        if self._switched:
            sys.setswitchinterval(self.switch_before)
            self._switched = False


__all__ = ["EarlyPack"]
