"""Forced tool calls under dspark speculation: greedy spec-on == spec-off.

The tiny target with a byte-level tokenizer and Qwen2.5's template
(``spec_features.make_tools_target``); the trained drafter drafts without the call
grammar's mask and a call's bytes are mostly forced, so the grammar cuts its drafts
before the forward: exact, no gain (the structured-output test has its drafts accepted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_features import TOOL_CHOICES, assert_forced_calls_identical, make_tools_target


@pytest.fixture(scope="module")
def tools_target(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tools_target(target_dir, tmp_path_factory.mktemp("dspark-tools") / "target")


@pytest.mark.parametrize(("choice", "one"), TOOL_CHOICES)
def test_forced_calls_are_identical_to_spec_off(tools_target: Path, trained_dir: Path,
                                                choice: dict[str, Any], one: bool) -> None:
    assert_forced_calls_identical(
        tools_target, {"method": "dspark", "model": str(trained_dir),
                       "num_speculative_tokens": 7}, choice, one)
