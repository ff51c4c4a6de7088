"""One rank's llama model: the same layers over its heads, with the reductions Megatron adds.

Column-parallel (each rank computes its own output rows, no communication): the fused
q/k/v projection (this rank's query heads and KV heads, so attention runs on local heads
with its own KV cache) and the fused gate/up projection (its MLP share). Row-parallel
(each rank holds the input columns that match, so its output is a partial sum): o_proj
and down, each followed by one :meth:`~draftwise.models.tp.group.TPGroup.reduce_sum` and
then the bias, added once. The residual stream is therefore whole and bit-identical on
every rank, and so are the hidden-state taps (``ModelOutput.hidden_states``: full width
on rank 0, as at TP=1). Vocab-parallel: each rank holds ``Split.vocab_per_rank`` rows of
the embedding and LM head; a lookup is a masked local lookup and a reduction (one rank
adds the row, the others add zeros: exact), and the logits are all-gathered along the
vocabulary and cut to its true size (``models.tp.group``: why all-gather).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F

from draftwise.models.backend import Backend
from draftwise.models.batch import ForwardBatch, KVCache, ModelOutput
from draftwise.models.linear import linear
from draftwise.models.llama import DecoderLayer, LlamaForCausalLM
from draftwise.models.tp.group import TPGroup

if TYPE_CHECKING:
    from draftwise.models.tp.plan import Split


class StepSender(Protocol):
    """Rank 0's link to the other ranks (``models.tp.driver.Driver``)."""

    def send(self, batch: ForwardBatch, kv: KVCache) -> None:
        """Hand this step's inputs to every other rank before rank 0 runs its shard."""
        ...


class TPDecoderLayer(DecoderLayer):
    """A decoder layer over this rank's heads, with o_proj and down row-parallel."""

    #: the group the row-parallel projections reduce over (set by the model)
    group: TPGroup

    def o_proj(self, attn: torch.Tensor) -> torch.Tensor:  # [T, q_local] -> [T, hidden]
        """Partial sums of this rank's heads, reduced, then the bias once."""
        out = self.group.reduce_sum(linear(attn, self.o_weight))
        return out if self.o_bias is None else out + self.o_bias

    def down_proj(self, act: torch.Tensor) -> torch.Tensor:  # [T, inter_local] -> [T, hidden]
        """Partial sums of this rank's MLP share, reduced, then the bias once."""
        out = self.group.reduce_sum(linear(act, self.down_weight))
        return out if self.down_bias is None else out + self.down_bias


class TPLlamaForCausalLM(LlamaForCausalLM):
    """One rank's shard of a llama-family target (see the module doc).

    ``config`` is the rank's local config (:attr:`Split.local`): its heads, KV heads and
    MLP width, which size its KV cache; :attr:`split` keeps the checkpoint's own.
    """

    layer_class = TPDecoderLayer

    def __init__(self, split: Split, rank: int, group: TPGroup, dtype: torch.dtype,
                 device: str | torch.device, backend: Backend) -> None:
        super().__init__(split.local, dtype, device, backend=backend)
        self.split, self.rank, self.group = split, rank, group
        #: the first vocabulary id this rank holds
        self.vocab_start = rank * split.vocab_per_rank
        #: rank 0 only: sends each step to the other ranks (None on the others)
        self.driver: StepSender | None = None
        for layer in self.decoder_layers():
            cast(TPDecoderLayer, layer).group = group

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        """This rank's rows of the embedding (zeros for ids it does not hold), summed."""
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.split.vocab_per_rank)
        table = cast(torch.Tensor, self.embed_weight)  # dense: quantized TP is refused
        rows = F.embedding(torch.where(mine, local, 0), table)
        return self.group.reduce_sum(torch.where(mine.unsqueeze(1), rows, 0))

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        """This rank's vocabulary columns, gathered from every rank into the full row."""
        local = super().lm_head(hidden)
        return self.group.gather_vocab(local)[:, : self.split.full.vocab_size]

    def forward(self, batch: ForwardBatch, kv: KVCache) -> ModelOutput:
        """Rank 0 first sends the step to the other ranks, then every rank runs the same
        forward on its shard (the collectives meet in the same order)."""
        if self.driver is not None:
            self.driver.send(batch, kv)
        return super().forward(batch, kv)
