"""What one target forward consumes: a flat batch of tokens over paged KV.

The engine builds a :class:`ForwardBatch` each step; every model in
``draftwise.models`` takes it with a :class:`KVCache` and returns a
:class:`ModelOutput`. Prefill chunks and decode rows (last token + drafts) are mixed
freely: row ``i`` owns tokens ``query_start_loc[i]:query_start_loc[i+1]``, whose
positions continue its context, and attends causally to its first ``seq_lens[i]``
cached positions (which include this step's tokens, written via ``slot_mapping``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftwise.models.hugepages import lazy_zeroed_tensor
from draftwise.models.kernels import PagedCache, paged_cache


@dataclass(slots=True)
class KVCache:
    """Paged key/value storage: per layer ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    Slot ``s`` is block ``s // block_size``, offset ``s % block_size``.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int
    #: every layer's caches checked for the native attention, once (:meth:`paged`)
    _paged: tuple[PagedCache, ...] | None = field(default=None, init=False, repr=False,
                                                  compare=False)

    def paged(self) -> tuple[PagedCache, ...]:
        """Each layer's K/V checked for the C attention kernel (``kernels.paged_cache``):
        once per cache, not once per layer call (a layer whose tensors were swapped is
        checked again). Raises ``KernelInputError`` when a layer's caches cannot go to the
        kernel (not bf16, not contiguous, mismatched)."""
        known = self._paged
        if known is None or len(known) != len(self.k) or not all(
                c.k is k and c.v is v for c, k, v in zip(known, self.k, self.v)):
            self._paged = tuple(paged_cache(k, v) for k, v in zip(self.k, self.v))
        return self._paged

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> KVCache:
        """Allocate once at startup; the engine never re-allocates per step."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        if torch.device(device).type != "cpu":
            k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            return cls(k, v, block_size)
        # on CPU one lazily zeroed arena on ordinary pages (models.hugepages: huge pages
        # cost the first token 2 faults of 2 MB per layer and speed decode by nothing seen)
        per = num_blocks * block_size * num_kv_heads * head_dim
        arena = lazy_zeroed_tensor(2 * num_layers * per, dtype)
        views = [arena[i * per : (i + 1) * per].view(shape) for i in range(2 * num_layers)]
        return cls(views[:num_layers], views[num_layers:], block_size)

    @property
    def num_blocks(self) -> int:
        """Blocks per layer."""
        return self.k[0].shape[0] if self.k else 0


@dataclass(slots=True)
class ForwardBatch:
    """One step's flat token batch. Tensors are int64 on the model's device."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] flat KV slot each token's K/V is written to
    query_start_loc: torch.Tensor  # [B + 1]
    seq_lens: torch.Tensor  # [B] context length per row, this step's tokens included
    block_tables: torch.Tensor  # [B, max_blocks_per_row] padded with 0
    logits_indices: torch.Tensor  # [N] indices into T whose logits are returned
    #: host copies, so the model never syncs to read shapes
    query_lens_cpu: list[int] = field(default_factory=list)
    seq_lens_cpu: list[int] = field(default_factory=list)
    #: layers whose hidden states (output of that decoder layer, ``[T, hidden]``) to return
    hidden_layers: tuple[int, ...] = ()
    #: models with recurrent layers: each row's slot in the RecurrentStatePool ([B] int64),
    #: with its host copy; None for pure-attention models
    state_slots: torch.Tensor | None = None
    state_slots_cpu: list[int] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        """Rows (sequences) in the batch."""
        return len(self.query_lens_cpu)

    @property
    def max_query_len(self) -> int:
        """Longest query in the batch."""
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        """Longest context in the batch."""
        return max(self.seq_lens_cpu, default=0)


@dataclass(slots=True)
class ModelOutput:
    """Logits at the requested positions and any requested hidden states."""

    logits: torch.Tensor  # [N, vocab] float32
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [T, hidden]


def build_forward_batch(
    token_ids: list[list[int]],
    start_positions: list[int],
    block_tables: list[list[int]],
    block_size: int,
    logits_rows: list[list[int]],
    device: str | torch.device = "cpu",
    hidden_layers: tuple[int, ...] = (),
    state_slots: list[int] | None = None,
) -> ForwardBatch:
    """Build a batch from per-row python lists.

    ``token_ids[i]`` are row ``i``'s new tokens starting at position ``start_positions[i]``;
    ``logits_rows[i]`` are offsets within that row whose logits are wanted;
    ``state_slots[i]`` is row ``i``'s recurrent-state slot (hybrid models only).
    """
    flat_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    logits_idx: list[int] = []
    for ids, start, table, wanted in zip(token_ids, start_positions, block_tables, logits_rows):
        n = len(ids)
        base = qsl[-1]
        flat_ids.extend(ids)
        for p in range(start, start + n):
            positions.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
        logits_idx.extend(base + j for j in wanted)
        qsl.append(base + n)
        seq_lens.append(start + n)
    width = max((len(t) for t in block_tables), default=0)
    padded = [t + [0] * (width - len(t)) for t in block_tables]

    def as_tensor(x: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return ForwardBatch(
        input_ids=as_tensor(flat_ids),
        positions=as_tensor(positions),
        slot_mapping=as_tensor(slots),
        query_start_loc=as_tensor(qsl),
        seq_lens=as_tensor(seq_lens),
        block_tables=as_tensor(padded) if padded else torch.zeros((0, 0), dtype=torch.long),
        logits_indices=as_tensor(logits_idx),
        query_lens_cpu=[len(t) for t in token_ids],
        seq_lens_cpu=seq_lens,
        hidden_layers=hidden_layers,
        state_slots=None if state_slots is None else as_tensor(list(state_slots)),
        state_slots_cpu=[] if state_slots is None else list(state_slots),
    )
