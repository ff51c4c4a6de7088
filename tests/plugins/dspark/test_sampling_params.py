"""dspark with every sampling feature: greedy spec-on == spec-off, drafts accepted.

The trained drafter (``conftest.train_dspark``) gets drafts accepted on its training
prompts, so each parameter applies at positions inside accepted blocks; every check
asserts acceptance, so none passes with all drafts rejected. The checks themselves are
``tests/spec_features.py``'s, shared by every method's column of the feature matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_features import (
    STOP_KINDS,
    WORD_PARAMS,
    assert_identical,
    assert_logprobs_match,
    assert_seeded_samples,
    assert_stop_inside_accepted_block,
)

from .conftest import TRAIN_PROMPTS

PROMPTS = TRAIN_PROMPTS[:2]


def spec(drafter: Path, k: int) -> dict[str, Any]:
    return {"method": "dspark", "model": str(drafter), "num_speculative_tokens": k}


@pytest.mark.parametrize("k", [7])  # dspark drafts whole blocks: k >= the block size (7)
@pytest.mark.parametrize("name", list(WORD_PARAMS))
def test_greedy_with_the_parameter_is_identical_to_spec_off(
    target_dir: Path, trained_dir: Path, name: str, k: int
) -> None:
    assert_identical(target_dir, spec(trained_dir, k), PROMPTS, WORD_PARAMS[name],
                     changes=name != "min_tokens", max_num_seqs=2)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_equal_spec_off(target_dir: Path, trained_dir: Path, mode: str) -> None:
    assert_logprobs_match(target_dir, spec(trained_dir, 7), PROMPTS, mode, max_num_seqs=2)


@pytest.mark.parametrize("kind", STOP_KINDS)
def test_a_stop_inside_an_accepted_block_truncates_there(
    target_dir: Path, trained_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_stop_inside_accepted_block(target_dir, spec(trained_dir, 7), PROMPTS[0], kind,
                                      monkeypatch)


def test_seeded_samples_are_reproducible(target_dir: Path, trained_dir: Path) -> None:
    assert_seeded_samples(target_dir, spec(trained_dir, 7), PROMPTS[0], presence_penalty=0.5)
