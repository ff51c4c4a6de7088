"""DFlash's objective on plain tensors: anchors, blocks, labels, weights."""

from __future__ import annotations

import math

import torch
from draftwise.train.acceptance import spread_anchors
from draftwise.train.dflash_objective import (
    block_inputs,
    default_gamma,
    position_weights,
    sample_anchors,
    weighted_ce_sum,
)


def test_anchors_are_distinct_sorted_response_positions_with_a_next_token() -> None:
    gen = torch.Generator().manual_seed(0)
    a = sample_anchors(20, 6, 100, gen)
    assert a.tolist() == list(range(6, 19))  # all candidates when asked for more
    b = sample_anchors(200, 50, 16, torch.Generator().manual_seed(1))
    assert len(set(b.tolist())) == 16 and b.tolist() == sorted(b.tolist())
    assert min(b.tolist()) >= 50 and max(b.tolist()) <= 198
    again = sample_anchors(200, 50, 16, torch.Generator().manual_seed(1))
    assert torch.equal(b, again)
    assert sample_anchors(7, 6, 4, gen).numel() == 0  # the response's only token: no label


def test_blocks_labels_and_validity() -> None:
    ids = torch.arange(100, 110)
    blocks, labels, valid = block_inputs(ids, torch.tensor([2, 8]), 4, mask_token_id=7)
    assert blocks.tolist() == [[102, 7, 7, 7], [108, 7, 7, 7]]
    assert labels[0].tolist() == [103, 104, 105]
    assert valid.tolist() == [[True, True, True], [True, False, False]]  # past the end


def test_published_gammas_and_weights() -> None:
    assert (default_gamma(16), default_gamma(8), default_gamma(10), default_gamma(4)) == (
        7.0, 4.0, 5.0, 2.0)
    w = position_weights(8, 4.0)
    assert w[0] == 1.0 and math.isclose(float(w[6]), math.exp(-6 / 4), rel_tol=1e-6)


def test_invalid_labels_do_not_count() -> None:
    logits = torch.zeros(1, 3, 5)
    labels = torch.tensor([[1, 2, 3]])
    full, _ = weighted_ce_sum(logits, labels, torch.tensor([[True, True, True]]),
                              torch.ones(3))
    part, _ = weighted_ce_sum(logits, labels, torch.tensor([[True, False, False]]),
                              torch.ones(3))
    assert math.isclose(float(full), 3 * math.log(5), rel_tol=1e-6)
    assert math.isclose(float(part), math.log(5), rel_tol=1e-6)


def test_held_out_anchors_keep_the_whole_block_inside() -> None:
    a = spread_anchors(30, 10, 8, 5)
    assert a.min() >= 10 and a.max() + 8 - 2 <= 29 and len(a) == 5
    assert len(spread_anchors(12, 10, 8, 5)) == 0
