"""``draftwise train export --format deepspec``: a trained DSpark drafter in DeepSpec's
``Qwen3DSparkModel`` layout, which the dspark plugin loads (its native lane) and drafts
with exactly as it drafts with the trained folder (speculators' layout); what DeepSpec's
layout cannot express is refused by name.

DeepSpec's own code is not installed here (a source tree, no PyPI package; the project
does not install it): :func:`test_deepspec_loads_the_export` runs only where
``deepspec`` is importable and is skipped, saying so, elsewhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from draftwise import LLM, SamplingParams
from draftwise.cli import cli
from draftwise.train.deepspec_export import export_deepspec
from draftwise.train.llamacpp_export import DrafterExportError
from safetensors.torch import load_file

from tests.plugins.dflash.test_oracle import record_drafts

from .conftest import PROMPTS, TAPS


@pytest.fixture(scope="module")
def exported(dspark_trained_full: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deepspec") / "drafter"
    export_deepspec(dspark_trained_full, out)
    return out


def test_the_layout_is_deepspecs(exported: Path, dspark_trained_full: Path,
                                 tiny_target: str) -> None:
    cfg = json.loads((exported / "config.json").read_text())
    target_cfg = json.loads((Path(tiny_target) / "config.json").read_text())
    spec = json.loads((dspark_trained_full / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["target_layer_ids"] == list(TAPS) and cfg["num_target_layers"] == 3
    assert cfg["num_hidden_layers"] == 1 and cfg["block_size"] == 4
    assert cfg["num_anchors"] == 8  # the run's --anchors
    assert cfg["mask_token_id"] == spec["mask_token_id"]
    assert (cfg["markov_rank"], cfg["markov_head_type"]) == (16, "vanilla")
    assert cfg["enable_confidence_head"] and cfg["confidence_head_with_markov"]
    assert cfg["vocab_size"] == target_cfg["vocab_size"] and not cfg["tie_word_embeddings"]
    assert cfg["bos_token_id"] == target_cfg["bos_token_id"]  # a copy of the target's
    assert "speculators_config" not in cfg and "draft_vocab_size" not in cfg
    ours, theirs = load_file(str(exported / "model.safetensors")), load_file(
        str(dspark_trained_full / "model.safetensors"))
    assert set(ours) == set(theirs) | {"embed_tokens.weight", "lm_head.weight"}
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    target = load_file(str(Path(tiny_target) / "model.safetensors"))
    for name, src in (("embed_tokens.weight", "model.embed_tokens.weight"),
                      ("lm_head.weight", "lm_head.weight")):
        assert torch.equal(ours[name], target[src].to(torch.bfloat16))


def drafts_of(target: str, drafter: Path, lane: str) -> tuple[list, list]:
    """Every drafted block (context, drafts) and the outputs, greedy at fixed depth; bf16,
    so the target's tables the speculators folder borrows are the export's bf16 copies."""
    llm = LLM(model=target, dtype="bfloat16", speculative_config={
        "method": "dspark", "model": str(drafter), "draftwise": {"adaptive": False}})
    seen = record_drafts(llm)
    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt"]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=20,
                                                ignore_eos=True))
    assert llm.engine.spec.proposers[0].draft.cfg.lane == lane
    return seen, [o.outputs[0].token_ids for o in outs]


def test_the_plugin_drafts_the_same_tokens_from_the_export(
        tiny_target: str, exported: Path, dspark_trained_full: Path) -> None:
    seen_export, out_export = drafts_of(tiny_target, exported, "Qwen3DSparkModel")
    seen_orig, out_orig = drafts_of(tiny_target, dspark_trained_full,
                                      "DSparkSpeculator")
    assert out_export == out_orig
    assert len(seen_orig) >= 10 and seen_export == seen_orig


def test_deepspec_loads_the_export(exported: Path) -> None:
    pytest.importorskip("deepspec", reason="DeepSpec's own code is not installed: its "
                                           "loader is not checked")
    from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel

    _, info = Qwen3DSparkModel.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def edited(src: Path, to: Path, **changes: object) -> Path:
    shutil.copytree(src, to)
    cfg = json.loads((to / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (to / "config.json").write_text(json.dumps(cfg))
    return to


def test_what_deepspec_cannot_express_is_refused_by_name(
        tiny_target: str, dspark_trained: Path, dspark_trained_full: Path, trained: Path,
        tmp_path: Path) -> None:
    cases = [
        (dspark_trained, "draft_vocab_size 128 of the target's 512"),
        (trained, "does not describe a DSparkSpeculator"),
        (tmp_path / "nope", "no such folder"),
        (edited(dspark_trained_full, tmp_path / "a", sample_from_anchor=False),
         "sample_from_anchor false"),
        (edited(dspark_trained_full, tmp_path / "w", sliding_window_non_causal=True),
         "sliding_window_non_causal true"),
    ]
    for drafter, match in cases:
        with pytest.raises(DrafterExportError, match=match):
            export_deepspec(drafter, tmp_path / "out")
    spec = json.loads((dspark_trained_full / "config.json").read_text())
    spec["speculators_config"].pop("verifier")
    lost = edited(dspark_trained_full, tmp_path / "v", speculators_config=spec[
        "speculators_config"])
    with pytest.raises(DrafterExportError, match="does not record its target"):
        export_deepspec(lost, tmp_path / "out")
    export_deepspec(lost, tmp_path / "given", target=tiny_target)  # --target says it
    assert not (tmp_path / "out").exists()


def test_cli_exports_and_refuses_with_exit_2(tiny_target: str, dspark_trained: Path,
                                             dspark_trained_full: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(cli, ["train", "export", "--drafter", str(dspark_trained_full),
                                      "--format", "deepspec", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["format"] == "deepspec" and summary["target_layer_ids"] == list(TAPS)
    assert (out / "config.json").is_file()
    for args, match in ((["--drafter", str(dspark_trained)], "--draft-vocab 512"),
                        (["--drafter", str(dspark_trained_full), "--type", "bf16"],
                         "--type bf16 is a llamacpp-gguf option")):
        result = CliRunner().invoke(cli, ["train", "export", "--format", "deepspec", "--out",
                                          str(tmp_path / "x"), *args])
        assert result.exit_code == 2, result.output
        assert match in result.output and "Traceback" not in result.output
