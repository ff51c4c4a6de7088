"""The typed records one engine step passes from propose to feedback.

``LLMEngine.step`` reads schedule -> propose -> forward -> verify -> commit -> feedback;
each phase hands the next one of these (propose a :class:`StepDrafts`, forward a
:class:`StepForward`, verify a :class:`StepOutcome`), never a side dictionary keyed by
request id nor a field of the engine.
Rows are the step's scheduled rows, in order; row ``i`` of every list below is row ``i``
of the schedule. Nothing here is committed anywhere: a step that fails before commit can
be run again for any subset of its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from draftwise.speculator import prefix_sums

if TYPE_CHECKING:
    import torch

    from draftwise.logprobs import PositionLogprobs


@dataclass(slots=True)
class StepDrafts:
    """Every row's draft: what propose made, what forward feeds and verify checks."""

    #: ``[total_draft_tokens]`` int64, row after row (target vocabulary)
    token_ids: np.ndarray
    #: ``[num_rows]`` draft tokens per row (0: the row does not speculate)
    num_draft_tokens: list[int]
    #: ``[num_rows]`` index of the chain member that drafted the row; None: no draft
    owner: list[int | None]
    #: ``[total_draft_tokens, vocab]`` float32 q, or None when every row's q is one-hot
    draft_probs: torch.Tensor | None = None
    #: ``[num_rows]`` per own-KV chain member: its KV positions right if every draft of
    #: the row is accepted (``Drafts.kv_valid``); absent members wrote nothing
    kv_valid: list[dict[int, int]] = field(default_factory=list)
    #: ``[num_rows]`` the drafter's evidence for the row's draft (``Drafts.evidence``:
    #: n-gram's match length), what adaptive depth keeps acceptance by; None: none given
    evidence: list[int | None] = field(default_factory=list)
    #: ``[num_rows]`` drafts each row's drafter made, before any cut; empty: nothing was
    #: cut (then it is ``num_draft_tokens``)
    num_made: list[int] = field(default_factory=list)
    #: ``[num_rows]`` the first draft a cut dropped from a one-hot row (None: none, or the
    #: row's q is not one-hot); empty: nothing was cut. Verify's token after the row's
    #: last kept draft says whether it would have held (:meth:`made_outcome`)
    first_dropped: list[int | None] = field(default_factory=list)
    #: seconds the drafters ran, on adaptive depth's clock (0: not timed, or nothing was
    #: drafted): the step's price leaves it out of the rest (``draftwise.step_clock``)
    draft_seconds: float = 0.0

    @classmethod
    def none(cls, num_rows: int) -> StepDrafts:
        """No row speculates (no speculative config, or nothing to draft)."""
        return cls(
            np.zeros(0, dtype=np.int64), [0] * num_rows, [None] * num_rows, None,
            [{} for _ in range(num_rows)], [None] * num_rows,
        )

    @property
    def cu_num_draft_tokens(self) -> list[int]:
        """Prefix sums of ``num_draft_tokens``, starting at 0."""
        return prefix_sums(self.num_draft_tokens)

    def rows(self) -> list[np.ndarray]:
        """Every row's draft tokens (views), the prefix sums taken once."""
        cu = self.cu_num_draft_tokens
        return [self.token_ids[cu[i] : cu[i + 1]] for i in range(len(self.num_draft_tokens))]

    def cut(self, keep: list[int]) -> StepDrafts:
        """Each row cut to its first ``keep[i]`` drafts (the same object when nothing is
        cut): a draft that will not pay, or cannot be accepted, is never fed to the target.

        Lossless when ``keep[i]`` depends only on what precedes the dropped drafts (the
        context, the earlier drafts, a drafter's evidence fixed before it drafted): a
        shorter draft then only changes how many tokens a step emits. A cut decided on a
        dropped draft's own sampled value changes the distribution when its q is not
        one-hot (``spec.grammar_trim`` keeps such a token instead).
        """
        if keep == list(self.num_draft_tokens):
            return self
        if len(keep) != len(self.num_draft_tokens):
            raise ValueError(f"cut takes one count per row: {len(keep)} for "
                             f"{len(self.num_draft_tokens)} rows")
        if any(not 0 <= n <= c for n, c in zip(keep, self.num_draft_tokens)):
            raise ValueError(f"cannot cut drafts of {self.num_draft_tokens} to {keep}")
        cu = self.cu_num_draft_tokens
        first = self.first_dropped or [None] * len(keep)
        probs = self.draft_probs
        first = [  # a later cut (a grammar's) drops from the front of what is left
            f if n == c else (int(self.token_ids[cu[i] + n]) if _one_hot(probs, cu[i] + n)
                              else None)
            for i, (n, c, f) in enumerate(zip(keep, self.num_draft_tokens, first))
        ]
        # (slices, not an index array: every draft cut, adaptive depth on weak evidence,
        # is the usual cut, and this runs on most of its steps)
        pieces = [self.token_ids[cu[i] : cu[i] + n] for i, n in enumerate(keep) if n]
        token_ids = (pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces) if pieces
                     else self.token_ids[:0].copy())
        if probs is not None:
            import torch

            kept = [j for i, n in enumerate(keep) for j in range(cu[i], cu[i] + n)]
            probs = probs[torch.tensor(kept, dtype=torch.int64)]
        return StepDrafts(
            token_ids=token_ids,
            num_draft_tokens=list(keep),
            owner=list(self.owner),
            draft_probs=probs,
            kv_valid=self.kv_valid,
            evidence=list(self.evidence),
            num_made=list(self.num_made or self.num_draft_tokens),
            first_dropped=first,
            draft_seconds=self.draft_seconds,
        )

    def made_outcome(
        self, i: int, num_accepted: int, output_ids: Sequence[int]
    ) -> tuple[int, int, int]:
        """Row ``i``'s draft as its drafter made it, before any cut: (drafts made, how
        many of them held, how many leading positions that is known for).

        The kept drafts' outcome is verify's. One position past them is known for free
        when every kept draft held: verify's next token there (the bonus) is the target's
        own pick, and a one-hot draft is accepted exactly when it equals that pick
        (greedy: the argmax; sampled: with probability p(draft), the chance the pick is
        the draft), so the first dropped draft would have held iff it equals the bonus
        token. What a cut dropped is thus still learned from, at no forward cost; deeper
        dropped positions stay unknown.
        """
        kept = self.num_draft_tokens[i]
        made = self.num_made[i] if self.num_made else kept
        first = self.first_dropped[i] if self.first_dropped else None
        if first is None or num_accepted < kept or len(output_ids) <= kept:
            return made, num_accepted, kept
        return made, num_accepted + int(output_ids[kept] == first), kept + 1


def _one_hot(probs: torch.Tensor | None, pos: int) -> bool:
    """Whether the draft at flat position ``pos`` has a one-hot q (None: every row has;
    a q row that sums to 1 with a 1 in it is one-hot)."""
    return probs is None or float(probs[pos].max()) == 1.0


@dataclass(slots=True)
class StepForward:
    """The target forward's result, and where each row sits in it: what verify reads
    (the logits) and what commit reads (the rows' positions, the hidden-state taps)."""

    #: ``[num_rows]`` each row's first fed position (its computed tokens before the step)
    starts: list[int]
    #: ``[num_rows]`` the row's prompt positions whose logits ``prompt_logprobs`` records
    #: (they come first among the row's logits rows)
    prompt_rows: list[list[int]]
    #: ``[num_logits_rows, vocab]`` float32: per row its prompt rows, then, where it
    #: samples, one row per draft plus one
    logits: torch.Tensor
    #: layer -> ``[num_tokens, hidden]``, the taps the drafters read (empty: none asked)
    hidden_states: dict[int, torch.Tensor]
    #: ``[num_rows + 1]`` where each row's tokens start in the flat batch (new tokens then
    #: drafts); the last entry is the tokens fed
    offsets: list[int]

    @property
    def num_tokens(self) -> int:
        """Tokens the forward fed (every row's new tokens and drafts)."""
        return self.offsets[-1]


@dataclass(slots=True)
class StepOutcome:
    """What verification decided, per row: the one input of commit and feedback."""

    #: ``[num_rows]`` accepted draft tokens (0 for rows that did not sample)
    num_accepted: list[int]
    #: ``[num_rows]`` output tokens (accepted + recovered or bonus); None: no sample
    #: (a prefill chunk that does not reach the end of the prompt)
    output_token_ids: list[list[int] | None]
    #: ``[num_rows]`` per output token its log-probabilities, for rows that asked
    logprobs: list[list[PositionLogprobs] | None] = field(default_factory=list)


__all__ = ["StepDrafts", "StepForward", "StepOutcome"]
