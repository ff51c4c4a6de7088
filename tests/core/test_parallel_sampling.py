"""n > 1: independent samples sharing the prompt's cached K/V, reproducible with a seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from spec_sampling import fixed_depth
from draftwise import LLM, SamplingParams
from tiny_checkpoints import save_tiny

PROMPT = [(i * 37) % 500 + 3 for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("parallel-llama"), seed=5, std=0.25)


def sampled(n: int, seed: int | None, **kw) -> SamplingParams:
    return SamplingParams(n=n, seed=seed, temperature=1.0, max_tokens=10, ignore_eos=True, **kw)


def generate(tiny: Path, params: SamplingParams, **engine_kw):
    llm = LLM(model=str(tiny), dtype="bfloat16", block_size=16, **engine_kw)
    out = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert llm.engine.kv.num_used_blocks == 0
    assert llm.engine.num_unfinished_requests == 0 and not llm.engine._parents
    return out, llm


def test_seeded_samples_are_reproducible_and_equal_single_requests(tiny: Path) -> None:
    out, _ = generate(tiny, sampled(4, seed=123))
    again, _ = generate(tiny, sampled(4, seed=123))
    toks = [c.token_ids for c in out.outputs]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert toks == [c.token_ids for c in again.outputs]
    assert len({tuple(t) for t in toks}) > 1, "the samples must be independent"
    # sample i is the request with seed + i (vLLM's rule)
    for i, t in enumerate(toks):
        alone, _ = generate(tiny, sampled(1, seed=123 + i))
        assert alone.outputs[0].token_ids == t
    assert all(c.finish_reason == "length" for c in out.outputs)
    assert out.metrics["num_output_tokens"] == 40


def test_samples_share_the_prompts_cached_blocks(tiny: Path) -> None:
    out, _ = generate(tiny, sampled(3, seed=7))
    assert out.num_cached_tokens == 2 * 32, "samples 1 and 2 reuse the two full prompt blocks"
    off, _ = generate(tiny, sampled(3, seed=7), enable_prefix_caching=False)
    assert off.num_cached_tokens == 0
    assert [c.token_ids for c in off.outputs] == [c.token_ids for c in out.outputs]


def test_greedy_samples_under_speculation_equal_spec_off(tiny: Path) -> None:
    params = SamplingParams(n=3, temperature=0.0, max_tokens=12, ignore_eos=True,
                            frequency_penalty=-1.5)
    off, _ = generate(tiny, params)
    spec = fixed_depth({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                        "prompt_lookup_min": 1})
    on, llm = generate(tiny, params, speculative_config=spec)
    assert [c.token_ids for c in on.outputs] == [c.token_ids for c in off.outputs]
    assert len({tuple(c.token_ids) for c in on.outputs}) == 1  # greedy: n equal samples
    assert llm.engine.spec.metrics.num_draft_tokens > 0


def test_abort_stops_every_sample_and_frees_their_blocks(tiny: Path) -> None:
    llm = LLM(model=str(tiny), dtype="bfloat16", block_size=16)
    engine = llm.engine
    rid = engine.add_request({"prompt_token_ids": PROMPT}, sampled(3, seed=1))
    engine.step()
    engine.step()
    assert engine.num_unfinished_requests == 3
    assert engine.abort_request(rid)
    assert engine.num_unfinished_requests == 0 and engine.kv.num_used_blocks == 0
    assert not engine.abort_request(rid)


def test_one_output_per_step_for_the_parent(tiny: Path) -> None:
    llm = LLM(model=str(tiny), dtype="bfloat16", block_size=16)
    engine = llm.engine
    rid = engine.add_request({"prompt_token_ids": PROMPT}, sampled(3, seed=1))
    finals = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        assert [o.request_id for o in outs] == [rid] * len(outs) and len(outs) <= 1
        finals += sum(o.finished for o in outs)
    assert finals == 1
