"""dflash with every sampling feature: greedy spec-on == spec-off, drafts accepted.

The trained drafters (``conftest.train_drafter``) get drafts accepted, so each parameter
is applied at positions inside an accepted block (position ``j`` sees the drafts before
it). DFlash1 drafts with the request's processing (``row.history``); DFlash2's walk does
not (exact either way). ``test_processed_drafts_are_accepted_more`` is what the history
wiring buys. The feature checks are ``tests/spec_features.py``'s (one per matrix cell).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM
from spec_features import (
    STOP_KINDS,
    WORD_PARAMS,
    assert_identical,
    assert_logprobs_match,
    assert_seeded_samples,
    assert_stop_inside_accepted_block,
    generate,
    greedy,
    token_ids,
)
from spec_sampling import fixed_depth

from .conftest import TRAIN_PROMPTS

PROMPTS = TRAIN_PROMPTS[:2]
PARAMS = WORD_PARAMS


def spec(drafter: Path, k: int) -> dict[str, Any]:
    """Fixed depth: every check here needs k-deep drafts every step (adaptive depth parked
    every k = 7 row on a loaded 2-core machine: no draft at all, 11 tests vacuous)."""
    return fixed_depth({"method": "dflash", "model": str(drafter), "num_speculative_tokens": k})


def run(target: Path, config: dict | None, extra: dict[str, Any]) -> tuple[list, LLM]:
    return generate(target, config, PROMPTS, greedy(**extra), max_num_seqs=2)


@pytest.fixture(scope="module")
def plain(target_dir: Path) -> list[list[int]]:
    return token_ids(run(target_dir, None, {})[0])


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("name", list(PARAMS))
def test_greedy_with_the_parameter_is_identical_to_spec_off(
    target_dir: Path, trained_dir: Path, name: str, k: int
) -> None:
    # min_tokens: identity with a stop id in reach; the change is the test below
    llm = assert_identical(target_dir, spec(trained_dir, k), PROMPTS, PARAMS[name],
                           changes=name != "min_tokens", max_num_seqs=2)
    m = llm.engine.spec.metrics
    assert m.num_accepted_tokens < m.num_draft_tokens


def test_min_tokens_changes_the_output_where_a_stop_id_is_greedy(target_dir: Path,
                                                                 trained_dir: Path,
                                                                 plain) -> None:
    """Stop on the 3rd greedy token unless min_tokens holds it back: the same with spec on."""
    stop = plain[0][2]
    cut = {"stop_token_ids": [stop]}
    held = {"stop_token_ids": [stop], "min_tokens": 5}
    short = token_ids(run(target_dir, None, cut)[0])
    off = token_ids(run(target_dir, None, held)[0])
    assert len(short[0]) == 3 and off[0] != short[0]
    for extra, want in ((cut, short), (held, off)):
        outs, llm = run(target_dir, spec(trained_dir, 7), extra)
        assert token_ids(outs) == want
        assert llm.engine.spec.metrics.num_accepted_tokens > 0


@pytest.mark.parametrize("name", ["presence_penalty", "allowed_token_ids", "mix"])
def test_dflash2_walk_is_identical(target_dir: Path, trained2_dir: Path, name: str) -> None:
    off = token_ids(run(target_dir, None, PARAMS[name])[0])
    outs, llm = run(target_dir, spec(trained2_dir, 7), PARAMS[name])
    assert token_ids(outs) == off
    assert llm.engine.spec.metrics.num_draft_tokens > 0


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("version", [1, 2])
def test_logprobs_equal_spec_off(target_dir: Path, trained_dir: Path, trained2_dir: Path,
                                 mode: str, version: int) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    assert_logprobs_match(target_dir, spec(drafter, 7), PROMPTS, mode, max_num_seqs=2)


@pytest.mark.parametrize("kind", STOP_KINDS)
def test_a_stop_inside_an_accepted_block_truncates_there(
    target_dir: Path, trained_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_stop_inside_accepted_block(target_dir, spec(trained_dir, 7), PROMPTS[0], kind,
                                      monkeypatch)


def test_seeded_samples_are_reproducible(target_dir: Path, trained_dir: Path) -> None:
    assert_seeded_samples(target_dir, spec(trained_dir, 7), PROMPTS[0], presence_penalty=0.5)


def test_processed_drafts_are_accepted_more(target_dir: Path, trained_dir: Path,
                                            monkeypatch) -> None:
    """DFlash1 drafting with the request's penalties and bias (``row.history``) gets more
    drafts accepted than drafting without (the history dropped): the wiring is live."""
    import draftwise_dflash.proposer as prop

    extra = {"logit_bias": {42: 40.0}}  # the target then says 42; an unprocessed draft never
    rates = []
    for keep in (True, False):
        if not keep:
            monkeypatch.setattr(prop.DFlashProposer, "_pick_in_order",
                                lambda self, rows, plans, logits: prop.pick_draft_tokens(
                                    logits, [rows[p.index].params for p in plans
                                             for _ in range(p.drafts)],
                                    [None] * logits.shape[0], False))
        _, llm = run(target_dir, spec(trained_dir, 7), extra)
        m = llm.engine.spec.metrics
        rates.append(m.num_accepted_tokens / m.num_draft_tokens)
    assert rates[0] > rates[1] + 0.5, rates
