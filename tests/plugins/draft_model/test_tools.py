"""Forced tool calls under draft_model (and n-gram) speculation: greedy spec-on == off.

The tiny llama gets a byte-level tokenizer and Qwen2.5-Instruct's own chat template
(``spec_features.make_tools_target``), so the server's tool plan applies: the call
grammar (one or more calls, or exactly one) is the request's constraint, its mask
applies at every verified position, and the parsed calls are the same with speculation
on as off. draft_model drafts without the grammar's mask and a call's bytes are mostly
forced, so the grammar cuts its drafts before the forward (exact, no gain); n-gram drafts
copied from the template's format instructions are accepted on the same requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_features import TOOL_CHOICES, assert_forced_calls_identical, make_tools_target
from tiny_checkpoints import perturbed_copy


@pytest.fixture(scope="module")
def tools_target(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tools_target(target_dir, tmp_path_factory.mktemp("dm-tools") / "target")


@pytest.fixture(scope="module")
def tools_draft(tools_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(tools_target, tmp_path_factory.mktemp("dm-tools") / "draft",
                          scale=0.015)


@pytest.mark.parametrize(("choice", "one"), TOOL_CHOICES)
@pytest.mark.parametrize("k", [2, 4])
def test_forced_calls_are_identical_to_spec_off(tools_target: Path, tools_draft: Path,
                                                choice: dict[str, Any], one: bool,
                                                k: int) -> None:
    assert_forced_calls_identical(
        tools_target, {"method": "draft_model", "model": str(tools_draft),
                       "num_speculative_tokens": k}, choice, one)
    assert_forced_calls_identical(
        tools_target, {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
                       "prompt_lookup_max": 4}, choice, one, accepted=True)
