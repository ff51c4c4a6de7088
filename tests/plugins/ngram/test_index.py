"""The per-request n-gram index against the numpy scan it replaces, as contexts grow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.speculator import DraftInput, DraftRow, ProposerContext
from draftwise_ngram.index import INDEX_MAX_N, NgramIndex
from draftwise_ngram.options import NgramOptions
from draftwise_ngram.proposer import NgramProposer, longest_earlier_match


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    max_n=st.integers(1, INDEX_MAX_N),
    steps=st.lists(st.integers(1, 5), min_size=1, max_size=30),
)
def test_growing_context_matches_the_scan_at_every_length(tokens, max_n, steps):
    """Synced a few tokens at a time (as decode steps commit them), every prefix's
    longest earlier match and its earliest end are the scan's."""
    index, n = NgramIndex(max_n), 0
    for grow in [*steps, len(tokens)]:
        n = min(len(tokens), n + grow)
        ctx = np.array(tokens[:n], dtype=np.int64)
        assert index.sync(ctx)
        assert index.longest_match() == longest_earlier_match(ctx, max_n)
        assert index.seq == tokens[:n]


def test_a_context_that_does_not_extend_the_indexed_one_is_refused_unchanged():
    index = NgramIndex(3)
    assert index.sync(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    assert not index.sync(np.array([1, 2, 3], dtype=np.int64))  # shorter
    assert not index.sync(np.array([1, 2, 3, 1, 9, 5], dtype=np.int64))  # last one differs
    assert not index.sync(np.array([7, 2, 3, 1, 2, 5], dtype=np.int64))  # first one differs
    assert index.seq == [1, 2, 3, 1, 2]
    assert index.longest_match() == (2, 1)


@pytest.mark.parametrize("max_n", [0, INDEX_MAX_N + 1])
def test_max_n_outside_the_indexed_range_is_refused(max_n):
    with pytest.raises(ValueError, match="max_n"):
        NgramIndex(max_n)


def _proposer(max_n: int, k: int = 3, min_n: int = 1, max_len: int = 1000) -> NgramProposer:
    ctx = ProposerContext(num_speculative_tokens=k, vocab_size=100, max_model_len=max_len)
    return NgramProposer(NgramOptions(prompt_lookup_min=min_n, prompt_lookup_max=max_n), ctx)


@settings(max_examples=60, deadline=None)
@given(
    contexts=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=50), min_size=1,
                      max_size=3),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 4),
    k=st.integers(1, 5),
    room=st.integers(-1, 8),
)
def test_indexed_proposer_drafts_what_the_scanning_one_drafts(contexts, min_n, extra, k, room):
    """Rows decoded step by step through one proposer (indexes kept across steps) draft
    exactly what a fresh scan drafts, evidence included; released rows leave nothing."""
    max_n = min(min_n + extra, INDEX_MAX_N)
    max_len = max(len(c) for c in contexts) + room
    indexed = _proposer(max_n, k, min_n, max_len)
    for n in range(1, max(len(c) for c in contexts) + 1):
        rows = [DraftRow(req_id=f"r{i}", token_ids=np.array(c[:n], dtype=np.int64), max_draft=k)
                for i, c in enumerate(contexts) if len(c) >= n]
        got = indexed.propose(DraftInput(rows))
        want = _proposer(max_n, k, min_n, max_len)
        want._indexes = None  # the scan: what every step did before the index
        ref = want.propose(DraftInput(rows))
        assert got.num_draft_tokens == ref.num_draft_tokens
        assert got.token_ids.tolist() == ref.token_ids.tolist()
        assert got.evidence == ref.evidence
    for i in range(len(contexts)):
        indexed.release(f"r{i}")
    assert indexed.num_indexed_requests == 0


def test_a_long_lookup_bound_scans_instead_of_indexing():
    proposer = _proposer(INDEX_MAX_N + 1)
    row = DraftRow(req_id="r", token_ids=np.array([1, 2, 3, 1, 2], dtype=np.int64), max_draft=3)
    assert proposer.propose(DraftInput([row])).token_ids.tolist() == [3, 1, 2]
    assert proposer.num_indexed_requests == 0


def test_a_reused_request_id_with_other_tokens_is_rebuilt():
    """A guard, not a path the core takes: the drafts follow the row's tokens."""
    proposer = _proposer(3)
    first = DraftRow(req_id="r", token_ids=np.array([1, 2, 3, 1, 2], dtype=np.int64), max_draft=3)
    other = DraftRow(req_id="r", token_ids=np.array([5, 6, 5], dtype=np.int64), max_draft=3)
    assert proposer.propose(DraftInput([first])).token_ids.tolist() == [3, 1, 2]
    assert proposer.propose(DraftInput([other])).token_ids.tolist() == [6, 5]


def test_a_context_past_the_indexed_length_drops_its_index_and_scans(monkeypatch):
    """Same drafts on either side of the cap; past it the request keeps no index."""
    import draftwise_ngram.proposer as proposer_module

    monkeypatch.setattr(proposer_module, "INDEX_MAX_TOKENS", 6)
    proposer = _proposer(3)
    tokens = [1, 2, 3, 1, 2, 3, 1, 2]
    for n, want in [(5, [3, 1, 2]), (6, [1, 2, 3]), (7, [2, 3, 1]), (8, [3, 1, 2])]:
        row = DraftRow(req_id="r", token_ids=np.array(tokens[:n], dtype=np.int64), max_draft=3)
        assert proposer.propose(DraftInput([row])).token_ids.tolist() == want
        assert proposer.num_indexed_requests == (1 if n <= 6 else 0)
