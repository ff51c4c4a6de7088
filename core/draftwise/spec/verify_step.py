"""The verify phase of one step: every sampling row's drafts checked in one call.

Its own module because it is the glue between a step's records and the rule
(``spec/verify.py``, which knows nothing of requests or steps): which rows sample, the
token histories penalties read through the drafts, the grammar's mask at every verified
position, and the logprobs of what each row emits. ``LLMEngine._verify`` records the
step's prompt logprobs, then calls :func:`verify_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from draftwise.logits_process import token_history
from draftwise.logprobs import LogprobsMode, position_logprobs
# the rule's module, not its function: ``rule.verify`` is looked up per call, so a test
# (or a device path) that replaces ``draftwise.spec.verify.verify`` is the one that runs
from draftwise.spec import verify as rule
from draftwise.spec.step import StepDrafts, StepOutcome
from draftwise.structured.masks import step_bitmask

if TYPE_CHECKING:
    import torch

    from draftwise.scheduler import ScheduledRow
    from draftwise.structured.compiler import GrammarCompiler


def verify_rows(
    rows: Sequence[ScheduledRow],
    drafts: StepDrafts,
    logits: torch.Tensor,  # [sum over sampling rows of (drafts + 1), vocab] float32
    grammars: GrammarCompiler,
    method: rule.VerifyMethod | str,
    logprobs_mode: LogprobsMode,
    decode: Callable[[int], str | None],
    on_device: bool = False,
) -> StepOutcome:
    """Verify every sampling row (rows without drafts simply sample) in one call; rows
    that do not sample (a prefill chunk short of the prompt's end) get no tokens.
    ``on_device``: the Triton kernels' verify (``draftwise.gpu.verify.verify_on_device``,
    the same rule and contract) runs it, and the step's tokens come back to the host at
    its end, not one copy per token."""
    sampling = [i for i, row in enumerate(rows) if row.samples]
    outcome = StepOutcome([0] * len(rows), [None] * len(rows), [None] * len(rows))
    if not sampling:
        return outcome
    reqs = [rows[i].request for i in sampling]
    draft_rows = drafts.rows()
    histories = [
        token_history(r, draft_rows[i]) if r.params.needs_history else None
        for i, r in zip(sampling, reqs)
    ]
    bitmask = None
    if any(r.grammar is not None for r in reqs):  # structured output: masks per position
        bitmask = step_bitmask(
            grammars.executor, [r.grammar for r in reqs],
            [draft_rows[i].tolist() for i in sampling], grammars.vocab_size,
        )
    # rows that do not sample never draft, so the flat drafts are the sampling rows'
    verify = rule.verify
    if on_device:
        from draftwise.gpu.verify import verify_on_device as verify
    result = verify(
        logits,
        drafts.token_ids,
        [drafts.num_draft_tokens[i] for i in sampling],
        [r.params for r in reqs],
        [r.generator for r in reqs],
        draft_probs=drafts.draft_probs,
        method=method,
        histories=histories if any(h is not None for h in histories) else None,
        token_bitmask=bitmask,
    )
    start = 0
    for i, toks, n_acc in zip(sampling, result.output_token_ids, result.num_accepted):
        outcome.output_token_ids[i] = toks
        outcome.num_accepted[i] = n_acc
        params = rows[i].request.params
        if params.logprobs is not None:  # positions start .. start+len(toks)-1 emitted
            span = slice(start, start + len(toks))
            outcome.logprobs[i] = position_logprobs(
                logits[span], result.logits[span], toks, params, logprobs_mode, decode,
            )
        start += drafts.num_draft_tokens[i] + 1
    return outcome


__all__ = ["verify_rows"]
