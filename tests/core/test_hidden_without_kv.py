"""A drafter that reads the target's hidden states with no checkpoint and no KV of its own.

A Medusa-style head computed from the target alone: it names its tap on the proposer
(``TapsHidden``), and each of its rows carries the hidden states committed since the rows
it was last handed, the newest last. The plugin below is a third party's (a fake
distribution, kit imports only). Checked here: greedy output identical to speculation
off, rows carry exactly the new positions (never a backlog that grows), the last row's
LM head predicts the row's last token (the tap is the last layer's output before the
final norm), and a reader that names no tap, or one the target lacks, is refused by name
when the engine builds it (``draft_stage.hidden_taps``: the taps live on the proposer, so
plugin loading cannot see them), while the other methods keep running.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny

HEADLESS = '''
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from draftwise.kit import Capabilities, Drafts, Speculator, hookimpl

SEEN = []  # (req_id, first position, rows) per handed row, for the test


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tap: int | None = None
    no_taps: bool = False  # hidden_layers == (): names no layer


class Headless:
    """Drafts the target's own top tokens of the newest committed position, shifted."""

    def __init__(self, options, ctx):
        self.target = ctx.target.model
        last = ctx.target.config.num_hidden_layers - 1
        self._tap = last if options.tap is None else options.tap
        self.no_taps = options.no_taps
        self.hits = 0

    @property
    def hidden_layers(self):
        return () if self.no_taps else (self._tap,)

    def propose(self, batch):
        ids, counts = [], []
        for row in batch.rows:
            h = row.hidden.get(self._tap)
            if h is None or h.shape[0] == 0 or row.max_draft == 0:
                counts.append(0)
                continue
            SEEN.append((row.req_id, row.num_kv_computed, h.shape[0], len(row.token_ids)))
            logits = self.target.lm_head(self.target.final_norm(h[-1:]))
            top = torch.topk(logits[0], row.max_draft + 1).indices.tolist()
            self.hits += int(top[0] == int(row.token_ids[-1]))
            ids += top[1:row.max_draft + 1]
            counts.append(row.max_draft)
        return Drafts(np.asarray(ids, dtype=np.int64), counts)

    def on_verified(self, outcome):
        pass

    def release(self, req_id):
        pass

    def stats(self):
        return {"hits": self.hits}


class Untapped:
    """Reads hidden states but has no hidden_layers property at all (not TapsHidden)."""

    def __init__(self, options, ctx):
        pass

    def propose(self, batch):
        return Drafts.from_lists([[] for _ in batch.rows])

    def on_verified(self, outcome):
        pass

    def release(self, req_id):
        pass


@hookimpl
def register_speculators(register):
    register(Speculator(method="headless", options=Options,
                        make_proposer=lambda o, c: Headless(o, c),
                        capabilities=Capabilities(needs_target_hidden=True)))
    register(Speculator(method="untapped", options=Options,
                        make_proposer=lambda o, c: Untapped(o, c),
                        capabilities=Capabilities(needs_target_hidden=True)))
'''


@pytest.fixture
def headless(make_dist) -> object:
    make_dist("acme-headless", "1.0", {"headless": "acme_headless"},
              {"acme_headless": HEADLESS})
    import acme_headless

    acme_headless.SEEN.clear()
    return acme_headless


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5], [3, 3, 3]]


def test_greedy_identity_and_rows_carry_only_new_positions(tmp_path: Path, headless) -> None:
    from draftwise import LLM, SamplingParams

    path = str(save_tiny("llama", tmp_path / "m", seed=3))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    off = LLM(model=path, dtype="float32").generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params)
    llm = LLM(model=path, dtype="float32",
              speculative_config={"method": "headless", "num_speculative_tokens": 2})
    on = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off]
    assert llm.engine.kv.num_used_blocks == 0 and llm.engine.spec.num_tracked_requests == 0
    seen = headless.SEEN
    assert seen
    by_req: dict[str, list[tuple[int, int, int]]] = {}
    for req, first, rows, n_tokens in seen:
        # the rows run from where the last ones ended to the last position with K/V
        assert first + rows == n_tokens - 1
        by_req.setdefault(req, []).append((first, rows, n_tokens))
    for steps in by_req.values():
        for (f0, r0, _), (f1, _, _) in zip(steps, steps[1:]):
            assert f1 == f0 + r0  # nothing handed twice, nothing skipped
    # the tap is the last layer before the final norm: its LM head gives the last token
    proposer = llm.engine.spec.drafters[0].proposer
    assert proposer.hits == len(seen)


@pytest.mark.parametrize(("tap", "message"), [(-1, "named hidden layers \\[-1\\]"),
                                              (99, "named hidden layers \\[99\\]")])
def test_a_tap_the_target_lacks_is_refused_by_name(tmp_path: Path, headless, tap,
                                                   message) -> None:
    from draftwise import LLM
    from draftwise.plugins.errors import PluginRegistrationError

    path = str(save_tiny("llama", tmp_path / "m", seed=3))
    with pytest.raises(PluginRegistrationError, match=message):
        LLM(model=path, dtype="float32",
            speculative_config={"method": "headless", "num_speculative_tokens": 2, "tap": tap})


@pytest.mark.parametrize(("spec", "message"), [
    ({"method": "headless", "no_taps": True}, "acme-headless 1.0: method 'headless' named "
     "hidden layers \\[\\]"),
    ({"method": "untapped"}, "acme-headless 1.0: method 'untapped' needs target hidden "
     "states and reads no checkpoint, so its proposer must name its taps"),
])
def test_a_reader_that_names_no_tap_is_refused_when_its_engine_builds(
        tmp_path: Path, headless, spec, message) -> None:
    from draftwise import LLM, SamplingParams
    from draftwise.plugins.errors import PluginRegistrationError

    path = str(save_tiny("llama", tmp_path / "m", seed=3))
    with pytest.raises(PluginRegistrationError, match=message):
        LLM(model=path, dtype="float32",
            speculative_config={**spec, "num_speculative_tokens": 2})
    # only runs of that method stop: the same plugin host still serves every other one
    llm = LLM(model=path, dtype="float32",
              speculative_config={"method": "headless", "num_speculative_tokens": 2})
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
