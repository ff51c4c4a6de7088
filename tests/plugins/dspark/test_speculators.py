"""The speculators DSpark layout (``DSparkSpeculator``): the same drafts as DeepSpec's.

The fixture (``conftest.to_speculators``) rewrites a DeepSpec drafter into speculators
0.9.0's published layout (``models/dspark/config.py``, ``models/dflash/core.py``'s save
rules): the config as
``DSparkSpeculatorConfig`` serialises it (``transformer_layer_config``,
``aux_hidden_state_layer_ids`` = DeepSpec ids + 1, every DSpark field), the state dict
without ``embed_tokens`` (never saved) and, for a full vocabulary, without ``lm_head``.
Both directories hold the same weights (DeepSpec's embedding and head are the target's
copies), so every draft of every step must be equal.

The speculators package's own heads are the oracle in ``test_speculators_oracle.py``;
its reduced draft vocabularies are ``test_draft_vocab.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM, SamplingParams
from draftwise.formats.errors import ModelFormatError
from spec_sampling import fixed_depth

from .conftest import TRAIN_PROMPTS, save_dspark, to_speculators
from .test_oracle import record_drafts

PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 90))]
def drafts_of(target: Path, drafter: Path, **extra: Any) -> tuple[list, list, LLM]:
    """Drafts at fixed depth, so that two layouts' runs compare step for step."""
    llm = LLM(model=str(target), dtype="bfloat16", max_num_seqs=3, speculative_config=fixed_depth({
        "method": "dspark", "model": str(drafter), "num_speculative_tokens": 7, **extra}))
    seen = record_drafts(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return seen, [o.outputs[0].token_ids for o in outs], llm


def test_speculators_layout_drafts_what_deepspec_drafts(target_dir, trained_dir, tmp_path
                                                        ) -> None:
    spec_dir = to_speculators(trained_dir, tmp_path / "spec")
    want, out_native, _ = drafts_of(target_dir, trained_dir)
    got, out, llm = drafts_of(target_dir, spec_dir)
    assert got == want and len(got) > 4
    assert out == out_native
    plain = LLM(model=str(target_dir), dtype="bfloat16").generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert out == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.spec.metrics.num_accepted_tokens > 0


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_every_markov_type_and_the_confidence_cut(target_dir, tmp_path, kind: str) -> None:
    src = save_dspark(tmp_path / kind, target_dir, kind=kind, enable_confidence_head=True,
                      confidence_head_with_markov=True, confidence_std=0.3)
    spec_dir = to_speculators(src, tmp_path / f"{kind}-spec")
    cut = {"draftwise": {"confidence_threshold": 0.5}}
    want, _, native = drafts_of(target_dir, src, **cut)
    got, _, llm = drafts_of(target_dir, spec_dir, **cut)
    assert got == want
    assert (llm.engine.spec.proposer_stats()[0]["confidence_cut_tokens"]
            == native.engine.spec.proposer_stats()[0]["confidence_cut_tokens"] > 0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"sample_from_anchor": False}, "sample_from_anchor is false"),
    ({"draft_vocab_size": 256}, "draft_vocab_size=256 is below vocab_size=512.*no 'd2t'"),
    ({"draft_vocab_size": 513}, "draft_vocab_size=513 must be an integer from 1"),
    ({"target_hidden_size": 4096}, "target_hidden_size=4096 differs"),
    ({"transformer_layer_config": None}, "transformer_layer_config is missing"),
    ({"aux_hidden_state_layer_ids": None}, "aux_hidden_state_layer_ids=None must be"),
    ({"speculators_model_type": "dflash"}, "is not 'dspark'"),
])
def test_speculators_refusals_by_name(target_dir, dspark_dir, tmp_path, changes, message
                                      ) -> None:
    bad = to_speculators(dspark_dir, tmp_path / "bad", **changes)
    with pytest.raises(ModelFormatError, match=message):
        LLM(model=str(target_dir), speculative_config={
            "method": "dspark", "model": str(bad), "num_speculative_tokens": 7})


def test_speculators_defaults_expect_the_confidence_head(target_dir, dspark_dir, tmp_path
                                                        ) -> None:
    """speculators' default is enable_confidence_head true: a config that leaves it out
    and a state dict without the head is refused by tensor name, not run headless."""
    bad = to_speculators(dspark_dir, tmp_path / "d")
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["enable_confidence_head"], cfg["confidence_head_with_markov"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="confidence_head.proj"):
        LLM(model=str(target_dir), speculative_config={
            "method": "dspark", "model": str(bad), "num_speculative_tokens": 7})
