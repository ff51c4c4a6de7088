"""MTP with the logits-processing parameters: greedy spec-on == spec-off on the tiny hybrid.

The tiny head is random, so its drafts are rejected: this covers the first verified
position and the GDN rollback with each parameter active. Accepted drafts inside a block
on the hybrid target are covered by ``tests/core/test_sampling_under_speculation.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]
PARAMS: dict[str, dict[str, Any]] = {
    "presence_penalty": {"presence_penalty": 1.0},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "logit_bias": {"logit_bias": {42: 3.0, 7: 2.0}},
    "allowed_token_ids": {"allowed_token_ids": tuple(range(0, 256, 3))},
    "mix": {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repetition_penalty": 1.1,
            "logit_bias": {3: 1.5}, "min_tokens": 4},
}


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(tmp_path_factory.mktemp("hybrid-mtp-params"), "qwen3_5")


def tokens(path: Path, config: dict | None, extra: dict[str, Any]) -> tuple[list[int], LLM]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **extra)
    llm = LLM(model=str(path), dtype="bfloat16", speculative_config=config)
    out = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert llm.engine.kv.num_used_blocks == 0
    return out.outputs[0].token_ids, llm


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("name", list(PARAMS))
def test_greedy_with_the_parameter_is_identical_to_spec_off(
    hybrid_dir: Path, name: str, k: int
) -> None:
    off, _ = tokens(hybrid_dir, None, PARAMS[name])
    plain, _ = tokens(hybrid_dir, None, {})
    assert off != plain, "the parameter must change the output, or the test cannot fail"
    on, llm = tokens(hybrid_dir, {"method": "mtp", "num_speculative_tokens": k}, PARAMS[name])
    assert on == off
    # the tiny head is random: its drafts are rejected, so this covers position 0 and the
    # recurrent rollback; accepted drafts under a hybrid target: the core oracle test
    assert llm.engine.spec.metrics.num_draft_tokens > 0
