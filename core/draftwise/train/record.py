"""The target's hidden states at chosen taps for a whole sequence, teacher-forced.

Why a second pass instead of recording during decoding: the engine's rows are chunked,
preempted, batched and partly served from the prefix cache, so the positions a step
computes are not a sequence's positions in order. One prefill over prompt + response
gives every position's states in one call, at prefill speed (several times decode's on
these CPUs), and the kernels are batch-invariant (every output row is one fixed-order
accumulation), so the states equal what decoding computed.

Taps follow ``draftwise.target``'s numbering: tap ``i`` is the output of decoder layer
``i`` before the final norm. :meth:`TapRecorder.record` also returns the final post-norm
state of the last layer when asked (what the LM head reads: a trainer recomputes the
target's logits from it without storing a vocabulary-wide row per token).
"""

from __future__ import annotations

from typing import Any

import torch

from draftwise.errors import EngineConfigError
from draftwise.models.batch import KVCache, build_forward_batch


class TapRecorder:
    """Teacher-forced hidden states of one sequence at a time, on a KV cache of its own."""

    def __init__(self, loaded: Any, taps: tuple[int, ...], max_len: int,
                 block_size: int = 16) -> None:
        model = loaded.model
        layers = int(loaded.config.num_hidden_layers)
        if hasattr(model, "recurrent_layout"):
            raise EngineConfigError(
                "train data: recording a GDN hybrid target's states is not supported yet "
                "(its forward needs recurrent state slots); use a llama-family target")
        if not taps or not all(0 <= t < layers for t in taps):
            raise EngineConfigError(
                f"train data: taps {list(taps)} must be layers of the target "
                f"(0 .. {layers - 1}; tap i is the output of decoder layer i)")
        self.model, self.taps, self.max_len = model, tuple(sorted(set(taps))), max_len
        self.last = layers - 1
        self.block_size = block_size
        blocks = -(-max_len // block_size)
        self.kv = KVCache.allocate(layers, blocks, block_size, model.num_kv_heads,
                                   model.head_dim, model.dtype, model.device)
        self.table = list(range(blocks))

    def record(self, ids: list[int], final: bool = True) -> dict[str, torch.Tensor]:
        """``{"tap<i>": [T, H], ..., "final": [T, H]}`` for the sequence ``ids`` (float32)."""
        if not 0 < len(ids) <= self.max_len:
            raise ValueError(f"a sequence of {len(ids)} tokens does not fit {self.max_len}")
        wanted = self.taps if not final or self.last in self.taps else (*self.taps, self.last)
        batch = build_forward_batch([list(ids)], [0], [self.table], self.block_size, [[]],
                                    device=self.model.device, hidden_layers=wanted)
        self.model.ensure_positions(len(ids))
        with torch.inference_mode():
            out = self.model.forward(batch, self.kv)
            states = {f"tap{t}": out.hidden_states[t].float() for t in self.taps}
            if final:
                states["final"] = self.model.final_norm(out.hidden_states[self.last]).float()
        return states


def default_taps(num_layers: int) -> tuple[int, ...]:
    """Four taps spread over the depth, the last layer included (DFlash-style drafters
    read several; MTP and Medusa-style heads read the last)."""
    picks = {max(0, round(num_layers * f) - 1) for f in (0.25, 0.5, 0.75)} | {num_layers - 1}
    return tuple(sorted(picks))


__all__ = ["TapRecorder", "default_taps"]
