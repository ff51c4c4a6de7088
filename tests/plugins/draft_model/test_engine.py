"""draft_model through the whole engine: greedy identity, batching, draft KV, refusals.

bf16 weights: target and draft forwards are batch-invariant, so every identity below is
exact (token lists equal), whatever else shares the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spec_sampling import fixed_depth

from draftwise import LLM
from draftwise.config import RefusedValueError
from draftwise.formats.default_model import default_model_path
from draftwise_draft_model.loader import DraftModelError
from draftwise_draft_model.proposer import DraftModelProposer

from ..conftest import assert_clean, generate, greedy

PROMPTS = [
    [7, 3, 11, 5, 2, 9],
    list(range(20, 57)),
    [100, 101, 102],
    [(i * 37) % 500 + 3 for i in range(23)],
]


def spec(draft: Path, k: int, **extra: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k, **extra}


@pytest.fixture(scope="module")
def want(target_dir: Path) -> list[list[int]]:
    """Each prompt alone, speculation off."""
    return [generate(target_dir, None, [p])[0][0] for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_identical_to_spec_off(target_dir, draft_dir, want, k: int) -> None:
    # fixed depth: the counts below need k-deep drafts every step; adaptive depth (the
    # default) parks this lone request after its first rejection
    got, llm = generate(target_dir, spec(draft_dir, k, draftwise={"adaptive": False}),
                        [PROMPTS[0]])
    assert got[0] == want[0]
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0 and 0 < m.num_accepted_tokens
    if k > 1:
        assert m.num_accepted_tokens < m.num_draft_tokens, "the jittered draft must miss some"
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["method"] == "draft_model" and stats["draft_forwards"] > 0
    assert_clean(llm)


@pytest.mark.parametrize("k", [2, 4])
def test_batched_rows_are_identical_to_each_alone(target_dir, draft_dir, want, k: int) -> None:
    # fixed depth: the rows must draft k deep together (adaptive depth may park them)
    got, llm = generate(target_dir, fixed_depth(spec(draft_dir, k)), PROMPTS, max_num_seqs=4)
    assert got == want
    stats = llm.engine.spec.proposer_stats()[0]
    # batched over rows: fewer draft forwards than drafting rows times depth
    assert stats["draft_forwards"] < stats["rows_drafted"] * k
    assert_clean(llm)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_heterogeneous_vocab_is_identical_and_maps_both_ways(
    target_dir, hetero_draft_dir, want, k: int
) -> None:
    # fixed depth: acceptance must be seen (adaptive depth may price a 1-token draft out)
    config = fixed_depth(spec(hetero_draft_dir, k, use_heterogeneous_vocab=True))
    got, llm = generate(target_dir, config, PROMPTS, max_num_seqs=4)
    assert got == want
    mapping = llm.engine.spec.proposers[0].mapping
    assert mapping is not None and mapping.num_shared == 502  # 501 words + [UNK]
    # agreement is only possible through a right map of context and drafts
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert_clean(llm)


def test_vocab_mismatch_without_the_flag_is_refused_by_name(target_dir, hetero_draft_dir) -> None:
    with pytest.raises(RefusedValueError) as info:
        LLM(model=str(target_dir), speculative_config=spec(hetero_draft_dir, 2))
    msg = str(info.value)
    assert "540 tokens" in msg and "512" in msg and '"use_heterogeneous_vocab": true' in msg


def test_refusals_vllm_makes_too(target_dir, draft_dir, no_tokenizer_draft) -> None:
    with pytest.raises(RefusedValueError, match="draft_tensor_parallel_size=2 is refused"):
        LLM(model=str(target_dir),
            speculative_config=spec(draft_dir, 2, draft_tensor_parallel_size=2))
    with pytest.raises(RefusedValueError, match="use_heterogeneous_vocab=true is refused"):
        LLM(model=str(target_dir), speculative_config=spec(
            draft_dir, 2, use_heterogeneous_vocab=True, draft_sample_method="probabilistic"))
    with pytest.raises(RefusedValueError, match="vLLM's PARD path"):
        LLM(model=str(target_dir), speculative_config=spec(draft_dir, 2, parallel_drafting=True))
    with pytest.raises(DraftModelError, match="the draft has no tokenizer.json"):
        LLM(model=str(target_dir), speculative_config=spec(
            no_tokenizer_draft, 2, use_heterogeneous_vocab=True))
    with pytest.raises(RefusedValueError, match="max_model_len=600 is refused"):
        LLM(model=str(target_dir), speculative_config=spec(draft_dir, 2, max_model_len=600))


def test_a_hybrid_draft_is_refused_by_name(target_dir, tmp_path) -> None:
    import importlib.util

    root = Path(__file__).resolve().parents[3]
    mod_spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", root / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    hybrid = mod.build(tmp_path / "hybrid", "qwen3_5")
    with pytest.raises(DraftModelError, match="recurrent state, which a draft cannot keep yet"):
        LLM(model=str(target_dir), speculative_config=spec(hybrid, 2))


def test_draft_max_model_len_skips_rows_past_it(target_dir, draft_dir, want) -> None:
    """vLLM's draft max_model_len: rows longer than it are not drafted (still lossless)."""
    got, llm = generate(target_dir, spec(draft_dir, 2, max_model_len=30), [PROMPTS[1]])
    assert got[0] == want[1]  # a 37-token prompt: never drafted
    assert llm.engine.spec.metrics.num_draft_tokens == 0
    got, llm = generate(target_dir, spec(draft_dir, 2, max_model_len=30), [PROMPTS[0]])
    assert got[0] == want[0] and llm.engine.spec.metrics.num_draft_tokens > 0


def test_no_leaked_blocks_after_finish_abort_and_preemption(target_dir, draft_dir, want) -> None:
    """A tight pool preempts rows with drafts in flight; an abort lands mid-decode (at fixed
    depth: adaptive depth's cost model times batches a 24-block pool cannot hold)."""
    llm = LLM(model=str(target_dir), dtype="bfloat16",
              speculative_config=spec(draft_dir, 3, draftwise={"adaptive": False}),
              block_size=4, num_kv_blocks=24, max_model_len=64, max_num_seqs=4,
              max_num_batched_tokens=32)
    engine = llm.engine
    ids = [engine.add_request({"prompt_token_ids": p}, greedy()) for p in PROMPTS]
    victim = engine.add_request({"prompt_token_ids": PROMPTS[0]}, greedy(), request_id="victim")
    done: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        steps += 1
        if steps == 4:
            assert engine.abort_request(victim)
        engine.kv.check_invariants()
    assert [done[i] for i in ids] == want
    assert engine.stats.num_preemptions > 0, "the test must force a preemption"
    assert engine.spec.metrics.num_draft_tokens > 0
    assert_clean(llm)


@pytest.mark.parametrize("first_drafts", [True, False], ids=["drafted", "spec-off"])
def test_prefix_cache_hits_give_the_same_drafts(
    target_dir, draft_dir, monkeypatch, first_drafts: bool
) -> None:
    """A request whose prefix is cached drafts exactly what it drafts on a cold cache,
    whether the request that left it there drafted (its draft KV is written) or ran
    with speculation off (the blocks are the target's only: the draft catches up from
    the tokens over them). At fixed depth: adaptive depth prices each engine's drafts by
    its own timing."""
    from draftwise import SpeculativeParams

    seen: list[list[list[int]]] = []
    real = DraftModelProposer.propose

    def record(self, batch):
        out = real(self, batch)
        seen.append([out.row(i).tolist() for i in range(len(batch.rows))])
        return out

    monkeypatch.setattr(DraftModelProposer, "propose", record)
    shared = list(range(30, 62))  # two full blocks of 16
    a, b = shared + [5, 6, 7], shared + [8, 9]
    fixed = spec(draft_dir, 3, draftwise={"adaptive": False})
    cold = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed)
    cold_out = cold.generate({"prompt_token_ids": b}, greedy(12))[0]
    cold_drafts = list(seen)
    warm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed)
    seen.clear()
    ask = None if first_drafts else SpeculativeParams(enabled=False)
    warm.generate({"prompt_token_ids": a}, greedy(12), speculative=ask)
    assert bool(seen) == first_drafts
    seen.clear()
    warm_out = warm.generate({"prompt_token_ids": b}, greedy(12))[0]
    assert warm_out.num_cached_tokens == 32, "b must hit a's two cached blocks"
    assert seen == cold_drafts
    assert warm_out.outputs[0].token_ids == cold_out.outputs[0].token_ids
    assert_clean(warm)


def test_a_gguf_checkpoint_drafts_too() -> None:
    """The embedded SmolLM2 GGUF drafting for itself: every draft is accepted."""
    path = default_model_path()
    prompt = "Count from one to ten:"
    plain = LLM(max_num_seqs=1).generate(prompt, greedy(12))[0]
    llm = LLM(max_num_seqs=1, speculative_config=spec(Path(path), 3))
    on = llm.generate(prompt, greedy(12))[0]
    assert on.outputs[0].token_ids == plain.outputs[0].token_ids
    sd = on.metrics["speculative_decoding"]
    assert sd["num_draft_tokens"] > 0 and sd["num_accepted_draft_tokens"] == sd["num_draft_tokens"]
    assert_clean(llm)


def test_a_step_that_fails_before_commit_can_run_again(
    target_dir, draft_dir, want, monkeypatch
) -> None:
    """Propose and forward change nothing the core cannot take back: after a failure in
    verify of a batched step, the engine re-runs each row alone (failure isolation) and
    every request ends with exactly the tokens of a run that never failed."""
    from draftwise.engine import LLMEngine

    llm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=spec(draft_dir, 3),
              max_num_seqs=4)
    engine = llm.engine
    ids = [engine.add_request({"prompt_token_ids": p}, greedy()) for p in PROMPTS]
    real, calls = LLMEngine._verify, {"n": 0}

    def flaky(self, rows, drafts, logits):
        calls["n"] += 1
        if calls["n"] == 3:
            assert len(rows) > 1, "the injected failure must hit a batched step"
            raise RuntimeError("injected")
        return real(self, rows, drafts, logits)

    monkeypatch.setattr(LLMEngine, "_verify", flaky)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        assert all(o.error is None for o in outs)
        done.update({o.request_id: o.outputs[0].token_ids for o in outs if o.finished})
    assert calls["n"] > 3 and [done[i] for i in ids] == want
    assert_clean(llm)


def test_min_draft_confidence_stops_unsure_rows_and_stays_identical(target_dir, draft_dir, want):
    """Rule 5 through the engine: the jittered draft's confidences straddle 0.25 (median
    ~0.24), so some rows stop after an unsure draft and others go the whole k; at 1.0
    every row stops after its first draft (one forward per step). Greedy output never moves."""
    got, llm = generate(target_dir, spec(draft_dir, 4, min_draft_confidence=0.25), PROMPTS,
                        max_num_seqs=4)
    assert got == want
    s = llm.engine.spec.proposer_stats()[0]
    assert s["confidence_stops"] > 0
    assert s["rows_drafted"] < s["draft_tokens"] < 4 * s["rows_drafted"]
    assert_clean(llm)
    got, llm = generate(target_dir, spec(draft_dir, 4, min_draft_confidence=1.0), PROMPTS,
                        max_num_seqs=4)
    assert got == want
    s = llm.engine.spec.proposer_stats()[0]
    # rows with room for one draft only are never asked: stops <= rows
    assert s["draft_tokens"] == s["rows_drafted"] >= s["confidence_stops"] > 0
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert_clean(llm)


def test_adaptive_depths_price_stops_unsure_rows_and_stays_identical(
        target_dir, draft_dir, want, monkeypatch) -> None:
    """Rule 7 through the engine: adaptive depth (the default) hands each row its price of
    a deeper draft, and the row stops once its drafts' confidences multiply below it.
    With the cap chosen every step and a price of 0.06, the jittered draft (confidences
    ~0.24) goes past its first draft and mostly stops after its second; greedy output
    never moves."""
    from draftwise.spec.adaptive import DepthPolicy

    seen: list[float] = []
    real_propose = DraftModelProposer.propose

    def spy(self, batch):
        seen.extend(r.stop_below for r in batch.rows)
        return real_propose(self, batch)

    monkeypatch.setattr(DepthPolicy, "choose", lambda self, estimates, caps: list(caps))
    monkeypatch.setattr(DepthPolicy, "stop_below", lambda self, num_rows: 0.06)
    monkeypatch.setattr(DraftModelProposer, "propose", spy)
    got, llm = generate(target_dir, spec(draft_dir, 4), PROMPTS, max_num_seqs=4)
    assert got == want
    s = llm.engine.spec.proposer_stats()[0]
    assert s["price_stops"] > 0 and s["confidence_stops"] == 0
    assert s["rows_drafted"] < s["draft_tokens"] < 3 * s["rows_drafted"]
    assert seen and set(seen) == {0.06}
    assert_clean(llm)
    # fixed depth hands no price: every row drafts its whole k
    seen.clear()
    got, llm = generate(target_dir, spec(draft_dir, 4, draftwise={"adaptive": False}),
                        PROMPTS, max_num_seqs=4)
    assert got == want and set(seen) == {0.0}
    assert llm.engine.spec.proposer_stats()[0]["price_stops"] == 0


def test_evidence_is_the_band_of_the_first_drafts_confidence(target_dir, draft_dir, want,
                                                            monkeypatch) -> None:
    """Rule 6: each drafting row's evidence is its depth-0 confidence in 5 bands; the
    jittered draft's confidences straddle 0.2, so both bands 0 and 1 occur; output never
    moves (adaptive depth cuts on the bands: test_adaptive_engine)."""
    import draftwise_draft_model.proposer as proposer_module

    firsts: list[list[float]] = []  # per propose call, the depth-0 confidences
    outs: list[tuple[list[int], list[int] | None]] = []
    confidence, propose = proposer_module.draft_confidence, DraftModelProposer.propose

    def record_confidence(logits):
        got = confidence(logits)
        if len(firsts) == len(outs):  # the call's first: depth 0
            firsts.append(got.tolist())
        return got

    def record_propose(self, batch):
        out = propose(self, batch)
        outs.append((list(out.num_draft_tokens), out.evidence))
        return out

    monkeypatch.setattr(proposer_module, "draft_confidence", record_confidence)
    monkeypatch.setattr(DraftModelProposer, "propose", record_propose)
    # fixed depth: every step's depth-0 confidences are recorded, no probe or parked row
    got, llm = generate(target_dir, spec(draft_dir, 3, draftwise={"adaptive": False}), PROMPTS,
                        max_num_seqs=4)
    assert got == want
    seen = set()
    for confs, (counts, evidence) in zip(firsts, outs):
        drafting = [e for n, e in zip(counts, evidence or []) if n]
        assert drafting == [min(4, int(c * 5)) for c in confs]
        seen.update(drafting)
    assert {0, 1} <= seen <= set(range(5))
    assert_clean(llm)
