"""DFlash2's two additions (z-lab ``dflash/model.py``): block convolutions and the selector.

**Grouped dynamic causal depthwise convolution** (``GroupedDynamicCausalConv``), around
each attention and MLP sublayer, inside each row's block only:

1. ``dynamic = kernel_projection(x)`` viewed ``[T, 2, taps, groups]`` (index 0 for the
   ``prepare`` pass on the sublayer's input, 1 for the ``finish`` pass on its output);
2. ``out[t] = sum_j (base[j] + dynamic[t, j, group]) * x[t - j]`` over taps ``j``, where
   ``x[t - j]`` is zero before the block's first slot (``block_index[t] < j``); ``base``
   is per channel, ``dynamic`` per group of ``conv_group_size`` channels, both taken at
   the OUTPUT slot ``t``.

**Candidate selector** (``CandidateSelector.select``): per block slot t the target head's
top-K logits are the candidates; edge scores are
``S_t(a, b) = logit_t(b) + <A[a] * (P h_t), B[b]>`` with ``a`` the token chosen at t-1 (the
anchor at t = 0). The walk goes left to right: greedy takes the argmax; sampling draws
from ``softmax(S_t / T)`` over the K candidates, and that distribution (scattered into
the vocabulary) is the draft's q for rejection sampling. Never the per-slot argmax.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from draftwise.kit import QuantWeight, Weight, dequant_rows, linear


@dataclass(slots=True)
class BlockConv:
    """One ``GroupedDynamicCausalConv``: ``base_kernel [2, taps, H]``,
    ``kernel_projection [2 * taps * groups, H]`` (dense, packed or GGUF-quantized)."""

    base_kernel: torch.Tensor
    kernel_projection: Weight
    group_size: int

    @property
    def taps(self) -> int:
        """Kernel size."""
        return int(self.base_kernel.shape[1])

    def prepare(
        self, x: torch.Tensor, block_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H], the finish pass's dynamic [T, taps, G])
        """Rule 1 and the first convolution (on the sublayer's input)."""
        groups = x.shape[-1] // self.group_size
        dyn = linear(x, self.kernel_projection).view(x.shape[0], 2, self.taps, groups)
        return convolve(x, dyn[:, 0], self.base_kernel[0], self.group_size, block_index), dyn[:, 1]

    def finish(
        self, x: torch.Tensor, dynamic: torch.Tensor, block_index: torch.Tensor
    ) -> torch.Tensor:  # [T, H]
        """The second convolution (on the sublayer's output)."""
        return convolve(x, dynamic, self.base_kernel[1], self.group_size, block_index)


def convolve(
    x: torch.Tensor,  # [T, H] flat, row after row, each row one block
    dynamic: torch.Tensor,  # [T, taps, groups]
    base: torch.Tensor,  # [taps, H]
    group_size: int,
    block_index: torch.Tensor,  # [T] each token's slot inside its block
) -> torch.Tensor:  # [T, H]
    """Rule 2, in z-lab's order of operations (base term, then the dynamic addcmul)."""
    t, hidden = x.shape
    groups = hidden // group_size
    blocks = x.view(t, groups, group_size)
    out = torch.zeros_like(blocks)
    for j in range(base.shape[0]):
        if j == 0:
            values = blocks
        else:
            values = torch.zeros_like(blocks)
            values[j:] = blocks[:-j]
            values = values.masked_fill((block_index < j).view(t, 1, 1), 0.0)
        out = out + base[j].view(1, groups, group_size).to(x.dtype) * values
        out = torch.addcmul(out, dynamic[:, j].unsqueeze(-1), values)
    return out.view(t, hidden)


@dataclass(slots=True)
class SelectorWeights:
    """``candidate_selector.*``: codebooks ``[V, r]`` and ``hidden_projection [r, H]``
    (a GGUF's quantized codebooks stay :class:`QuantWeight`; :func:`codebook_rows`)."""

    predecessor: torch.Tensor | QuantWeight
    successor: torch.Tensor | QuantWeight
    hidden_projection: Weight
    top_k: int


def codebook_rows(table: torch.Tensor | QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a codebook as fp32 (``ids`` of any shape; rows appended): a
    quantized one dequantizes only the gathered rows, exactly (ggml's get_rows)."""
    if isinstance(table, QuantWeight):
        flat = dequant_rows(table, ids.reshape(-1), torch.float32)
        return flat.view(*ids.shape, table.in_features)
    return table[ids].float()


#: (scores [R, K] float32 of the rows still walking, their row indices, slot t)
#:   -> (chosen candidate index per row [R], q over the K candidates [R, K] or None)
ChooseFn = Callable[[torch.Tensor, list[int], int], tuple[torch.Tensor, torch.Tensor | None]]


def selector_walk(
    sel: SelectorWeights,
    hidden: torch.Tensor,  # [N, H] block hidden of the drafting slots, row after row
    logits: torch.Tensor,  # [N, V] float32 the target head's logits of those slots
    anchors: list[int],  # [R]
    lengths: list[int],  # [R] slots per row (its drafts)
    choose: ChooseFn,
    keep_q: bool = False,
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:  # tokens per row, q [V] per draft
    """The scored walk (module doc), every row advancing one slot per iteration; with
    ``keep_q`` each draft's q over the vocabulary (one-hot where ``choose`` took the
    argmax)."""
    unary, cand = torch.topk(logits, sel.top_k, dim=-1, sorted=False)  # [N, K]
    proj = linear(hidden, sel.hidden_projection).float()  # [N, r]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    pred = torch.tensor(anchors, dtype=torch.long)
    tokens: list[list[int]] = [[] for _ in lengths]
    qs: list[list[torch.Tensor]] = [[] for _ in lengths]
    vocab = logits.shape[1]
    for t in range(max(lengths, default=0)):
        live = [r for r, n in enumerate(lengths) if n > t]
        at = torch.tensor([starts[r] + t for r in live], dtype=torch.long)
        a = codebook_rows(sel.predecessor, pred[live]) * proj[at]  # [R, r]
        b = codebook_rows(sel.successor, cand[at])  # [R, K, r]
        scores = unary[at] + torch.einsum("rd,rkd->rk", a, b)
        index, q = choose(scores, live, t)
        chosen = cand[at].gather(-1, index.view(-1, 1)).view(-1)
        for j, r in enumerate(live):
            tokens[r].append(int(chosen[j]))
            if not keep_q:
                continue
            full = torch.zeros(vocab, dtype=torch.float32)
            if q is None:
                full[chosen[j]] = 1.0
            else:
                full.scatter_(0, cand[at[j]], q[j].float())
            qs[r].append(full)
        pred = pred.clone()
        pred[live] = chosen
    return tokens, qs


__all__ = ["BlockConv", "ChooseFn", "SelectorWeights", "codebook_rows", "convolve", "selector_walk"]
