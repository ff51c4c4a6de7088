"""The suffix index against a brute-force reading of Arctic's suffix-tree semantics."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise_ngram.suffix_index import GlobalIndex, TokenStreams, speculate


def reference(seqs: list[list[int]], context: list[int], max_spec: int, factor: float,
              min_prob: float, depth: int) -> tuple[list[int], list[float], int]:
    """Every (stream, end) occurrence counted by scanning: Arctic's SuffixTree::speculate
    (path drafts), ties in the most frequent continuation to the smallest token id."""
    pattern = context[-depth:]
    best: tuple[list[int], list[float], int] | None = None
    for m in range(1, len(pattern)):
        pat = pattern[-m:]
        occ = [(s, e) for s, seq in enumerate(seqs) for e in range(m - 1, len(seq))
               if seq[e - m + 1 : e + 1] == pat]
        if not occ:
            break
        limit = max(0, min(max_spec, int(m * factor + 1e-6), depth - m))
        toks: list[int] = []
        probs: list[float] = []
        cur = occ
        while len(toks) < limit:
            nxt = [(s, e + 1) for s, e in cur if e + 1 < len(seqs[s])]
            if not nxt:
                break
            counts: dict[int, int] = {}
            for s, e in nxt:
                counts[seqs[s][e]] = counts.get(seqs[s][e], 0) + 1
            tok = min(counts, key=lambda t: (-counts[t], t))
            prob = counts[tok] / len(occ)
            if prob < min_prob:
                break
            toks.append(tok)
            probs.append(prob)
            cur = [(s, e) for s, e in nxt if seqs[s][e] == tok]
        if best is None or sum(probs) >= sum(best[1]):
            best = (toks, probs, m)
    return best if best is not None else ([], [], 0)


streams_st = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=40), min_size=1,
                      max_size=5)


@settings(max_examples=300, deadline=None)
@given(seqs=streams_st, ctx=st.lists(st.integers(0, 3), min_size=1, max_size=30),
       max_spec=st.integers(0, 8), factor=st.sampled_from([0.5, 1.0, 1.5, 3.0]),
       min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.6]), depth=st.integers(1, 12))
def test_speculate_matches_brute_force(seqs, ctx, max_spec, factor, min_prob, depth):
    streams = TokenStreams()
    for h, seq in enumerate(seqs):
        # built in interleaved pieces, as running requests append
        streams.extend(h, seq[: len(seq) // 2])
    for h, seq in enumerate(seqs):
        streams.extend(h, seq[len(seq) // 2 :])
    got = speculate(streams, ctx, max_spec, factor, min_prob, depth)
    toks, probs, m = reference(seqs, ctx, max_spec, factor, min_prob, depth)
    assert got.token_ids == toks
    assert got.probs == probs
    if toks:
        assert got.match_len == m


@settings(max_examples=150, deadline=None)
@given(seqs=streams_st, drop=st.lists(st.booleans(), min_size=5, max_size=5),
       ctx=st.lists(st.integers(0, 3), min_size=2, max_size=20), compact=st.booleans())
def test_removed_streams_are_never_matched(seqs, drop, ctx, compact):
    streams = TokenStreams()
    for h, seq in enumerate(seqs):
        streams.extend(h, seq)
    kept = [seq for h, seq in enumerate(seqs) if not drop[h]]
    for h in range(len(seqs)):
        if drop[h]:
            streams.remove(h)
    if compact:
        streams.compact()
        streams.extend(99, [1, 2])  # appends after a compaction still link up
        kept.append([1, 2])
    got = speculate(streams, ctx, 8, 1.0, 0.1, 10)
    assert got.token_ids == reference(kept, ctx, 8, 1.0, 0.1, 10)[0]


def test_longer_match_wins_and_probability_cuts():
    # "1 2 3" occurs twice, both times followed by 4, then by 6 once and 7 once;
    # "2 3" occurs three times (4, 4, 5)
    streams = TokenStreams()
    for h, seq in enumerate([[1, 2, 3, 4, 6], [1, 2, 3, 4, 7], [9, 2, 3, 5]]):
        streams.extend(h, seq)
    got = speculate(streams, [0, 1, 2, 3], 8, 2.0, 0.6, 24)
    assert (got.token_ids, got.probs, got.match_len) == ([4], [1.0], 3)  # 6: p = 1/2 < 0.6
    got = speculate(streams, [0, 1, 2, 3], 8, 2.0, 0.4, 24)
    assert (got.token_ids, got.probs) == ([4, 6], [1.0, 0.5])  # a tie: the smaller id
    got = speculate(streams, [0, 1, 2, 3], 8, 0.5, 0.4, 24)  # 3 * 0.5: one token
    assert got.token_ids == [4]


def test_global_index_isolates_keys_and_evicts_fifo():
    g = GlobalIndex(max_cached_requests=2)
    g.start("a", "alice")
    g.extend("a", [5, 6, 7, 8])
    g.start("b", "bob")
    g.extend("b", [5, 6, 9, 9])
    assert g.speculate("alice", [5, 6], 4, 1.0, 0.1, 24).token_ids == [7]
    assert g.speculate("bob", [5, 6], 4, 1.0, 0.1, 24).token_ids == [9]
    assert g.speculate("carol", [5, 6], 4, 1.0, 0.1, 24).token_ids == []
    g.start("c", "alice")  # a third request: the oldest ("a") goes
    assert not g.is_recording("a")
    assert g.speculate("alice", [5, 6], 4, 1.0, 0.1, 24).token_ids == []
    assert g.num_evicted == 1


def test_eviction_keeps_memory_under_budget():
    budget = 2 * 1024 * 1024
    g = GlobalIndex(max_cached_requests=10**6, budget_bytes=budget)
    rng = random.Random(0)
    peak = 0
    for r in range(400):
        g.start(f"r{r}", "k")
        for _ in range(10):
            g.extend(f"r{r}", [rng.randrange(2000) for _ in range(50)])
        peak = max(peak, g.nbytes())
        g.stop(f"r{r}")
    assert g.num_evicted > 0  # 200k tokens do not fit in 2 MiB
    assert peak <= budget, peak
    assert g.num_tokens > budget // 40  # and it still holds a useful share
    # the newest outputs are the ones kept
    assert g.is_recording("r399") and not g.is_recording("r0")


def test_max_cached_requests_zero_keeps_nothing():
    g = GlobalIndex(max_cached_requests=0)
    g.start("a", "k")
    g.extend("a", [1, 2, 3])
    assert not g.is_recording("a") and g.num_tokens == 0
