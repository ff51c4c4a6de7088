"""Helpers the method plugins' engine tests share (dflash, draft_model, dspark and its
SpecForge lane): greedy runs through the whole engine and the books checked after them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftwise import LLM, SamplingParams


def greedy(n: int = 20) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def generate(target: Path, config: dict | None, prompts: list[list[int]], n: int = 20,
             **kw: Any) -> tuple[list[list[int]], LLM]:
    """Every prompt's greedy tokens from one bf16 engine (batch-invariant: identity is
    exact whatever shares the batch), and the engine, for its metrics and books."""
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(n))
    return [o.outputs[0].token_ids for o in outs], llm


def assert_clean(llm: LLM) -> None:
    """Every block and every draft state returned; the pool's books balance."""
    assert llm.engine.kv.num_used_blocks == 0
    assert llm.engine.spec.num_tracked_requests == 0
    llm.engine.kv.check_invariants()


def run_staggered(
    llm: LLM, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], int]:
    """Requests arriving while others decode: each prompt joins, two steps run, then the
    rest drain; with a small token budget the long prompt is also chunked.

    Returns every prompt's output tokens in prompt order, and how many of the steps after
    a second request joined ran with drafts made (0 with speculation off): the proof that
    a prefill shared a step with speculating rows.
    """
    engine = llm.engine
    ids: dict[str, int] = {}
    done: dict[str, list[int]] = {}
    mixed = 0
    for i, p in enumerate(prompts):
        ids[engine.add_request({"prompt_token_ids": p}, params)] = i
        for _ in range(2):
            outs = engine.step()
            done.update({o.request_id: o.outputs[0].token_ids for o in outs if o.finished})
            if engine.spec is not None:
                mixed += engine.spec.metrics.num_drafts > 0 and i > 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        done.update({o.request_id: o.outputs[0].token_ids for o in outs if o.finished})
    return [done[r] for r in ids], mixed
