"""NgramProposer behind the Proposer protocol, on plain token lists with no engine."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.speculator import DraftInput, DraftRow, Proposer, ProposerContext, VerifyOutcome
from draftwise_ngram.options import NgramOptions
from draftwise_ngram.proposer import NgramProposer


def make(k: int = 3, min_n: int = 1, max_n: int = 3, max_len: int = 1000) -> NgramProposer:
    ctx = ProposerContext(num_speculative_tokens=k, vocab_size=100, max_model_len=max_len)
    return NgramProposer(NgramOptions(prompt_lookup_min=min_n, prompt_lookup_max=max_n), ctx)


def row(tokens: list[int], max_draft: int = 8, req_id: str = "r") -> DraftRow:
    return DraftRow(req_id=req_id, token_ids=np.array(tokens, dtype=np.int64), max_draft=max_draft)


def test_is_a_proposer():
    assert isinstance(make(), Proposer)


def test_batch_of_rows_with_and_without_matches():
    drafts = make(k=2).propose(
        DraftInput(
            rows=[
                row([1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3], req_id="a"),
                row([1, 2, 3, 4], req_id="b"),  # no match: no speculation for this row
                row([1, 2, 3, 4, 1, 2], req_id="c"),
            ]
        )
    )
    assert drafts.num_draft_tokens == [2, 0, 2]
    assert [drafts.row(i).tolist() for i in range(3)] == [[10, 1], [], [3, 4]]
    assert drafts.token_ids.dtype == np.int64 and drafts.draft_probs is None
    # the evidence adaptive depth keeps acceptance by: the length of the match followed
    assert drafts.evidence == [3, 0, 2]


def test_k_is_the_smallest_of_config_row_budget_and_room():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert make(k=5).propose(DraftInput([row(tokens)])).row(0).tolist() == [3, 4, 5, 6, 1]
    assert make(k=5).propose(DraftInput([row(tokens, max_draft=2)])).row(0).tolist() == [3, 4]
    assert make(k=5, max_len=11).propose(DraftInput([row(tokens)])).row(0).tolist() == [3, 4, 5]
    assert make(k=5, max_len=8).propose(DraftInput([row(tokens)])).num_draft_tokens == [0]
    assert make(k=5).propose(DraftInput([row(tokens, max_draft=0)])).num_draft_tokens == [0]


def test_min_n_is_honoured():
    batch = DraftInput([row([1, 2, 9, 1, 2])])
    assert make(min_n=3, max_n=4).propose(batch).num_draft_tokens == [0]
    assert make(min_n=2, max_n=4).propose(batch).row(0).tolist() == [9, 1, 2]


def test_empty_batch_and_feedback_are_no_ops():
    p = make()
    out = p.propose(DraftInput(rows=[]))
    assert out.num_draft_tokens == [] and out.token_ids.shape == (0,)
    p.on_verified(VerifyOutcome(["r"], [2], [1], [[5, 6]]))
    p.release("r")


def test_bad_bounds_are_refused():
    class Loose:  # bypasses NgramOptions validation, as a hand-built object might
        prompt_lookup_min = 4
        prompt_lookup_max = 2

    with pytest.raises(ValueError, match="prompt_lookup_min <= prompt_lookup_max"):
        NgramProposer(Loose(), ProposerContext(3, 100, 1000))  # type: ignore[arg-type]
