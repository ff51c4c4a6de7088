"""The offline acceptance estimate is what the engine measures online, step for step.

The walk is checked twice: as a pure function on tables of which slots matched, and on a
tiny target against the engine itself (greedy, fixed depth, float32 so that the training
forward and the engine's paged-KV forward pick the same drafts): the estimate's draft
steps, accepted tokens and per-position counts must equal the engine's metrics on the
same prompts, with drafts accepted (so the context after an accepted run, the bonus
token's, is exercised) and drafts rejected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from draftwise.train.acceptance import estimate_acceptance, walk_steps
from draftwise.train.dflash import load_target, make_shape
from draftwise.train.dflash_layout import load_weights
from draftwise.train.dflash_net import DFlashNet
from draftwise.train.shards import Sequence
from spec_sampling import fixed_depth

from .conftest import PROMPTS, TAPS, plan


def test_the_walk_moves_by_accepted_plus_one_and_cuts_drafts_to_the_tokens_left() -> None:
    # a row of 10 tokens whose response starts at 2: anchors 2 .. 7 can draft
    hits = [[True, True, False], [True, True, True], [True, True, True],
            [False, True, True], [True, True, True], [True, False, True]]
    hits = [h[: min(3, 10 - (2 + i) - 2)] for i, h in enumerate(hits)]  # anchor 6: 2, 7: 1
    # anchor 2 accepts 2; anchor 5 none; anchor 6 (two slots left) both; 9 is the end
    assert walk_steps(hits, 2, 10, 3) == [(3, 2), (3, 0), (2, 2)]


def test_a_uniform_anchor_average_over_reads_the_walk() -> None:
    # easy stretches accept a whole block, hard ones nothing: every anchor counted once
    # says 2.5 tokens a step; the walk strides over the easy ones and says 1.6
    hits = ([[True] * 3] * 8 + [[False] * 3] * 8) * 4
    length = 2 + len(hits) + 5
    hits += [[False] * min(3, length - a - 2) for a in range(2 + len(hits), length - 2)]
    steps = walk_steps(hits, 2, length, 3)
    walk = 1 + sum(m for _, m in steps) / len(steps)
    anchors = 1 + sum(sum(h) for h in hits[:64]) / 64
    assert anchors == 2.5 and walk < 1.7


def test_the_estimate_equals_the_engines_online_acceptance(tiny_target: str,
                                                           trained: Path) -> None:
    from draftwise import LLM, SamplingParams
    from draftwise.models.loader import load_model
    from draftwise.train.record import TapRecorder

    t = load_target(tiny_target)
    net = DFlashNet(make_shape(plan(tiny_target, trained, trained), t, TAPS))
    load_weights(net, trained)
    net.eval()
    k = net.shape.block_size - 1
    llm = LLM(model=tiny_target, dtype="float32", speculative_config=fixed_depth(
        {"method": "dflash", "model": str(trained), "num_speculative_tokens": k}))
    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt", "zz top", "the dog"]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    online = llm.engine.spec.metrics
    recorder = TapRecorder(load_model(tiny_target, dtype="float32"), TAPS, 512)
    seqs = []
    for out in outs:
        ids = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        states = {n: v.numpy() for n, v in recorder.record(ids).items()}
        seqs.append(Sequence(np.asarray(ids, dtype=np.int32), len(out.prompt_token_ids),
                             states))

    def taps_of(seq: Sequence) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([seq.states["tap0"], seq.states["final"]], 1))

    est = estimate_acceptance(net, seqs, taps_of, t.embed, t.head)
    assert est.sequences == len(prompts) and est.skipped_sampled == 0
    assert 0 < online.num_accepted_tokens < online.num_draft_tokens  # accepts and rejects
    assert est.steps == online.num_drafts
    assert [round(x * est.steps) for x in est.per_position] == \
        online.num_accepted_tokens_per_pos
    assert est.mean_length == pytest.approx(online.summary()["mean_acceptance_length"])


def test_a_saved_drafter_is_estimated_again_as_its_run_did(tiny_target: str, tiny_data: Path,
                                                            trained: Path) -> None:
    import json

    from click.testing import CliRunner
    from draftwise.cli import cli
    from draftwise.train.dflash import REPORT

    last = json.loads((trained / REPORT).read_text())["acceptance"]
    assert last["sequences"] >= 1 and last["steps"] >= 1
    result = CliRunner().invoke(cli, ["train", "estimate", "--drafter", str(trained),
                                      "--data", str(tiny_data), "--model", tiny_target])
    assert result.exit_code == 0, result.output
    assert {"step": last["step"], **json.loads(result.output)} == last
