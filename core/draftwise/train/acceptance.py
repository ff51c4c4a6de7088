"""The offline acceptance estimate: the tokens per step greedy speculation would commit.

Teacher-forced on held-out sequences of the data folder (never trained on). Why a walk and
not an average over anchors: online, a step anchored at position ``a`` that accepts ``m``
drafts moves the next anchor to ``a + m + 1``, so the positions a run drafts at are not a
uniform sample of the sequence: where the drafter is right the walk strides over several
positions in one step, where it is wrong it stops at every one, so the engine's mean
acceptance length (committed tokens per step) weights positions by how a run reaches
them. And the first anchor of every row is the response's first token. On the default
model's first drafter, over the 45 greedy held-out rows: every anchor counted once
averaged 1.68, the walk 1.603, and the engine decoding the same prompts 1.602 (2,979
steps); on the bench's prompts the walk read 1.529 and 1.228 where the engine measured
1.526 and 1.228 (``docs/training.md``). The estimate before this one spread three anchors
over each row, one on the response's first token, where that drafter commits 3.38 tokens
against 1.66 elsewhere, and read 2.11. So, rule by rule:

1. the rows walked are the held-out rows whose response is the target's greedy path: on
   them the recorded tokens are exactly what verify would commit. A row is greedy when
   every response token's logit, recomputed from the recorded post-norm state through the
   LM head, is within ``GREEDY_MARGIN`` of the largest: not exact equality, because the
   recomputation (float16 states, the trainer's copy of the head) is not the engine's
   kernel, and on the default model's data it moved 1-5 tokens of every greedy row of
   128 off the argmax, by at most 0.25; every sampled row had a token at least 2.07 below
   it (median 4.8). Sampled rows are not walked (what the target would have committed
   after a rejected draft was never recorded), and are counted as skipped;
2. the walk mirrors the engine and ``draftwise doctor``'s ``simulate_walk``: the prefill
   commits the first response token, so the first anchor is ``response_start``; a step at
   anchor ``a`` drafts ``w = min(B - 1, T - a - 2)`` slots (the tokens left, less the bonus
   token), as the block ``[token[a], MASK x w]`` over the context before ``a``; slot ``j``
   is accepted while every slot up to it equals ``token[a + j]``; the next anchor is
   ``a + m + 1``. A step with ``w = 0`` commits one token and drafts nothing, so, as in
   vLLM's metric, it is not a draft step;
3. the mean acceptance length is ``1 + accepted / draft steps`` (the bonus token counts),
   the number the engine's ``mean_acceptance_length`` reports for greedy requests;
   ``per_position[j]`` is the share of draft steps whose first ``j + 1`` slots were accepted
   (``num_accepted_tokens_per_pos / num_drafts``). With no greedy row there is no
   estimate (``None``), never a number from rows that cannot give one;
4. beside it, the same rows' uniform average over every anchor with a full block, kept
   so the two can be compared: it is what a drafter scores per position, the walk is what
   it is worth per step.

Cost: every anchor of a walked row is drafted in one batched forward (the walk then reads
the ones it visits), so ``max_anchors`` bounds the blocks drafted; rows are taken in order
until it is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.train.dflash_net import DFlashNet
from draftwise.train.shards import Sequence

#: logits a greedy row's token may sit below the recomputed maximum (rule 1)
GREEDY_MARGIN = 1.0


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Rule 3's numbers (the walk) and rule 4's (every anchor), with what they ran on."""

    mean_length: float | None  # None: no greedy row was walked (rule 3)
    steps: int  # draft steps of the walk
    sequences: int  # greedy rows walked
    #: share of draft steps whose first j+1 slots were all accepted, j = 0 .. B-2
    per_position: tuple[float, ...]
    anchor_mean_length: float | None  # None: no full block drafted
    anchors: int
    anchor_per_position: tuple[float, ...]
    skipped_sampled: int  # held-out rows not walked: not the target's greedy path (rule 1)

    def describe(self) -> str:
        """One line for progress output."""
        if self.mean_length is None:
            return (f"none (no greedy held-out row; {self.skipped_sampled} sampled rows "
                    "cannot be walked)")
        per_anchor = ("" if self.anchor_mean_length is None
                      else f"; {self.anchor_mean_length:.3f} averaged over every anchor")
        return (f"{self.mean_length:.3f} ({self.steps} steps on {self.sequences} greedy "
                f"rows{per_anchor})")

    def as_dict(self) -> dict[str, object]:
        mean = None if self.mean_length is None else round(self.mean_length, 4)
        return {"mean_acceptance_length": mean, "steps": self.steps,
                "sequences": self.sequences,
                "accepted_through_slot": [round(x, 4) for x in self.per_position],
                "sampled_sequences_skipped": self.skipped_sampled,
                "per_anchor": {"mean_acceptance_length": None if self.anchor_mean_length
                               is None else round(self.anchor_mean_length, 4),
                               "anchors": self.anchors,
                               "accepted_through_slot": [round(x, 4) for x in
                                                         self.anchor_per_position]}}


def spread_anchors(length: int, response_start: int, block_size: int,
                   count: int) -> np.ndarray:  # [<= count] int64
    """Up to ``count`` anchors spread evenly over the positions whose block fits."""
    last = length - block_size + 1
    if last < response_start or count <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(response_start, last, num=count).round().astype(np.int64))


def greedy_path(ids: torch.Tensor,  # [T] int64
                final: np.ndarray,  # [T, H] the recorded post-norm states
                start: int, head: torch.Tensor) -> bool:
    """Rule 1: is every response token the target's argmax after the position before it
    (up to ``GREEDY_MARGIN``)?"""
    rows = torch.from_numpy(np.asarray(final[start - 1:-1], dtype=np.float32))
    logits = F.linear(rows.to(head.dtype), head).float()  # [R, V]
    picked = logits.gather(1, ids[start:, None])[:, 0]
    return bool((logits.max(-1).values - picked <= GREEDY_MARGIN).all())


def walk_steps(hits: list[list[bool]],  # per anchor a - start: slot j matched
               start: int, length: int, k: int) -> list[tuple[int, int]]:
    """Rule 2 over one row: ``(drafted, accepted)`` per draft step, in order."""
    out = []
    a = start
    while a <= length - 2:
        w = min(k, length - a - 2)
        m = 0
        while m < w and hits[a - start][m]:
            m += 1
        if w:
            out.append((w, m))
        a += m + 1
    return out


@torch.no_grad()
def draft_hits(net: DFlashNet, ids: torch.Tensor,  # [T] int64
               taps: torch.Tensor,  # [T, taps*H]
               start: int, embed: torch.Tensor, head: torch.Tensor) -> list[list[bool]]:
    """For every anchor ``a`` in ``start .. T-3``: which of its ``w`` slots (rule 2's
    block, a shorter one near the end as online) equal the recorded next tokens."""
    k = net.shape.block_size - 1
    t = ids.shape[0]
    hits: list[list[bool]] = [[] for _ in range(max(0, t - 2 - start))]
    by_width: dict[int, list[int]] = {}
    for a in range(start, t - 2):
        by_width.setdefault(min(k, t - a - 2), []).append(a)
    for w, group in by_width.items():
        anchors = torch.tensor(group, dtype=torch.int64)
        blocks = torch.full((len(group), w + 1), net.shape.mask_token_id, dtype=torch.int64)
        blocks[:, 0] = ids[anchors]
        hidden = net(taps, embed[blocks], anchors)  # type: ignore[operator]
        rows = hidden[:, 1:].reshape(-1, hidden.shape[-1]).to(head.dtype)
        drafts = F.linear(rows, head).argmax(-1).view(-1, w)
        match = drafts == ids[anchors[:, None] + torch.arange(1, w + 1)]
        for a, row in zip(group, match.tolist()):
            hits[a - start] = row
    return hits


@torch.no_grad()
def estimate_acceptance(
    net: DFlashNet,
    sequences: list[Sequence],
    taps_of: object,  # Callable[[Sequence], Tensor [T, taps*H]]
    embed: torch.Tensor,  # [V, H] the target's embedding
    head: torch.Tensor,  # [V, H] the target's LM head (its dtype is the GEMMs')
    max_anchors: int = 4096,
) -> Acceptance:
    """Rules 1-4 for a DFlash drafter over ``sequences``, drafting at most about
    ``max_anchors`` blocks."""
    def hits_of(seq: Sequence, ids: torch.Tensor, start: int) -> list[list[bool]]:
        return draft_hits(net, ids, taps_of(seq), start, embed, head)  # type: ignore[operator]

    return walk_estimate(sequences, net.shape.block_size - 1, hits_of, head, max_anchors)


@torch.no_grad()
def walk_estimate(
    sequences: list[Sequence],
    k: int,  # drafts per step at most
    hits_of: Callable[[Sequence, torch.Tensor, int], list[list[bool]]],
    head: torch.Tensor,  # [V, H] the target's LM head (rule 1's greedy check)
    max_anchors: int = 4096,
) -> Acceptance:
    """Rules 1-4 for any drafter: ``hits_of(seq, ids, start)`` says, for every anchor
    ``a`` in ``start .. T-3``, which of its ``min(k, T-a-2)`` first drafts equal the
    recorded tokens (a list per anchor, indexed ``a - start``)."""
    steps: list[tuple[int, int]] = []
    full: list[list[bool]] = []  # rule 4: anchors with a whole block
    walked = skipped = drafted = 0
    for seq in sequences:
        if drafted >= max_anchors:
            break
        ids = torch.from_numpy(np.asarray(seq.token_ids, dtype=np.int64))
        start = seq.response_start
        if ids.shape[0] - start < 3:
            continue
        if not greedy_path(ids, seq.states["final"], start, head):
            skipped += 1
            continue
        hits = hits_of(seq, ids, start)
        drafted += len(hits)
        walked += 1
        steps += walk_steps(hits, start, ids.shape[0], k)
        full += [h for h in hits if len(h) == k]
    per_pos = [0] * k
    for _, m in steps:
        for j in range(m):
            per_pos[j] += 1
    n = max(1, len(steps))
    acc = torch.tensor(full, dtype=torch.int32).cumprod(1) if full else torch.zeros(0, k)
    return Acceptance(
        mean_length=1.0 + sum(m for _, m in steps) / n if steps else None,
        steps=len(steps), sequences=walked,
        per_position=tuple(c / n for c in per_pos),
        anchor_mean_length=1.0 + float(acc.sum(1).float().mean()) if full else None,
        anchors=len(full),
        anchor_per_position=tuple(float(x) for x in acc.float().mean(0)) if full
        else tuple(0.0 for _ in range(k)),
        skipped_sampled=skipped)


__all__ = ["GREEDY_MARGIN", "Acceptance", "draft_hits", "estimate_acceptance", "greedy_path",
           "spread_anchors", "walk_estimate", "walk_steps"]
