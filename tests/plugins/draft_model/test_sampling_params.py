"""draft_model with every logits-processing parameter: greedy spec-on == spec-off.

The jittered draft agrees with the target often, so accepted drafts sit inside verified
blocks, where each position's penalties and masks must see the drafts before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftwise import LLM, SamplingParams

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
    config = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k}
    on, llm = tokens(target_dir, config, PARAMS[name])
    assert on == off
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
