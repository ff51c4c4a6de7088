"""MTP with every sampling feature: greedy spec-on == spec-off on the tiny hybrid.

The tiny head is random, so under most settings its drafts are rejected: the parameter
table covers the first verified position and the GDN rollback with each parameter
active. Under :data:`FORCED` (three allowed tokens, each penalised once used) the head's
processed drafts are often what the target must say, so drafts are accepted: logprobs,
stops inside an accepted block and seeded ``n > 1`` run there
(``tests/spec_features.py``'s checks, which assert acceptance).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from spec_sampling import fixed_depth
from draftwise import LLM, SamplingParams
from spec_features import (
    STOP_KINDS,
    assert_logprobs_match,
    assert_seeded_samples,
    assert_stop_inside_accepted_block,
)
from tiny_checkpoints import write_wordlevel_tokenizer

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]
PARAMS: dict[str, dict[str, Any]] = {
    "presence_penalty": {"presence_penalty": 1.0},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "logit_bias": {"logit_bias": {42: 3.0, 7: 2.0}},
    "allowed_token_ids": {"allowed_token_ids": tuple(range(0, 256, 3))},
    # the greedy output's 3rd token, and its 8th after the 7th
    "bad_words": {"bad_words": ("w164", "w45 w189")},
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
    path = mod.build(tmp_path_factory.mktemp("hybrid-mtp-params"), "qwen3_5")
    return write_wordlevel_tokenizer(path, [f"w{i}" for i in range(255)] + ["[UNK]"])


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
    on, llm = tokens(hybrid_dir, fixed_depth({"method": "mtp", "num_speculative_tokens": k}),
                     PARAMS[name])
    assert on == off
    # the tiny head is random: its drafts are rejected, so this covers position 0 and the
    # recurrent rollback; accepted drafts under a hybrid target: the core oracle test
    assert llm.engine.spec.metrics.num_draft_tokens > 0


#: three allowed tokens, each penalised once used: what the target says next is often
#: forced, and the head drafts with the same processing, so its drafts are accepted
FORCED: dict[str, Any] = {"allowed_token_ids": (7, 9, 11), "frequency_penalty": 2.0,
                          "presence_penalty": 2.0}
#: a prompt whose first decode step accepts two drafts under FORCED (a new token inside)
STOP_PROMPT = [216, 98, 194, 227, 107, 10, 66, 247, 130, 124]
MTP3 = {"method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_equal_spec_off(hybrid_dir: Path, mode: str) -> None:
    assert_logprobs_match(hybrid_dir, MTP3, [PROMPT, STOP_PROMPT], mode, extra=FORCED)


@pytest.mark.parametrize("kind", STOP_KINDS)
def test_a_stop_inside_an_accepted_block_truncates_there(
    hybrid_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_stop_inside_accepted_block(hybrid_dir, MTP3, STOP_PROMPT, kind, monkeypatch, **FORCED)


def test_seeded_samples_are_reproducible(hybrid_dir: Path) -> None:
    assert_seeded_samples(hybrid_dir, MTP3, STOP_PROMPT, **FORCED)
