"""A request that fails inside a step fails alone: the others in that step go on, unchanged.

The fault is injected where a real per-request failure would surface (verify builds each
row's sampling tensors; a proposer drafts each row), and keyed on one request's sampling
params, so only that request's row can trigger it. Each survivor's tokens must equal its
solo run (bf16 is batch-invariant), and every KV block and recurrent slot must come back.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny

import draftwise.spec.verify
from draftwise import LLM, SamplingParams
from draftwise.request import RequestStatus

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = [[5, 9, 13, 2, 7], list(range(20, 57)), [100, 101, 102], [42] * 11]
#: the culprit is recognised by this max_tokens (no other request asks for it)
CULPRIT_MAX_TOKENS = 9


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("isolation-llama"), seed=3)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(tmp_path_factory.mktemp("isolation-hybrid"), "qwen3_5")


def greedy(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


class Boom(RuntimeError):
    """The injected fault."""


@pytest.fixture
def faulty_verify(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """verify() raises whenever the culprit is among its rows; yields the call count."""
    real = draftwise.spec.verify.verify
    calls = [0]

    def verify(logits, flat, num_draft, params, generators, **kw):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if any(p.max_tokens == CULPRIT_MAX_TOKENS for p in params):
            raise Boom("injected fault in one request's sampling")
        return real(logits, flat, num_draft, params, generators, **kw)

    monkeypatch.setattr(draftwise.spec.verify, "verify", verify)
    yield calls


def alone(path: Path, **kw: object) -> list[list[int]]:
    llm = LLM(model=str(path), dtype="bfloat16", **kw)
    return [
        llm.generate({"prompt_token_ids": p}, greedy())[0].outputs[0].token_ids for p in PROMPTS
    ]


def run_with_culprit(llm: LLM, culprit: int) -> tuple[list[list[int]], object]:
    """All prompts batched, then a culprit copy of PROMPTS[culprit] joins while they decode.

    Joining late puts the fault in a step whose other rows are mid-decode (their state
    advanced by earlier steps), which is what a retry must not get wrong.
    """
    engine = llm.engine
    ids = [engine.add_request({"prompt_token_ids": p}, greedy()) for p in PROMPTS]
    final = {}
    steps = 0
    bad = None
    while engine.has_unfinished_requests():
        steps += 1
        assert steps < 500, "the engine must not spin on a failing request"
        if steps == 4:
            bad = engine.add_request(
                {"prompt_token_ids": PROMPTS[culprit]}, greedy(CULPRIT_MAX_TOKENS)
            )
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[i].outputs[0].token_ids for i in ids], final[bad]


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3,
                                         "prompt_lookup_min": 1, "prompt_lookup_max": 2}])
def test_a_failing_request_fails_alone_and_the_rest_are_unchanged(
    tiny_llama: Path, faulty_verify: list[int], spec: dict | None
) -> None:
    want = alone(tiny_llama)
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", speculative_config=spec)
    got, bad = run_with_culprit(llm, culprit=1)
    assert got == want
    assert bad.finished and bad.outputs[0].finish_reason == RequestStatus.FINISHED_ERROR.value
    assert bad.error is not None and "Boom" in bad.error and "injected" in bad.error
    assert llm.engine.kv.num_used_blocks == 0
    assert not llm.engine.scheduler.requests


def test_a_chunked_prefill_in_the_failed_step_is_retried(
    tiny_llama: Path, faulty_verify: list[int]
) -> None:
    """A small budget leaves a prefill half done in the failing step; it still ends right."""
    want = alone(tiny_llama)
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", max_num_batched_tokens=16, block_size=4)
    got, bad = run_with_culprit(llm, culprit=0)
    assert got == want
    assert bad.error is not None
    assert llm.engine.kv.num_used_blocks == 0


def test_recurrent_state_is_recomputed_not_reused(hybrid: Path, faulty_verify: list[int]) -> None:
    """The failed forward advanced every row's GDN state in place; retries must not reuse it."""
    want = alone(hybrid)
    llm = LLM(model=str(hybrid), dtype="bfloat16", max_num_seqs=8)
    got, bad = run_with_culprit(llm, culprit=2)
    assert got == want
    assert bad.error is not None
    assert llm.engine.runner.states is not None and llm.engine.runner.states.num_used_slots == 0


def test_a_failure_in_commit_fails_that_row_only(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-row work after verify (detokenize, stops) failing: that row alone, no retry needed."""
    want = alone(tiny_llama)
    llm = LLM(model=str(tiny_llama), dtype="bfloat16")
    engine = llm.engine
    import draftwise.engine as engine_mod

    real = engine_mod.append_tokens

    def append(req, toks):  # type: ignore[no-untyped-def]
        if req.params.max_tokens == CULPRIT_MAX_TOKENS and req.num_output_tokens >= 2:
            raise Boom("injected fault while committing")
        return real(req, toks)

    monkeypatch.setattr(engine_mod, "append_tokens", append)
    got, bad = run_with_culprit(llm, culprit=3)
    assert got == want
    assert bad.error is not None and "committing" in bad.error
    assert len(bad.outputs[0].token_ids) == 2
    assert engine.kv.num_used_blocks == 0
