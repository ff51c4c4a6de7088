"""``draftwise train dspark`` on a tiny target: it learns, it saves a reduced-vocabulary
drafter the dspark plugin runs losslessly, it resumes exactly, it refuses bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from draftwise.cli import cli
from draftwise.errors import DraftwiseError
from draftwise.train.dspark import train_dspark
from draftwise.train.loop import REPORT, STATE, TrainResumeError

from .conftest import PROMPTS, VOCAB, dplan


def test_loss_falls_and_held_out_acceptance_rises(dspark_trained: Path) -> None:
    report = json.loads((dspark_trained / REPORT).read_text())
    losses = report["losses"]
    assert len(losses) == 80 and report["method"] == "dspark"
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    before, after = report["acceptance_history"][0], report["acceptance"]
    assert before["step"] == 0 and after["step"] == 80
    assert before["mean_acceptance_length"] < 1.3
    assert after["mean_acceptance_length"] > before["mean_acceptance_length"] + 0.8
    assert report["shape"]["draft_vocab_size"] == VOCAB


def test_the_layout_is_speculators_with_a_reduced_vocabulary(dspark_trained: Path) -> None:
    from safetensors.torch import load_file

    cfg = json.loads((dspark_trained / "config.json").read_text())
    assert cfg["architectures"] == ["DSparkSpeculator"] and cfg["draft_vocab_size"] == VOCAB
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3]  # the data's taps (0, 2) + 1
    verifier = cfg["speculators_config"]["verifier"]  # speculators' schema requires it
    assert verifier["architectures"] == ["LlamaForCausalLM"] and verifier["name_or_path"]
    t = load_file(str(dspark_trained / "model.safetensors"))
    ids = torch.arange(VOCAB) + t["d2t"]
    assert torch.equal(t["t2d"].nonzero().flatten(), ids)
    assert t["lm_head.weight"].shape == (VOCAB, 128)
    assert t["markov_head.markov_w1.weight"].shape[0] == 512  # the target's vocabulary
    assert "embed_tokens.weight" not in t


def test_the_saved_drafter_runs_in_the_plugin_and_greedy_output_is_lossless(
        tiny_target: str, dspark_trained: Path) -> None:
    from draftwise import LLM, SamplingParams

    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt"]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    off = [o.outputs[0].token_ids for o in LLM(model=tiny_target).generate(prompts, sp)]
    llm = LLM(model=tiny_target, speculative_config={
        "method": "dspark", "model": str(dspark_trained),
        "draftwise": {"adaptive": False}})
    on = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert on == off
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0
    assert m.num_accepted_tokens > 0.3 * m.num_draft_tokens  # it learnt these answers


def test_an_interrupted_run_resumes_to_the_same_curve_and_weights(
        tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    whole = train_dspark(dplan(tiny_target, tiny_data, tmp_path / "whole", steps=10))
    half = train_dspark(dplan(tiny_target, tiny_data, tmp_path / "split", steps=5))
    assert half.step == 5
    rest = train_dspark(dplan(tiny_target, tiny_data, tmp_path / "split", steps=10))
    assert rest.step == 10 and rest.losses == whole.losses
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_of_the_cost_models_shape_resumes_with_it(tiny_target: str, tiny_data: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "auto"
    first = train_dspark(dplan(tiny_target, tiny_data, out, steps=2, layers=None,
                               draft_vocab=None))
    lines: list[str] = []
    train_dspark(dplan(tiny_target, tiny_data, out, steps=3, layers=None, draft_vocab=None),
                 lines.append)
    assert any("shape of the run in" in line for line in lines)
    state = torch.load(out / STATE, weights_only=False)
    assert state["step"] == 3 and first.step == 2


def test_resuming_with_other_settings_or_another_method_is_refused(
        tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    from draftwise.train.dflash import DFlashPlan, train_dflash

    train_dspark(dplan(tiny_target, tiny_data, tmp_path / "r", steps=2))
    with pytest.raises(TrainResumeError, match=r"draft_vocab: 128 there, 32 now"):
        train_dspark(dplan(tiny_target, tiny_data, tmp_path / "r", steps=4, draft_vocab=32))
    with pytest.raises(TrainResumeError, match="holds a dspark run, not a dflash one"):
        train_dflash(DFlashPlan(data=tiny_data, out=tmp_path / "r", model=tiny_target,
                                steps=4, block_size=4, threads=1, held_out_share=0.2))


def test_bad_options_are_refused_by_name(tiny_target: str, tiny_data: Path,
                                         tmp_path: Path) -> None:
    for kw, match in (({"draft_vocab": 0}, "--draft-vocab 0"),
                      ({"draft_vocab": 513}, "--draft-vocab 513"),
                      ({"block_size": 0}, "--block-size 0"),
                      ({"markov_rank": 0}, "--markov-rank 0"),
                      ({"steps": None}, "needs a budget"),
                      ({"mask_token_id": 512}, "--mask-token-id 512")):
        with pytest.raises(DraftwiseError, match=match):
            train_dspark(dplan(tiny_target, tiny_data, tmp_path / "o", **kw))


@pytest.mark.parametrize(("args", "match"), [
    (["--data", "{tmp}/nope"], "no such folder"),
    (["--draft-vocab", "100000"], "--draft-vocab 100000"),
    (["--layers", "0"], "--layers 0"),
])
def test_cli_refusals_exit_2_without_a_traceback(tiny_target: str, tiny_data: Path,
                                                 tmp_path: Path, args: list[str],
                                                 match: str) -> None:
    base = ["train", "dspark", "--model", tiny_target, "--data", str(tiny_data),
            "--out", str(tmp_path / "o"), "--steps", "1", "--layers", "1",
            "--draft-vocab", "128"]
    result = CliRunner().invoke(cli, base + [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert match in result.output and "Traceback" not in result.output


def test_cli_trains_and_reports(tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(cli, [
        "train", "dspark", "--model", tiny_target, "--data", str(tiny_data), "--out", str(out),
        "--steps", "3", "--block-size", "4", "--draft-vocab", "128", "--layers", "1",
        "--batch", "1", "--anchors", "4", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    assert "dspark: step 1/3, loss" in result.output
    assert "break-even acceptance" in result.output  # the measured costs, printed
    assert (out / "config.json").is_file() and (out / REPORT).is_file()


def test_a_quantized_target_lends_its_embedding_and_stays_lossless(tmp_path: Path) -> None:
    """The default model's case: a GGUF target whose embedding (and tied head) is
    quantized. The drafter saves its own reduced head; the plugin embeds the block
    through the target's ``embed`` (no dense table to borrow), and greedy output equals
    speculation off."""
    from draftwise import LLM, SamplingParams
    from draftwise.train.data import DataPlan, generate_data
    from tiny_gguf import Q, write_tiny_gguf

    target = str(write_tiny_gguf(tmp_path / "q.gguf", embed_type=Q.Q8_0, seed=3).path)
    data = tmp_path / "data"
    generate_data(DataPlan(model=target, out=data, taps=(0, 1), max_tokens=24, batch=6,
                           sampled_share=0.0), PROMPTS)
    out = tmp_path / "drafter"
    train_dspark(dplan(target, data, out, steps=30))
    prompts = [p.text for p in PROMPTS[:3]]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    off = [o.outputs[0].token_ids for o in LLM(model=target).generate(prompts, sp)]
    llm = LLM(model=target, speculative_config={
        "method": "dspark", "model": str(out), "draftwise": {"adaptive": False}})
    assert llm.engine.spec is not None
    on = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert on == off and llm.engine.spec.metrics.num_draft_tokens > 0


def test_train_estimate_refuses_a_dspark_drafter_by_name(tiny_target: str, tiny_data: Path,
                                                        dspark_trained: Path) -> None:
    result = CliRunner().invoke(cli, ["train", "estimate", "--drafter", str(dspark_trained),
                                      "--data", str(tiny_data), "--model", tiny_target])
    assert result.exit_code == 2, result.output
    assert "not a DFlash drafter" in result.output and "Traceback" not in result.output
