"""DraftModelProposer: a smaller model drafts k tokens per row, batched over rows.

The loop (vLLM ``DraftModelProposer``, one draft forward per depth, not one per row):

1. depth 0 feeds every drafting row what its draft KV lacks, from ``row.num_kv_computed``
   to its last token (the tokens accepted last step and the bonus token; the whole
   prompt the first time), and picks draft 1 at the last position;
2. depth j feeds draft j at the next position, for the rows that want more than j;
3. picking is the argmax, or a sample from the request's processed draft distribution
   (``draft_sample_method: "probabilistic"``, whose q goes to verification);
4. the draft's KV lives in the core's pool under the request's target block table; the
   positions written are right exactly when the drafts fed are accepted, so
   ``kv_valid = len(tokens) + drafts - 1`` and the core rolls the rest back with the
   target's (the last draft is never fed);
5. with ``min_draft_confidence`` t > 0 a row drafts past a token only while the draft's
   probability of it (its softmax maximum) is at least t: the unsure token is still
   verified, the forwards after it are not run (HF's ``assistant_confidence_threshold``).
   A draft forward costs ~0.4 of a target step and the draft is well calibrated (on the
   1.5B/0.5B Qwen2.5-Coder pair 99% of drafts it gave >= 0.9 held, about half of those
   under 0.6), so each row drafts deep where the text is predictable and stops where it
   is not. llama.cpp's ``--draft-p-min`` drops the unsure token instead; simulated on a
   recorded k = 8 trace that gives 1.12x against 1.28x for keeping it (k <= 8, t = 0.8): its
   forward is spent either way and one more verified token costs little.
   Lossless: how many drafts a row gets depends only on the drafts made so far.
6. each row's ``evidence`` is the draft's confidence in its first draft (its softmax
   maximum at depth 0, a function of the context alone) in :data:`CONFIDENCE_BUCKETS`
   bands: adaptive depth keeps acceptance per band, as it does per n-gram match length,
   so a run of rejected unsure drafts does not park a request whose confident drafts
   still hold (the parking measured 1.09x against the fixed setting's 1.16x at one row).
7. under adaptive depth a row also stops once the product of its drafts' confidences
   falls below the engine's price of one more draft (``DraftRow.stop_below``: the
   drafter's cost plus the verify's, over a step's): deeper drafts would be accepted at
   most that often. Lossless for the same reason as rule 5.

With another tokenizer (``use_heterogeneous_vocab``) the context is fed through
:class:`~draftwise_draft_model.vocab.VocabMap`, draft logits are masked to the shared
tokens and drafts are mapped back to target ids. The proposer keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from draftwise.kit import (
    DraftInput,
    Drafts,
    KVCache,
    VerifyOutcome,
    build_forward_batch,
    pick_draft_tokens,
)

from draftwise_draft_model.head import SubsetHead
from draftwise_draft_model.vocab import VocabMap

#: (tokens fed per row, first position per row, row indices) -> last-position logits [R, V]
StepFn = Callable[[list[list[int]], list[int], list[int]], torch.Tensor]
#: (logits [R, V], row indices) -> the draft-vocabulary token picked per row
PickFn = Callable[[torch.Tensor, list[int]], list[int]]
#: (logits [R, V], row indices) -> per row, whether it drafts past the token just picked
MoreFn = Callable[[torch.Tensor, list[int]], list[bool]]
#: equal bands of the first draft's confidence reported as ``evidence`` (0: under 0.2,
#: ..., 4: 0.8 and up); few, because adaptive depth keeps an estimate per band per request
CONFIDENCE_BUCKETS = 5


@dataclass(frozen=True, slots=True)
class DraftModel:
    """What the loader hands the proposer: the loaded draft and, across vocabularies, the map."""

    loaded: Any  # draftwise.models.loader.LoadedModel
    mapping: VocabMap | None = None
    #: ``lm_head_tokens``: the head over part of the vocabulary (None: the model's own)
    head: SubsetHead | None = None


def draft_autoregressive(
    first: list[list[int]], starts: list[int], wants: list[int], step: StepFn, pick: PickFn,
    more: MoreFn | None = None,
) -> list[list[int]]:
    """Up to ``wants[r]`` drafts per row (rules 1-2), one ``step`` call per depth.

    ``first[r]`` is what row r feeds at depth 0, from position ``starts[r]``; the result is
    in the vocabulary ``pick`` returns. ``more`` (rule 5) is asked, with the logits just
    picked from, about the rows that may go deeper; a row it stops keeps its drafts and
    costs no further forward.
    """
    drafts: list[list[int]] = [[] for _ in first]
    live = [r for r, w in enumerate(wants) if w > 0 and first[r]]
    depth = 0
    while live:
        if depth == 0:
            ids = [first[r] for r in live]
            pos = [starts[r] for r in live]
        else:
            ids = [[drafts[r][-1]] for r in live]
            pos = [starts[r] + len(first[r]) + depth - 1 for r in live]
        logits = step(ids, pos, live)
        for r, tok in zip(live, pick(logits, live)):
            drafts[r].append(tok)
        depth += 1
        deeper = [j for j, r in enumerate(live) if wants[r] > depth]
        if more is not None and deeper:
            rows = [live[j] for j in deeper]
            go = more(logits[deeper] if len(deeper) < len(live) else logits, rows)
            live = [r for r, g in zip(rows, go) if g]
        else:
            live = [live[j] for j in deeper]
    return drafts


class DraftModelProposer:
    """The Proposer shell around :func:`draft_autoregressive` and the draft's forward."""

    def __init__(
        self,
        draft: DraftModel,
        kv: KVCache,
        k: int,
        block_size: int,
        probabilistic: bool = False,
        min_confidence: float = 0.0,
    ) -> None:
        self.model = draft.loaded.model
        self.mapping, self.head = draft.mapping, draft.head
        self.kv, self.k, self.block_size = kv, k, block_size
        self.probabilistic = probabilistic
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        self.min_confidence = min_confidence
        if len(kv.k) != self.model.num_layers or kv.block_size != block_size:
            raise ValueError(
                f"the draft needs {self.model.num_layers} KV layers of block size {block_size}, "
                f"got {len(kv.k)} of {kv.block_size}"
            )
        #: ``confidence_stops``: rows that stopped short of their depth on an unsure token
        self.counters = {"draft_forwards": 0, "rows_drafted": 0, "draft_tokens": 0,
                         "confidence_stops": 0, "price_stops": 0}

    @torch.inference_mode()
    def propose(self, batch: DraftInput) -> Drafts:
        """Drafts for every row, ``min(k, row.max_draft)`` each."""
        rows = batch.rows
        wants = [min(self.k, r.max_draft) for r in rows]
        starts = [r.num_kv_computed for r in rows]
        first = [self._to_draft(r.token_ids[r.num_kv_computed :]) for r in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        extra = None
        if self.head is not None:  # the context's tokens the cut head lacks, once per step
            context = np.concatenate([np.asarray(r.token_ids, np.int64) for r in rows])
            extra = self.head.context(np.asarray(self._to_draft(context), np.int64)
                                      if self.mapping is not None else context)

        def step(ids: list[list[int]], pos: list[int], live: list[int]) -> torch.Tensor:
            tables = [rows[r].block_table for r in live]
            self.counters["draft_forwards"] += 1
            if self.head is None:
                fb = build_forward_batch(
                    ids, pos, tables, self.block_size, [[len(t) - 1] for t in ids],
                    device=self.model.device,
                )
                return self.model(fb, self.kv).logits
            # no logits from the model's own head: the last layer's states go to ours
            last = self.model.num_layers - 1
            fb = build_forward_batch(ids, pos, tables, self.block_size, [[] for _ in ids],
                                     device=self.model.device, hidden_layers=(last,))
            h = self.model(fb, self.kv).hidden_states[last]
            ends = fb.query_start_loc[1:] - 1
            return self.head.logits(self.model.final_norm(h.index_select(0, ends)), extra)

        so_far: list[list[int]] = [[] for _ in rows]
        evidence = [0] * len(rows)
        first_confidence: dict[int, float] = {}  # row -> its depth-0 confidence (float32)

        def pick(logits: torch.Tensor, live: list[int]) -> list[int]:
            histories = None
            if self.mapping is not None:
                self.mapping.mask_(logits)  # draft-vocabulary logits: no target processing
            if not so_far[live[0]]:  # depth 0: every drafting row's first draft (rule 6)
                confidence = draft_confidence(logits)
                first_confidence.update(zip(live, confidence.tolist()))
                bands = (confidence * CONFIDENCE_BUCKETS).long()
                for r, band in zip(live, bands.clamp_(0, CONFIDENCE_BUCKETS - 1).tolist()):
                    evidence[r] = band
            if self.mapping is None:
                histories = [None if rows[r].history is None
                             else rows[r].history.after(so_far[r]) for r in live]
            tok, q = pick_draft_tokens(
                logits, [rows[r].params for r in live], [rows[r].generator for r in live],
                self.probabilistic, histories,
            )
            for j, r in enumerate(live):
                so_far[r].append(int(tok[j]))
            if self.probabilistic:
                for j, r in enumerate(live):
                    probs[r].append(q[j] if q is not None else _one_hot(tok[j], logits.shape[1]))
            return tok.tolist()

        running: dict[int, float] = {}  # row -> product of its drafts' confidences

        def sure(logits: torch.Tensor, live: list[int]) -> list[bool]:
            if len(so_far[live[0]]) == 1:  # after depth 0: pick measured it (rule 6)
                confidence = torch.tensor([first_confidence[r] for r in live],
                                          dtype=torch.float32)
            else:
                confidence = draft_confidence(logits)
            go = self._sure(confidence, live)
            for j, (r, c) in enumerate(zip(live, confidence.tolist())):
                running[r] = running.get(r, 1.0) * c
                if go[j] and running[r] < rows[r].stop_below:  # rule 7: not worth its price
                    go[j] = False
                    self.counters["price_stops"] += 1
            return go

        priced = any(r.stop_below > 0.0 for r in rows)
        more = sure if self.min_confidence > 0.0 or priced else None
        drafts = draft_autoregressive(first, starts, wants, step, pick, more)
        out = Drafts.from_lists([self._to_target(d) for d in drafts])
        out.evidence = evidence
        out.kv_valid = [
            len(r.token_ids) + len(d) - 1 if d else r.num_kv_computed for r, d in zip(rows, drafts)
        ]
        flat = [q for row in probs for q in row]
        if self.probabilistic and flat:
            out.draft_probs = torch.stack(flat)
        self.counters["rows_drafted"] += sum(1 for d in drafts if d)
        self.counters["draft_tokens"] += sum(len(d) for d in drafts)
        return out

    def _sure(self, confidence: torch.Tensor, live: list[int]) -> list[bool]:  # [R]
        """Rule 5: whether each row's draft just picked was sure enough to draft past
        (``confidence``: :func:`draft_confidence` of the logits it was picked from)."""
        sure = (confidence >= self.min_confidence).tolist()
        self.counters["confidence_stops"] += len(sure) - sum(sure)
        return sure

    def _to_draft(self, target_ids: np.ndarray) -> list[int]:
        """Context tokens in the draft's vocabulary."""
        ids = target_ids if self.mapping is None else self.mapping.to_draft(target_ids)
        return [int(t) for t in ids]

    def _to_target(self, draft_ids: list[int]) -> list[int]:
        """Drafts in the target's vocabulary (every one shared: logits were masked)."""
        if self.mapping is None or not draft_ids:
            return draft_ids
        return self.mapping.to_target(torch.tensor(draft_ids)).tolist()

    def stats(self) -> dict[str, Any]:
        """Draft forwards run (one per depth per call), rows and tokens drafted."""
        return dict(self.counters)

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Nothing to undo: the core keeps ``min(kv_valid, committed)`` of the draft KV."""

    def release(self, req_id: str) -> None:
        """No per-request state: the draft KV blocks are the request's, freed by the core."""


def draft_confidence(logits: torch.Tensor) -> torch.Tensor:  # [R, V] -> [R] float32
    """The draft's probability of its most likely token per row (softmax maximum of the
    raw draft logits: a function of the context alone, whatever was picked)."""
    return logits.float().softmax(-1).amax(-1)


def _one_hot(token: torch.Tensor, vocab: int) -> torch.Tensor:  # [] -> [vocab]
    """q of a greedy row in a probabilistic batch."""
    q = torch.zeros(vocab, dtype=torch.float32)
    q[token] = 1.0
    return q
