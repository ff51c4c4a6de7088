"""SuffixProposer on plain token lists with no engine: own context, global index, isolation."""

from __future__ import annotations

import numpy as np

from draftwise.speculator import DraftInput, DraftRow, Proposer, ProposerContext, VerifyOutcome
from draftwise_ngram.suffix_options import SuffixOptions
from draftwise_ngram.suffix_proposer import SuffixProposer

PROMPT = [100, 101, 102]
#: an output long enough for its own suffix to match it later
OUTPUT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]


def make(k: int = 8, max_len: int = 1000, **opts) -> SuffixProposer:
    ctx = ProposerContext(num_speculative_tokens=k, vocab_size=200, max_model_len=max_len)
    return SuffixProposer(SuffixOptions(**opts), ctx)


def row(tokens: list[int], req_id: str, key: str | None, num_prompt: int = 3,
        max_draft: int = 8) -> DraftRow:
    return DraftRow(req_id=req_id, token_ids=np.array(tokens, dtype=np.int64),
                    max_draft=max_draft, num_prompt_tokens=num_prompt, isolation_key=key)


def run_request(p: SuffixProposer, req_id: str, key: str | None, output: list[int]) -> None:
    """Propose once per committed output token, as the engine does, then finish."""
    for n in range(1, len(output) + 1):
        p.propose(DraftInput([row(PROMPT + output[:n], req_id, key)]))
    p.release(req_id)


def test_is_a_proposer():
    assert isinstance(make(), Proposer)


def test_own_context_drafts_without_a_key():
    p = make()
    out = p.propose(DraftInput([row([1, 2, 3, 4, 5, 9, 1, 2, 3], "a", None)]))
    assert out.row(0).tolist() == [4, 5, 9]  # match of 3: at most 3 tokens (factor 1)
    assert out.evidence == [3]
    assert p.stats()["drafts_from_request"]["num_drafts"] == 1
    assert p.stats()["global_cached_requests"] == 0  # no key: nothing recorded


def test_a_keys_outputs_draft_for_the_same_key_only():
    p = make()
    run_request(p, "a", "alice", OUTPUT)
    # a new request of alice's whose output starts like a's: drafted from the global index
    out = p.propose(DraftInput([row([55, 56, 57, 7, 8, 9, 10], "b", "alice", num_prompt=3)]))
    assert out.row(0).tolist() == [11, 12, 13, 14]
    assert p.stats()["drafts_from_global"]["num_drafts"] == 1
    # bob's identical request gets nothing from alice's output; nor does a keyless one
    for req_id, key in (("c", "bob"), ("d", None)):
        out = p.propose(DraftInput([row([55, 56, 57, 7, 8, 9, 10], req_id, key)]))
        assert out.num_draft_tokens == [0], key
    assert p.stats()["drafts_from_global"]["num_drafts"] == 1


def test_prompt_tokens_are_not_recorded_globally():
    p = make()
    run_request(p, "a", "k", OUTPUT)
    out = p.propose(DraftInput([row([1, 100, 101, 102], "b", "k", num_prompt=4)]))
    assert out.num_draft_tokens == [0]  # a's prompt stayed a's


def test_global_disabled_with_zero_cached_requests():
    p = make(suffix_decoding_max_cached_requests=0)
    run_request(p, "a", "k", OUTPUT)
    out = p.propose(DraftInput([row([55, 7, 8, 9, 10], "b", "k", num_prompt=1)]))
    assert out.num_draft_tokens == [0]


def test_draft_bounded_by_k_row_budget_and_room():
    p = make(k=2)
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert p.propose(DraftInput([row(tokens, "a", None)])).row(0).tolist() == [4, 5]
    p = make(k=8)
    assert p.propose(DraftInput([row(tokens, "b", None, max_draft=1)])).row(0).tolist() == [4]
    p = make(k=8, max_len=len(tokens) + 2)
    assert p.propose(DraftInput([row(tokens, "c", None)])).row(0).tolist() == [4, 5]


def test_release_drops_own_index_and_keeps_output_cached():
    p = make()
    run_request(p, "a", "k", OUTPUT)
    assert p.num_indexed_requests == 0
    assert p.stats()["global_cached_requests"] == 1
    assert p.stats()["global_tokens"] == len(OUTPUT)


def test_accepted_tokens_counted_by_source():
    p = make()
    run_request(p, "a", "k", OUTPUT)
    p.propose(DraftInput([row([55, 56, 57, 7, 8, 9, 10], "b", "k")]))
    p.on_verified(VerifyOutcome(["b"], [4], [3], [[11, 12, 13, 20]]))
    assert p.stats()["drafts_from_global"]["num_accepted_tokens"] == 3


def test_accepted_tokens_of_a_request_released_before_feedback_still_count():
    p = make()
    run_request(p, "a", "k", OUTPUT)
    p.propose(DraftInput([row([55, 56, 57, 7, 8, 9, 10], "b", "k")]))
    p.release("b")  # finished in this step: the core releases before on_verified
    p.on_verified(VerifyOutcome(["b"], [4], [4], [[11, 12, 13, 14, 15]]))
    assert p.stats()["drafts_from_global"]["num_accepted_tokens"] == 4
