"""MTP under adaptive depth: greedy tokens equal spec off while rows go off and on.

A row adaptive depth keeps at k = 0 is never shown to the head, so the head's KV
frontier falls behind and its hidden states pile up in the core's buffer; the next probe
catches the head up over the backlog in one pass. With prior 0 and a probe every 3
steps (no backoff) that happens all the time, alone and batched. ``max_probe_interval`` 3
makes every third parked step probe whatever the price check says: the check reads the
machine's measured forward times, and on a slow CI machine it once refused every probe of
this tiny model, so the head was never shown a row and the test proved nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from draftwise import LLM, SamplingParams

from .test_proposer import PROMPT, builder

ADAPTIVE = {"prior": 0.0, "probe_interval": 3, "probe_backoff": 1.0,
            "max_probe_interval": 3, "cost_cache": False}


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builder().build(tmp_path_factory.mktemp("hybrid-mtp-adaptive"), "qwen3_5")


def test_adaptive_mtp_equals_spec_off_alone_and_batched(hybrid_dir: Path) -> None:
    prompts = [{"prompt_token_ids": PROMPT}, {"prompt_token_ids": PROMPT[::-1] * 2}]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM(model=str(hybrid_dir), dtype="bfloat16")
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    cfg = {"method": "mtp", "num_speculative_tokens": 2, "draftwise": {"adaptive": ADAPTIVE}}
    llm = LLM(model=str(hybrid_dir), dtype="bfloat16", speculative_config=cfg, max_num_seqs=4)
    for p, w in zip(prompts, want):
        assert llm.generate(p, params)[0].outputs[0].token_ids == w
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    spec = llm.engine.spec
    assert spec.proposers[0].witness.draft_forwards > 0  # probes reached the head
    assert 0 < spec.metrics.num_drafts < 4 * 23  # ... but not on every decode row-step
    assert spec.num_tracked_requests == 0 and llm.engine.kv.num_used_blocks == 0
