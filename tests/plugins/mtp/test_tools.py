"""Forced tool calls under MTP speculation: greedy spec-on == spec-off, on the tiny hybrid.

The hybrid with 512 tokens (room for the byte-level vocabulary a call's text needs),
Qwen2.5's template (``spec_features.make_tools_target``) and its random MTP head: the head
drafts without the call grammar's mask and a call's bytes are mostly forced, so the
grammar cuts its drafts before the forward and rolls back with rejected ones; exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_features import TOOL_CHOICES, assert_forced_calls_identical, make_tools_target
from tiny_checkpoints import save_tiny_hybrid


@pytest.fixture(scope="module")
def tools_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = save_tiny_hybrid(tmp_path_factory.mktemp("mtp-512") / "h", vocab_size=512)
    return make_tools_target(base, tmp_path_factory.mktemp("mtp-tools") / "target")


@pytest.mark.parametrize(("choice", "one"), TOOL_CHOICES)
def test_forced_calls_are_identical_to_spec_off(tools_target: Path, choice: dict[str, Any],
                                                one: bool) -> None:
    assert_forced_calls_identical(tools_target, {"method": "mtp", "num_speculative_tokens": 3},
                                  choice, one)
