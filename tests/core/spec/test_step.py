"""The step's typed records: cutting drafts keeps every per-row field in step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.spec.step import StepDrafts


def drafts() -> StepDrafts:
    ids = np.array([10, 11, 12, 20, 21], dtype=np.int64)
    q = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
    return StepDrafts(ids, [3, 0, 2], [0, None, 1], q, [{}, {}, {0: 7}], [4, None, 1])


def test_cut_keeps_each_rows_prefix_and_its_q() -> None:
    d = drafts()
    out = d.cut([1, 0, 2])
    assert out.num_draft_tokens == [1, 0, 2] and out.token_ids.tolist() == [10, 20, 21]
    assert out.draft_probs is not None and out.draft_probs.tolist() == d.draft_probs[[0, 3, 4]].tolist()
    assert out.owner == d.owner and out.evidence == d.evidence and out.kv_valid == d.kv_valid
    assert [r.tolist() for r in out.rows()] == [[10], [], [20, 21]]


def test_cut_to_nothing_and_to_everything() -> None:
    d = drafts()
    assert d.cut([3, 0, 2]) is d
    out = d.cut([0, 0, 0])
    assert out.token_ids.shape == (0,) and out.draft_probs.shape == (0, 3)


def test_cut_never_lengthens() -> None:
    with pytest.raises(ValueError, match="cannot cut"):
        drafts().cut([4, 0, 2])


@pytest.mark.parametrize("keep", [[1, 0], [1, 0, 2, 0]])
def test_cut_refuses_a_keep_list_of_another_length(keep: list[int]) -> None:
    """One count per row: a shorter list would drop the last rows' drafts silently (zip
    stops early) and leave the step with fewer rows than it schedules."""
    with pytest.raises(ValueError, match="one count per row"):
        drafts().cut(keep)


# -- what a cut dropped is still learned from: made_outcome -----------------------------


def one_hot_drafts(rows: list[list[int]]) -> StepDrafts:
    flat = np.array([t for r in rows for t in r], dtype=np.int64)
    n = len(rows)
    return StepDrafts(flat, [len(r) for r in rows], [0] * n, None, [{}] * n, [1] * n)


def test_an_uncut_row_is_known_as_far_as_verified() -> None:
    d = one_hot_drafts([[10, 11, 12]])
    assert d.made_outcome(0, 1, [10, 99]) == (3, 1, 3)
    assert d.made_outcome(0, 3, [10, 11, 12, 13]) == (3, 3, 3)


def test_the_first_dropped_draft_is_known_from_the_bonus_token() -> None:
    """Cut to 1 of 3 drafts: when the kept draft held, verify's next token is the target's
    own pick at the first dropped position, so that draft would have held iff it equals
    it; deeper dropped drafts stay unknown, and a rejected kept draft says nothing more."""
    cut = one_hot_drafts([[10, 11, 12]]).cut([1])
    assert cut.num_made == [3] and cut.first_dropped == [11]
    assert cut.made_outcome(0, 1, [10, 11]) == (3, 2, 2)  # it would have held
    assert cut.made_outcome(0, 1, [10, 77]) == (3, 1, 2)  # it would have failed
    assert cut.made_outcome(0, 0, [55]) == (3, 0, 1)  # the kept one failed: no more known


def test_a_row_cut_to_nothing_learns_its_first_draft() -> None:
    cut = one_hot_drafts([[10, 11], [20]]).cut([0, 1])
    assert cut.made_outcome(0, 0, [10]) == (2, 1, 1)
    assert cut.made_outcome(0, 0, [12]) == (2, 0, 1)
    assert cut.made_outcome(1, 1, [20, 5]) == (1, 1, 1)  # not cut: verify's own outcome


def test_a_second_cut_drops_from_what_the_first_kept() -> None:
    """The grammar trims after adaptive depth's cut: the first dropped draft is then the
    refused one (which the target's pick can never equal)."""
    twice = one_hot_drafts([[10, 11, 12, 13]]).cut([3]).cut([1])
    assert twice.num_made == [4] and twice.first_dropped == [11]
    assert twice.cut([1]) is twice and one_hot_drafts([[10, 11]]).cut([2]).num_made == []


def test_a_sampled_row_is_not_learned_past_its_cut() -> None:
    """With q not one-hot a draft is accepted with probability min(1, p/q), not when it
    equals the target's pick: the bonus token tells nothing about it."""
    d = drafts()  # q rows are not one-hot
    cut = d.cut([1, 0, 1])
    assert cut.first_dropped == [None, None, None]
    assert cut.made_outcome(0, 1, [10, 11]) == (3, 1, 1)
