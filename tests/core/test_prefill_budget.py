"""A long prompt never stalls a running stream for more than a bounded step (issue 40).

While any running request decodes, a step's prefill rows together do at most
``long_prefill_token_threshold`` tokens' work at context 0 (``draftwise.prefill_budget``).
These tests count tokens per step, never time: each engine step's schedule is recorded
and checked against the bound, with and without ``prompt_logprobs``, and the outputs
(greedy tokens, prompt log-probabilities) are the same as with the bound off, with
speculation on (n-gram) and off.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from draftwise import LLMEngine, SamplingParams
from draftwise.engine_args import EngineArgs
from draftwise.prefill_budget import PrefillBudget, attention_context_scale, logits_share
from draftwise.scheduler import SchedulerOutput
from tiny_checkpoints import save_tiny

#: the victim's prompt, and the long prompt's (the tiny llama's context is 512)
VICTIM = [5, 9, 13, 2, 7, 11]
LONG = [(i * 37 + 11) % 500 + 3 for i in range(480)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("prefill-budget"), seed=3)


# -- the bound itself ---------------------------------------------------------------------

SMOLLM2 = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64, intermediate_size=1536, num_hidden_layers=30,
                          vocab_size=49152)


def test_smollm2_context_scale_is_its_multiply_add_ratio() -> None:
    # (576 * 1536 + 3 * 576 * 1536) / (2 * 9 * 64)
    assert attention_context_scale(SMOLLM2) == 3072
    assert logits_share(SMOLLM2) == pytest.approx(576 * 49152 / (30 * 576 * 6144))
    hybrid = SimpleNamespace(base=SMOLLM2, layer_types=["linear_attention"] * 3
                             + ["full_attention"])
    assert attention_context_scale(hybrid) == 4 * 3072


@pytest.mark.parametrize("scale", [1, 7, 3072])
@pytest.mark.parametrize("logits", [False, True])
def test_tokens_is_the_most_that_fits(scale: int, logits: bool) -> None:
    budget = PrefillBudget(256, scale, logits_share=0.27)
    for start in (0, 1, 255, 1000, 8191):
        for spent in (0, 1, budget.limit // 3, budget.limit - 1, budget.limit):
            n = budget.tokens(start, 10**6, spent, logits)
            if n > 1 or spent:
                assert budget.work(start, n, logits) <= budget.limit - spent
            assert budget.work(start, n + 1, logits) > budget.limit - spent
            assert n >= (1 if spent == 0 else 0)  # a step's first prefill row progresses
            assert budget.tokens(start, 3, spent, logits) == min(n, 3)
    assert budget.tokens(0, 10**6, 0) == 256  # at context 0 the work is the threshold's
    if scale == 3072:  # a prompt's logits cost its chunks about a fifth
        assert 0.75 * 256 < budget.tokens(0, 10**6, 0, logits=True) < 0.85 * 256


def test_chunks_shrink_as_the_prefix_grows() -> None:
    budget = PrefillBudget(256, 3072)
    sizes = [budget.tokens(s, 10**6, 0) for s in (0, 2048, 4096, 8000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] // 3


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        PrefillBudget(-1, 3072)


# -- the engine: tokens counted per step -----------------------------------------------------

def record_steps(engine: LLMEngine) -> list[tuple[int, int]]:
    """Wrap the scheduler so every step logs (decode rows, prefill tokens), counted
    before the step runs (when ``is_decoding`` still says which rows decode)."""
    log: list[tuple[int, int]] = []
    schedule = engine.scheduler.schedule

    def logged() -> SchedulerOutput:
        out = schedule()
        decode = [r for r in out.rows if r.request.is_decoding]
        prefill = [r for r in out.rows if not r.request.is_decoding]
        log.append((len(decode), sum(r.num_new_tokens for r in prefill)))
        budget = engine.scheduler.prefill_budget
        if decode and budget is not None and budget.enabled:
            work = sum(budget.work(r.request.num_computed_tokens, r.num_new_tokens,
                                   r.request.params.prompt_logprobs is not None)
                       for r in prefill)
            assert work <= budget.limit or len(prefill) == 1 and prefill[0].num_new_tokens == 1
        return out

    engine.scheduler.schedule = logged  # type: ignore[method-assign]
    return log


def run_beside(tiny: Path, prompt_logprobs: int | None = None, spec: dict | None = None,
               **engine_kw: object) -> tuple[dict[str, object], list[tuple[int, int]],
                                             LLMEngine]:
    """A greedy victim decodes; a long prompt arrives after its third step. Returns each
    request's final output, the step log and the engine."""
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", speculative_config=spec,
                                  **engine_kw))  # type: ignore[arg-type]
    log = record_steps(engine)
    greedy = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    engine.add_request({"prompt_token_ids": VICTIM}, greedy, request_id="victim")
    final: dict[str, object] = {}
    steps = 0
    while engine.has_unfinished_requests():
        if steps == 3:
            long_params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                         prompt_logprobs=prompt_logprobs)
            engine.add_request({"prompt_token_ids": LONG}, long_params, request_id="long")
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
    return final, log, engine


@pytest.mark.parametrize("prompt_logprobs", [None, 5], ids=["plain", "prompt_logprobs"])
def test_default_bound_holds_while_a_stream_decodes(tiny: Path,
                                                    prompt_logprobs: int | None) -> None:
    # today's defaults: max_num_batched_tokens 2048 would feed all 480 prompt tokens in the
    # victim's next step
    _, log, engine = run_beside(tiny, prompt_logprobs)
    threshold = EngineArgs().long_prefill_token_threshold
    assert 0 < threshold < len(LONG)
    beside = [prefill for decode, prefill in log if decode and prefill]
    assert len(beside) >= 2, "the long prompt must be prefilled beside the victim"
    assert max(beside) <= threshold
    assert sum(beside) == len(LONG)  # the victim was decoding all along
    assert engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("prompt_logprobs", [None, 5], ids=["plain", "prompt_logprobs"])
def test_later_chunks_are_shorter(tiny: Path, prompt_logprobs: int | None) -> None:
    _, log, engine = run_beside(tiny, prompt_logprobs, long_prefill_token_threshold=32)
    budget = engine.scheduler.prefill_budget
    assert budget is not None and budget.context_scale == 576  # the tiny llama's
    chunks = [prefill for decode, prefill in log if decode and prefill]
    assert max(chunks) <= 32 and sum(chunks) == len(LONG)
    assert chunks[-2] < chunks[0]  # (the last is what is left)
    if prompt_logprobs is None:
        assert chunks[0] == 32
    else:  # each position's logits are paid for too
        assert chunks[0] == budget.tokens(0, len(LONG), 0, logits=True) < 32


def test_without_decode_rows_prefill_takes_the_token_budget(tiny: Path) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16",
                                  long_prefill_token_threshold=16))
    log = record_steps(engine)
    engine.add_request({"prompt_token_ids": LONG},
                       SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert log[0] == (0, len(LONG))


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["off", "ngram"])
@pytest.mark.parametrize("prompt_logprobs", [None, 5], ids=["plain", "prompt_logprobs"])
def test_outputs_do_not_depend_on_the_bound(tiny: Path, spec: dict | None,
                                            prompt_logprobs: int | None) -> None:
    bounded, log, _ = run_beside(tiny, prompt_logprobs, spec, long_prefill_token_threshold=16)
    free, free_log, _ = run_beside(tiny, prompt_logprobs, spec, long_prefill_token_threshold=0)
    assert max(p for d, p in free_log if d) == len(LONG)  # off: one chunk beside the victim
    assert max(p for d, p in log if d) <= 16
    for rid in ("victim", "long"):
        a, b = bounded[rid], free[rid]
        assert a.outputs[0].token_ids == b.outputs[0].token_ids, rid  # type: ignore[attr-defined]
        assert a.prompt_logprobs == b.prompt_logprobs, rid  # type: ignore[attr-defined]
    if prompt_logprobs is not None:
        entries = bounded["long"].prompt_logprobs  # type: ignore[attr-defined]
        assert len(entries) == len(LONG) and entries[0] is None


def record_rows(engine: LLMEngine) -> list[dict[str, int]]:
    """Wrap the scheduler so every step logs each row's tokens by request id."""
    log: list[dict[str, int]] = []
    schedule = engine.scheduler.schedule

    def logged() -> SchedulerOutput:
        out = schedule()
        log.append({r.request.req_id: r.num_new_tokens for r in out.rows})
        return out

    engine.scheduler.schedule = logged  # type: ignore[method-assign]
    return log


@pytest.mark.parametrize("victim", [False, True], ids=["alone", "beside-a-stream"])
def test_a_newcomer_starts_at_once_beside_a_long_prompt(tiny: Path, victim: bool) -> None:
    # 64-token steps: the long prompt takes 8 steps even alone
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", max_num_batched_tokens=64,
                                  long_prefill_token_threshold=32))
    log = record_rows(engine)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    if victim:
        engine.add_request({"prompt_token_ids": VICTIM}, greedy, request_id="victim")
        engine.step()
    engine.add_request({"prompt_token_ids": LONG},
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       request_id="long")
    engine.step()
    engine.step()
    assert engine.scheduler.requests["long"].num_computed_tokens < len(LONG) - 64
    engine.add_request({"prompt_token_ids": [7, 8, 9, 10, 11, 12, 13, 14]}, greedy,
                       request_id="short")
    engine.step()
    # the newcomer's whole prompt ran in the step after it came, beside a shorter chunk
    assert log[-1]["short"] == 8
    budget = engine.scheduler.prefill_budget
    assert budget is not None
    start = engine.scheduler.requests["long"].num_computed_tokens - log[-1]["long"]
    assert budget.work(start, log[-1]["long"]) <= budget.limit // 2
    if not victim:  # before it came, the long prompt took whole 64-token steps
        assert [step["long"] for step in log[:2]] == [64, 64]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv.num_used_blocks == 0
