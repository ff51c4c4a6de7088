"""The whole-engine sampling run the chi-square tests of every model-based drafter share.

``n`` seeded requests of one prompt (top-k 3, four tokens), counted by their 2nd and 3rd
tokens: those are drawn from positions the drafts cover, so a wrong accept rule or a
wrong q shows in the counts. With a config, the run is checked to have drafted every
request twice, rejected some drafts and returned every KV block.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from draftwise import LLM, SamplingParams


def fixed_depth(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` at vLLM's fixed depth (``"draftwise": {"adaptive": false}``).

    Adaptive depth is the default, and it verifies fewer drafts where they do not pay (a
    probe of one draft, k = 0 after rejections): a test of the accept rule or of a
    feature at every draft position needs each request drafted k deep, every step."""
    ns = config.get("draftwise")
    return {**config, "draftwise": {**(ns if isinstance(ns, dict) else {}), "adaptive": False}}


def sample_pairs(target: Path, config: dict[str, Any] | None, seed: int, prompt: list[int],
                 n: int, check: bool = True, temperature: float = 1.0) -> Counter:
    """Counts of (token 2, token 3) over ``n`` samples (see the module doc), at fixed depth."""
    if config is not None:
        config = fixed_depth(config)
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, max_num_seqs=256)
    params = [
        SamplingParams(temperature=temperature, top_k=3, max_tokens=4, seed=seed * 100_000 + i,
                       ignore_eos=True)
        for i in range(n)
    ]
    outs = llm.generate([{"prompt_token_ids": prompt}] * n, params)
    if config is not None and check:
        m = llm.engine.spec.metrics
        assert m.num_draft_tokens >= 2 * n, "every request must get two drafts"
        assert 0 < m.num_accepted_tokens < m.num_draft_tokens, "some drafts must be rejected"
        assert llm.engine.kv.num_used_blocks == 0
    return Counter(tuple(o.outputs[0].token_ids[1:3]) for o in outs)
