"""``draftwise train export --format llamacpp-gguf``: a drafter the trainer saved becomes
llama.cpp's ``dflash`` GGUF that gguf-py reads back tensor for tensor, with the header
llama.cpp's loader reads; what llama.cpp cannot run is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from draftwise.cli import cli
from draftwise.train.dflash_layout import save_drafter
from draftwise.train.dflash_net import DFlashNet, DFlashShape
from draftwise.train.llamacpp_export import DrafterExportError, export_llamacpp, gguf_name
from safetensors.numpy import load_file
from tiny_gguf import tiny_vocab, write_tiny_gguf

LAYERS = 3  # the target's


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export-target") / "target.gguf"
    write_tiny_gguf(path, layers=LAYERS, hidden=64, heads=4, kv_heads=2, ffn=128)
    return path


def drafter(out: Path, taps: tuple[int, ...] = (0, 1), layers: int = 2, seed: int = 0) -> Path:
    """A drafter for the tiny target, saved by the trainer's own ``save_drafter``."""
    vocab = len(tiny_vocab()[0])
    shape = DFlashShape(hidden_size=64, num_layers=layers, num_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=96, vocab_size=vocab, block_size=4,
                        target_layer_ids=taps, num_target_layers=LAYERS,
                        mask_token_id=vocab - 1, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=256)
    net = DFlashNet(shape)
    net.init_weights(seed, std=0.1)
    save_drafter(net, out)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return drafter(tmp_path_factory.mktemp("export-drafter") / "d")


def fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items()}


def test_every_tensor_reads_back_equal_under_llamacpp_names(saved: Path, target: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    report = export_llamacpp(saved, out, str(target))
    source = load_file(str(saved / "model.safetensors"))
    reader = gguf.GGUFReader(str(out))
    got = {t.name: t for t in reader.tensors}
    assert report.tensors == len(source) == len(got) == 3 + 2 * 11
    for name, arr in source.items():
        t = got[gguf_name(name)]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == list(reversed(arr.shape))  # ggml order, fastest dim first
        np.testing.assert_array_equal(np.asarray(t.data).reshape(arr.shape), arr)
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight",
            "blk.1.attn_q_norm.weight", "blk.0.ffn_down.weight"} <= set(got)
    assert "token_embd.weight" not in got and "output.weight" not in got  # the target's


def test_the_header_is_the_config_in_llamacpps_keys(saved: Path, target: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    export_llamacpp(saved, out, str(target))
    config = json.loads((saved / "config.json").read_text())
    meta = fields(out)
    assert meta["general.architecture"] == "dflash"
    expect = {
        "dflash.block_count": config["num_hidden_layers"],
        "dflash.embedding_length": config["hidden_size"],
        "dflash.feed_forward_length": config["intermediate_size"],
        "dflash.attention.head_count": config["num_attention_heads"],
        "dflash.attention.head_count_kv": config["num_key_value_heads"],
        "dflash.attention.key_length": config["head_dim"],
        "dflash.context_length": config["max_position_embeddings"],
        "dflash.block_size": config["dflash_config"]["block_size"],
        "tokenizer.ggml.mask_token_id": config["dflash_config"]["mask_token_id"],
    }
    assert {k: meta[k] for k in expect} == expect
    # llama.cpp records layer inputs: z-lab's "output of layer i" is its layer i + 1
    assert meta["dflash.target_layers"] == [t + 1 for t in config["dflash_config"]
                                            ["target_layer_ids"]]
    assert meta["dflash.rope.freq_base"] == pytest.approx(config["rope_theta"])
    assert meta["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(
        config["rms_norm_eps"])
    assert "dflash.attention.causal" not in meta  # non-causal inside the block
    tgt = fields(target)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model",
                "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert meta[key] == tgt[key]


def test_q8_0_matrices_dequantize_close_and_norms_stay_f32(saved: Path, target: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "q.gguf"
    export_llamacpp(saved, out, str(target), matrix_type="q8_0")
    source = load_file(str(saved / "model.safetensors"))
    for t in gguf.GGUFReader(str(out)).tensors:
        name = next(k for k in source if gguf_name(k) == t.name)
        arr = source[name]
        if arr.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
        back = gguf.quants.dequantize(t.data, t.tensor_type).reshape(arr.shape)
        assert np.abs(back - arr).max() <= np.abs(arr).max() / 100


def test_a_tap_at_the_last_layer_needs_the_patch_flag(target: Path, tmp_path: Path) -> None:
    d = drafter(tmp_path / "final", taps=(0, LAYERS - 1))
    with pytest.raises(DrafterExportError, match=r"tap the target's last layer .*"
                                                 r"llamacpp_final_tap.patch"):
        export_llamacpp(d, tmp_path / "x.gguf", str(target))
    assert not (tmp_path / "x.gguf").exists()
    export_llamacpp(d, tmp_path / "y.gguf", str(target), allow_final_tap=True)
    assert fields(tmp_path / "y.gguf")["dflash.target_layers"] == [1, LAYERS]


def broken(saved: Path, to: Path, config: dict | None = None, drop: str | None = None) -> Path:
    shutil.copytree(saved, to)
    if config is not None:
        c = json.loads((to / "config.json").read_text())
        (to / "config.json").write_text(json.dumps({**c, **config}))
    if drop is not None:
        (to / drop).unlink()
    return to


@pytest.mark.parametrize(("edit", "match"), [
    ({"drop": "model.safetensors"}, "no model.safetensors"),
    ({"drop": "config.json"}, "no config.json"),
    ({"config": {"hidden_size": 32}}, "hidden_size 32, but the target"),
    ({"config": {"num_target_layers": 5}}, "num_target_layers 5"),
    ({"config": {"num_hidden_layers": 1}}, "does not match its config"),
    ({"config": {"hidden_act": "relu"}}, "hidden_act 'relu' is not exported"),
    ({"config": {"layer_types": ["sliding_attention"] * 2}}, "layer_types"),
    ({"config": {"dflash_config": {"block_size": 4, "mask_token_id": 0}}},
     "lacks or mistypes 'target_layer_ids'"),
])
def test_broken_drafters_are_refused_by_name(saved: Path, target: Path, tmp_path: Path,
                                             edit: dict, match: str) -> None:
    d = broken(saved, tmp_path / "b", **edit)
    with pytest.raises(DrafterExportError, match=match):
        export_llamacpp(d, tmp_path / "x.gguf", str(target))


def test_a_target_that_is_not_gguf_is_refused(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(DrafterExportError, match="not a .gguf file"):
        export_llamacpp(saved, tmp_path / "x.gguf", str(tmp_path))


def test_cli_exports_and_refuses_with_exit_2(saved: Path, target: Path, tmp_path: Path
                                             ) -> None:
    out = tmp_path / "cli.gguf"
    base = ["train", "export", "--drafter", str(saved), "--format", "llamacpp-gguf",
            "--target", str(target)]
    ok = CliRunner().invoke(cli, [*base, "--out", str(out), "--type", "f16", "--json"])
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.output)
    assert summary["target_layers"] == [1, 2] and summary["type"] == "f16" and out.is_file()
    missing = CliRunner().invoke(cli, ["train", "export", "--drafter", str(tmp_path / "nope"),
                                       "--format", "llamacpp-gguf", "--target", str(target),
                                       "--out", str(tmp_path / "n.gguf")])
    assert missing.exit_code == 2, missing.output
    assert "no such folder" in missing.output and "Traceback" not in missing.output
