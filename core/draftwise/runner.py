"""The target model plus its paged KV cache: turns scheduled rows into one forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftwise.models.batch import ForwardBatch, KVCache, ModelOutput, build_forward_batch

if TYPE_CHECKING:
    from draftwise.models.loader import LoadedModel

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


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

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int) -> None:
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

    def build(
        self,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        logits_rows: list[list[int]],
        hidden_layers: tuple[int, ...] = (),
    ) -> ForwardBatch:
        """Flatten per-row lists into a :class:`ForwardBatch`."""
        return build_forward_batch(
            token_ids,
            start_positions,
            block_tables,
            self.block_size,
            logits_rows,
            device=self.device,
            hidden_layers=hidden_layers,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> ModelOutput:
        """One target forward over the whole step."""
        return self.model(batch, self.kv)
