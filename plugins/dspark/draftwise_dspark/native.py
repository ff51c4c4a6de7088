"""The greedy Markov pass as one C call (``core/csrc/markov.c``, the kit's ``markov_pass``).

What it computes is :mod:`draftwise_dspark.markov`'s pass, bitwise: per drafting row,
left to right, ``pick_j = argmax(base_j + W2 u_j)`` (first maximum), ``u_j`` the head's
latent from ``pick_{j-1}``. The latent runs on the same packed GEMM rows as the torch
path (``gate_proj``/``joint_proj``), every elementwise op rounds to bf16 where torch's
does, and sigmoid/tanh are read from tables of torch's own bf16 results for all 65536
inputs (:func:`activation_tables`), so ``u`` and the rnn state are the torch path's bits;
``W2 u`` is the same kernel's blocks; the base add is the same fp32 add. What it saves is
the torch path's ~10 Python-driven calls per block position and the ``[R, V]`` bias
tensor: the product is fused with the base add and the argmax.

Inside the call (all of which moves time only, never a token):

- the certified screen (:meth:`MarkovHead.certified_argmax`'s bound, per lane), where
  the proposer's give-up rule allows it;
- windows: each round gives a row up to ``1 + depth`` positions under guessed previous
  tokens (a certified pick where the screen decided, else the corrected maximum over the
  :data:`GUESS_TOKENS` best base tokens), one ``W2`` product over every pending lane of
  every row, each row's lanes kept left to right while the guess was the pick. ``depth``
  follows the measured guess hit rate (:meth:`HitRate.window`).

It runs where the kernels are built, ``W2`` (and ``gate_proj``/``joint_proj``) are packed
for the native GEMM (bf16 drafters) and every row of the call is greedy; elsewhere the
torch pass runs. The tables are torch's vectorised activations; a gated or rnn head whose
rank is not a multiple of 32 also meets torch's element-at-a-time path (a row's tail),
so there the native pass runs only if that path gives the same bits for every input
(measured equal with torch 2.13 on this machine). :func:`native_pass` decides once, at
the proposer's construction.

Measured (``benchmarks/dspark_step.py``, random drafters, 2 cores shared with other
load; ``benchmarks/README.md``): the pass's share of the draft step at the benchmark's
tiny shape (H 576, V 49152, r 256) 0.02-0.05 for vanilla and gated (the screen certifies
every pick: ~0.35 ms a pass), 0.17-0.22 for rnn (1.5 ms at B = 7 on one thread: the
products 0.95, latents 0.20, guesses 0.11); at DeepSpec's published proportions (H 2560,
V 151936) 0.002-0.007 and 0.05-0.07. The rnn at the tiny shape is over the 10% goal
because its exact ``W2 u`` row (V x r multiply-adds, ~65 us of one core) is 27% of the
draft's own arithmetic per drafted token there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from draftwise.kit import BlockedWeight, markov_kernel_head, markov_pass, markov_pass_built

from draftwise_dspark.lookahead import GUESS_TOKENS, HitRate
from draftwise_dspark.markov import MAX_BLOCK_SHARE, MarkovHead

#: lanes (a row at one position) one round takes at most: a whole B = 15 block of one
#: row; the product's arithmetic grows with its lanes, its W2 stream does not
LANES = 16
#: a window's next lane is tried while its chance of being kept (hit rate ** d) is at
#: least this. Measured at the benchmark's tiny shape (one thread): a lane costs its
#: product row (~0.065 ms), its latent (~0.02 ms) and a guess (~0.015 ms), ~0.1 ms; a
#: position left to the next round costs a W2 stream (~0.55-0.65 ms) plus its lane
LANE_WORTH = 0.15


def activation_tables() -> torch.Tensor:  # [2, 65536] int16: sigmoid, tanh by input bits
    """torch's bf16 ``sigmoid`` and ``tanh`` of every bf16 bit pattern, computed as the
    torch pass computes them: contiguous runs whose length is a multiple of the vector
    width (chunks of 1024, under the intra-op grain: one thread, no scalar tail)."""
    every, out = _every_bf16(), torch.empty(2, 65536, dtype=torch.int16)
    for i, fn in enumerate((torch.sigmoid, torch.tanh)):
        for at in range(0, 65536, 1024):
            out[i, at : at + 1024] = fn(every[at : at + 1024]).view(torch.int16)
    return out


def _scalar_path_agrees(tables: torch.Tensor) -> bool:
    """Whether torch's element-at-a-time path (a strided input: the tail of a row whose
    length is not a multiple of the vector width) gives the tables' bits too."""
    wide = torch.zeros(2 * 65536, dtype=torch.bfloat16)
    wide[::2] = _every_bf16()
    return all(torch.equal(fn(wide[::2]).view(torch.int16), tables[i])
               for i, fn in enumerate((torch.sigmoid, torch.tanh)))


def _every_bf16() -> torch.Tensor:  # [65536] bf16
    """Every bf16 bit pattern, in the order of its unsigned 16 bits (the tables' index)."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def native_pass(head: MarkovHead | None, hidden_size: int) -> NativeMarkov | None:
    """The native pass for ``head`` (a drafter of width ``hidden_size``), or None where the
    torch pass runs (module doc)."""
    if head is None or not markov_pass_built():
        return None
    w = head.w
    latent = {"gated": w.gate, "rnn": w.joint}.get(w.kind)
    if (not isinstance(w.w2, BlockedWeight) or w.w1.dtype != torch.bfloat16
            or (w.kind != "vanilla" and (
                latent is None or not isinstance(latent[0], BlockedWeight)
                or latent[1].dtype != torch.bfloat16))):
        return None
    tables = activation_tables()
    if w.kind != "vanilla" and w.rank % 32 and not _scalar_path_agrees(tables):
        return None  # torch's activations would depend on an element's place in its row
    return NativeMarkov(head, latent, hidden_size, tables)  # type: ignore[arg-type]


class NativeMarkov:
    """One head's checked kernel arguments and its window hit rate."""

    def __init__(self, head: MarkovHead, latent: tuple[BlockedWeight, torch.Tensor] | None,
                 hidden_size: int, tables: torch.Tensor) -> None:
        w = head.w
        self.head = head
        w2: BlockedWeight = w.w2  # type: ignore[assignment]
        self.kernel = markov_kernel_head(
            w.kind, w.w1.contiguous(), w2, tables, hidden_size, latent, head.row_norms,
            None if w.vocab is None else w.vocab.ids)
        self.blocks = w2.data.shape[0]
        self.hits = HitRate()
        #: False: one position per product (the benchmark's A/B of the windows)
        self.windows = True

    def run(self, hidden: torch.Tensor, base: torch.Tensor, counts: Sequence[int],
            anchors: Sequence[int], screen: bool, give_up: int
            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:  # tokens, previous [N]
        """The pass over ``hidden`` [N, H] and ``base`` [N, Vd] (rows' slots row-major):
        tokens in draft-index space, previous tokens verifier ids (as
        :meth:`MarkovHead.feed` maps them);
        ``screen``: try the certified pick (given up after ``give_up`` misses in a row)."""
        depth = self.hits.window(LANE_WORTH, max(counts, default=1) - 1) if self.windows else 0
        tok, prev, stats = markov_pass(
            self.kernel, hidden.contiguous(), base.contiguous(), counts, anchors, depth=depth,
            lanes=LANES, screen=screen, give_up=give_up,
            max_blocks=max(4, int(MAX_BLOCK_SHARE * self.blocks)),
            guess_tokens=min(GUESS_TOKENS, base.shape[1]),
            w2_rows=self.head.w2_rows() if depth else None)
        self.hits.update(stats["guesses"], stats["guesses_held"])
        return tok, prev, stats


__all__ = ["LANES", "NativeMarkov", "activation_tables", "native_pass"]
