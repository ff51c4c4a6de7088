"""The model-based contract end to end with a third-party plugin: draft stage, draft KV
frontiers, the hidden-state channel, and the refusals of what the core cannot serve.

``kvprobe`` is what a new model-based method looks like from outside: a Loader whose
detect() decides k, whose load() asks for a KV layout and two target layers, and a
proposer that records what each row carried (frontier, block table, hidden shapes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_checkpoints import save_tiny

from draftwise import LLM, SamplingParams
from draftwise.plugins import PluginRegistrationError
from draftwise.spec.speculation import ProposerOutputError

PLUGIN = '''
from __future__ import annotations
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from draftwise import hookimpl
from draftwise.speculator import (
    Capabilities, DraftCheckpoint, Drafts, KVLayout, LoadedDraft, Speculator,
)

SEEN = []
OUTCOMES = []
MODE = {"kv_layout": True, "valid": "last", "too_many": False, "evidence": None}


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def check_checkpoint(self, k, config):
        return k if k is not None else config["n_predict"]


class Loader:
    def detect(self, path):
        return DraftCheckpoint(path, "probe", "probe", {"n_predict": 2})

    def load(self, checkpoint, options, target):
        layout = KVLayout(1, 1, 16, target.dtype) if MODE["kv_layout"] else None
        return LoadedDraft("weights", layout, hidden_layers=(0, 2), summary="probe")


class Probe:
    def __init__(self, options, ctx):
        self.ctx = ctx

    def propose(self, batch):
        ids, counts, valid = [], [], []
        for row in batch.rows:
            n = len(row.token_ids)
            shapes = {k: tuple(v.shape) for k, v in (row.hidden or {}).items()}
            SEEN.append((row.req_id, n, row.num_kv_computed, len(row.block_table), shapes))
            m = row.max_draft + (1 if MODE["too_many"] else 0)
            ids += [int(row.token_ids[-1])] * m
            counts.append(m)
            valid.append(n - 1 if MODE["valid"] == "last" else n + m - 1)
        value = MODE.get("evidence_value", 1)
        evidence = None if MODE["evidence"] is None else [value] * (len(counts) + MODE["evidence"])
        return Drafts(np.asarray(ids, dtype=np.int64), counts, kv_valid=valid,
                      evidence=evidence)

    def on_verified(self, outcome):
        OUTCOMES.append(outcome)

    def release(self, req_id):
        pass


@hookimpl
def register_speculators(register):
    register(Speculator(
        method="kvprobe", options=Options, make_proposer=lambda o, c: Probe(o, c),
        loader=Loader(),
        capabilities=Capabilities(needs_checkpoint=True, checkpoint_in_target=True,
                                  own_kv_cache=True, needs_target_hidden=True),
    ))
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("probe-llama"), seed=5, std=0.25)


@pytest.fixture
def probe(make_dist: Any) -> Any:
    make_dist("acme-probe", "1.0", {"kvprobe": "acme_probe"}, {"acme_probe": PLUGIN})
    import acme_probe

    acme_probe.SEEN.clear()
    acme_probe.OUTCOMES.clear()
    acme_probe.MODE.update(kv_layout=True, valid="last", too_many=False, evidence=None,
                           evidence_value=1)
    return acme_probe


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_k_from_the_checkpoint_frontiers_and_hidden_states(
    tiny: Path, probe: Any, caplog: pytest.LogCaptureFixture
) -> None:
    prompt = list(range(3, 23))  # 20 tokens
    plain = LLM(model=str(tiny), dtype="bfloat16").generate({"prompt_token_ids": prompt},
                                                             greedy(10))[0]
    with caplog.at_level("INFO", logger="draftwise.bootstrap"):
        # fixed depth: every propose below is checked, and adaptive depth's cost model
        # (the default) times batches a 64-block pool cannot hold (refused at start-up)
        llm = LLM(model=str(tiny), dtype="bfloat16", num_kv_blocks=64,
                  speculative_config={"method": "kvprobe", "draftwise": {"adaptive": False}})
    # one budget for the target's KV and the draft's, stated at startup
    assert any(
        "KV cache: 64 blocks x 16 tokens = 0.8 MiB (target 0.8 MiB, drafts 0.1 MiB in 1 cache(s))"
        in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    out = llm.generate({"prompt_token_ids": prompt}, greedy(10))[0]
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert llm.engine.spec.k == 2  # from detect(): the checkpoint decided k
    assert llm.engine.spec.hidden_layers == (0, 2)
    first = probe.SEEN[0]
    # the first propose: nothing in the draft KV yet, hidden states of the whole prompt
    assert first[1:4] == (21, 0, 2) and first[4] == {0: (20, 128), 2: (20, 128)}
    for (_, n, frontier, blocks, shapes), (_, n2, f2, _, _) in zip(probe.SEEN, probe.SEEN[1:]):
        assert shapes[0][0] == n - 1 - frontier  # hidden from the frontier to the last target KV
        assert f2 == n - 1  # kv_valid=n-1 was kept: it is below what verify committed
        assert blocks * 16 >= n - 1 + 2
    assert llm.engine.spec.num_tracked_requests == 0 and llm.engine.kv.num_used_blocks == 0
    # feedback: every drafted row's outcome, the accepted drafts then one more token
    outcomes = probe.OUTCOMES
    assert sum(len(o.req_ids) for o in outcomes) == llm.engine.spec.metrics.num_drafts
    for o in outcomes:
        for nd, acc, toks in zip(o.num_draft_tokens, o.num_accepted, o.output_token_ids):
            assert 0 <= acc <= nd and len(toks) == acc + 1


def test_kv_valid_past_the_accepted_drafts_is_cut_to_what_was_committed(
    tiny: Path, probe: Any
) -> None:
    probe.MODE["valid"] = "all"  # claims its KV is right through every draft
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config={"method": "kvprobe"})
    out = llm.generate({"prompt_token_ids": list(range(3, 23))}, greedy(10))[0]
    accepted = out.metrics["speculative_decoding"]["acceptance_histogram"]
    seen = probe.SEEN
    for (_, n, _, _, _), (_, n2, f2, _, _) in zip(seen, seen[1:]):
        assert f2 == min(n + 1, n2 - 1)  # kv_valid = n + 2 - 1, cut at the committed tokens
    assert sum(accepted) > 0


def test_an_own_kv_method_whose_loader_reports_no_layout_is_refused(
    tiny: Path, probe: Any
) -> None:
    probe.MODE["kv_layout"] = False
    with pytest.raises(PluginRegistrationError, match="declares own_kv_cache but its loader"):
        LLM(model=str(tiny), dtype="bfloat16", speculative_config={"method": "kvprobe"})


def test_drafts_that_do_not_fit_the_batch_name_the_method(tiny: Path, probe: Any) -> None:
    probe.MODE["too_many"] = True
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config={"method": "kvprobe"})
    # the request fails alone (engine failure isolation), its error naming the method
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy(6))[0]
    assert out.outputs[0].finish_reason == "error"
    assert out.error is not None and ProposerOutputError.__name__ in out.error
    assert "method 'kvprobe' returned a row got more" in out.error


def test_evidence_that_does_not_fit_the_batch_names_the_method(tiny: Path, probe: Any) -> None:
    probe.MODE["evidence"] = 1  # one value more than rows
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config={"method": "kvprobe"})
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy(6))[0]
    assert out.outputs[0].finish_reason == "error"
    assert "method 'kvprobe' returned 2 evidence values for 1 rows" in (out.error or "")


@pytest.mark.parametrize("value", [-1, 1.5, True, 70_000])
def test_evidence_that_is_not_a_small_integer_names_the_method(
    tiny: Path, probe: Any, value: Any
) -> None:
    """Adaptive depth keeps an estimate per evidence value: a float, a bool, a negative
    or a huge value is a plugin bug, refused by name (not a dict that grows for ever)."""
    probe.MODE.update(evidence=0, evidence_value=value)
    llm = LLM(model=str(tiny), dtype="bfloat16", speculative_config={"method": "kvprobe"})
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy(6))[0]
    assert out.outputs[0].finish_reason == "error"
    assert "method 'kvprobe' returned an evidence value that is not an integer" in (out.error or "")
