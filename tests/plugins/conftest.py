"""Helpers the method plugins' engine tests share (dflash, dspark and its SpecForge lane)."""

from __future__ import annotations

from draftwise import LLM, SamplingParams


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
