"""dflash with structured output: greedy spec-on == spec-off with a grammar active.

The tiny target's tokens are words (token ``i >= 11`` is the text ``w<i>``), so a regex
that is an alternation of token texts is (nearly) a per-position token mask. The grammar
(``spec_features.WORD_GRAMMAR``) bans two tokens of the greedy continuations (their 9th
and 10th), so the output changes there while the trained drafter's drafts before it are
accepted: the mask applies inside an accepted block, drafts the grammar refuses are cut,
and the matcher rolls back with rejected ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from spec_features import WORD_GRAMMAR, WORD_TEXTS, assert_grammar_identical, write_byte_level_words

from .conftest import TRAIN_PROMPTS


@pytest.fixture(scope="module")
def target(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target declaring an EOS (``[UNK]``, 511: what a finished grammar allows),
    its words as a byte-level BPE (what llguidance reads)."""
    path = tmp_path_factory.mktemp("df-so") / "target"
    shutil.copytree(target_dir, path)
    return write_byte_level_words(path, WORD_TEXTS, eos=511)


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("version", [1, 2])
def test_greedy_identical_with_grammar(target: Path, trained_dir: Path, trained2_dir: Path,
                                       version: int, k: int) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    assert_grammar_identical(target, {"method": "dflash", "model": str(drafter),
                                      "num_speculative_tokens": k},
                             TRAIN_PROMPTS[:2], WORD_GRAMMAR, max_num_seqs=2)
