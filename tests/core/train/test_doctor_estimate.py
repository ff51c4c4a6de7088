"""``draftwise doctor`` on a trained hidden-state drafter: it predicts from the held-out
estimate ``draftwise train`` saved beside the drafter (the offline walk cannot run a
drafter that reads the target's hidden states), and refuses an estimate of the old form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from draftwise.cli import cli
from draftwise.train.loop import REPORT

from .conftest import PROMPTS


def _doctor(target: str, drafter: Path, workload: Path, *extra: str) -> tuple[int, str]:
    config = json.dumps({"method": "dflash", "model": str(drafter),
                         "num_speculative_tokens": 3})
    res = CliRunner().invoke(cli, ["doctor", "--model", target, "-sc", config, "--workload",
                                   str(workload), "--max-tokens", "16", "--ignore-eos",
                                   *extra])
    return res.exit_code, res.output


def test_doctor_predicts_a_trained_drafter_from_its_estimate(
        tiny_target: str, tiny_data: Path, trained: Path, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in PROMPTS[:3]))
    drafter = tmp_path / "drafter"
    shutil.copytree(trained, drafter)
    code, out = _doctor(tiny_target, drafter, workload, "--json", "--no-measure")
    assert code == 0, out
    doc = json.loads(out)
    saved = json.loads((drafter / REPORT).read_text())["acceptance"]
    assert doc["training_estimate"]["accepted_through_slot"] == saved["accepted_through_slot"]
    rows = doc["per_k"]
    assert [r["k"] for r in rows] == [1, 2, 3]
    # tokens a step commits: 1 + the shares of steps whose first j drafts all held
    through = saved["accepted_through_slot"]
    for r in rows:
        assert abs(r["expected_tokens_per_step"] - 1 - sum(through[: r["k"]])) < 1e-9
        assert r["predicted_speedup"] > 0 and r["measured_speedup"] is None
    assert doc["draft_step_seconds"] > 0

    # an estimate of the old form (per anchor, no walk) is refused by name, exit 2,
    # with the command that refreshes it; --save writes the refreshed one
    report = json.loads((drafter / REPORT).read_text())
    report["acceptance"] = {"mean_acceptance_length": 2.1, "accepted_through_slot": [0.6]}
    (drafter / REPORT).write_text(json.dumps(report))
    code, out = _doctor(tiny_target, drafter, workload, "--no-measure")
    assert code == 2 and "draftwise train estimate" in out and "Traceback" not in out
    res = CliRunner().invoke(cli, ["train", "estimate", "--drafter", str(drafter), "--data",
                                   str(tiny_data), "--model", tiny_target, "--save"])
    assert res.exit_code == 0, res.output
    again = json.loads((drafter / REPORT).read_text())["acceptance"]
    assert again == {k: v for k, v in saved.items() if k != "step"}  # the same walk
    code, out = _doctor(tiny_target, drafter, workload, "--no-measure")
    assert code == 0 and "tokens/step" in out and "recommended:" in out, out
