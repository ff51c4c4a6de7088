"""DFlash2 drafters as llama.cpp ``dflash`` GGUFs (``draftwise_dflash.gguf_drafter``).

Each file is the tiny z-lab DFlash2 drafter converted the way llama.cpp's
``convert_hf_to_gguf.py`` converts it (``test_containers.write_dflash_gguf``): conv base
kernels F32 under ``blk.N.{attn,ffn}_conv_base``, conv projections and the selector in
the file type, codebooks as ``selector_{predecessor,successor}.weight``, the four
DFlash2 keys. Greedy output is the target's own either way; the drafts are compared with
the safetensors drafter's, step by step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from draftwise import LLM, SamplingParams
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.models.quant import QuantWeight

from .conftest import TRAIN_PROMPTS, save_drafter
from .test_containers import (
    agreement,
    drafts_of,
    no_target_load,  # noqa: F401 (fixture)
    refused,
    write_dflash_gguf,
)

PROMPTS = TRAIN_PROMPTS[:2]


@pytest.fixture(scope="module")
def plain(target_dir: Path) -> list[list[int]]:
    llm = LLM(model=str(target_dir), dtype="bfloat16")
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def reference(target_dir: Path, trained2_dir: Path):
    """The safetensors DFlash2 drafter's drafts and outputs."""
    seen, outs, llm = drafts_of(target_dir, trained2_dir, PROMPTS)
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    return seen, outs


def test_converter_layout_is_llama_cpps(trained2_dir: Path, tmp_path: Path) -> None:
    """The fixture writes what llama.cpp loads: names, numpy-order shapes, types."""
    path = write_dflash_gguf(trained2_dir, tmp_path / "d.gguf", Q.BF16)
    ckpt = GGUFCheckpoint(str(path))
    assert tuple(ckpt.info("blk.0.attn_conv_base").shape) == (2, 2, 128)  # ggml {H, k, 2}
    assert ckpt.qtype("blk.1.ffn_conv_base") == Q.F32
    assert tuple(ckpt.info("blk.0.attn_conv_proj.weight").shape) == (32, 128)
    assert ckpt.qtype("blk.0.attn_conv_proj.weight") == Q.BF16
    assert tuple(ckpt.info("selector_predecessor.weight").shape) == (512, 32)
    assert tuple(ckpt.info("selector_hidden.weight").shape) == (32, 128)
    assert ckpt.metadata["dflash.selector_top_k"] == 8


@pytest.mark.parametrize("ftype", [Q.BF16, Q.F32], ids=["bf16", "f32"])
def test_dense_gguf_drafts_exactly_what_safetensors_drafts(target_dir, trained2_dir, plain,
                                                           reference, ftype, tmp_path) -> None:
    path = write_dflash_gguf(trained2_dir, tmp_path / f"d-{ftype.name}.gguf", ftype)
    got, out, llm = drafts_of(target_dir, path, PROMPTS)
    ref, out_ref = reference
    assert got == ref
    assert out == plain == out_ref  # greedy spec-on == spec-off
    model = llm.engine.spec.proposers[0].model
    assert model.cfg.v2 is not None and model.w.selector is not None


def test_q8_0_gguf_stays_quantized_and_drafts_near_its_source(target_dir, trained2_dir, plain,
                                                              reference, tmp_path) -> None:
    path = write_dflash_gguf(trained2_dir, tmp_path / "d-q8.gguf", Q.Q8_0)
    got, out, llm = drafts_of(target_dir, path, PROMPTS)
    assert out == plain
    w = llm.engine.spec.proposers[0].model.w
    assert isinstance(w.layers[0].qkv_weight, QuantWeight)
    assert isinstance(w.convs[0][0].kernel_projection, QuantWeight)
    assert isinstance(w.selector.predecessor, QuantWeight)  # rows gathered exactly
    assert isinstance(w.selector.hidden_projection, QuantWeight)
    assert agreement(got, reference[0]) >= 0.85


@pytest.fixture(scope="module")
def wide_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256-wide target: K-quant blocks need rows of 256."""
    from tiny_checkpoints import save_tiny, write_wordlevel_tokenizer

    from .conftest import TOKENS

    path = save_tiny("qwen3", tmp_path_factory.mktemp("df2-wide"), seed=4, std=0.2,
                     num_hidden_layers=3, hidden_size=256, intermediate_size=512, head_dim=64)
    return write_wordlevel_tokenizer(path, TOKENS)


def test_q4_k_m_mix_runs_on_the_quantized_kernels(wide_target, tmp_path) -> None:
    """Q4_K with Q6_K down projections; the rank-32 codebooks cannot hold 256-blocks, so
    they are Q8_0 (llama-quantize's fallback for short rows), against the dense twin."""
    src = save_drafter(tmp_path / "wide", hidden=256, intermediate=512, head_dim=64,
                       version=2)
    path = write_dflash_gguf(src, tmp_path / "d-q4km.gguf", Q.Q4_K,
                             {"ffn_down": Q.Q6_K, "selector_predecessor": Q.Q8_0,
                              "selector_successor": Q.Q8_0}, reference=tmp_path / "twin")
    ref, out_ref, _ = drafts_of(wide_target, tmp_path / "twin", PROMPTS)
    got, out, llm = drafts_of(wide_target, path, PROMPTS)
    plain = LLM(model=str(wide_target), dtype="bfloat16").generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert out == out_ref == [o.outputs[0].token_ids for o in plain]
    w = llm.engine.spec.proposers[0].model.w
    assert isinstance(w.layers[0].down_weight, QuantWeight)
    assert isinstance(w.convs[1][1].kernel_projection, QuantWeight)
    assert isinstance(w.selector.successor, QuantWeight)
    assert agreement(got, ref) >= 0.8


def test_broken_and_mis_declared_dflash2_ggufs_refused_by_name(target_dir, drafter2_dir,
                                                               tmp_path, no_target_load) -> None:  # noqa: F811
    nokey = write_dflash_gguf(drafter2_dir, tmp_path / "nokey.gguf", Q.BF16,
                              drop_key="selector_top_k")
    refused(target_dir, nokey, "without metadata \\['dflash.selector_top_k'\\]")
    kernel = write_dflash_gguf(drafter2_dir, tmp_path / "kernel.gguf", Q.BF16,
                               keys={"conv_kernel_size": 3})
    refused(target_dir, kernel, "tensor 'blk.0.attn_conv_base' has shape \\[2, 2, 128\\], "
            "expected \\[2, 3, 128\\]")
    nosel = write_dflash_gguf(drafter2_dir, tmp_path / "nosel.gguf", Q.BF16,
                              drop_tensor="selector_hidden.weight")
    refused(target_dir, nosel, "not DFlash1 tensors \\(DFlash2 tensors without "
            "selector_hidden.weight")
    noconv = write_dflash_gguf(drafter2_dir, tmp_path / "noconv.gguf", Q.BF16,
                               drop_tensor="blk.1.ffn_conv_proj.weight")
    refused(target_dir, noconv, "missing tensors \\['blk.1.ffn_conv_proj.weight'\\]")
    good = write_dflash_gguf(drafter2_dir, tmp_path / "good.gguf", Q.BF16)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    refused(target_dir, cut, "truncated")


def test_converter_scale_keys_are_read_and_unknown_ones_refused(drafter2_dir, tmp_path) -> None:
    """``qwen.py`` writes input_embedding_scale, output_multiplier, the softcap and
    is_causal as GGUF keys; they reach the config (none is dropped), and keys with no
    implementation here are refused by name."""
    from draftwise_dflash.gguf_drafter import DFlashGGUFError
    from draftwise_dflash.loader import DFlashLoader

    path = write_dflash_gguf(drafter2_dir, tmp_path / "keys.gguf", Q.BF16, extra_kv={
        "embedding_scale": 2.0, "logit_scale": 0.5, "final_logit_softcapping": 30.0,
        "attention.causal": False})
    cfg = DFlashLoader().detect(str(path)).config["dflash"]
    assert (cfg.input_embedding_scale, cfg.output_multiplier) == (2.0, 0.5)
    assert cfg.final_logit_softcapping == 30.0 and cfg.causal == (False, False)
    assert cfg.v2 is not None and cfg.v2.selector_rank == 32
    for kv, match in (({"attention.value_scale": 0.5}, "an attention value scale"),
                      ({"hidden_act": "gelu"}, "only silu MLPs run here")):
        bad = write_dflash_gguf(drafter2_dir, tmp_path / "bad.gguf", Q.BF16, extra_kv=kv)
        with pytest.raises(DFlashGGUFError, match=match):
            DFlashLoader().detect(str(bad))
