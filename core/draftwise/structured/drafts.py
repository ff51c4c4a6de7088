"""Cut each row's draft at the first token its grammar refuses, before the forward.

A draft token the grammar forbids can never be accepted (its p is 0 once the mask is
applied, ``masks.py``), and every token after it in the same draft is then never reached.
Feeding them to the target is pure cost: on CPU each extra position of a decode step is
a few milliseconds. So after propose, each grammar row keeps only its longest prefix the
grammar accepts (``LLMatcher.validate_tokens``: no state change, tens of microseconds).

Losslessness is untouched: verification is lossless for any draft, and a shorter draft
only changes how many tokens this step emits, not their distribution. The cut drafts are
never verified, so the spec-decode metrics do not count them as drafted.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftwise.step import StepDrafts
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
    return drafts.cut(keep)


__all__ = ["trim_to_grammar"]
