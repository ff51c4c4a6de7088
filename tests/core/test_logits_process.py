"""Per-position logits processing: the vectorised pipeline equals the readable reference,
each setting does what vLLM's does, and position j sees the drafts before it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from draftwise.logits_process import (
    AllTokensExcludedError,
    TokenHistory,
    apply_logits_processors,
    apply_logits_processors_reference,
    bad_words_token_ids,
)
from draftwise.sampling_params import SamplingParams

V = 40


def history(params: SamplingParams, out: list[int], drafts: list[int], prompt=(1, 2, 3),
            bad=(), stops=frozenset()) -> TokenHistory:
    return TokenHistory(params, np.array(prompt, dtype=np.int64), np.array(out, dtype=np.int64),
                        np.array(drafts, dtype=np.int64), tuple(bad), frozenset(stops))


SETTINGS = [
    SamplingParams(presence_penalty=1.5),
    SamplingParams(frequency_penalty=0.7),
    SamplingParams(frequency_penalty=-1.2, presence_penalty=-0.4),
    SamplingParams(repetition_penalty=1.8),
    SamplingParams(repetition_penalty=0.6),
    SamplingParams(logit_bias={3: 5.0, 9: -100.0}),
    SamplingParams(allowed_token_ids=(1, 4, 5, 9, 11, 30)),
    SamplingParams(min_tokens=6, max_tokens=20),
    SamplingParams(temperature=0.0, presence_penalty=0.5, repetition_penalty=1.2,
                   logit_bias={4: 2.0}, frequency_penalty=0.3),
]


def batch(seed: int):
    gen = np.random.default_rng(seed)
    hs, counts = [], []
    for i, params in enumerate(SETTINGS + [SamplingParams()]):
        out = gen.integers(0, 12, size=int(gen.integers(0, 8))).tolist()
        drafts = gen.integers(0, 12, size=int(gen.integers(0, 5))).tolist()
        bad = [(7,), (4, 5), (5, 4, 11)] if i % 3 == 0 else []
        hs.append(history(params, out, drafts, bad=bad, stops={0, 2}))
        counts.append(len(drafts) + 1)
    hs.insert(2, None)  # a request with nothing to apply
    counts.insert(2, 3)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    logits = torch.from_numpy(gen.normal(size=(int(cu[-1]), V)).astype(np.float32)) * 3
    return logits, cu, hs


@pytest.mark.parametrize("seed", range(8))
def test_vectorised_equals_reference(seed: int) -> None:
    logits, cu, hs = batch(seed)
    keep = logits.clone()
    fast = apply_logits_processors(logits, cu, hs)
    ref = apply_logits_processors_reference(logits, cu, hs)
    assert torch.equal(fast, ref)
    assert torch.equal(logits, keep), "the input is never edited"
    assert not torch.equal(fast, logits), "the settings must change something"


def test_nothing_to_apply_returns_the_input() -> None:
    logits = torch.randn(4, V)
    cu = np.array([0, 2, 4])
    assert apply_logits_processors(logits, cu, [None, history(SamplingParams(), [], [5])]) is logits


def rows(params: SamplingParams, out: list[int], drafts: list[int], **kw) -> torch.Tensor:
    h = history(params, out, drafts, **kw)
    logits = torch.full((h.num_positions, V), 2.0)
    logits[:, 1] = -2.0
    return apply_logits_processors(logits, np.array([0, h.num_positions]), [h])


def test_penalties_see_the_drafts_before_each_position() -> None:
    # output [5], drafts [5, 6]: position 0 saw 5 once, position 1 twice, position 2 also 6
    got = rows(SamplingParams(frequency_penalty=1.0, presence_penalty=0.5), [5], [5, 6])
    assert got[:, 5].tolist() == [2.0 - 1.5, 2.0 - 2.5, 2.0 - 2.5]
    assert got[:, 6].tolist() == [2.0, 2.0, 2.0 - 1.5]
    assert got[:, 3].tolist() == [2.0] * 3  # prompt tokens are not output tokens


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    got = rows(SamplingParams(repetition_penalty=2.0), [], [1], prompt=(3,))
    assert got[0, 3] == 1.0 and got[0, 1] == -2.0  # prompt token 3; token 1 not yet seen
    assert got[1, 1] == -4.0  # the draft before position 1
    assert got[0, 7] == 2.0


def test_min_tokens_counts_drafts_and_bad_words_match_their_prefix() -> None:
    got = rows(SamplingParams(min_tokens=3, max_tokens=9), [8], [4, 5], stops={0})
    assert torch.isneginf(got[:2, 0]).all() and got[2, 0] == 2.0  # 1 + 2 drafts = 3 tokens
    got = rows(SamplingParams(bad_words=("x",)), [8], [4, 5], bad=[(4, 5, 9), (7,)])
    assert torch.isneginf(got[:, 7]).all()
    assert got[:2, 9].tolist() == [2.0, 2.0] and torch.isneginf(got[2, 9])


def test_everything_excluded_is_a_named_error() -> None:
    with pytest.raises(AllTokensExcludedError, match="allowed_token_ids"):
        rows(SamplingParams(allowed_token_ids=(7,)), [], [], bad=[(7,)])


def test_bad_words_tokenize_alone_and_after_a_space() -> None:
    vocab = {"hello": [10], " hello": [11], "new york": [20, 21], " new york": [22, 21]}
    got = bad_words_token_ids(["hello", "new york"], lambda t: vocab[t])
    assert got == ((10,), (11,), (20, 21), (22, 21))
    same = bad_words_token_ids(["hello"], lambda t: [10])
    assert same == ((10,),)
