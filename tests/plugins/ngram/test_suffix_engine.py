"""Suffix decoding in the engine on the default model: greedy output identical to
speculation off, from the request's own context and from the global index, one at a
time and batched (prompts prefilled in the same steps as others decode), with adaptive
depth and per-request controls; and one key's outputs never draft for another key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftwise import LLM, SamplingParams
from draftwise.spec.cost_model import CostModel
from draftwise.spec.params import SpeculativeParams

pytestmark = pytest.mark.default_model

WORKLOAD = Path(__file__).parents[3] / "benchmarks" / "workloads" / "cpu-smoke-8.jsonl"
MAX_TOKENS = 40
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8}


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in WORKLOAD.read_text().splitlines()]


@pytest.fixture(scope="module")
def spec_off(conversations) -> list[list[int]]:
    llm = LLM(max_num_seqs=8)
    return [o.outputs[0].token_ids for o in llm.chat(conversations, greedy())]


def sources(llm: LLM) -> dict:
    (stats,) = llm.engine.spec.proposer_stats()
    return stats


def test_one_at_a_time_own_context_then_global(conversations, spec_off) -> None:
    llm = LLM(speculative_config=SUFFIX, max_num_seqs=1)
    for rnd in range(2):  # round 2 repeats round 1: drafted from the global index
        got = [llm.chat(c, greedy(), isolation_key="user-a")[0].outputs[0].token_ids
               for c in conversations]
        assert got == spec_off, rnd
    stats = sources(llm)
    assert stats["drafts_from_global"]["num_accepted_tokens"] > 0
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.kv.num_used_blocks == 0


def test_batched_with_prefill_in_the_step(conversations, spec_off) -> None:
    """At fixed depth, so the global index is drafted from whatever this machine's cost
    grid says (adaptive depth, the default, may price 8-row drafts out on a loaded one;
    the next test runs it)."""
    llm = LLM(speculative_config={**SUFFIX, "draftwise": {"adaptive": False}}, max_num_seqs=8)
    for rnd in range(2):
        outs = llm.chat(conversations, greedy(), isolation_key="user-a")
        assert [o.outputs[0].token_ids for o in outs] == spec_off, rnd
    assert sources(llm)["drafts_from_global"]["num_drafts"] > 0
    assert llm.engine.spec.num_tracked_requests == 0


def test_adaptive_depth_and_per_request_controls(conversations, spec_off) -> None:
    config = {**SUFFIX, "draftwise": {"adaptive": {"probe_interval": 2, "cost_cache": False}}}
    llm = LLM(speculative_config=config, max_num_seqs=8)
    asks = [None, SpeculativeParams(enabled=False),
            SpeculativeParams(num_speculative_tokens=2), SpeculativeParams(adaptive=False)] * 2
    for _ in range(2):
        outs = llm.chat(conversations, greedy(), speculative=asks, isolation_key="k")
        assert [o.outputs[0].token_ids for o in outs] == spec_off


def test_one_keys_outputs_never_draft_for_another(conversations, spec_off) -> None:
    """Bob's drafts after alice ran the same prompts are exactly those of a fresh engine
    that never saw alice: her outputs changed nothing he was drafted from. At fixed depth:
    adaptive depth (the default) sets bob's depths by the acceptance pooled over alice's
    requests too, so his draft counts would differ from a fresh engine's for that alone."""
    fixed = {**SUFFIX, "draftwise": {"adaptive": False}}
    fresh = LLM(speculative_config=fixed, max_num_seqs=8)
    fresh.chat(conversations, greedy(), isolation_key="bob")
    alone = sources(fresh)

    llm = LLM(speculative_config=fixed, max_num_seqs=8)
    llm.chat(conversations, greedy(), isolation_key="alice")
    after_alice = sources(llm)
    outs = llm.chat(conversations, greedy(), isolation_key="bob")
    assert [o.outputs[0].token_ids for o in outs] == spec_off
    bob = sources(llm)
    for source in ("drafts_from_request", "drafts_from_global"):
        delta = {k: bob[source][k] - after_alice[source][k] for k in bob[source]}
        assert delta == alone[source], source
    # a keyless request drafts from its own tokens only, so alice's outputs do not help it
    before = sources(llm)["drafts_from_global"]
    outs = llm.chat(conversations, greedy())
    assert [o.outputs[0].token_ids for o in outs] == spec_off
    assert sources(llm)["drafts_from_global"] == before
    index = llm.engine.spec.drafters[0].proposer.global_index
    assert set(index.streams) == {"alice", "bob"}


class FixedCosts(CostModel):
    """A cost model the engine's steps do not recalibrate."""

    def observe_step(self, num_rows: int, num_tokens: int, forward: float, rest: float) -> None:
        pass


def test_outputs_of_parked_requests_reach_the_global_index(conversations) -> None:
    """Suffix decoding drafts from earlier requests' outputs: a request adaptive depth (the
    default) keeps at k = 0 must be recorded too, or where drafts are priced out the index
    stays empty and no later request of the key can draft from it (the method declares
    ``Capabilities.sees_every_row``: parked rows are handed to it with max_draft 0)."""
    llm = LLM(speculative_config=SUFFIX, max_num_seqs=8)
    pol = llm.engine.spec.policy
    # a step's seconds grow with its tokens per row as fast as its output: drafts never pay
    pol.cost = FixedCosts(pol.cost.rows, pol.cost.tokens_per_row,
                          [[float(t) for t in pol.cost.tokens_per_row] for _ in pol.cost.rows])
    pol._step_tables.clear()
    outs = llm.chat(conversations, greedy(), isolation_key="alice")
    made = sum(len(o.outputs[0].token_ids) for o in outs)
    if llm.engine.spec.metrics.num_draft_tokens >= made // 4:
        raise RuntimeError("the rows must be parked, or this tests nothing")
    # at fixed depth the index holds ~90% of the outputs (up to each one's last propose)
    assert sources(llm)["global_tokens"] >= made // 2
