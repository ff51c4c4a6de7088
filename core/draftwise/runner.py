"""The target model plus its paged KV cache: turns scheduled rows into one forward.

Models with linear-attention layers (the GDN hybrid) also get a ``RecurrentStatePool``:
one slot per running request, taken the first time the request is fed and zeroed
whenever it is fed from position 0 (a fresh prompt or a recompute after preemption),
plus ``max_spec_positions`` per-position copies for speculative verify. After verify the
engine rolls the pool back with ``cache.rollback.rollback`` (K/V and recurrent state in
one call) and calls :meth:`release` when a request leaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftwise.models.batch import ForwardBatch, KVCache, ModelOutput, build_forward_batch

if TYPE_CHECKING:
    from draftwise.cache.recurrent import RecurrentStatePool
    from draftwise.models.loader import LoadedModel

def kv_bytes_per_token(loaded: LoadedModel) -> int:
    """Bytes of K and V one token occupies across all layers."""
    model = loaded.model
    elem = torch.empty((), dtype=model_dtype(loaded)).element_size()
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * elem


def model_dtype(loaded: LoadedModel) -> torch.dtype:
    """The dtype the model's weights were loaded in."""
    return next(loaded.model.parameters()).dtype


class ModelRunner:
    """Owns the KV cache tensors (allocated once) and runs the target forward."""

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int = 1,
        max_spec_positions: int = 0,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.block_size = block_size
        self.device = next(self.model.parameters()).device
        self.kv = KVCache.allocate(
            num_layers=self.model.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=self.model.num_kv_heads,
            head_dim=self.model.head_dim,
            dtype=model_dtype(loaded),
            device=self.device,
        )
        self.states: RecurrentStatePool | None = None
        layout = getattr(self.model, "recurrent_layout", None)
        if layout is not None:
            from draftwise.cache.recurrent import RecurrentStatePool

            layers, shapes, dtypes = layout()
            self.states = RecurrentStatePool(
                max(1, max_num_seqs), shapes, layers, dtypes, max_spec_positions, self.device
            )

    @property
    def has_recurrent_state(self) -> bool:
        """Whether rows carry recurrent state (then prefix caching cannot skip tokens)."""
        return self.states is not None

    def _state_slots(self, req_ids: list[str], start_positions: list[int]) -> list[int]:
        """Each row's slot: taken on first sight, zeroed when the row restarts at 0."""
        pool = self.states
        if pool is None:
            return []
        slots: list[int] = []
        for req_id, start in zip(req_ids, start_positions, strict=True):
            if req_id not in pool:
                if start != 0:
                    raise ValueError(
                        f"request {req_id!r} starts at position {start} with no recurrent state "
                        "(prefix caching cannot be used with linear-attention models)"
                    )
                slots.append(pool.allocate(req_id))
                continue
            if start == 0:  # a recompute after preemption: start from zero state again
                pool.free(req_id)
                slots.append(pool.allocate(req_id))
                continue
            slots.append(pool.slot(req_id))
        return slots

    def release(self, req_id: str) -> None:
        """The request finished, was aborted or preempted: free its state slot."""
        if self.states is not None:
            self.states.free(req_id)

    def build(
        self,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        logits_rows: list[list[int]],
        hidden_layers: tuple[int, ...] = (),
        req_ids: list[str] | None = None,
    ) -> ForwardBatch:
        """Flatten per-row lists into a :class:`ForwardBatch` (``req_ids``: hybrid models)."""
        slots = None
        if self.states is not None:
            if req_ids is None:
                raise ValueError("this model has recurrent state: build() needs the rows' req_ids")
            slots = self._state_slots(req_ids, start_positions)
        return build_forward_batch(
            token_ids,
            start_positions,
            block_tables,
            self.block_size,
            logits_rows,
            device=self.device,
            hidden_layers=hidden_layers,
            state_slots=slots,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> ModelOutput:
        """One target forward over the whole step."""
        if self.states is not None:
            return self.model(batch, self.kv, self.states)
        return self.model(batch, self.kv)
