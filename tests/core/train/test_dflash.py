"""``draftwise train dflash`` on a tiny target: it learns, it saves what the engine runs
losslessly, it resumes exactly, and it refuses bad inputs by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from draftwise.cli import cli
from draftwise.errors import DraftwiseError
from draftwise.train.dflash import REPORT, STATE, TrainResumeError, train_dflash
from draftwise.train.shards import DataFolderError

from .conftest import PROMPTS, plan


def test_loss_falls_and_held_out_acceptance_rises(trained: Path) -> None:
    report = json.loads((trained / REPORT).read_text())
    losses = report["losses"]
    assert len(losses) == 80 and report["training"]["steps"] == 80
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    before, after = report["acceptance_history"][0], report["acceptance"]
    assert before["step"] == 0 and after["step"] == 80
    assert before["mean_acceptance_length"] < 1.3
    assert after["mean_acceptance_length"] > before["mean_acceptance_length"] + 0.8
    assert report["shape"]["block_size"] == 4 and report["data"]["held_out_sequences"] >= 1


def test_the_saved_drafter_drafts_and_greedy_output_is_lossless(tiny_target: str,
                                                                trained: Path) -> None:
    from draftwise import LLM, SamplingParams

    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt"]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    off = [o.outputs[0].token_ids for o in LLM(model=tiny_target).generate(prompts, sp)]
    llm = LLM(model=tiny_target, speculative_config={  # fixed depth: drafts every step
        "method": "dflash", "model": str(trained), "num_speculative_tokens": 3,
        "draftwise": {"adaptive": False}})
    on = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert on == off
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0
    assert m.num_accepted_tokens > 0.3 * m.num_draft_tokens  # it learnt these answers


def test_an_interrupted_run_resumes_to_the_same_curve_and_weights(
        tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    whole = train_dflash(plan(tiny_target, tiny_data, tmp_path / "whole", steps=12))
    half = train_dflash(plan(tiny_target, tiny_data, tmp_path / "split", steps=6))
    assert half.step == 6 and half.stopped == "steps"
    rest = train_dflash(plan(tiny_target, tiny_data, tmp_path / "split", steps=12))
    assert rest.step == 12
    assert rest.losses == whole.losses  # bit for bit: the same floats
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(tmp_path / "whole" / STATE, weights_only=False)
    sb = torch.load(tmp_path / "split" / STATE, weights_only=False)
    assert (sa["epoch"], sa["position"]) == (sb["epoch"], sb["position"])


def test_ctrl_c_inside_a_step_keeps_the_checkpoint_and_resumes_exactly(
        tiny_target: str, tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import draftwise.train.dflash as loop

    whole = train_dflash(plan(tiny_target, tiny_data, tmp_path / "whole", steps=8))
    calls = {"n": 0}
    ce = loop.weighted_ce_sum

    def interrupted(*args):  # the loss of step 6's 2nd sequence (batch 2): after a backward
        calls["n"] += 1
        if calls["n"] == 2 * 5 + 2:
            raise KeyboardInterrupt
        return ce(*args)

    monkeypatch.setattr(loop, "weighted_ce_sum", interrupted)
    out = tmp_path / "cut"
    cut = train_dflash(plan(tiny_target, tiny_data, out, steps=8, checkpoint_minutes=1e-9))
    assert cut.stopped == "interrupted" and cut.step == 5
    monkeypatch.setattr(loop, "weighted_ce_sum", ce)
    rest = train_dflash(plan(tiny_target, tiny_data, out, steps=8))
    assert rest.losses == whole.losses


def test_resuming_with_other_settings_is_refused(tiny_target: str, tiny_data: Path,
                                                 tmp_path: Path) -> None:
    train_dflash(plan(tiny_target, tiny_data, tmp_path / "r", steps=2))
    with pytest.raises(TrainResumeError, match=r"block_size: 4 there, 8 now"):
        train_dflash(plan(tiny_target, tiny_data, tmp_path / "r", steps=4, block_size=8))
    shutil.copy(tmp_path / "r" / "config.json", tmp_path / "config.json")
    (tmp_path / "foreign").mkdir()
    shutil.copy(tmp_path / "config.json", tmp_path / "foreign" / "config.json")
    with pytest.raises(TrainResumeError, match="without train_state.pt"):
        train_dflash(plan(tiny_target, tiny_data, tmp_path / "foreign", steps=2))


def edited_copy(data: Path, to: Path, **changes: object) -> Path:
    shutil.copytree(data, to)
    m = json.loads((to / "manifest.json").read_text())
    m.update(changes)
    (to / "manifest.json").write_text(json.dumps(m))
    return to


@pytest.mark.parametrize(("case", "match"), [
    ("missing", "no such folder"),
    ("not-data", "no manifest.json"),
    ("hidden", "width 64, the target's is 128"),
    ("taps", r"taps \[0, 7\], not layers of the target"),
    ("model", "was recorded on /elsewhere/model"),
])
def test_bad_data_folders_are_refused_by_name(tiny_target: str, tiny_data: Path,
                                              tmp_path: Path, case: str, match: str) -> None:
    data = {"missing": lambda: tmp_path / "nope",
            "not-data": lambda: tmp_path,
            "hidden": lambda: edited_copy(tiny_data, tmp_path / "h", hidden_size=64),
            "taps": lambda: edited_copy(tiny_data, tmp_path / "t", taps=[0, 7]),
            "model": lambda: edited_copy(tiny_data, tmp_path / "m", model="/elsewhere/model"),
            }[case]()
    with pytest.raises(DataFolderError, match=match):
        train_dflash(plan(tiny_target, data, tmp_path / "out", steps=1))


def test_bad_options_are_refused_by_name(tiny_target: str, tiny_data: Path,
                                         tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="--block-size 1"):
        train_dflash(plan(tiny_target, tiny_data, tmp_path / "o", block_size=1))
    with pytest.raises(DraftwiseError, match="needs a budget"):
        train_dflash(plan(tiny_target, tiny_data, tmp_path / "o", steps=None))
    with pytest.raises(DraftwiseError, match="--mask-token-id 512"):
        train_dflash(plan(tiny_target, tiny_data, tmp_path / "o", mask_token_id=512))


@pytest.mark.parametrize(("args", "match"), [
    (["--data", "{tmp}/nope"], "no such folder"),
    (["--block-size", "1"], "--block-size 1"),
    (["--layers", "0"], "--layers 0"),
])
def test_cli_refusals_exit_2_without_a_traceback(tiny_target: str, tiny_data: Path,
                                                 tmp_path: Path, args: list[str],
                                                 match: str) -> None:
    base = ["train", "dflash", "--model", tiny_target, "--data", str(tiny_data),
            "--out", str(tmp_path / "o"), "--steps", "1"]
    result = CliRunner().invoke(cli, base + [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert match in result.output and "Traceback" not in result.output


def test_cli_trains_and_reports(tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(cli, [
        "train", "dflash", "--model", tiny_target, "--data", str(tiny_data), "--out", str(out),
        "--steps", "3", "--block-size", "4", "--batch", "1", "--anchors", "4", "--threads",
        "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    assert "dflash: step 1/3, loss" in result.output  # progress on stderr (mixed here)
    assert (out / "config.json").is_file() and (out / REPORT).is_file()
