"""The rnn pass's look-ahead windows (``draftwise_dspark.lookahead``) draft exactly what the
one-position-per-product pass drafts.

bf16 drafters, so ``W2`` and ``joint_proj`` are on the native row-invariant kernel and
the windows run. For every draft call of a batched generation the tokens, each slot's
previous token and q (sampled rows) are compared with the pass the windows replace
(``look_ahead = False``), on a drafter whose guesses mostly hold (a small bias: windows
kept whole) and one whose guesses mostly fail (a bias large against the base margins:
windows cut short), greedy and ``draft_sample_method: "probabilistic"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM, SamplingParams
from draftwise_dspark.lookahead import HitRate

from .conftest import save_dspark
from .test_engine import PROMPTS, fixed


def passes(target_dir: Path, drafter: Path, look_ahead: bool, sampled: bool, seqs: int
           ) -> tuple[list[tuple[torch.Tensor, ...]], list[list[int]], dict[str, int]]:
    """Every Markov pass's (tokens, previous tokens, q), the outputs and the counters."""
    extra = {"draft_sample_method": "probabilistic"} if sampled else {}
    llm = LLM(model=str(target_dir), dtype="bfloat16", max_num_seqs=seqs,
              speculative_config=fixed(drafter, **extra))
    prop = llm.engine.spec.proposers[0]
    prop.native = None  # the torch pass's windows (test_native covers the C pass's)
    prop.look_ahead = look_ahead
    seen: list[tuple[torch.Tensor, ...]] = []
    real = prop._markov_pass

    def record(*a: Any) -> Any:
        out = real(*a)
        seen.append(tuple(x.clone() for x in out if x is not None))
        return out

    prop._markov_pass = record
    params = [SamplingParams(temperature=0.8 if sampled else 0.0, seed=11 + i, max_tokens=20,
                             ignore_eos=True) for i in range(len(PROMPTS))]
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    return seen, [o.outputs[0].token_ids for o in outs], llm.engine.spec.proposer_stats()[0]


@pytest.mark.parametrize("seqs", [1, 2])
@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("markov_std", [0.02, 0.5])
def test_windows_draft_what_one_position_per_product_drafts(target_dir, tmp_path, sampled,
                                                            markov_std, seqs) -> None:
    """One row (windows up to 4 positions) and two sharing the batch (up to 2)."""
    drafter = save_dspark(tmp_path / "rnn", target_dir, kind="rnn", markov_std=markov_std)
    got, out, stats = passes(target_dir, drafter, True, sampled, seqs)
    want, want_out, want_stats = passes(target_dir, drafter, False, sampled, seqs)
    assert out == want_out and len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert stats["markov_steps"] == want_stats["markov_steps"]
    assert (want_stats["markov_w2_products"] + want_stats["markov_certified"]
            == want_stats["markov_steps"])
    if markov_std < 0.1 and not sampled:  # greedy picks the guesses: fewer products
        assert stats["markov_w2_products"] < 0.8 * stats["markov_steps"]


def test_depth_follows_the_hit_rate_and_the_rows() -> None:
    rate = HitRate(prior=0.9)
    assert rate.depth(rows=1, room=6) == 3
    assert rate.depth(rows=1, room=1) == 1
    assert rate.depth(rows=2, room=6) == 1  # 2 rows x 2 positions fill the product
    assert rate.depth(rows=4, room=6) == 0
    for _ in range(60):
        rate.update(1, 0)
    assert rate.p < 0.05
    depths = [rate.depth(rows=1, room=6) for _ in range(64)]
    assert depths.count(1) == 2 and depths.count(0) == 62  # retried now and then
