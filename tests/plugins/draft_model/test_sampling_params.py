"""draft_model with every logits-processing parameter: greedy spec-on == spec-off.

The jittered draft agrees with the target often, so accepted drafts sit inside verified
blocks, where each position's penalties and masks must see the drafts before it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM, SamplingParams
from spec_features import (
    STOP_KINDS,
    assert_logprobs_match,
    assert_seeded_samples,
    assert_stop_inside_accepted_block,
)
from spec_sampling import fixed_depth
from stats import CHI2_9999, chi2_two_sample, pool_rare

PROMPTS = [[7, 3, 11, 5, 2, 9], [(i * 37) % 500 + 3 for i in range(23)]]

PARAMS: dict[str, dict[str, Any]] = {
    "presence_penalty": {"presence_penalty": 1.5},
    "frequency_penalty": {"frequency_penalty": 1.0},
    "repetition_penalty": {"repetition_penalty": 1.5},
    "logit_bias": {"logit_bias": {17: 4.0, 40: 3.0}},
    "allowed_token_ids": {"allowed_token_ids": tuple(range(3, 300, 2))},
    "bad_words": {"bad_words": ("w344", "w459 w415", "w225")},
    "min_tokens": {"min_tokens": 15, "ignore_eos": False, "stop_token_ids": (432, 225)},
    "mix": {"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
            "logit_bias": {5: 1.0}, "min_tokens": 3},
}


def tokens(target: Path, config: dict | None, extra: dict[str, Any]) -> tuple[list, LLM]:
    params = SamplingParams(temperature=0.0, max_tokens=20, **{"ignore_eos": True, **extra})
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert llm.engine.kv.num_used_blocks == 0
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", list(PARAMS))
def test_greedy_with_the_parameter_is_identical_to_spec_off(
    target_dir: Path, draft_dir: Path, name: str, k: int
) -> None:
    off, _ = tokens(target_dir, None, PARAMS[name])
    plain, _ = tokens(target_dir, None, {})
    assert off != plain, "the parameter must change the output, or the test cannot fail"
    # fixed depth: drafts must be made and both accepted and rejected (adaptive depth
    # may price a draft out on a loaded machine, and then the check below cannot hold)
    config = fixed_depth({"method": "draft_model", "model": str(draft_dir),
                          "num_speculative_tokens": k})
    on, llm = tokens(target_dir, config, PARAMS[name])
    assert on == off
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens


def test_drafts_follow_the_requests_processing(
    target_dir: Path, draft_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft applies the penalties and bias too, so more of its drafts are accepted."""
    import draftwise_draft_model.proposer as proposer_mod

    extra = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "logit_bias": {17: 4.0}}
    # fixed depth: two acceptance rates are compared, each over k-deep drafts every step
    config = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 4,
              "draftwise": {"adaptive": False}}
    off, _ = tokens(target_dir, None, extra)
    on, llm = tokens(target_dir, config, extra)
    assert on == off
    rate = llm.engine.spec.metrics.num_accepted_tokens / llm.engine.spec.metrics.num_draft_tokens
    real = proposer_mod.pick_draft_tokens
    monkeypatch.setattr(proposer_mod, "pick_draft_tokens",
                        lambda logits, p, g, prob, histories=None: real(logits, p, g, prob))
    blind, llm = tokens(target_dir, config, extra)
    assert blind == off  # still exact: drafts only propose
    blind_rate = (llm.engine.spec.metrics.num_accepted_tokens
                  / llm.engine.spec.metrics.num_draft_tokens)
    assert rate > blind_rate + 0.1, (rate, blind_rate)


def draft_spec(draft_dir: Path, k: int) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k}


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("k", [2, 4])
def test_logprobs_equal_spec_off(target_dir: Path, draft_dir: Path, mode: str, k: int) -> None:
    assert_logprobs_match(target_dir, draft_spec(draft_dir, k), PROMPTS, mode)


@pytest.mark.parametrize("kind", STOP_KINDS)
def test_a_stop_inside_an_accepted_block_truncates_there(
    target_dir: Path, draft_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_stop_inside_accepted_block(target_dir, draft_spec(draft_dir, 4), PROMPTS[0], kind,
                                      monkeypatch)


def test_seeded_samples_are_reproducible(target_dir: Path, draft_dir: Path) -> None:
    assert_seeded_samples(target_dir, draft_spec(draft_dir, 4), PROMPTS[1],
                          frequency_penalty=0.5)


N = 2500


def sample_pairs(target: Path, config: dict | None, seed: int) -> Counter:
    """Counts of (token 2, token 3), at fixed depth: the step verifying two drafts makes both."""
    if config is not None:
        config = fixed_depth(config)
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, max_num_seqs=256)
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=4, seed=seed * 100_000 + i,
                             ignore_eos=True, presence_penalty=1.0, frequency_penalty=0.5,
                             logit_bias={17: 1.5})
              for i in range(N)]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[0]}] * N, params)
    if config is not None:
        m = llm.engine.spec.metrics
        assert m.num_draft_tokens >= 2 * N and 0 < m.num_accepted_tokens < m.num_draft_tokens
    return Counter(tuple(o.outputs[0].token_ids[1:3]) for o in outs)


@pytest.mark.parametrize("rejection_sample_method", ["standard", "block"])
def test_sampled_penalties_with_the_drafts_q_match_spec_off(
    target_dir: Path, draft_dir: Path, rejection_sample_method: str
) -> None:
    """Probabilistic drafting under the request's penalties: q is the processed draft."""
    off = sample_pairs(target_dir, None, seed=1)
    config = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 2,
              "draft_sample_method": "probabilistic",
              "rejection_sample_method": rejection_sample_method}
    on = sample_pairs(target_dir, config, seed=2)
    stat, dof = chi2_two_sample(*pool_rare(off, on))
    assert stat < CHI2_9999[dof], (stat, dof)
