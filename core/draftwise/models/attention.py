"""Paged causal attention in plain torch, bitwise batch-invariant in bf16.

Speculative decoding is only lossless in practice if a token's logits do not depend on
what else is in the batch: a decode row alone, the same row with k draft tokens after
it, and the row next to longer rows must give the same bits. Each step therefore:

1. writes this step's K/V at ``slot_mapping``;
2. gathers every row's context from its block table into a padded, kv-head-major
   ``[kv_heads, B, N, head_dim]`` buffer, N rounded up to a multiple of ``CHUNK``;
3. scores with one bf16 matmul, masks with -inf, and normalises in fp32 by hand: the
   max is exact, ``exp`` is elementwise, and the denominator is summed per fixed
   ``CHUNK`` of key positions and then across chunks with a sequential ``cumsum``, so
   padding only ever adds exact zeros at the end (``torch.softmax``'s sum changes with
   the row length);
4. multiplies the bf16 probabilities with V one ``CHUNK`` at a time (a fixed reduction
   length: oneDNN's blocking of a long K changes with K) and sums the chunks in fp32.

Measured on oneDNN's bf16 GEMM: a row's result does not depend on M (for M >= 2; M == 1
takes a GEMV path that rounds differently, so it is padded to 2), the batch size, or N.
fp32 GEMM (MKL) depends on M, so fp32 models are accurate but not batch-invariant.
SDPA is not used: its blocking depends on the query and key lengths.

A block drafter (DFlash) runs its block non-causally: ``causal=False`` lets every query
of a row see the row's whole context, this step's tokens included. The torch path masks
against the row's last position; the native kernel gets each row's M queries as M times
the heads of ONE query at the row's last position (query-heads ordered kv head, query,
head within the group, which is how the kernel groups heads over a kv head), so a row's
context is gathered and transposed once per kv head instead of once per query (M times
less), and each (query, head) is still the same instruction sequence over the same keys
in the same order as a query of its own: the same bits. The kernel writes every token's
K/V before any row reads.

On CPU with bf16 caches a hand-written C kernel (``core/csrc/paged_attention.c``, built
at install when a compiler is present) does the same job without the gather and the
padding, batch-invariant by construction; this torch path is its readable reference and
runs everywhere else. ``DRAFTWISE_ATTENTION=torch|native`` forces one (``native`` where
the kernel cannot run is an error, not a silent fallback). Under the Triton kernels
(``Backend.kernels == "triton"``: a CUDA device, or the interpreter in tests) the model's
attention backend is ``triton`` and :func:`paged_attention` hands the same index tensors
to ``draftwise.gpu.attention.paged_attention`` (causal only).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from draftwise.models import kernels
from draftwise.models.batch import ForwardBatch
from draftwise.models.kernels import KERNELS
from draftwise.models.kv_slots import write_kv

#: key positions per softmax-denominator chunk; every context is padded to a multiple
CHUNK = 256

#: ``auto`` (native where it can run), ``native`` or ``torch``
BACKEND_ENV = "DRAFTWISE_ATTENTION"


#: the C kernels, or None (tests read it here)
_kernels = KERNELS


def native_head_dim(head_dim: int) -> bool:
    """Whether the C kernel takes heads of this size (a multiple of 16 up to 512)."""
    return head_dim % 16 == 0 and head_dim <= 512


def choose_backend(dtype: torch.dtype, head_dim: int, device: torch.device | str) -> str:
    """``native`` (the C kernel) or ``torch`` for a model's KV dtype and head size.

    The rule only: ``models.backend.decide_backend`` is its one caller outside tests.
    """
    wanted = os.environ.get(BACKEND_ENV, "auto")
    if wanted not in ("auto", "native", "torch"):
        raise ValueError(f"{BACKEND_ENV}={wanted!r}: use auto, native or torch")
    why_not = None
    if _kernels is None:
        why_not = "the C kernels were not built (no compiler at install time)"
    elif torch.device(device).type != "cpu" or dtype != torch.bfloat16:
        why_not = f"it runs bf16 on CPU only (this model: {dtype} on {device})"
    elif not native_head_dim(head_dim):
        why_not = f"head_dim {head_dim} is not a multiple of 16 up to 512"
    if wanted == "native" and why_not is not None:
        raise RuntimeError(f"{BACKEND_ENV}=native, but the native attention cannot run: {why_not}")
    return "torch" if wanted == "torch" or why_not is not None else "native"


@dataclass(slots=True)
class AttentionMetadata:
    """Per-forward index tensors and masks, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # [T]
    block_ids: torch.Tensor  # [B * W] each row's block table, W * block_size >= ctx_len
    num_rows: int
    max_query_len: int
    ctx_len: int  # padded context N, a multiple of CHUNK
    chunk: int
    #: row-major padded query layout: [B * M] indices into T (None: one row, no padding)
    pad_index: torch.Tensor | None
    #: back to the flat layout: [T] indices into B * M
    unpad_index: torch.Tensor | None
    #: sliding window (None: full causal) -> additive fp32 mask [1, B, M, 1, N]
    masks: dict[int | None, torch.Tensor]
    #: ``native`` (the C kernel) and ``triton`` (``draftwise.gpu.attention``) read these
    #: instead of the padded layout above
    backend: str = "torch"
    query_start_loc: torch.Tensor | None = None  # [B + 1] int64
    seq_lens: torch.Tensor | None = None  # [B] int64
    block_tables: torch.Tensor | None = None  # [B, W] int64, contiguous
    #: native non-causal: each row's queries ride as extra heads of one query (module
    #: doc); pad_index/unpad_index then map T <-> [B, max_query_len]
    queries_as_heads: bool = False
    #: ``native``: the four index tensors above, checked once for the C kernel
    index: kernels.AttentionIndex | None = None

    def __post_init__(self) -> None:
        """A native value made by hand (not by :meth:`build`) is checked here, once."""
        if self.index is None and self.backend == "native" and None not in (
                self.query_start_loc, self.seq_lens, self.block_tables):
            self.index = kernels.attention_index(
                self.slot_mapping, self.query_start_loc, self.seq_lens,  # type: ignore[arg-type]
                self.block_tables)  # type: ignore[arg-type]

    @classmethod
    def build(
        cls,
        batch: ForwardBatch,
        block_size: int,
        windows: Iterable[int | None] = (None,),
        chunk: int = CHUNK,
        backend: str = "torch",
        num_blocks: int | None = None,
        causal: bool = True,
    ) -> AttentionMetadata:
        """Shapes come from the host lists, so building never syncs on the device.

        ``native`` reads the cache through raw pointers, so the batch is bounds-checked
        here first (once per forward): a malformed batch is a ``ValueError``, not a crash.
        ``causal=False`` (a non-causal block, see the module doc) takes no sliding window.
        """
        if not causal and any(w is not None for w in windows):
            raise ValueError("non-causal attention takes no sliding window")
        if backend == "triton":
            return cls._triton(batch, chunk, causal)
        if backend == "native" and not causal:
            _check_native_bounds(batch, block_size, num_blocks)
            return cls._native_non_causal(batch, chunk, num_blocks)
        if backend == "native":
            _check_native_bounds(batch, block_size, num_blocks)
            return cls._native(batch, chunk, num_blocks, batch.query_start_loc.contiguous())
        qlens = batch.query_lens_cpu
        b, m = len(qlens), max(qlens)
        n = -(-max(batch.seq_lens_cpu) // chunk) * chunk
        width = -(-n // block_size)
        tables = batch.block_tables
        if tables.shape[1] >= width:
            tables = tables[:, :width]
        else:
            tables = torch.nn.functional.pad(tables, (0, width - tables.shape[1]))
        device = batch.input_ids.device
        if b == 1:
            pad_index = unpad_index = None
            qpos = batch.positions.view(1, m)
        else:
            pad: list[int] = []
            unpad: list[int] = []
            start = 0
            for row, q in enumerate(qlens):
                pad.extend(range(start, start + q))
                pad.extend([start + q - 1] * (m - q))  # pad with a real query: finite row
                unpad.extend(range(row * m, row * m + q))
                start += q
            pad_index = torch.tensor(pad, dtype=torch.long, device=device)
            unpad_index = torch.tensor(unpad, dtype=torch.long, device=device)
            qpos = batch.positions.index_select(0, pad_index).view(b, m)
        if not causal:  # every query sees its row's last position and all before it
            last = torch.tensor([s - 1 for s in batch.seq_lens_cpu], device=device)
            qpos = last[:, None].expand(b, m)
        key_pos = torch.arange(n, device=device)
        masks = {}
        for window in set(windows):
            allowed = key_pos[None, None, :] <= qpos[:, :, None]
            if window is not None:
                allowed &= key_pos[None, None, :] > qpos[:, :, None] - window
            mask = torch.zeros((b, m, n), dtype=torch.float32, device=device)
            masks[window] = mask.masked_fill_(~allowed, float("-inf")).view(1, b, m, 1, n)
        return cls(
            slot_mapping=batch.slot_mapping,
            block_ids=tables.reshape(-1),
            num_rows=b,
            max_query_len=m,
            ctx_len=n,
            chunk=chunk,
            pad_index=pad_index,
            unpad_index=unpad_index,
            masks=masks,
        )

    @classmethod
    def _triton(cls, batch: ForwardBatch, chunk: int, causal: bool) -> AttentionMetadata:
        """``draftwise.gpu``'s kernel reads the batch's own index tensors (on its device);
        no padded layout, no masks. It is causal only: a non-causal block is refused."""
        if not causal:
            raise ValueError("the Triton attention is causal only: a non-causal block "
                             "(DFlash) has no device kernel yet")
        return cls(
            slot_mapping=batch.slot_mapping,
            block_ids=batch.block_tables,
            num_rows=batch.num_rows,
            max_query_len=max(batch.query_lens_cpu),
            ctx_len=max(batch.seq_lens_cpu),
            chunk=chunk,
            pad_index=None,
            unpad_index=None,
            masks={},
            backend="triton",
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_tables=batch.block_tables,
        )

    @classmethod
    def _native_non_causal(
        cls, batch: ForwardBatch, chunk: int, num_blocks: int | None
    ) -> AttentionMetadata:
        """Each row's queries as the heads of one query at its last position (module doc)."""
        device = batch.input_ids.device
        qlens = batch.query_lens_cpu
        b, m = len(qlens), max(qlens)
        pad_index = unpad_index = None
        if any(q != m for q in qlens):
            pad: list[int] = []
            unpad: list[int] = []
            start = 0
            for row, q in enumerate(qlens):
                pad.extend(range(start, start + q))
                pad.extend([start + q - 1] * (m - q))  # a real query: a finite, dropped row
                unpad.extend(range(row * m, row * m + q))
                start += q
            pad_index = torch.tensor(pad, dtype=torch.long, device=device)
            unpad_index = torch.tensor(unpad, dtype=torch.long, device=device)
        starts = torch.arange(b + 1, dtype=torch.long, device=device)
        return cls._native(batch, chunk, num_blocks, starts, pad_index, unpad_index,
                           queries_as_heads=True)

    @classmethod
    def _native(
        cls,
        batch: ForwardBatch,
        chunk: int,
        num_blocks: int | None,
        query_start_loc: torch.Tensor,  # [B + 1] int64, contiguous
        pad_index: torch.Tensor | None = None,
        unpad_index: torch.Tensor | None = None,
        queries_as_heads: bool = False,
    ) -> AttentionMetadata:
        """The C kernel's metadata, causal or not: its four index tensors contiguous and
        checked once (``kernels.attention_index``), no padded layout or masks."""
        slots, lens = batch.slot_mapping.contiguous(), batch.seq_lens.contiguous()
        tables = batch.block_tables.contiguous()
        return cls(
            slot_mapping=slots,
            block_ids=batch.block_tables,
            num_rows=batch.num_rows,
            max_query_len=max(batch.query_lens_cpu),
            ctx_len=max(batch.seq_lens_cpu),
            chunk=chunk,
            pad_index=pad_index,
            unpad_index=unpad_index,
            masks={},
            backend="native",
            query_start_loc=query_start_loc,
            seq_lens=lens,
            block_tables=tables,
            queries_as_heads=queries_as_heads,
            index=kernels.attention_index(slots, query_start_loc, lens, tables, num_blocks),
        )


def _check_native_bounds(batch: ForwardBatch, block_size: int, num_blocks: int | None) -> None:
    """Every index the C kernel will follow lands inside the cache (see ``build``)."""
    qlens, seqs = batch.query_lens_cpu, batch.seq_lens_cpu
    if len(qlens) != len(seqs) or sum(qlens) != batch.input_ids.shape[0]:
        raise ValueError("ForwardBatch: query lengths do not add up to the tokens fed")
    if any(q < 1 or q > s for q, s in zip(qlens, seqs)):
        raise ValueError("ForwardBatch: every row needs 1 <= query_len <= seq_len")
    if max(seqs) > batch.block_tables.shape[1] * block_size:
        raise ValueError("ForwardBatch: a row's context runs past its block table")
    if num_blocks is not None and batch.block_tables.numel():
        lo, hi = int(batch.block_tables.min()), int(batch.block_tables.max())
        slots_lo, slots_hi = int(batch.slot_mapping.min()), int(batch.slot_mapping.max())
        if lo < 0 or hi >= num_blocks or slots_lo < 0 or slots_hi >= num_blocks * block_size:
            raise ValueError(
                f"ForwardBatch: block ids or slots outside the cache ({num_blocks} blocks)"
            )


def gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    meta: AttentionMetadata,
) -> torch.Tensor:  # [kv_heads, B, N, head_dim]
    """Every row's context in position order, padded to ``meta.ctx_len``, kv-head major.

    Whole blocks are gathered (contiguous copies), then transposed once into the layout
    the matmuls want: merged (kv, B) batch dims over contiguous ``[N, d]`` matrices, so
    the matmul makes no hidden copy of its own.
    """
    _, _, kv, d = cache.shape
    rows = cache.index_select(0, meta.block_ids).view(meta.num_rows, -1, kv, d)
    return rows[:, : meta.ctx_len].permute(2, 0, 1, 3).contiguous()


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,  # [T, kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [T, heads * head_dim]
    """Causal attention of each row's queries over its cached context (GQA-aware)."""
    _, h, d = q.shape
    kv = k.shape[1]
    rep = h // kv
    b, m, n = meta.num_rows, meta.max_query_len, meta.ctx_len
    if meta.backend == "native":
        return _native_attention(q, k, v, k_cache, v_cache, meta, scale, window)
    if meta.backend == "triton":
        from draftwise.gpu.attention import paged_attention as device_attention

        return device_attention(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                scale, window)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    keys = gather_context(k_cache, meta)
    values = gather_context(v_cache, meta)
    qp = q if meta.pad_index is None else q.index_select(0, meta.pad_index)
    # the query heads sharing a kv head, row-padded: [kv, B, M * rep, d]
    qp = qp.view(b, m, kv, rep, d).permute(2, 0, 1, 3, 4).reshape(kv, b, m * rep, d)
    scores = matmul_rows(qp, keys.transpose(-1, -2)).view(kv, b, m, rep, n)
    probs = torch.add(meta.masks[window], scores, alpha=scale)  # fp32 [kv, B, M, rep, N]
    probs.sub_(probs.amax(dim=-1, keepdim=True)).exp_()
    chunks, c = n // meta.chunk, meta.chunk
    denom = probs.view(kv, b, m, rep, chunks, c).sum(dim=-1).cumsum(dim=-1)[..., -1:]
    p = torch.div(probs, denom).to(q.dtype).view(kv, b, m * rep, n)
    if chunks == 1:
        out = matmul_rows(p, values)  # [kv, B, M * rep, d]
    else:
        # one fixed-K matmul per chunk, summed in fp32 in position order
        p = p.view(kv, b, m * rep, chunks, c).transpose(2, 3)  # [kv, B, chunks, M*rep, C]
        partial = matmul_rows(p, values.reshape(kv, b, chunks, c, d))
        out = partial.float().cumsum(dim=2)[:, :, -1].to(q.dtype)
    out = out.view(kv, b, m, rep, d).permute(1, 2, 0, 3, 4).reshape(b * m, h * d)
    return out if meta.unpad_index is None else out.index_select(0, meta.unpad_index)


def _native_attention(
    q: torch.Tensor,  # [T, heads, head_dim] bf16
    k: torch.Tensor,  # [T, kv_heads, head_dim]
    v: torch.Tensor,  # [T, kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim] bf16, contiguous
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
) -> torch.Tensor:  # [T, heads * head_dim]
    """The C kernel: writes this step's K/V, then attends over the paged cache in place."""
    if meta.index is None:
        raise ValueError("native attention needs metadata built with backend='native'")
    h, d = q.shape[1], q.shape[2]
    if meta.queries_as_heads:  # [T, H, D] -> [B, KV * M * rep, D] (module doc)
        b, m, kvh = meta.num_rows, meta.max_query_len, k.shape[1]
        qp = q if meta.pad_index is None else q.index_select(0, meta.pad_index)
        q = (qp.reshape(b, m, kvh, h // kvh, d).permute(0, 2, 1, 3, 4)
             .reshape(b, m * h, d).contiguous())
    out = kernels.paged_attention(q, k, v, kernels.paged_cache(k_cache, v_cache), meta.index,
                                  window, scale)
    if meta.queries_as_heads:
        b, m, kvh = meta.num_rows, meta.max_query_len, k.shape[1]
        out = (out.view(b, kvh, m, h // kvh, d).permute(0, 2, 1, 3, 4)
               .reshape(b * m, h * d))
        if meta.unpad_index is not None:
            out = out.index_select(0, meta.unpad_index)
    return out


def matmul_rows(
    a: torch.Tensor,  # [..., M, K]
    b: torch.Tensor,  # [..., K, N]
) -> torch.Tensor:  # [..., M, N]
    """``a @ b`` never run with M == 1 in bf16/fp16: that path (a GEMV) rounds differently
    from GEMM. fp32 is not batch-invariant anyway and keeps the faster GEMV."""
    if a.shape[-2] != 1 or a.dtype == torch.float32:
        return torch.matmul(a, b)
    shape = list(a.shape)
    shape[-2] = 2
    return torch.matmul(a.expand(shape), b)[..., :1, :]
