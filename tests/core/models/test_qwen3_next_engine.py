"""The GDN hybrid through the real engine: batching, chunked prefill, preemption, MTP spec.

bf16, greedy: every identity below is exact (token lists equal).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from draftwise import LLM, SamplingParams
from draftwise.models.linear import BlockedWeight

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = [
    [5, 9, 13, 2, 7],
    list(range(20, 57)),
    [100, 101, 102],
    [(i * 37) % 250 + 3 for i in range(23)],
]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(tmp_path_factory.mktemp("engine-hybrid"), "qwen3_5")


@pytest.fixture(scope="module")
def want(hybrid: Path) -> list[list[int]]:
    """Each prompt alone, plain engine."""
    return alone(hybrid)


def greedy(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def alone(path: Path, **kw: object) -> list[list[int]]:
    llm = LLM(model=str(path), dtype="bfloat16", **kw)
    return [
        llm.generate({"prompt_token_ids": p}, greedy())[0].outputs[0].token_ids for p in PROMPTS
    ]


def test_batched_chunked_preempted_equals_alone(hybrid: Path, want: list[list[int]]) -> None:
    llm = LLM(
        model=str(hybrid),
        dtype="bfloat16",
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=15,
        max_model_len=52,
        max_num_seqs=4,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    assert [o.outputs[0].token_ids for o in outs] == want
    assert llm.engine.stats.num_preemptions > 0, "the test must force a preemption"
    assert llm.engine.runner.states is not None and llm.engine.runner.states.num_used_slots == 0


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_mtp_speculation_is_token_identical(hybrid: Path, want: list[list[int]], k: int) -> None:
    llm = LLM(
        model=str(hybrid),
        dtype="bfloat16",
        # fixed depth: the witness below counts the head's forwards at k-deep drafts
        speculative_config={"method": "mtp", "num_speculative_tokens": k,
                            "draftwise": {"adaptive": False}},
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    assert [o.outputs[0].token_ids for o in outs] == want
    proposer = llm.engine.spec.proposers[0]
    # the head runs the target's native kernels (packed GEMMs, C attention and norms)
    head = proposer.head
    assert (head.attention, head.native) == ("native", True)
    assert isinstance(head.fc, BlockedWeight)
    assert all(isinstance(w, BlockedWeight) for layer in head.layers
               for w in (layer.gate_up_weight, layer.down_weight, layer.mixer.qkv_weight))
    assert proposer.witness.rows > 0 and proposer.witness.extra_forwards >= (k - 1)
    if k >= 2:
        assert proposer.witness.rows_beyond_copy > 0
    assert llm.engine.spec.metrics.num_drafts > 0


SCRIPTED = '''
import json

import numpy as np
from pydantic import BaseModel, ConfigDict

from draftwise import hookimpl
from draftwise.speculator import Drafts, Speculator


class ScriptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    script_path: str


class ScriptProposer:
    """One-hot drafts from {generated-so-far: next token}."""

    def __init__(self, options, ctx):
        with open(options.script_path) as f:
            data = json.load(f)
        self.prompt_len, self.k = data["prompt_len"], ctx.num_speculative_tokens
        self.table = {tuple(json.loads(key)): tok for key, tok in data["table"].items()}

    def propose(self, batch):
        ids, counts = [], []
        for row in batch.rows:
            ctx, n = tuple(int(t) for t in row.token_ids[self.prompt_len:]), 0
            while n < min(self.k, row.max_draft) and ctx in self.table:
                ids.append(self.table[ctx])
                ctx, n = ctx + (self.table[ctx],), n + 1
            counts.append(n)
        return Drafts(np.asarray(ids, dtype=np.int64), counts)

    def on_verified(self, outcome):
        pass

    def release(self, req_id):
        pass


@hookimpl
def register_speculators(register):
    register(Speculator(method="scripted", options=ScriptOptions,
                        make_proposer=lambda o, c: ScriptProposer(o, c)))
'''


@pytest.mark.parametrize("k", [1, 3])
def test_right_and_wrong_drafts_roll_back_recurrent_state(
    hybrid: Path, want: list[list[int]], make_dist, tmp_path: Path, k: int
) -> None:
    """Every accept length, including full accepts on the step that finishes the request."""
    import json

    make_dist("acme-scripted", "1.0", {"scripted": "acme_scripted"}, {"acme_scripted": SCRIPTED})
    prompt, ref = PROMPTS[3], want[3]
    table = {
        json.dumps(ref[:i]): (ref[i] + 1) % 256 if i % 5 in (1, 3) else ref[i] for i in range(12)
    }
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"prompt_len": len(prompt), "table": table}))
    # fixed depth: the wrong drafts sit at known positions of k-deep drafts, and adaptive
    # depth (the default) may park this lone request after its first rejection
    config = {"method": "scripted", "num_speculative_tokens": k, "script_path": str(script),
              "draftwise": {"adaptive": False}}
    llm = LLM(model=str(hybrid), dtype="bfloat16", speculative_config=config)
    out = llm.generate({"prompt_token_ids": prompt}, greedy())[0]
    assert out.outputs[0].token_ids == ref
    sd = out.metrics["speculative_decoding"]
    assert sd["num_accepted_draft_tokens"] > 0
    if k > 1:
        assert sd["num_accepted_draft_tokens"] < sd["num_draft_tokens"]
    assert llm.engine.runner.states is not None and llm.engine.runner.states.num_used_slots == 0
