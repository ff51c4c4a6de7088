"""dflash with the logits-processing parameters and logprobs: greedy spec-on == spec-off.

The trained drafters (``conftest.train_drafter``) get drafts accepted, so each parameter
is applied at positions inside an accepted block (position ``j`` sees the drafts before
it). DFlash1 drafts with the request's processing (``row.history``); DFlash2's walk does
not (exact either way). ``test_processed_drafts_are_accepted_more`` is what the history
wiring buys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM, SamplingParams

from .conftest import TRAIN_PROMPTS

PROMPTS = TRAIN_PROMPTS[:2]
BANNED = (354, 280)
PARAMS: dict[str, dict[str, Any]] = {
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "logit_bias": {"logit_bias": {42: 3.0, 7: 2.0}},
    # all but two tokens of the greedy continuations (at their 9th and 10th positions), so
    # the drafts before them are accepted
    "allowed_token_ids": {"allowed_token_ids": tuple(t for t in range(510) if t not in BANNED)},
    "min_tokens": {"min_tokens": 6, "stop_token_ids": [0]},
    "mix": {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repetition_penalty": 1.1,
            "logit_bias": {3: 1.5}, "min_tokens": 4},
}


def spec(drafter: Path, k: int) -> dict[str, Any]:
    return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}


def run(target: Path, config: dict | None, extra: dict[str, Any], **kw: Any):
    params = SamplingParams(temperature=0.0, max_tokens=20, **{"ignore_eos": True, **extra})
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, max_num_seqs=2,
              **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert all(o.error is None for o in outs)
    assert llm.engine.kv.num_used_blocks == 0
    assert llm.engine.spec is None or llm.engine.spec.num_tracked_requests == 0
    return outs, llm


def token_ids(outs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def plain(target_dir: Path) -> list[list[int]]:
    return token_ids(run(target_dir, None, {})[0])


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("name", list(PARAMS))
def test_greedy_with_the_parameter_is_identical_to_spec_off(
    target_dir: Path, trained_dir: Path, plain, name: str, k: int
) -> None:
    off = token_ids(run(target_dir, None, PARAMS[name])[0])
    if name != "min_tokens":  # min_tokens: identity with a stop id in reach; see below
        assert off != plain, "the parameter must change the output, or the test cannot fail"
    outs, llm = run(target_dir, spec(trained_dir, k), PARAMS[name])
    assert token_ids(outs) == off
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens


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


def logprob_table(outs: list) -> list[list[dict[int, tuple[float, int]]]]:
    return [[{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in o.outputs[0].logprobs]
            for o in outs]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("version", [1, 2])
def test_logprobs_equal_spec_off(target_dir: Path, trained_dir: Path, trained2_dir: Path,
                                 mode: str, version: int) -> None:
    extra = {"logprobs": 5, "presence_penalty": 0.5, "logit_bias": {7: 2.0}}
    off, _ = run(target_dir, None, extra, logprobs_mode=mode)
    drafter = trained_dir if version == 1 else trained2_dir
    on, llm = run(target_dir, spec(drafter, 7), extra, logprobs_mode=mode)
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert token_ids(on) == token_ids(off)
    a, b = logprob_table(on), logprob_table(off)
    assert [len(r) for r in a] == [len(o.outputs[0].token_ids) for o in on]
    for ra, rb in zip(a, b):
        for pa, pb in zip(ra, rb):
            assert pa.keys() == pb.keys()
            for t in pa:
                assert pa[t][1] == pb[t][1]
                assert pa[t][0] == pytest.approx(pb[t][0], abs=1e-5)


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
