"""prompt_logprobs: the target's log-probabilities of the prompt's own tokens.

Equal to transformers' one full forward (``log_softmax`` at position ``t - 1`` for token
``t``; token 0 has none) on the tiny llama in float32, whether the prefill is one chunk
or many, with speculation on or off, and when the prompt's prefix is in the prefix cache
(the hit is not taken for positions still to record, as vLLM does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spec_sampling import fixed_depth
from draftwise import LLM, SamplingParams
from tiny_checkpoints import save_tiny

PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 9, 10, 11, 3, 4, 5, 6, 20, 21, 22, 23, 3, 4, 5, 6, 7, 8,
          9, 40, 41, 42, 43, 3, 4, 5, 6, 50, 51, 52]  # 37 tokens: more than two blocks of 16
TOP = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("plp"), seed=5, std=0.25)


@pytest.fixture(scope="module")
def want(tiny: Path) -> torch.Tensor:  # [len(PROMPT) - 1, V] transformers' log-probs
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    return logits[:-1].log_softmax(-1)


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 6, "ignore_eos": True,
                             "prompt_logprobs": TOP, **kw})


def check(entries: list, want: torch.Tensor) -> None:
    assert len(entries) == len(PROMPT) and entries[0] is None
    for t, entry in enumerate(entries[1:], start=1):
        row = want[t - 1]
        tok = PROMPT[t]
        assert next(iter(entry)) == tok
        assert entry[tok].logprob == pytest.approx(float(row[tok]), abs=1e-4)
        assert entry[tok].rank == int((row > row[tok]).sum()) + 1
        top = row.topk(TOP).indices.tolist()
        assert set(top) <= set(entry) and len(entry) in (TOP, TOP + 1)
        for r, i in enumerate(top, start=1):
            assert entry[i].rank == r


NGRAM = fixed_depth({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 3})


@pytest.mark.parametrize("budget", [None, 8, 5])
@pytest.mark.parametrize("config", [None, NGRAM], ids=["off", "ngram"])
def test_equal_to_one_full_forward(tiny: Path, want, budget: int | None,
                                   config: dict | None) -> None:
    kw = {} if budget is None else {"max_num_batched_tokens": budget}
    llm = LLM(model=str(tiny), dtype="float32", speculative_config=config, **kw)
    plain = llm.generate({"prompt_token_ids": PROMPT},
                         SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    out = llm.generate({"prompt_token_ids": PROMPT}, params())[0]
    check(out.prompt_logprobs, want)
    # the generated tokens are unchanged by asking for the prompt's
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert plain.prompt_logprobs is None
    if config is not None:
        assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.kv.num_used_blocks == 0


def test_a_cached_prefix_is_computed_again(tiny: Path, want) -> None:
    llm = LLM(model=str(tiny), dtype="float32")
    llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=4))
    warm = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=4))[0]
    assert warm.num_cached_tokens == 32, "the prompt's two full blocks must be cached"
    out = llm.generate({"prompt_token_ids": PROMPT}, params())[0]
    assert out.num_cached_tokens == 0
    check(out.prompt_logprobs, want)


def test_only_the_finished_prefill_reports_them_and_n_samples_share_them(tiny: Path,
                                                                          want) -> None:
    llm = LLM(model=str(tiny), dtype="float32", max_num_batched_tokens=8)
    engine = llm.engine
    engine.add_request({"prompt_token_ids": PROMPT}, params(), request_id="r")
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.prompt_logprobs for o in engine.step()]
    assert seen and all(s is not None for s in seen)  # outputs start with the first token
    check(seen[-1], want)
    out = llm.generate({"prompt_token_ids": PROMPT}, params(n=2, temperature=1.0, seed=1))[0]
    check(out.prompt_logprobs, want)


def test_preemption_records_nothing_twice(tiny: Path, want) -> None:
    """Requests preempted (and recomputed) mid-run keep one entry per prompt token."""
    llm = LLM(model=str(tiny), dtype="float32", block_size=4, num_kv_blocks=24,
              max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16)
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * 4, params(max_tokens=12))
    assert llm.engine.stats.num_preemptions > 0, "the test must force a preemption"
    for out in outs:
        check(out.prompt_logprobs, want)
    assert llm.engine.kv.num_used_blocks == 0
