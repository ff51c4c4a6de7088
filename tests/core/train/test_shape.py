"""The shape chooser (``draftwise.train.shape``): the cost model decides, not the paper."""

from __future__ import annotations

import numpy as np
from draftwise.train.shape import Candidate, choose, time_draft_step

TARGET = [0.005, 0.006, 0.007, 0.008, 0.009]  # T(1) .. T(5): a 1-token step, 1 + 4 drafts


def test_a_dear_draft_step_picks_the_cheaper_drafter() -> None:
    # the full vocabulary covers every label, the reduced one 97%; when the draft step
    # is dear (the full head dominating it) the cheaper, smaller drafter wins
    small = Candidate(1, 4096, 4, draft_seconds=0.002, coverage=0.97)
    full = Candidate(1, 49152, 4, draft_seconds=0.010, coverage=1.0)
    assert choose([full, small], TARGET) is small
    assert small.break_even(TARGET) < full.break_even(TARGET)


def test_a_cheap_draft_step_picks_the_better_covering_drafter() -> None:
    # the same pair when drafting is nearly free: coverage decides
    small = Candidate(1, 4096, 4, draft_seconds=0.0001, coverage=0.80)
    full = Candidate(1, 49152, 4, draft_seconds=0.0002, coverage=1.0)
    assert choose([small, full], TARGET) is full


def test_ties_go_to_the_cheaper_step() -> None:
    one = Candidate(1, 4096, 4, draft_seconds=0.002, coverage=1.0)
    two = Candidate(2, 4096, 4, draft_seconds=0.002 + 1e-12, coverage=1.0)
    assert choose([two, one], TARGET) is one


def test_break_even_and_prediction_follow_their_formulas() -> None:
    c = Candidate(1, 4096, 4, draft_seconds=0.004, coverage=0.5)
    assert np.isclose(c.break_even(TARGET), (0.009 + 0.004) / 0.005)
    p = 0.42 * 0.5
    assert np.isclose(c.predicted_tau(), 1 + p + p**2 + p**3 + p**4)
    assert "break-even acceptance 2.60" in c.describe(TARGET)


def test_a_bigger_head_times_dearer() -> None:
    args = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128,
            "taps": 2, "layers": 1, "block_size": 4, "markov_rank": 16, "repeats": 5}
    small = time_draft_step(draft_vocab=256, **args)
    big = time_draft_step(draft_vocab=65536, **args)
    assert 0 < small < big
