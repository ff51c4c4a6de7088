"""The doctor's offline walk equals what online greedy n-gram speculation measures."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny
from spec_sampling import fixed_depth

from draftwise import LLM, SamplingParams
from draftwise import doctor as dr

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
PROMPTS = [[5, 9, 13, 2, 7] * 4, list(range(20, 40)) * 2, [42] * 11, [7, 8, 9] * 5,
           [(i * 37) % 500 + 3 for i in range(23)]]
MAX_TOKENS = 30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("doctor-llama"), seed=3)


@pytest.mark.parametrize("k", [1, 3])
def test_offline_acceptance_equals_online(tiny: Path, k: int) -> None:
    # fixed depth online: the offline walk drafts k every step, as vLLM does
    online = LLM(model=str(tiny), dtype="bfloat16", max_num_seqs=1,
                 speculative_config=fixed_depth({**NGRAM, "num_speculative_tokens": k}))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = [online.generate({"prompt_token_ids": p}, params)[0] for p in PROMPTS]
    measured = online.engine.spec.metrics

    offline = LLM(model=str(tiny), dtype="bfloat16", max_num_seqs=1, speculative_config=NGRAM)
    engine = offline.engine
    conts = dr.greedy_continuations(engine, PROMPTS, MAX_TOKENS, ignore_eos=True)
    assert conts == [o.outputs[0].token_ids for o in outs]  # speculation off is plain
    walk = dr.simulate_walk(engine.spec, PROMPTS, conts, MAX_TOKENS, k, engine.max_model_len)
    got = walk.stats.summary()
    want = measured.summary()
    assert measured.num_accepted_tokens > 0
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert got[key] == want[key], key
    assert got["num_accepted_tokens_per_pos"][:k] == want["num_accepted_tokens_per_pos"]
    assert engine.spec.metrics.num_drafts == 0  # the walk verified nothing online


def test_model_based_drafters_are_refused_by_name(tiny: Path) -> None:
    llm = LLM(model=str(tiny), dtype="bfloat16", max_num_seqs=1, speculative_config={
        "method": "draft_model", "model": str(tiny), "num_speculative_tokens": 2})
    with pytest.raises(dr.DoctorError, match="method 'draft_model'"):
        dr.check_walkable(llm.engine.spec)
    findings = dr.pairing_checks(llm.engine)
    assert {(f.check, f.status) for f in findings} >= {("vocab_size", "ok"), ("context", "ok")}


def test_recommendation() -> None:
    rec = dr.recommend({"method": "ngram", "num_speculative_tokens": 4}, {1: 1.2, 2: 1.4}, {2})
    assert rec["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2}
    rec = dr.recommend({"method": "ngram"}, {1: 1.1, 2: 1.05}, {0, 1})
    assert rec["speculative_config"]["draftwise"] == {"adaptive": True}
    assert dr.recommend({"method": "ngram"}, {1: 0.9}, {0})["speculative_config"] is None
