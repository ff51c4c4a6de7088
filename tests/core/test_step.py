"""The step's typed records: cutting drafts keeps every per-row field in step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.step import StepDrafts


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
