"""Cut each row's draft at the first token its grammar refuses, before the forward.

A draft token the grammar forbids can never be accepted (its p is 0 once the mask is
applied, ``structured/masks.py``), and every token after it in the same draft is then
never reached.
Feeding them to the target is pure cost: on CPU each extra position of a decode step is
a few milliseconds. So after propose, each grammar row keeps only its longest prefix the
grammar accepts (``LLMatcher.validate_tokens``: no state change, tens of microseconds).

Losslessness: verification is lossless for any draft, and dropping drafts is lossless when
the decision depends only on what comes before them. A refused token drawn from a q that
is not one-hot breaks that: verifying it rejects it for certain and samples position j
from the residual ``max(p - q, 0)``, while cutting it samples position j from p, so the
cut would make the token's own random draw decide the distribution (q = (.8, 0, .2) with
token 2 refused gave p(0) = .6 instead of .5). Such a row keeps the refused token (one
dead position, verified and rejected) and loses only what follows it, which verification
never reaches. A one-hot q (greedy or n-gram drafts) is cut at the refused token: its
residual is p itself. The cut drafts are never verified, so the spec-decode metrics do
not count them as drafted.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftwise.spec.step import StepDrafts
from draftwise.structured.matcher import GrammarMatcher


def trim_to_grammar(
    matchers: Sequence[GrammarMatcher | None],  # [num_rows] None: no grammar
    drafts: StepDrafts,
) -> StepDrafts:
    """``drafts`` with each grammar row cut to its grammar-valid prefix (the same object
    when nothing is cut)."""
    if not drafts.token_ids.size or all(m is None for m in matchers):
        return drafts
    rows = drafts.rows()
    keep = [
        len(r) if m is None or not len(r) else m.valid_prefix(r.tolist())
        for m, r in zip(matchers, rows)
    ]
    q, cu = drafts.draft_probs, drafts.cu_num_draft_tokens
    if q is not None:  # a sampled refused token stays, to be rejected (module doc)
        keep = [n + 1 if n < len(r) and float(q[cu[i] + n, int(r[n])]) != 1.0 else n
                for i, (n, r) in enumerate(zip(keep, rows))]
    return drafts.cut(keep)


__all__ = ["trim_to_grammar"]
