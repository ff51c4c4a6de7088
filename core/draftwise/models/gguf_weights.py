"""Which GGUF weights stay quantized, and packing them: one decision per load.

A projection (fused as the model runs it: q|k|v, gate|up, o, down), the embedding table
and an untied LM head each stay in their stored GGUF type when every stored part is a
type the native kernels run (``WeightType.native``, ``formats.weight_types``) and the model computes in
bf16 on the CPU with the kernels built. Everything else is dequantized to the model dtype
as before, and a quantized type that is dequantized is never silent: one notice line
names each such type and its share of the weight bytes (``QuantPlan.notices``, logged
by ``models.loader``). F16/BF16/F32 tensors are dense by nature and need no notice.

``DRAFTWISE_QUANT`` overrides the choice: ``auto`` (default), ``native`` (fail at start-up
if the kernels cannot run here) or ``0`` (dequantize everything: the old behaviour, for
comparisons).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.gpu.quant import BLOCKS as DEVICE_BLOCKS
from draftwise.gpu.quant import DeviceQuantWeight
from draftwise.models import packed_cache
from draftwise.models.arena import PrefaultedArena
from draftwise.models.config import ModelConfig
from draftwise.models.early_pack import EarlyPack
from draftwise.models.hugepages import huge_page_tensor, region_tensor
from draftwise.models.pack_plan import (
    PackPlan,
    StreamStopped,
    plan_packing,
    quantizable_groups,
    stream_plan,
)
from draftwise.models.quant import QuantWeight, pack_quant

if TYPE_CHECKING:
    from draftwise.models.backend import Backend
    from draftwise.models.prefault import Ahead

logger = logging.getLogger("draftwise")

@dataclass(frozen=True)
class QuantPlan:
    """The weights that stay quantized: model weight name -> HF tensor names (fused order).

    Model weight names are those ``LlamaForCausalLM.set_quantized`` takes:
    ``embed_weight``, ``lm_head_weight``, ``layers.<i>.<projection>``.
    """

    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notices: tuple[str, ...] = ()

    @property
    def hf_names(self) -> frozenset[str]:
        """HF tensors the quantized groups cover (not copied densely)."""
        return frozenset(n for names in self.groups.values() for n in names)


def plan_quantized(
    ckpt: GGUFCheckpoint,
    config: ModelConfig,
    available: Mapping[str, tuple[str, tuple[int, ...]]],
    dtype: torch.dtype,
    device: torch.device | str,
    backend: Backend | None = None,
) -> QuantPlan:
    """Decide, for every weight, quantized or dense (see the module doc), under the
    model's decided ``backend`` (None: decide here, for tests)."""
    if backend is None:
        from draftwise.models.backend import keep_quantized

        keep, why = keep_quantized(dtype, device)
    else:
        keep, why = backend.quantized, backend.quantized_why_not
    on_device = backend is not None and backend.kernels == "triton"
    groups: dict[str, tuple[str, ...]] = {}
    dense_bytes: dict[str, int] = {}
    total = sum(ckpt.nbytes(g) for g, _ in available.values())
    for target, hf in quantizable_groups(config).items():
        types = [ckpt.qtype(available[n][0]) for n in hf]
        if keep and all(int(t) in DEVICE_BLOCKS if on_device else t.native for t in types):
            groups[target] = hf
            continue
        for n, t in zip(hf, types):
            if not t.dense:  # floats are widened or cast: no notice
                dense_bytes[t.name] = dense_bytes.get(t.name, 0) + ckpt.nbytes(available[n][0])
    notices = []
    if dense_bytes:
        listed = ", ".join(f"{name} ({100 * b / max(total, 1):.1f}% of the weight bytes)"
                           for name, b in sorted(dense_bytes.items(), key=lambda kv: -kv[1]))
        reason = why or ("no device kernel for these types (Q4_K, Q6_K and Q8_0 have one)"
                         if on_device else "no native kernel for these types")
        target_dtype = str(dtype).removeprefix("torch.")
        notices.append(f"GGUF weights dequantized to {target_dtype} at load: {listed}; {reason}")
    return QuantPlan(groups, tuple(notices))


def load_quantized(
    ckpt: GGUFCheckpoint,
    config: ModelConfig,
    plan: QuantPlan,
    available: Mapping[str, tuple[str, tuple[int, ...]]],
    install: Callable[[str, object], None],
    progress: Callable[[str], None] | None = None,
    reserved: Ahead | None = None,
) -> int:
    """Pack every planned group into one huge-page arena and ``install(name, weight)`` it.

    Each stored tensor's mapped pages are released once copied, so the file's bytes are
    resident once (in the arena), not twice. ``reserved``: memory faulted in ahead of the
    load (``models.arena``), used when the arena fits in it; its unused pages go back to
    the OS before the arena is filled (all of them, when it does not fit, before a fresh
    one is allocated); or the cache file an early start is packing
    (``models.early_pack``), taken when it was packed under this load's cache key.
    Returns the arena's size in bytes.
    """
    try:
        return _pack_groups(ckpt, config, plan, available, install, progress, reserved)
    finally:
        if reserved is not None:
            reserved.finish()


def load_device_quantized(
    ckpt: GGUFCheckpoint,
    config: ModelConfig,
    plan: QuantPlan,
    available: Mapping[str, tuple[str, tuple[int, ...]]],
    install: Callable[[str, object], None],
    device: torch.device | str,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Every planned group as the file's blocks on ``device`` (the Triton kernels'
    :class:`~draftwise.gpu.quant.DeviceQuantWeight`): rows in the model's order (GGUF's
    q/k row permutation undone on whole rows, which are whole blocks), adjacent parts of
    one type joined into one segment, nothing widened. Returns the bytes placed."""
    total = 0
    for target, hf in plan.groups.items():
        segments: list[tuple[int, torch.Tensor]] = []
        for n in hf:
            name = available[n][0]
            raw = ckpt.raw(name)
            order = ckpt.row_order(name, config.num_attention_heads, config.num_key_value_heads)
            rows = torch.from_numpy(raw[order] if order is not None else raw.copy())
            qtype = int(ckpt.qtype(name))
            if segments and segments[-1][0] == qtype:
                segments[-1] = (qtype, torch.cat([segments[-1][1], rows]))
            else:
                segments.append((qtype, rows))
            ckpt.release(name)
        weight = DeviceQuantWeight([(q, r.to(device)) for q, r in segments],
                                   available[hf[0]][1][1])
        install(target, weight)
        total += weight.nbytes
        for n in hf:
            if progress is not None:
                progress(n)
    return total


def _pack_groups(
    ckpt: GGUFCheckpoint,
    config: ModelConfig,
    plan: QuantPlan,
    available: Mapping[str, tuple[str, tuple[int, ...]]],
    install: Callable[[str, object], None],
    progress: Callable[[str], None] | None,
    reserved: Ahead | None,
) -> int:
    packing = plan_packing(ckpt, config, plan.groups, available)
    sizes, total = packing.sizes, packing.total
    early = reserved if isinstance(reserved, EarlyPack) else None
    arena_ahead = reserved if isinstance(reserved, PrefaultedArena) else None
    key = packed_cache.cache_key(ckpt.path, sizes) if packed_cache.enabled() else None
    cached = packed_cache.load(key, total) if key is not None else None
    writing, tried = None, False
    if key is not None and cached is None and early is not None:
        written = early.take(key)  # packed since before the imports (models.early_pack)
        tried = early.tried and early.key == key
        if written is not None:
            cached = written.finish()
    if key is not None and cached is None and total and not tried:
        writing = packed_cache.PackedFile.create(key, total)
    taken = (arena_ahead.take(0 if cached is not None or writing is not None else total)
             if arena_ahead is not None else None)
    if not sizes:
        return 0
    workers = min(os.cpu_count() or 1, len(sizes))
    if writing is not None:  # packed straight into the cache file, then mapped
        cached = _stream_to_file(writing, packing, ckpt, workers)
    if cached is not None:  # packed by an earlier start or just now: mapped, nothing to pack
        arena = cached
    elif taken is not None:
        arena = region_tensor(*taken, total, torch.uint8)
    else:
        arena = huge_page_tensor(total, torch.uint8)
    slices, offset = {}, 0
    for target, size in sizes.items():
        slices[target] = arena[offset : offset + size]
        offset += size
    stored, parts_of, k_of = packing.stored, packing.parts_of, packing.k_of

    def pack(target: str) -> QuantWeight:
        """One weight, packed by one thread, which gives its stored pages back: a tensor
        in stored order a call at a time as it is read (the embedding, the LM head, o,
        down), fused or reordered parts once packed. With the arena faulted in ahead
        (``models.arena``) every stored page read and not yet given back adds to the
        peak: given back in order by the main thread, which shares the GIL with the
        tokenizer's build, they had raised the 1.5B's (file-backed RSS at the peak
        398 MiB, against 108 so)."""
        names, parts = stored[target], parts_of[target]
        follow = None
        if len(parts) == 1 and parts[0].order is None and cached is None:
            follow = functools.partial(ckpt.release, names[0])
        weight = pack_quant(parts, k_of[target], slices[target], 1, follow,
                            packed=cached is not None)
        for name in names:
            ckpt.release(name)
        return weight

    # one weight per task, each packed by one thread: no barrier between the threads
    # (a late thread, its core busy elsewhere, only delays its own weight), and the arena's
    # pages not faulted in yet are zeroed by the kernel in whichever thread first writes them
    with ThreadPoolExecutor(workers, thread_name_prefix="draftwise-pack") as pool:
        packed = {t: pool.submit(pack, t) for t in sizes}
        for target, hf in plan.groups.items():
            install(target, packed[target].result())
            for n in hf:
                if progress is not None:
                    progress(n)
    return offset


def _stream_to_file(writing: packed_cache.PackedFile, packing: PackPlan, ckpt: GGUFCheckpoint,
                    workers: int) -> torch.Tensor | None:
    """Pack every weight into ``writing`` (the cache file, ``packed_cache.PackedFile``) and
    map it; None when that failed (the file is gone, the caller packs into memory). The
    threads are ``pack_plan.stream_plan``'s, as an early start's are (``models.early_pack``)."""
    try:
        stream_plan(packing, ckpt, writing.write, workers)
    except (OSError, StreamStopped) as exc:  # a disk that filled up after all, an I/O error
        logger.warning("draftwise: packed weights not cached at %s: %s (%s=0: do not try)",
                       writing.data, exc, packed_cache.ENV)
        writing.abandon()
        return None
    return writing.finish()
