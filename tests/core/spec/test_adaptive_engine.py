"""Adaptive depth and per-request speculation through the engine: lossless, honoured.

n-gram drafting on a tiny random llama: prompts are repetitive so lookups find drafts
that are sometimes right; greedy output must equal speculation off token for token,
alone and batched, whatever depths adaptive chose and whatever each request asked.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from spec_sampling import fixed_depth
from tiny_checkpoints import save_tiny

from draftwise import LLM, SamplingParams, SpeculativeParams
from draftwise.errors import RequestError
from draftwise.spec.adaptive import DepthPolicy
from draftwise.spec.cost_model import CostModel

PROMPTS = [
    [5, 9, 13, 2, 7] * 4,
    list(range(20, 40)) * 2,
    [42] * 11,
    [(i * 37) % 500 + 3 for i in range(23)],
    [7, 8, 9, 7, 8, 9, 7, 8],
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
ADAPTIVE = {**NGRAM, "draftwise": {"adaptive": {"probe_interval": 2, "cost_cache": False}}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("adaptive-llama"), seed=3)


def greedy(n: int = 24) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(tiny: Path) -> list[list[int]]:
    llm = LLM(model=str(tiny), dtype="bfloat16", max_num_seqs=8)
    return [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], greedy())]


class FixedCosts(CostModel):
    """A cost model the engine's steps do not recalibrate (nor add their rest to)."""

    def observe_step(self, num_rows: int, num_tokens: int, forward: float, rest: float) -> None:
        pass


def cheap_drafts(llm: LLM) -> LLM:
    """The rule under test here is losslessness, not the clock: a grid timed on a loaded
    machine can price the tiny model's drafts out (then nothing is drafted and the checks
    prove nothing), so its draft tokens are made nearly free, and stay so."""
    pol = llm.engine.spec.policy
    pol.cost = FixedCosts(pol.cost.rows, pol.cost.tokens_per_row,
                          [[1.0 + 0.01 * t for t in pol.cost.tokens_per_row]
                           for _ in pol.cost.rows])
    pol._step_tables.clear()
    return llm


@pytest.fixture(scope="module")
def adaptive(tiny: Path) -> LLM:
    return cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=ADAPTIVE,
                            max_num_seqs=8))


def prompts() -> list[dict]:
    return [{"prompt_token_ids": p} for p in PROMPTS]


def test_adaptive_alone_equals_spec_off(adaptive: LLM, plain: list[list[int]]) -> None:
    for p, want in zip(prompts(), plain):
        out = adaptive.generate(p, greedy())[0]
        assert out.outputs[0].token_ids == want
        assert "adaptive" in out.metrics["speculative_decoding"]
    assert adaptive.engine.spec.metrics.num_accepted_tokens > 0  # speculation happened
    # the n-gram's match lengths reached adaptive depth, which keeps acceptance by them
    assert adaptive.engine.spec.policy.pooled


def test_adaptive_batched_equals_spec_off(adaptive: LLM, plain: list[list[int]]) -> None:
    outs = adaptive.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert adaptive.engine.spec.num_tracked_requests == 0


def test_the_policy_keeps_each_requests_estimate_until_it_ends(adaptive: LLM) -> None:
    """``Request`` is plain data: adaptive depth keeps each request's running acceptance
    itself, by request id, through the request's life; when the request ends (finished
    or aborted) the estimate goes, and the final output reports what it learned."""
    policy = adaptive.engine.spec.policy
    outs = adaptive.generate(prompts()[:2], greedy(8))
    assert policy.estimates == {}
    for out in outs:
        learned = out.metrics["speculative_decoding"]["adaptive"]
        assert len(learned["acceptance_rate_per_pos"]) == policy.max_k
    engine = adaptive.engine
    req_id = engine.add_request(prompts()[0], greedy(64))
    while req_id not in policy.estimates:  # its first decode step makes it
        engine.step()
    assert engine.abort_request(req_id) and policy.estimates == {}


def test_objective_switches_with_the_queue_and_stays_lossless(
    tiny: Path, plain: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots for five requests: while some wait the batch maximises throughput, once
    none wait each row's rate weighs alike (``objective: auto``); the output is the plain
    output either way."""
    llm = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=ADAPTIVE,
                           max_num_seqs=2))
    seen: list[tuple[int, bool]] = []
    set_waiting = DepthPolicy.set_waiting

    def spy(self: DepthPolicy, num_waiting: int) -> None:
        set_waiting(self, num_waiting)
        seen.append((num_waiting, self.fair))

    monkeypatch.setattr(DepthPolicy, "set_waiting", spy)
    outs = llm.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert any(w > 0 and not fair for w, fair in seen)
    assert any(w == 0 and fair for w, fair in seen)
    assert all(fair == (w == 0) for w, fair in seen)
    assert llm.engine.spec.metrics.num_accepted_tokens > 0


def test_the_default_is_adaptive_and_false_pins_fixed_depth(
    tiny: Path, plain: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config without the ``draftwise`` key runs adaptive depth (the policy exists and
    the depths it chooses vary within the cap); ``"adaptive": false`` has no policy, so
    every decode row may draft k; both give speculation off's tokens."""
    chosen: list[int] = []
    choose = DepthPolicy.choose

    def spy(self: DepthPolicy, estimates: list, caps: list[int]) -> list[int]:
        ks = choose(self, estimates, caps)
        chosen.extend(ks)
        return ks

    monkeypatch.setattr(DepthPolicy, "choose", spy)
    default = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=NGRAM,
                               max_num_seqs=8))
    assert default.engine.spec.policy is not None
    assert default.engine.spec_config.depth == "adaptive"
    outs = default.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert default.engine.spec.metrics.num_accepted_tokens > 0
    assert len(set(chosen)) > 1 and max(chosen) <= 4, Counter(chosen)

    chosen.clear()
    fixed = LLM(model=str(tiny), dtype="bfloat16", max_num_seqs=8,
                speculative_config={**NGRAM, "draftwise": {"adaptive": False}})
    assert fixed.engine.spec.policy is None and fixed.engine.spec_config.depth == "fixed"
    outs = fixed.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert chosen == [] and fixed.engine.spec.metrics.num_accepted_tokens > 0


def test_spec_off_request_in_a_speculating_batch(tiny: Path, plain: list[list[int]]) -> None:
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=fixed_depth(NGRAM),
              max_num_seqs=8)  # fixed: the others must draft, whatever the clock
    asks = [SpeculativeParams(enabled=False), None, SpeculativeParams(num_speculative_tokens=1),
            None, SpeculativeParams(enabled=False)]
    outs = llm.generate(prompts(), greedy(), speculative=asks)
    assert [o.outputs[0].token_ids for o in outs] == plain
    for out, ask in zip(outs, asks):
        sd = out.metrics["speculative_decoding"]
        if ask is not None and not ask.enabled:
            assert sd["num_draft_tokens"] == 0 and sd["num_spec_steps"] == 0
            assert sd["request_settings"] == {"enabled": False}
        if ask is not None and ask.num_speculative_tokens == 1:
            assert sd["acceptance_histogram"][2:] == [0, 0, 0]  # never more than 1 draft
    assert sum(o.metrics["speculative_decoding"]["num_draft_tokens"] for o in outs) > 0


def test_fixed_depth_per_request_under_adaptive(adaptive: LLM, plain: list[list[int]]) -> None:
    fixed = SpeculativeParams(adaptive=False, num_speculative_tokens=2, return_provenance=True)
    outs = adaptive.generate(prompts(), greedy(), speculative=fixed)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert all("adaptive" not in o.metrics["speculative_decoding"] for o in outs)


def test_over_limit_and_unknown_member_are_refused(adaptive: LLM) -> None:
    engine = adaptive.engine
    with pytest.raises(RequestError) as err:
        engine.add_request([1, 2, 3], greedy(), speculative=SpeculativeParams(
            num_speculative_tokens=5))
    assert err.value.field == "speculative.num_speculative_tokens"
    with pytest.raises(RequestError) as err:
        engine.add_request([1, 2, 3], greedy(), speculative=SpeculativeParams(method="mtp"))
    assert err.value.field == "speculative.method"
    assert not engine.has_unfinished_requests()


def test_no_speculation_server_refuses_asking_for_it(tiny: Path) -> None:
    llm = LLM(model=str(tiny), dtype="bfloat16")
    with pytest.raises(RequestError):
        llm.engine.add_request([1, 2], greedy(), speculative=SpeculativeParams(
            num_speculative_tokens=2))
    out = llm.generate([1, 2, 3], greedy(4), speculative=SpeculativeParams(
        enabled=False, return_provenance=True))[0]
    assert out.metrics["token_provenance"] == ["plain"] * 4


def test_provenance_sums_equal_the_metrics(adaptive: LLM, plain: list[list[int]]) -> None:
    outs = adaptive.generate(prompts(), greedy(), speculative=SpeculativeParams(
        return_provenance=True))
    assert [o.outputs[0].token_ids for o in outs] == plain
    for out in outs:
        prov = out.metrics["token_provenance"]
        sd = out.metrics["speculative_decoding"]
        counts = Counter(prov)
        assert len(prov) == len(out.outputs[0].token_ids)
        assert counts["accepted:ngram"] == sd["num_accepted_draft_tokens"]
        assert counts["recovered"] + counts["bonus"] == sd["num_spec_steps"]
        assert counts["bonus"] >= sd["acceptance_histogram"][4]  # every full accept ends so
    total = Counter(t for o in outs for t in o.metrics["token_provenance"])
    assert total["accepted:ngram"] > 0


def test_chain_with_adaptive_and_per_request_member(tiny: Path, plain: list[list[int]]) -> None:
    chain = {"num_speculative_tokens": 3, "draftwise": {
        "adaptive": {"cost_cache": False},
        "drafter_chain": [{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                          {"method": "draft_model", "model": str(tiny)}]}}
    llm = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=chain,
                           max_num_seqs=8))
    for member in ("ngram", "draft_model", None):
        ask = SpeculativeParams(method=member, return_provenance=True)
        outs = llm.generate(prompts(), greedy(), speculative=ask)
        assert [o.outputs[0].token_ids for o in outs] == plain
        used = {t for o in outs for t in o.metrics["token_provenance"] if t.startswith("acc")}
        if member is not None:
            assert used <= {f"accepted:{member}"}
    assert llm.engine.spec.num_tracked_requests == 0


def test_batch_size_schedule_caps_adaptive(tiny: Path, plain: list[list[int]]) -> None:
    cfg = {**ADAPTIVE, "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 8, 1]]}
    llm = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=cfg,
                           max_num_seqs=8))
    outs = llm.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    # five requests run together until the last ones finish: with more than one running,
    # no step verifies more than one draft; alone, up to the full depth
    per_pos = llm.engine.spec.metrics.num_draft_tokens_per_pos
    assert per_pos[0] > 0 and per_pos[1] <= per_pos[0]
    for o in outs[:3]:  # finished while all were running: capped at 1
        assert sum(o.metrics["speculative_decoding"]["acceptance_histogram"][2:]) == 0


def sampled_triples(tiny: Path, config: dict | None, n: int, seed: int) -> tuple[Counter, LLM]:
    """Joint counts of the first three sampled tokens over ``n`` seeded requests."""
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=config, max_num_seqs=256)
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=4, seed=seed * 100_000 + i,
                             ignore_eos=True) for i in range(n)]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[0]}] * n, params)
    return Counter(tuple(o.outputs[0].token_ids[:3]) for o in outs), llm


def test_adaptive_sampling_keeps_the_distribution(tiny: Path, tmp_path: Path) -> None:
    """Depth chosen from each request's own (random) history must not bias what is sampled:
    the joint law of the first three tokens equals speculation off (chi-square). The draft
    is a different tiny model sampling its own q, so rejection sampling really rejects."""
    from stats import CHI2_9999, chi2_two_sample

    draft = save_tiny("llama", tmp_path / "draft", seed=3, std=0.1)
    n = 2000
    off, _ = sampled_triples(tiny, None, n, seed=1)
    cfg = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2,
           "draft_sample_method": "probabilistic",
           "draftwise": {"adaptive": {"prior": 0.9, "probe_interval": 1, "cost_cache": False}}}
    on, llm = sampled_triples(tiny, cfg, n, seed=2)
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # it drafted, and some failed
    # (which depths adaptive picks depends on this machine's measured costs; whatever they
    # are, each is a function of the request's past, and the law must not move)
    stat, dof = chi2_two_sample(off, on)
    assert stat < CHI2_9999[dof], (stat, dof)


def _record_calls(llm: LLM) -> list[list[str]]:
    """Wrap the first drafter's propose: each call's row ids, in order."""
    proposer = llm.engine.spec.drafters[0].proposer
    inner, calls = proposer.propose, []

    def propose(batch):
        calls.append([r.req_id for r in batch.rows])
        return inner(batch)

    proposer.propose = propose
    return calls


def test_a_step_with_every_row_off_is_the_plain_step(
    tiny: Path, plain: list[list[int]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adaptive depth that keeps every row at k = 0 (no acceptance expected, no probes
    after each request's first decode step) runs no proposer and no feedback on any
    other step, and the tokens are the plain engine's."""
    cfg = {**NGRAM, "draftwise": {"adaptive": {
        "prior": 0.0, "probe_interval": 1_000_000, "cost_cache": False}}}
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=cfg, max_num_seqs=8)
    calls = _record_calls(llm)
    fed_back: list[int] = []
    spec = llm.engine.spec
    inner = spec.feedback
    monkeypatch.setattr(spec, "feedback", lambda rows, *a: fed_back.append(len(rows)) or
                        inner(rows, *a))
    outs = llm.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in outs] == plain
    # each request is shown to the drafter once (its first decode step's probe), and
    # feedback runs only on steps where some row could draft
    seen = [rid for ids in calls for rid in ids]
    assert sorted(seen) == sorted({o.request_id for o in outs})
    assert len(fed_back) == len(calls) and len(calls) <= len(PROMPTS)
    assert spec.num_tracked_requests == 0


DRAFT_MODEL_ADAPTIVE = {"method": "draft_model", "num_speculative_tokens": 3,
                        "draftwise": {"adaptive": {"probe_interval": 2, "cost_cache": False}}}


def test_adaptive_draft_model_equals_spec_off(
    tiny: Path, plain: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """draft_model under adaptive depth, alone and batched: greedy tokens equal spec off,
    and a request with speculation off never reaches the draft model (k = 0 means its
    rows cost the drafter nothing)."""
    cfg = {**DRAFT_MODEL_ADAPTIVE, "model": str(tiny)}  # the target as its own draft: accepts
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=cfg, max_num_seqs=8)
    # (a draft here costs what a target step does, so no acceptance pays for a probe and
    # parked rows would never be probed again: this test is about who reaches the drafter)
    monkeypatch.setattr(type(llm.engine.spec.policy), "probe_could_pay", lambda *a: True)
    for p, want in zip(prompts(), plain):
        assert llm.generate(p, greedy())[0].outputs[0].token_ids == want
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    calls = _record_calls(llm)
    asks = [None, SpeculativeParams(enabled=False), None, None, None]
    outs = llm.generate(prompts(), greedy(), speculative=asks)
    assert [o.outputs[0].token_ids for o in outs] == plain
    off_id = outs[1].request_id
    assert calls and all(off_id not in ids for ids in calls)
    assert outs[1].metrics["speculative_decoding"]["num_draft_tokens"] == 0
    assert llm.engine.spec.num_tracked_requests == 0


def test_adaptive_draft_model_that_rejects_turns_off(tiny: Path, tmp_path: Path,
                                                     plain: list[list[int]]) -> None:
    """A draft model that disagrees with the target: adaptive depth stops asking it (few
    calls after the first rejections, probes backed off) and the output stays plain's.
    Each draft token costs half a step here (the rule, not the clock: on the tiny model
    the rest of a step is most of it, so drafts are nearly free and a 30% chance pays)."""
    draft = save_tiny("llama", tmp_path / "bad-draft", seed=11)
    cfg = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3,
           "draftwise": {"adaptive": {"probe_interval": 2, "cost_cache": False}}}
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=cfg, max_num_seqs=8)
    pol = llm.engine.spec.policy
    pol.cost = FixedCosts(pol.cost.rows, pol.cost.tokens_per_row,
                          [[1.0 + 0.5 * (t - 1) for t in pol.cost.tokens_per_row]
                           for _ in pol.cost.rows])
    pol._step_tables.clear()
    calls = _record_calls(llm)
    out = llm.generate(prompts()[3], greedy(64))[0]
    assert out.outputs[0].token_ids[:24] == plain[3]
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0 and m.num_accepted_tokens == 0  # (seeded: always rejects)
    # of 63 decode steps: probes after 2, 4, 8, 16, 32 steps off, not every 2 (~30 calls)
    assert len(calls) <= 8


def test_a_draft_models_price_is_its_drafts_not_its_prompt_catch_up(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An own-KV drafter's first probe of a request feeds it the whole prompt (one batched
    forward) before its one draft; spreading that step's time over the prompt's tokens
    priced the 0.5B draft of the 1.5B at 6.5 ms a draft where its drafts took 15, and
    adaptive depth drafted open prose at a loss. A step whose catch-up outnumbers its
    drafts is not a price; otherwise a catch-up counts one draft's worth."""
    from draftwise.spec import speculation

    cfg = {**DRAFT_MODEL_ADAPTIVE, "model": str(tiny)}
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=cfg, max_num_seqs=8)
    spec = llm.engine.spec
    monkeypatch.setattr(type(spec.policy), "probe_could_pay", lambda *a: True)
    steps: list[tuple[int, int]] = []  # (drafts made, catch-up tokens) per drafting step
    observed: list[int] = []
    real_catch_up, proposer = speculation.catch_up_tokens, spec.drafters[0].proposer
    inner = proposer.propose

    def catch_up(rows):  # noqa: ANN001, ANN202
        steps.append((0, real_catch_up(rows)))
        return steps[-1][1]

    def propose(batch):  # noqa: ANN001, ANN202
        out = inner(batch)
        steps[-1] = (int(sum(out.num_draft_tokens)), steps[-1][1])
        return out

    def observe(self: CostModel, seconds: float, num_tokens: int) -> None:
        observed.append(num_tokens)

    monkeypatch.setattr(speculation, "catch_up_tokens", catch_up)
    monkeypatch.setattr(CostModel, "observe_draft", observe)
    proposer.propose = propose
    llm.generate(prompts()[0], greedy(16))
    assert any(b > m for m, b in steps)  # the prompt's catch-up happened (the case)
    assert any(b == 0 and m for m, b in steps)  # and steady drafting steps
    assert observed == [m + (1 if b else 0) for m, b in steps if m and b <= m]


def test_the_engine_times_its_decode_steps_for_the_cost_model(tiny: Path) -> None:
    """Adaptive depth prices a draft token against the whole step: the engine times each
    decode step's forward (which calibrates the grid) and its rest (outside the target
    forward and the drafters) on the cost model's clock, per batch size; a fake clock
    that ticks 1 per reading makes the rest exact."""
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=ADAPTIVE, max_num_seqs=8)
    cost = llm.engine.spec.policy.cost
    assert cost.overhead == {}
    llm.generate(prompts()[:1], greedy(8))
    assert set(cost.overhead) == {1} and cost.overhead_seconds(1) > 0
    # and each decode step's forward, at its grid point (1 row x 1 + drafts tokens): all
    # but the prefill step
    steps = cost.summary()["engine_steps"]
    assert sum(steps[0]) == llm.engine.stats.num_steps - 1 and not any(map(any, steps[1:]))
    ticks = iter(range(1_000_000))
    cost.clock = lambda: float(next(ticks))
    cost.overhead.clear()
    llm.generate(prompts()[:2], greedy(8))
    # the step reads its one clock at its start and at the end of each of its five laps
    # (schedule, propose, forward, verify, commit: draftwise.step_clock), and propose
    # reads it around the drafters when it drafts: a decode step's rest (its time less
    # the forward lap and the drafting) is 4 ticks when it does not draft, 5 when it does
    assert set(cost.overhead) <= {1, 2}
    assert all(4.0 <= cost.overhead_seconds(r) <= 5.0 for r in cost.overhead)


def test_a_batch_that_rests_stays_lossless(tiny: Path, plain: list[list[int]]) -> None:
    # 3-token matches only: most lookups find nothing, so the batch rests between the
    # steps whose matches are verified (draftwise.spec.batch_rest)
    config = {**ADAPTIVE, "prompt_lookup_min": 3}
    llm = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=config,
                           max_num_seqs=8))
    for batch, want in (([prompts()[3]], [plain[3]]), (prompts(), plain)):
        assert [o.outputs[0].token_ids for o in llm.generate(batch, greedy())] == want
    rest = llm.engine.spec.policy.rest.summary()
    assert rest["rests"] > 0 and rest["rested_steps"] > 0
    assert llm.engine.spec.metrics.num_drafts > 0  # and the steps between them drafted


def test_a_seeded_sampled_request_stays_at_fixed_depth(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seeded sampled row's draws follow its depth, and adaptive depth follows the
    machine's timing: it is kept out of the policy (fixed depth), so the same seed gives
    the same text on every run; an unseeded sampled row beside it stays adaptive."""
    rows_seen: list[int] = []
    choose = DepthPolicy.choose

    def spy(self: DepthPolicy, estimates: list, caps: list[int]) -> list[int]:
        rows_seen.append(len(caps))
        return choose(self, estimates, caps)

    monkeypatch.setattr(DepthPolicy, "choose", spy)
    llm = cheap_drafts(LLM(model=str(tiny), dtype="bfloat16", speculative_config=NGRAM,
                           max_num_seqs=8))
    seeded = SamplingParams(temperature=1.0, top_k=3, max_tokens=12, seed=7, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": PROMPTS[0]}, seeded)[0].outputs[0].token_ids
    assert rows_seen == [] or set(rows_seen) == {0}
    again = llm.generate({"prompt_token_ids": PROMPTS[0]}, seeded)[0].outputs[0].token_ids
    assert first == again
    free = seeded.model_copy(update={"seed": None})
    llm.generate([{"prompt_token_ids": PROMPTS[0]}] * 2, [seeded, free])
    assert max(rows_seen) == 1  # the unseeded one only
