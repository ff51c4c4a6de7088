"""Speculation through the whole engine: losslessness with a scripted drafter plugin.

The drafter is installed as a (fake) distribution, so the engine finds it the way it
finds any third-party method. It drafts from a script written by the test, which
controls how many drafts are right: greedy output must be token-identical to
speculation off whatever the drafts are, and under sampling the joint distribution of
the first two tokens must match speculation off, for one-hot and probabilistic drafts,
standard and block verification. The same test with a broken accept rule must fail.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from spec_sampling import fixed_depth
from stats import CHI2_9999, chi2_two_sample
from tiny_checkpoints import save_tiny

from draftwise import LLM, SamplingParams

PLUGIN = '''
from __future__ import annotations
import json
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from draftwise import hookimpl
from draftwise.speculator import Capabilities, Drafts, Speculator


class ScriptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    script_path: str


class ScriptProposer:
    """Drafts from a JSON script: {context: [[token, q], ...]} keyed by generated tokens."""

    def __init__(self, options, ctx):
        with open(options.script_path) as f:
            data = json.load(f)
        self.prompt_len = data["prompt_len"]
        self.table = {tuple(json.loads(k)): v for k, v in data["table"].items()}
        self.k = ctx.num_speculative_tokens
        self.vocab = ctx.vocab_size
        self.probabilistic = ctx.draft_sample_method == "probabilistic"
        self.gen = torch.Generator().manual_seed(1234)
        self.proposed = 0

    def propose(self, batch):
        ids, counts, probs = [], [], []
        for row in batch.rows:
            ctx = tuple(int(t) for t in row.token_ids[self.prompt_len:])
            n = 0
            while n < min(self.k, row.max_draft) and ctx in self.table:
                cands = self.table[ctx]
                toks = torch.tensor([c[0] for c in cands])
                q = torch.tensor([c[1] for c in cands], dtype=torch.float32)
                pick = int(toks[torch.multinomial(q, 1, generator=self.gen)])
                full = torch.zeros(self.vocab)
                full[toks] = q
                ids.append(pick)
                probs.append(full)
                ctx = ctx + (pick,)
                n += 1
            counts.append(n)
        self.proposed += sum(counts)
        draft_probs = torch.stack(probs) if (self.probabilistic and probs) else None
        return Drafts(np.asarray(ids, dtype=np.int64), counts, draft_probs)

    def on_verified(self, outcome):
        pass

    def release(self, req_id):
        pass


def make(options, ctx):
    return ScriptProposer(options, ctx)


@hookimpl
def register_speculators(register):
    register(Speculator(method="scripted", options=ScriptOptions, make_proposer=make,
                        capabilities=Capabilities(draft_probs=True)))
'''

PROMPT = [7, 3, 11, 5, 2, 9]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("spec-llama"), seed=5, std=0.25)


@pytest.fixture
def scripted(make_dist: Any) -> None:
    make_dist("acme-scripted", "1.0", {"scripted": "acme_scripted"}, {"acme_scripted": PLUGIN})


def write_script(path: Path, table: dict[tuple[int, ...], list[tuple[int, float]]]) -> str:
    data = {
        "prompt_len": len(PROMPT),
        "table": {json.dumps(list(k)): [list(c) for c in v] for k, v in table.items()},
    }
    path.write_text(json.dumps(data))
    return str(path)


def spec_config(script: str, k: int, **extra: Any) -> dict[str, Any]:
    return {"method": "scripted", "num_speculative_tokens": k, "script_path": script, **extra}


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_identical_with_right_and_wrong_drafts(
    tiny: Path, scripted: None, tmp_path: Path, k: int
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    off = LLM(model=str(tiny), dtype="bfloat16").generate({"prompt_token_ids": PROMPT}, params)
    ref = off[0].outputs[0].token_ids
    # script the true continuation, but make positions 1 and 3 of every 5 wrong
    table = {}
    for i in range(len(ref)):
        tok = (ref[i] + 1) % 512 if i % 5 in (1, 3) else ref[i]
        table[tuple(ref[:i])] = [(tok, 1.0)]
    script = write_script(tmp_path / "script.json", table)
    # fixed depth: the wrong drafts sit at known positions of k-deep drafts, and adaptive
    # depth (the default) parks this single request after its first rejections
    llm = LLM(model=str(tiny), dtype="bfloat16",
              speculative_config=spec_config(script, k, draftwise={"adaptive": False}))
    on = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert on.outputs[0].token_ids == ref
    sd = on.metrics["speculative_decoding"]
    assert sd["num_draft_tokens"] > 0 and sd["num_accepted_draft_tokens"] > 0
    if k > 1:
        assert sd["num_accepted_draft_tokens"] < sd["num_draft_tokens"], "some drafts must fail"
    assert llm.engine.kv.num_used_blocks == 0


def top3(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return torch.topk(logits, 3).indices.tolist()


@pytest.fixture(scope="module")
def sampling_script(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """q over the target's top-3 tokens, in the reverse of the target's order."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    q = (0.1, 0.3, 0.6)
    table: dict[tuple[int, ...], list[tuple[int, float]]] = {}
    first = top3(model, PROMPT)
    table[()] = list(zip(first, q))
    with torch.no_grad():  # cover near-ties: our bf16 top-3 may differ from fp32's
        likely = torch.topk(model(torch.tensor([PROMPT])).logits[0, -1], 6).indices.tolist()
    for t in likely:
        table[(t,)] = list(zip(top3(model, PROMPT + [t]), q))
    return write_script(tmp_path_factory.mktemp("script") / "q.json", table)


def sample_pairs(tiny: Path, config: dict[str, Any] | None, n: int, seed: int) -> Counter:
    """Joint counts of the first two generated tokens over ``n`` seeded requests.

    Three tokens are generated so that the step producing the second one has room for
    a draft (the scheduler drafts no further than ``max_tokens``). At fixed depth: the
    accept rule is under test at every request's draft (``spec_sampling.fixed_depth``).
    """
    config = fixed_depth(config) if config is not None else None
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config=config, max_num_seqs=256,
              enable_prefix_caching=True)
    params = [
        SamplingParams(temperature=1.0, top_k=3, max_tokens=3, seed=seed * 100_000 + i,
                       ignore_eos=True)
        for i in range(n)
    ]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * n, params)
    if config is not None:
        assert llm.engine.spec.metrics.num_draft_tokens >= n, "every request must be drafted for"
    return Counter(tuple(o.outputs[0].token_ids[:2]) for o in outs)


N = 2500


@pytest.fixture(scope="module")
def reference_pairs(tiny: Path) -> Counter:
    return sample_pairs(tiny, None, N, seed=1)


@pytest.mark.parametrize(
    ("draft_sample_method", "rejection_sample_method"),
    [("greedy", "standard"), ("probabilistic", "standard"), ("greedy", "block"),
     ("probabilistic", "block")],
)
def test_sampling_distribution_matches_spec_off(
    tiny: Path, scripted: None, sampling_script: str, reference_pairs: Counter,
    draft_sample_method: str, rejection_sample_method: str,
) -> None:
    config = spec_config(sampling_script, 2, draft_sample_method=draft_sample_method,
                         rejection_sample_method=rejection_sample_method)
    on = sample_pairs(tiny, config, N, seed=2)
    stat, dof = chi2_two_sample(reference_pairs, on)
    assert stat < CHI2_9999[dof], (stat, dof, reference_pairs, on)


def test_wrong_accept_rule_is_detected(
    tiny: Path, scripted: None, sampling_script: str, reference_pairs: Counter,
    wrong_accept_rule: None,
) -> None:
    config = spec_config(sampling_script, 2, draft_sample_method="probabilistic")
    on = sample_pairs(tiny, config, N, seed=2)
    stat, dof = chi2_two_sample(reference_pairs, on)
    assert stat > CHI2_9999[dof], "a wrong accept rule must be caught by the distribution test"
