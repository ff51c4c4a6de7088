"""The n-gram lookup on plain token lists: vLLM's worked examples, rules, and two oracles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise_ngram.proposer import longest_earlier_match, propose_ngram


def propose(tokens: list[int], min_n: int, max_n: int, k: int, max_len: int = 10_000) -> list[int]:
    return propose_ngram(np.array(tokens, dtype=np.int64), min_n, max_n, k, max_len).tolist()


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int, max_len: int) -> list[int]:
    """The rules, spelled out: longest suffix (<= max_n) seen earlier, earliest occurrence."""
    n = len(tokens)
    if n < min_n:
        return []
    k = min(k, max_len - n)
    if k <= 0:
        return []
    for length in range(min(max_n, n - 1), min_n - 1, -1):
        suffix = tokens[n - length :]
        for start in range(0, n - length):  # the occurrence ends before the last token
            if tokens[start : start + length] == suffix:
                return tokens[start + length : start + length + k]
    return []


def vllm_kmp(tokens: list[int], min_n: int, max_n: int, k: int, max_len: int) -> list[int]:
    """vLLM's own algorithm (a KMP scan over the reversed context, LPS capped at max_n)."""
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:  # >=: later in reversed order = earlier in the original
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + min(k, total - start)]


@pytest.mark.parametrize(
    ("tokens", "min_n", "max_n", "k", "expected"),
    [
        # the reference's worked examples
        ([1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3], 1, 3, 2, [10, 1]),
        ([1, 2, 3, 4, 1, 2], 1, 5, 5, [3, 4, 1, 2]),
        # earliest occurrence of the longest match wins
        ([5, 1, 7, 5, 1, 8, 5, 1], 1, 3, 1, [7]),
        # a longer, later match beats a shorter, earlier one
        ([2, 9, 1, 2, 4, 1, 2], 1, 3, 2, [4, 1]),
        # the draft may run into the suffix itself
        ([3, 3, 3, 3], 1, 2, 3, [3, 3]),
        # no earlier occurrence of the last token
        ([1, 2, 3, 4], 1, 3, 3, []),
        # longest match shorter than min_n
        ([1, 2, 3, 9, 3], 2, 3, 3, []),
        # context shorter than min_n
        ([4], 2, 3, 3, []),
        ([], 1, 3, 3, []),
        # max_n caps the match: the earliest occurrence of the 2-token suffix is used
        ([1, 2, 3, 0, 2, 3, 5, 1, 2, 3], 1, 2, 2, [0, 2]),
    ],
)
def test_worked_examples(tokens, min_n, max_n, k, expected):
    assert propose(tokens, min_n, max_n, k) == expected
    assert vllm_kmp(tokens, min_n, max_n, k, 10_000) == expected


def test_max_model_len_caps_k():
    tokens = [1, 2, 3, 4, 1, 2]
    assert propose(tokens, 1, 5, 5, max_len=8) == [3, 4]
    assert propose(tokens, 1, 5, 5, max_len=6) == []
    assert propose(tokens, 1, 5, 0) == []


def test_match_length_and_position():
    assert longest_earlier_match(np.array([1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3]), 3) == (3, 2)
    assert longest_earlier_match(np.array([1, 2, 3]), 3) is None
    assert longest_earlier_match(np.array([7]), 3) is None


def test_result_is_a_copy_not_a_view():
    tokens = np.array([1, 2, 1], dtype=np.int64)
    draft = propose_ngram(tokens, 1, 2, 2, 100)
    tokens[1] = 99
    assert draft.tolist() == [2, 1]


@settings(max_examples=250, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=0, max_size=40),
    min_n=st.integers(1, 4),
    extra=st.integers(0, 3),
    k=st.integers(0, 6),
    room=st.integers(-2, 8),
)
def test_matches_brute_force_and_vllm(tokens, min_n, extra, k, room):
    max_n = min_n + extra
    max_len = len(tokens) + room
    want = brute_force(tokens, min_n, max_n, k, max_len)
    assert propose(tokens, min_n, max_n, k, max_len) == want
    assert vllm_kmp(tokens, min_n, max_n, k, max_len) == want
