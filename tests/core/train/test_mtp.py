"""``draftwise train mtp`` on a tiny llama target: it learns, the saved head runs in the mtp
plugin by ``"model"`` losslessly, the engine drafts what the training forward drafts (the
oracle for a wrong tap, norm or position), it resumes exactly, it refuses bad inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from draftwise.cli import cli
from draftwise.errors import DraftwiseError
from draftwise.train.loop import REPORT
from draftwise.train.mtp import MtpPlan, train_mtp

from .conftest import PROMPTS

LAST = 2  # the tiny target's last layer: what the head reads, before the final norm


def mplan(target: str, data: Path, out: Path, **kw: object) -> MtpPlan:
    """A small, fast plan (overrides by keyword)."""
    base: dict = {"data": data, "out": out, "model": target, "steps": 200, "batch": 2,
                  "anchors": 8, "warmup": 5, "lr": 3e-3, "held_out_share": 0.2, "seed": 0,
                  "threads": 1, "depth": 2, "eval_k": 3}
    return MtpPlan(**{**base, **kw})


@pytest.fixture(scope="module")
def mtp_trained(tiny_target: str, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Path:
    out = tmp_path_factory.mktemp("mtp") / "head"
    train_mtp(mplan(tiny_target, tiny_data, out))
    return out


def test_loss_falls_and_held_out_acceptance_rises(mtp_trained: Path) -> None:
    report = json.loads((mtp_trained / REPORT).read_text())
    losses = report["losses"]
    assert len(losses) == 200 and report["method"] == "mtp"
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    before, after = report["acceptance_history"][0], report["acceptance"]
    assert before["step"] == 0 and after["step"] == 200
    assert before["mean_acceptance_length"] < 1.3
    assert after["mean_acceptance_length"] > before["mean_acceptance_length"] + 0.8
    per_k = report["acceptance_per_k"]
    assert set(per_k) == {"1", "2", "3"} and per_k["1"] <= per_k["2"] <= per_k["3"]
    assert report["shape"]["hidden"] == "pre-final-norm" and report["shape"]["hidden_layer"] \
        == LAST


def test_the_layout_is_the_plugins_nextn_layout(mtp_trained: Path) -> None:
    from draftwise_mtp.head import detect_layout
    from safetensors.torch import load_file

    layout, n, cfg = detect_layout(str(mtp_trained))
    assert (layout, n) == ("deepseek_nextn", 1)
    assert cfg["hidden_size"] == 128 and cfg["vocab_size"] == 512
    names = set(load_file(str(mtp_trained / "model.safetensors")))
    assert {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight",
            "model.layers.3.hnorm.weight", "model.layers.3.shared_head.norm.weight",
            "model.layers.3.self_attn.q_proj.weight", "model.layers.3.mlp.down_proj.weight",
            } <= names
    assert not any("embed_tokens" in n or "shared_head.head" in n for n in names)


def record(llm: Any) -> list[tuple[list[int], list[int], torch.Tensor | None]]:
    """(context tokens, drafts, the hidden rows handed over) of every drafted row."""
    proposer = llm.engine.spec.proposers[0]
    seen: list[tuple[list[int], list[int], torch.Tensor | None]] = []
    original = proposer.propose

    def propose(batch: Any) -> Any:
        out = original(batch)
        for i, row in enumerate(batch.rows):
            if out.num_draft_tokens[i]:
                hidden = None if row.hidden is None else row.hidden.get(LAST)
                seen.append(([int(t) for t in row.token_ids], out.row(i).tolist(),
                             None if hidden is None else (row.num_kv_computed,
                                                          hidden.float().clone())))
        return out

    proposer.propose = propose
    return seen


def test_greedy_output_is_lossless_and_drafts_are_accepted(tiny_target: str,
                                                           mtp_trained: Path) -> None:
    from draftwise import LLM, SamplingParams

    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt"]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    off = [o.outputs[0].token_ids for o in LLM(model=tiny_target).generate(prompts, sp)]
    llm = LLM(model=tiny_target, speculative_config={
        "method": "mtp", "model": str(mtp_trained), "num_speculative_tokens": 2,
        "draftwise": {"adaptive": False}})
    on = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert on == off
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0
    assert m.num_accepted_tokens > 0.3 * m.num_draft_tokens  # it learnt these answers


def test_engine_drafts_equal_the_training_forward(tiny_target: str, mtp_trained: Path) -> None:
    """Every drafted row of every engine step (k = 3, the head looped on itself) equals the
    training forward's argmax over the teacher-forced pre-norm states of that context, and
    the states the engine hands the head are the ones the data records (tap ``LAST``)."""
    from draftwise import LLM, SamplingParams
    from draftwise.models.loader import load_model
    from draftwise.train.loop import load_target
    from draftwise.train.mtp import head_input, make_shape
    from draftwise.train.mtp_net import MtpNet, chain_logits
    from draftwise.train.record import TapRecorder
    from safetensors.torch import load_file

    llm = LLM(model=tiny_target, dtype="float32", speculative_config={
        "method": "mtp", "model": str(mtp_trained), "num_speculative_tokens": 3,
        "draftwise": {"adaptive": False}})
    seen = record(llm)
    llm.generate([p.text for p in PROMPTS[:3]] + ["zz top"],
                 SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    t = load_target(tiny_target)
    net = MtpNet(make_shape(mplan(tiny_target, mtp_trained, mtp_trained), t))
    p = f"model.layers.{LAST + 1}."
    net.load_state_dict({k[len(p):]: v for k, v in
                         load_file(str(mtp_trained / "model.safetensors")).items()})
    net.eval()
    recorder = TapRecorder(load_model(tiny_target, dtype="float32"), (0, LAST), 512)
    assert len(seen) >= 10 and any(len(d) == 3 for _, d, _ in seen)
    for tokens, drafts, handed in seen:
        states = recorder.record(tokens[:-1])
        hidden = head_input({k: v.numpy() for k, v in states.items()}, LAST)
        assert handed is not None
        start, rows = handed
        torch.testing.assert_close(rows, hidden[start:], atol=2e-3, rtol=1e-3)  # batching order
        ids = torch.tensor(tokens)
        with torch.no_grad():
            steps = chain_logits(net, t.embed, t.head, ids, hidden,
                                 torch.tensor([len(tokens) - 1]), len(drafts), False)
        assert [int(x.argmax(-1)) for x in steps] == drafts, f"ctx {tokens}"


def test_an_interrupted_run_resumes_to_the_same_curve_and_weights(
        tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    whole = train_mtp(mplan(tiny_target, tiny_data, tmp_path / "whole", steps=8))
    half = train_mtp(mplan(tiny_target, tiny_data, tmp_path / "split", steps=4))
    assert half.step == 4
    rest = train_mtp(mplan(tiny_target, tiny_data, tmp_path / "split", steps=8))
    assert rest.step == 8 and rest.losses == whole.losses
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_options_and_data_without_the_last_tap_are_refused(
        tiny_target: str, tmp_path: Path) -> None:
    from draftwise.train.data import DataPlan, generate_data

    data = tmp_path / "no-last"
    generate_data(DataPlan(model=tiny_target, out=data, taps=(0,), max_tokens=8, batch=4,
                           sampled_share=0.0), PROMPTS[:4])
    with pytest.raises(DraftwiseError, match=r"not the target's last layer 2"):
        train_mtp(mplan(tiny_target, data, tmp_path / "o"))
    for kw, match in (({"layers": 2}, "--layers 2"), ({"depth": 0}, "--depth 0"),
                      ({"eval_k": 0}, "--eval-k 0"), ({"steps": None}, "needs a budget"),
                      ({"mask_token_id": 3}, "--mask-token-id 3"),
                      ({"intermediate_size": 64}, "intermediate_size 64")):
        with pytest.raises(DraftwiseError, match=match):
            train_mtp(mplan(tiny_target, data, tmp_path / "o", **kw))


@pytest.mark.parametrize(("args", "match"), [
    (["--data", "{tmp}/nope"], "no such folder"),
    (["--layers", "2"], "--layers 2"),
    (["--depth", "0"], "--depth 0"),
])
def test_cli_refusals_exit_2_without_a_traceback(tiny_target: str, tiny_data: Path,
                                                 tmp_path: Path, args: list[str],
                                                 match: str) -> None:
    base = ["train", "mtp", "--model", tiny_target, "--data", str(tiny_data),
            "--out", str(tmp_path / "o"), "--steps", "1"]
    result = CliRunner().invoke(cli, base + [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert match in result.output and "Traceback" not in result.output


def test_cli_trains_and_reports(tiny_target: str, tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(cli, [
        "train", "mtp", "--model", tiny_target, "--data", str(tiny_data), "--out", str(out),
        "--steps", "3", "--batch", "1", "--anchors", "4", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    assert "mtp: step 1/3, loss" in result.output
    assert (out / "config.json").is_file() and (out / REPORT).is_file()
