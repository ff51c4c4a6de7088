"""The draft_model loop and the vocabulary map as plain functions, with no model."""

from __future__ import annotations

import numpy as np
import torch

from draftwise_draft_model.proposer import draft_autoregressive
from draftwise_draft_model.vocab import build_vocab_map, first_token_fallback


class CountingStep:
    """A fake draft forward: logits favour (last fed token + 1); records every call."""

    def __init__(self, vocab: int = 50) -> None:
        self.vocab = vocab
        self.calls: list[tuple[list[list[int]], list[int], list[int]]] = []

    def __call__(self, ids, pos, live):
        self.calls.append((ids, pos, live))
        logits = torch.zeros(len(ids), self.vocab)
        for j, row in enumerate(ids):
            logits[j, (row[-1] + 1) % self.vocab] = 1.0
        return logits


def argmax(logits, live):
    return logits.argmax(-1).tolist()


def test_one_forward_per_depth_over_every_row() -> None:
    step = CountingStep()
    first = [[1, 2, 3], [7], [20, 21]]
    drafts = draft_autoregressive(first, [0, 9, 4], [3, 1, 2], step, argmax)
    assert drafts == [[4, 5, 6], [8], [22, 23]]
    assert len(step.calls) == 3  # depth 0, 1, 2: not one forward per row
    (ids0, pos0, live0), (ids1, pos1, live1), (ids2, pos2, live2) = step.calls
    assert ids0 == first and pos0 == [0, 9, 4] and live0 == [0, 1, 2]
    # depth 1 feeds draft 1 right after each row's fed tokens
    assert ids1 == [[4], [22]] and pos1 == [3, 6] and live1 == [0, 2]
    assert ids2 == [[5]] and pos2 == [4] and live2 == [0]


def test_rows_that_want_nothing_cost_nothing() -> None:
    step = CountingStep()
    assert draft_autoregressive([[1], [2]], [0, 0], [0, 0], step, argmax) == [[], []]
    assert step.calls == []


def test_vocab_map_shares_strings_and_maps_both_ways() -> None:
    target = {"a": 0, "b": 1, "c": 2, "only-target": 3}
    draft = {"c": 0, "a": 1, "only-draft": 2, "b": 4}
    m = build_vocab_map(target, draft, target_size=5, draft_size=6)
    assert m.num_shared == 3
    assert m.shared.tolist() == [True, True, False, False, True, False]
    assert m.to_target(torch.tensor([0, 1, 4])).tolist() == [2, 0, 1]
    assert m.to_draft(np.array([0, 1, 2])).tolist() == [1, 4, 0]
    logits = torch.zeros(2, 6)
    m.mask_(logits)
    assert torch.isinf(logits[:, [2, 3, 5]]).all() and (logits[:, [0, 1, 4]] == 0).all()
    # target ids with no twin: id 3 ("only-target") and the padding id 4 go to draft id 0
    assert m.to_draft(np.array([3, 4])).tolist() == [0, 0]


def test_fallback_feeds_the_first_draft_token_of_the_same_text() -> None:
    target = {"ab": 0, "a": 1}
    draft = {"a": 0, "b": 1}
    texts = {0: "ab", 1: "a"}
    pieces = {"ab": [0, 1], "a": [0], "": []}
    fb = first_token_fallback(
        lambda ids: [texts.get(i, "") for i in ids], lambda ts: [pieces[t] for t in ts]
    )
    m = build_vocab_map(target, draft, target_size=3, draft_size=2, fallback=fb)
    assert m.to_draft(np.array([0, 1, 2])).tolist() == [0, 0, 0]  # "ab" -> "a"; empty -> 0
    assert m.num_shared == 1


def test_a_row_more_stops_keeps_its_drafts_and_costs_no_further_forward() -> None:
    step = CountingStep()
    asked: list[list[int]] = []

    def more(logits, rows):
        asked.append(list(rows))
        assert logits.shape[0] == len(rows)
        return [r != 1 for r in rows]  # row 1 stops after its first draft

    drafts = draft_autoregressive([[1], [7], [20]], [0, 0, 0], [3, 3, 1], step, argmax, more)
    assert drafts == [[2, 3, 4], [8], [21]]
    assert [live for _, _, live in step.calls] == [[0, 1, 2], [0], [0]]
    # asked only about rows that may go deeper (row 2 wants 1; none at the last depth)
    assert asked == [[0, 1], [0]]


def test_draft_confidence_is_the_softmax_maximum() -> None:
    from draftwise_draft_model.proposer import draft_confidence

    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, float("-inf"), 0.0]])
    conf = draft_confidence(logits)
    assert torch.allclose(conf, torch.tensor([0.25, 1 / (1 + 2 * float(np.exp(-10)))]))
