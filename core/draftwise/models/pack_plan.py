"""What a GGUF's packed weights are, and streaming their bytes, decided without torch.

Why its own module, and why torch-free: a first start packs the weights into the cache
file (``models.packed_cache.PackedFile``) on threads that :mod:`draftwise.models.early_pack`
starts before the process imports torch (~1.1 s of the 1.5B's ~1.5 s of imports, on one
core: the other core is idle then). Those threads and the loader use the functions here,
the same ones, so the file an early start writes holds exactly the bytes the loader
would have packed: which weights stay quantized (:func:`native_groups`), each one's
stored parts and row order (:func:`plan_packing`), their sizes (:func:`plan_bytes`,
which name the file through ``packed_cache.cache_key``) and the tiles
(:func:`pack_quant_stream`, the C ``quant_pack`` called by address). ``models.quant``
re-exports :class:`QuantPart` and :func:`plan_bytes`, and packs into memory with them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from draftwise.formats.weight_types import TILE, WeightType, weight_type
from draftwise.models.config import ModelConfig

#: fused parts per call the kernel accepts
MAX_SEGMENTS = 8
#: stored bytes per packing call when a loader follows the packing (``pack_quant``'s
#: ``rows_done``): with the arena faulted in before the load (``models.arena``), the
#: stored pages not yet given back are what the load adds to the peak resident set
PACK_CALL_BYTES = 8 << 20


@dataclass(frozen=True)
class QuantPart:
    """One stored tensor to pack: ``raw`` is ``[rows, row_bytes]`` GGUF blocks (a view of
    the mapped file), ``order`` the stored row each packed row takes (None: as stored).
    ``qtype`` may be given as a number (a ``GGMLQuantizationType``): it becomes its
    registered record here, once."""

    qtype: WeightType
    raw: np.ndarray  # [rows, row_bytes] uint8
    order: np.ndarray | None = None  # [rows] int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "qtype", weight_type(self.qtype))


def segments(parts: Sequence[QuantPart]) -> list[list[QuantPart]]:
    """Adjacent parts of one type share a segment when the earlier ones fill whole tiles."""
    groups: list[list[QuantPart]] = []
    for part in parts:
        last = groups[-1] if groups else None
        if last and last[0].qtype == part.qtype and sum(p.raw.shape[0] for p in last) % TILE == 0:
            last.append(part)
        else:
            groups.append([part])
    return groups


def row_addresses(group: Sequence[QuantPart], k: int) -> np.ndarray:  # [rows] int64
    """The address of each stored row of one segment's parts, in packed order (checked)."""
    qtype = group[0].qtype
    if not qtype.native or qtype.container != "gguf" or k % qtype.block_k:
        raise ValueError(f"{qtype.name} with {k} columns cannot be packed natively")
    row_bytes = qtype.row_bytes(k)
    pointers = []
    for part in group:
        raw = part.raw
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != row_bytes:
            raise ValueError(f"{qtype.name} rows must be uint8 [rows, {row_bytes}]")
        if raw.strides[1] != 1:
            raise ValueError("stored rows must be contiguous")
        order = np.arange(raw.shape[0]) if part.order is None else part.order
        base = raw.__array_interface__["data"][0]
        pointers.append(base + np.asarray(order, dtype=np.int64) * raw.strides[0])
    return np.concatenate(pointers).astype(np.int64)


def plan_bytes(parts: Sequence[QuantPart], k: int) -> int:
    """Bytes :func:`pack_quant` will need for ``parts`` (to size one arena for a model)."""
    return sum(
        g[0].qtype.packed_bytes(sum(p.raw.shape[0] for p in g), k) for g in segments(parts)
    )


def _quant_pack() -> Callable[[int, int, int, int, int, int], None]:
    """The C ``quant_pack(type, row_addresses, dst, rows, k, threads)`` (torch-free)."""
    try:
        from draftwise import _cpu_kernels
    except ImportError:
        _cpu_kernels = None  # type: ignore[assignment]
    call = getattr(_cpu_kernels, "quant_pack", None)
    if call is None:
        raise RuntimeError("the quantized GEMM is not built (no C compiler at install)")
    return call  # type: ignore[no-any-return]


def pack_quant_stream(
    parts: Sequence[QuantPart],
    k: int,
    scratch: np.ndarray,  # [>= PACK_CALL_BYTES] uint8
    write: Callable[[int, np.ndarray], None],
    rows_done: Callable[[int], None] | None = None,
) -> int:
    """``pack_quant``'s bytes without an arena: packed a kernel call at a time into
    ``scratch`` (uint8, at least :data:`PACK_CALL_BYTES` plus one tile of the widest row)
    and handed to ``write(offset, bytes)`` at their offset in the weight's packed bytes.

    Why: a first start writes the packed weights straight into the cache file
    (``models.packed_cache.PackedFile``), so the process allocates them once, as page
    cache, and not a second time as an anonymous arena (each fresh page is a fault the
    host of a VM with free page reporting supplies). The bytes are ``pack_quant``'s:
    a call writes whole tiles, and tiles do not depend on the call they were packed in.
    Returns the bytes written (:func:`plan_bytes`).
    """
    pack = _quant_pack()
    groups = segments(parts)
    if len(groups) > MAX_SEGMENTS:
        raise ValueError(f"at most {MAX_SEGMENTS} type segments per weight, got {len(groups)}")
    if scratch.dtype != np.uint8 or scratch.ndim != 1 or not scratch.flags.c_contiguous \
            or not scratch.flags.writeable:
        raise ValueError("pack_quant_stream needs a writable contiguous uint8 scratch buffer")
    address = scratch.__array_interface__["data"][0]
    offset, start = 0, 0
    for group in groups:
        qtype = group[0].qtype
        rows = row_addresses(group, k)  # refuses a type without a native kernel
        kernel, row_bytes = int(qtype.kernel or 0), qtype.row_bytes(k)
        if TILE * row_bytes > scratch.size:
            raise ValueError(f"a scratch of {scratch.size} bytes holds no tile of "
                             f"{qtype.name} x {k}")
        step = scratch.size // (row_bytes * TILE) * TILE
        for first in range(0, len(rows), step):
            n = min(step, len(rows) - first)
            part_bytes = qtype.packed_bytes(n, k)
            pack(kernel, rows.ctypes.data + rows.itemsize * first, address, n, k, 1)
            write(offset + first * row_bytes, scratch[:part_bytes])
            if rows_done is not None:
                rows_done(start + first + n)
        offset += qtype.packed_bytes(len(rows), k)
        start += len(rows)
    return offset


def quantizable_groups(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Model weight name -> the HF tensors fused into it, for every quantizable weight
    (GGUF here, NVFP4 in ``models.nvfp4_weights``)."""
    out: dict[str, tuple[str, ...]] = {"embed_weight": ("model.embed_tokens.weight",)}
    if not config.tie_word_embeddings:
        out["lm_head_weight"] = ("lm_head.weight",)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        out[f"layers.{i}.qkv_weight"] = tuple(f"{p}self_attn.{n}_proj.weight" for n in "qkv")
        out[f"layers.{i}.o_weight"] = (f"{p}self_attn.o_proj.weight",)
        out[f"layers.{i}.gate_up_weight"] = tuple(f"{p}mlp.{n}_proj.weight" for n in ("gate", "up"))
        out[f"layers.{i}.down_weight"] = (f"{p}mlp.down_proj.weight",)
    return out


class GGUFRows(Protocol):
    """What this module reads of a checkpoint (``formats.gguf.GGUFCheckpoint``)."""

    def qtype(self, name: str) -> WeightType: ...
    def raw(self, name: str) -> np.ndarray: ...
    def row_order(self, gguf_name: str, num_heads: int,
                  num_kv_heads: int) -> np.ndarray | None: ...
    def release(self, name: str, rows: int | None = None, evict: bool = False) -> None: ...


def native_groups(ckpt: GGUFRows, config: ModelConfig,
                  available: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict[str, tuple[str, ...]]:
    """The weights that stay quantized on the CPU where the model may keep them so
    (``gguf_weights.plan_quantized``'s rule there): those whose every part is a type the
    native kernels run."""
    return {target: hf for target, hf in quantizable_groups(config).items()
            if all(ckpt.qtype(available[n][0]).native for n in hf)}


@dataclass(frozen=True)
class PackPlan:
    """Every quantized weight's stored parts, in the order they are packed."""

    parts_of: dict[str, list[QuantPart]]
    #: weight -> in_features
    k_of: dict[str, int]
    #: weight -> packed bytes, in file order (the plan ``packed_cache.cache_key`` names)
    sizes: dict[str, int]
    #: weight -> its GGUF tensor names (released once packed)
    stored: dict[str, list[str]]

    @property
    def total(self) -> int:
        """Packed bytes of every weight (the arena's or cache file's size)."""
        return sum(self.sizes.values())


def plan_packing(ckpt: GGUFRows, config: ModelConfig, groups: Mapping[str, tuple[str, ...]],
                 available: Mapping[str, tuple[str, tuple[int, ...]]]) -> PackPlan:
    """The parts, sizes and tensor names of ``groups`` (row orders undone as the model
    runs them: llama.cpp's Q/K permutation)."""
    parts_of: dict[str, list[QuantPart]] = {}
    for target, hf in groups.items():
        parts = []
        for n in hf:
            name = available[n][0]
            order = ckpt.row_order(name, config.num_attention_heads, config.num_key_value_heads)
            parts.append(QuantPart(ckpt.qtype(name), ckpt.raw(name), order))
        parts_of[target] = parts
    k_of = {t: available[hf[0]][1][1] for t, hf in groups.items()}
    sizes = {t: plan_bytes(parts_of[t], k_of[t]) for t in groups}
    stored = {t: [available[n][0] for n in hf] for t, hf in groups.items()}
    return PackPlan(parts_of, k_of, sizes, stored)


class StreamStopped(Exception):
    """:func:`stream_plan` was told to stop (its packed bytes are incomplete)."""


def stream_plan(plan: PackPlan, ckpt: GGUFRows, write: Callable[[int, np.ndarray], None],
                workers: int, stop: threading.Event | None = None) -> None:
    """Pack every weight of ``plan`` and ``write(offset, bytes)`` it at its offset in the
    plan's bytes, on ``workers`` threads, a weight at a time each.

    Each thread packs through one scratch buffer of its own, reused (fresh memory faulted
    once, not per weight), and gives the weight's stored pages back as they are read, to
    the page cache too (``evict``: the memory of the GGUF's copy becomes the packed
    file's, ``GGUFFile.release``; later starts map the packed file and do not read these
    bytes). Daemon threads: an early start (``models.early_pack``) that is never claimed
    does not hold the process's exit. Raises the first thread's error (an ``OSError``
    from a disk that filled up), or :class:`StreamStopped` when ``stop`` was set.
    """
    widest = max((TILE * max(p.qtype.row_bytes(plan.k_of[t]) for p in plan.parts_of[t])
                  for t in plan.sizes), default=0)
    scratch_bytes = max(PACK_CALL_BYTES, widest)
    offsets, at = {}, 0
    for target, size in plan.sizes.items():
        offsets[target] = at
        at += size
    todo = iter(list(plan.sizes))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        scratch = np.empty(scratch_bytes, dtype=np.uint8)
        while not errors and not (stop is not None and stop.is_set()):
            with lock:
                target = next(todo, None)
            if target is None:
                return
            names, parts, base = plan.stored[target], plan.parts_of[target], offsets[target]
            follow = None
            if len(parts) == 1 and parts[0].order is None:
                def follow(rows: int, name: str = names[0]) -> None:
                    ckpt.release(name, rows, evict=True)
            def put(offset: int, chunk: np.ndarray, base: int = base) -> None:
                if stop is not None and stop.is_set():  # within a call, not a whole weight
                    raise StreamStopped("stopped before every weight was packed")
                write(base + offset, chunk)

            try:
                pack_quant_stream(parts, plan.k_of[target], scratch, put, follow)
                for name in names:
                    ckpt.release(name, evict=True)
            except BaseException as exc:  # noqa: BLE001 (handed to the caller, raised there)
                errors.append(exc)
                return

    threads = [threading.Thread(target=work, name=f"draftwise-pack_{i}", daemon=True)
               for i in range(max(1, min(workers, len(plan.sizes))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    if stop is not None and stop.is_set():
        raise StreamStopped("stopped before every weight was packed")


__all__ = ["MAX_SEGMENTS", "PACK_CALL_BYTES", "PackPlan", "QuantPart", "StreamStopped",
           "native_groups", "pack_quant_stream", "plan_bytes", "plan_packing",
           "quantizable_groups", "row_addresses", "segments", "stream_plan"]
