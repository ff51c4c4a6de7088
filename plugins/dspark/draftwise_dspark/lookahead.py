"""The rnn Markov pass with look-ahead: several block positions per ``W2`` product.

Profile of the sequential rnn pass (``benchmarks/dspark_step.py``'s drafter, V = 49152,
r = 256, one row): per position the ``W2 u`` product is ~80% of the pass (a stream of
the ``[V, r]`` bf16 weight, 25 MB, at the machine's memory bandwidth), the latent (the
GRU step: embedding row, ``joint_proj`` GEMV of 1.7 MB, three activations) ~14%, the pick
and the indexing the rest. The bound of :meth:`MarkovHead.certified_argmax` never
decides for rnn (see :mod:`draftwise_dspark.markov`), and hoisting ``J_h h`` out of the
loop would change the joint projection's rounding while saving at most part of the 14%.
What does pay: the ``W2`` stream costs about the same for 1 to ~4 rows (the weight is
read once whatever the row count; 0.90 / 0.92 / 1.15 ms at 1 / 2 / 4 rows here), and
the native kernel's rows never depend on what shares the call.

So each product serves a window of ``1 + D`` positions: position ``j``'s latent with its
true previous token, then positions ``j+1 .. j+D`` under a guessed previous token, each
latent chained on the guessed state. The guess for position ``i-1``'s pick is the
corrected maximum over its :data:`GUESS_TOKENS` best base tokens, their bias taken from
those rows of ``W2`` (a ``[T, r]`` gather, not the ``[V, r]`` stream): the pick itself
whenever the bias does not lift a token from outside them to the top; one ``W2`` product over all their latents; then
the picks left to right, position ``i`` kept only while its guess equals the pick just
made at ``i-1`` (for every row). A kept position's latent, state and bias are bitwise
those of the sequential pass (the same inputs, the same row-invariant kernels), and the
picks run in the same order with the same generators, so tokens and q are identical;
a wrong guess costs the wasted rows of that product and the window restarts there.

``D`` follows the measured guess hit rate ``p`` (a window covers ``1 + p + .. + p^D``
positions on average), and the product's rows ``rows * (1 + D)`` stay within
:data:`MAX_ROWS`, past which extra rows stop being nearly free; ``D = 0`` is the
sequential pass. Used only where ``W2`` and ``joint_proj`` are packed for the native
kernel (row invariance is what makes it exact); elsewhere the plain pass runs. All-greedy
passes run the same windows inside one C call instead (:mod:`draftwise_dspark.native`,
its depth from :meth:`HitRate.window`); this torch version serves sampled rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from draftwise.kit import BlockedWeight

from draftwise_dspark.markov import MarkovHead, store_pick

#: rows of one W2 product past which a look-ahead row is no longer nearly free
MAX_ROWS = 4
#: the longest window beyond its first position
MAX_DEPTH = 3
#: under a 5% hit rate, a one-guess window is retried once every this many windows
RETRY = 32
#: base-logit candidates a guess scores with their exact bias (the corrected maximum is
#: among a row's top 64 base tokens unless the bias moves a token past ~63 others)
GUESS_TOKENS = 64


def can_look_ahead(head: MarkovHead | None) -> bool:
    """An rnn head whose products are row-invariant (module doc)."""
    return (head is not None and head.w.kind == "rnn" and isinstance(head.w.w2, BlockedWeight)
            and head.w.joint is not None and isinstance(head.w.joint[0], BlockedWeight))


class HitRate:
    """The running share of guesses that held, and the depth it makes worth trying."""

    def __init__(self, prior: float = 0.5, weight: float = 0.1) -> None:
        self.p, self.weight = prior, weight
        self._idle = 0  # windows run at depth 0 since the rate fell under the floor

    def update(self, tried: int, held: int) -> None:
        """``tried`` guesses checked in one window, ``held`` of them right."""
        for i in range(tried):
            self.p += self.weight * (float(i < held) - self.p)

    def depth(self, rows: int, room: int) -> int:
        """``D`` for ``rows`` live rows and ``room`` positions left after the first: one
        more position per ~0.3 of hit rate, within :data:`MAX_ROWS` and the room; under
        a 5% rate only now and then (a wasted guess costs its latent and a row)."""
        want = min(MAX_DEPTH, 1 + int(self.p / 0.3))
        if self.p < 0.05:  # guesses that never hold: try again once every RETRY windows
            self._idle += 1
            want = int(self._idle % RETRY == 0)
        return max(0, min(want, MAX_ROWS // max(rows, 1) - 1, room))

    def window(self, worth: float, room: int) -> int:
        """``D`` for the native pass (:mod:`draftwise_dspark.native`): positions past the
        first while the chance the d-th is kept, ``p ** d``, is at least ``worth``, within
        ``room``; under a 5% rate one guess now and then, as :meth:`depth`."""
        if self.p < 0.05:
            self._idle += 1
            return min(int(self._idle % RETRY == 0), room)
        d = 0
        while d < room and self.p ** (d + 1) >= worth:
            d += 1
        return d


def guess(base: torch.Tensor, u: torch.Tensor, top: torch.Tensor, w2_rows: torch.Tensor
          ) -> torch.Tensor:  # [R] int64
    """The likely pick: the corrected maximum over each row's ``top`` base tokens, their
    bias from the gathered ``W2`` rows (fp32; only a guess, so its rounding may differ
    from the kernel's: the window's check keeps the output exact)."""
    sub = w2_rows[top].float()  # [R, T, r]
    corrected = base.gather(1, top) + torch.bmm(sub, u.float().unsqueeze(2)).squeeze(2)
    return top.gather(1, corrected.argmax(dim=1, keepdim=True)).squeeze(1)


def lookahead_pass(
    head: MarkovHead,
    hidden: torch.Tensor,  # [N, H] the slots' hidden states, row-major
    base: torch.Tensor,  # [N, V] float32 base logits
    counts: Sequence[int],  # drafts per plan
    anchors: Sequence[int],
    pick: Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, torch.Tensor | None]],
    w2_rows: torch.Tensor,  # [V, r] W2 unpacked, for the guesses
    rate: HitRate,
    counters: dict[str, int],
    probabilistic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The rnn pass over windows (module doc): tokens ``[N]`` (draft indices), each slot's
    previous token ``[N]`` (verifier ids, :meth:`MarkovHead.feed`) and q (``[N, Vd]``,
    probabilistic only). ``pick(logits, live)`` is the proposer's pick for the live
    plans' rows."""
    dev = hidden.device
    starts = torch.tensor([0, *counts[:-1]], device=dev).cumsum(0)
    tok = torch.empty(base.shape[0], dtype=torch.int64, device=dev)
    prev_of = torch.empty_like(tok)
    q = torch.zeros(base.shape, dtype=torch.float32) if probabilistic else None
    prev = torch.tensor(list(anchors), device=dev)
    state: Any = head.init_state(len(counts), hidden.dtype, dev)
    live = list(range(len(counts)))
    first = starts
    t = min(GUESS_TOKENS, base.shape[1])
    j = 0
    while True:
        sel = [i for i, r in enumerate(live) if counts[r] > j]
        if not sel:
            break
        if len(sel) < len(live):  # rows whose drafts are done drop out
            keep = torch.tensor(sel, device=dev)
            live = [live[i] for i in sel]
            prev, first = prev.index_select(0, keep), first.index_select(0, keep)
            state = state.index_select(0, keep)
        rows = len(live)
        depth = rate.depth(rows, min(counts[r] for r in live) - j - 1)
        guesses, latents, states, bases = [prev], [], [state], []
        p, s = prev, state
        for d in range(depth + 1):
            at = first + j + d
            u, s = head.latent(p, hidden.index_select(0, at), s)
            latents.append(u)
            states.append(s)
            bases.append(base.index_select(0, at))
            if d < depth:  # topk per guessed row only: ~a tenth of a W2 product each
                p = head.feed(guess(bases[d], u, bases[d].topk(t, dim=1).indices, w2_rows))
                guesses.append(p)
        bias = head.bias(torch.cat(latents) if depth else latents[0])
        counters["markov_w2_products"] += 1
        kept = 0
        for d in range(depth + 1):
            if d and not torch.equal(guesses[d], prev):
                break
            at = first + j + d
            logits = bases[d] + bias[d * rows : (d + 1) * rows]
            prev_of[at] = guesses[d]
            x, qj = pick(logits.contiguous(), live)
            store_pick(tok, q, at, x.to(dev), qj)
            prev = head.feed(x.to(dev))
            kept = d + 1
        counters["markov_steps"] += kept
        rate.update(min(kept, depth), kept - 1)
        state = states[kept]
        j += kept
    return tok, prev_of, q


__all__ = ["GUESS_TOKENS", "MAX_DEPTH", "MAX_ROWS", "HitRate", "can_look_ahead", "guess",
           "lookahead_pass"]
