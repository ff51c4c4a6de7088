"""dspark with structured output: greedy spec-on == spec-off with a regex grammar active.

The grammar (``spec_features.WORD_GRAMMAR``) bans two tokens of the greedy continuations,
so the output changes there while the trained drafter's blocks before it are accepted:
the mask applies inside accepted blocks and the matcher rolls back with rejected drafts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from spec_features import WORD_GRAMMAR, WORD_TEXTS, assert_grammar_identical, write_byte_level_words

from .conftest import TRAIN_PROMPTS


@pytest.fixture(scope="module")
def target(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with EOS ``[UNK]`` (511) and its words as a byte-level BPE."""
    path = tmp_path_factory.mktemp("ds-so") / "target"
    shutil.copytree(target_dir, path)
    return write_byte_level_words(path, WORD_TEXTS, eos=511)


def test_greedy_identical_with_grammar(target: Path, trained_dir: Path) -> None:
    assert_grammar_identical(target, {"method": "dspark", "model": str(trained_dir),
                                      "num_speculative_tokens": 7},
                             TRAIN_PROMPTS[:2], WORD_GRAMMAR, max_num_seqs=2)
