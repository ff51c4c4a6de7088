"""Every container a DFlash drafter comes in: GGUF arms drafting what their safetensors
source drafts, and every refusal by name before any target weight is read.

GGUF files are written by gguf-py's ``GGUFWriter`` in llama.cpp mainline's ``dflash``
layout (``draftwise_dflash.gguf_drafter``), with its converter's type rules: bf16 and
Q8_0 quantized from the safetensors drafter; Q4_K / Q6_K (gguf-py cannot quantize
K-quants) as random blocks, whose dequantization is written back as the dense safetensors
reference. DFlash2 GGUFs: ``test_gguf_dflash2.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_checkpoints import save_tiny, write_wordlevel_tokenizer
from tiny_gguf import random_blocks

from draftwise import LLM, SamplingParams
from draftwise.formats.errors import ModelFormatError
from draftwise.models.quant import QuantWeight
from draftwise_dflash.gguf_drafter import _gguf as gguf_name
from draftwise_dflash.loader import DFlashError, DFlashLoader

from .conftest import MASK, TOKENS, TRAIN_PROMPTS, save_drafter
from .test_oracle import record_drafts


#: metadata keys of llama.cpp's DFlash2 (``gguf-py/gguf/constants.py:169-172``; the
#: installed gguf-py predates them, so they are written by name)
V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def converter_type(name: str, arr: np.ndarray, ftype: Q) -> Q:
    """The type llama.cpp's converter stores a tensor in (``conversion/base.py:1084-1121``):
    1-D tensors, norms and names not ending in ``.weight`` (the conv base kernels) are
    F32, the rest the file type."""
    if arr.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return Q.F32
    return ftype


def write_dflash_gguf(src: Path, out: Path, qtype: Q, types: dict[str, Q] | None = None,
                      reference: Path | None = None, arch: str = "dflash",
                      drop_key: str | None = None, extra_tensor: str | None = None,
                      keys: dict[str, int] | None = None, drop_tensor: str | None = None,
                      extra_kv: dict[str, Any] | None = None) -> Path:
    """``src`` (a z-lab safetensors drafter, DFlash1 or DFlash2) as llama.cpp's converter
    writes it (``conversion/qwen.py`` ``DFlashModel``): names through
    ``gguf_drafter``'s table, types by :func:`converter_type` (``types`` overrides per
    tensor kind, as llama-quantize's mixes do). K-quant matrices get random blocks; with
    ``reference`` the GGUF's dequantized content is saved there as a safetensors drafter
    (its dense twin). ``keys`` overrides uint32 metadata values (mis-declared files);
    ``extra_kv`` adds typed keys (float, bool, str) under the architecture."""
    from safetensors.torch import load_file, save_file

    from draftwise_dflash.loader import _ALIASES

    cfg = json.loads((src / "config.json").read_text())
    dc = cfg["dflash_config"]
    tensors = {_ALIASES.get(k, k): v.float().numpy()
               for k, v in load_file(str(src / "model.safetensors")).items()}
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(out), arch)
    meta: dict[str, Any] = {
        "block_count": cfg["num_hidden_layers"], "context_length": 512,
        "embedding_length": cfg["hidden_size"], "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "attention.key_length": cfg["head_dim"], "attention.value_length": cfg["head_dim"],
        "block_size": dc["block_size"],
        **{k: dc[k] for k in V2_KEYS if k in dc},
        **(keys or {}),
    }
    for key, value in meta.items():
        if key != drop_key:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 1000000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_array(f"{arch}.target_layers", [i + 1 for i in dc["target_layer_ids"]])
    w.add_uint32(f"{arch}.target_hidden_size", cfg["hidden_size"])
    w.add_uint32("tokenizer.ggml.mask_token_id", MASK)
    for key, value in (extra_kv or {}).items():
        add = (w.add_bool if isinstance(value, bool) else w.add_float32
               if isinstance(value, float) else w.add_string)
        add(f"{arch}.{key}", value)
    dense = {}
    for z, arr in tensors.items():
        name = gguf_name(z)
        if name == drop_tensor:
            continue
        parts = name.split(".")
        kind = parts[2] if parts[0] == "blk" else parts[0]
        qt = converter_type(name, arr, qtype)
        if qt != Q.F32:
            qt = (types or {}).get(kind, qt)
        if qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            raw = random_blocks(qt, arr.shape[0], arr.shape[1], rng, scale=0.15)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qt)
        elif qt == Q.F32:
            raw = arr.astype(np.float32)
            w.add_tensor(name, raw)
        else:
            raw = gguf.quants.quantize(arr, qt)
            w.add_tensor(name, raw, raw_dtype=qt)
        if qt != Q.F32:
            arr = gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(arr.shape)
        dense[z] = torch.from_numpy(arr)
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(cfg["hidden_size"], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if reference is not None:
        shutil.copytree(src, reference)
        save_file({k: v.contiguous() for k, v in dense.items()},
                  str(reference / "model.safetensors"), metadata={"format": "pt"})
    return out


def spec(drafter: Path, k: int = 7, **extra: Any) -> dict[str, Any]:
    """At fixed depth: twins are compared draft for draft, k deep at every step, and
    adaptive depth (the default) would draft each by its own timing and acceptance."""
    return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k,
            "draftwise": {"adaptive": False}, **extra}


def drafts_of(target: Path, drafter: Path, prompts: list[list[int]], n: int = 16):
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=spec(drafter))
    seen = record_drafts(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return seen, [o.outputs[0].token_ids for o in outs], llm


def agreement(a: list, b: list) -> float:
    """Share of draft tokens equal at the same step and slot (same contexts only)."""
    pairs = [(x, y) for (cx, x), (cy, y) in zip(a, b) if cx == cy]
    same = sum(u == v for x, y in pairs for u, v in zip(x, y))
    return same / max(1, sum(len(x) for x, _ in pairs))


@pytest.fixture(scope="module")
def plain(target_dir: Path) -> list[list[int]]:
    llm = LLM(model=str(target_dir), dtype="bfloat16")
    outs = llm.generate([{"prompt_token_ids": p} for p in TRAIN_PROMPTS[:2]],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


def test_bf16_gguf_drafts_exactly_what_safetensors_drafts(target_dir, trained_dir, plain,
                                                          tmp_path) -> None:
    path = write_dflash_gguf(trained_dir, tmp_path / "d-bf16.gguf", Q.BF16)
    ref, out_ref, _ = drafts_of(target_dir, trained_dir, TRAIN_PROMPTS[:2])
    got, out, llm = drafts_of(target_dir, path, TRAIN_PROMPTS[:2])
    assert got == ref and out == plain == out_ref
    assert llm.engine.spec.metrics.num_accepted_tokens > 0


def test_q8_0_gguf_stays_quantized_and_drafts_near_its_source(target_dir, trained_dir, plain,
                                                              tmp_path) -> None:
    path = write_dflash_gguf(trained_dir, tmp_path / "d-q8.gguf", Q.Q8_0)
    ref, _, _ = drafts_of(target_dir, trained_dir, TRAIN_PROMPTS[:2])
    got, out, llm = drafts_of(target_dir, path, TRAIN_PROMPTS[:2])
    assert out == plain
    model = llm.engine.spec.proposers[0].model
    assert isinstance(model.w.layers[0].qkv_weight, QuantWeight)
    assert isinstance(model.w.fc, QuantWeight)
    assert agreement(got, ref) >= 0.85


@pytest.fixture(scope="module")
def wide_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256-wide target: K-quant blocks need rows of 256."""
    path = save_tiny("qwen3", tmp_path_factory.mktemp("df-wide"), seed=4, std=0.2,
                     num_hidden_layers=3, hidden_size=256, intermediate_size=512, head_dim=64)
    return write_wordlevel_tokenizer(path, TOKENS)


def test_q4_k_m_mix_runs_on_the_quantized_kernels(wide_target, tmp_path) -> None:
    """Q4_K with Q6_K down projections (the published Q4_K_M mix) against its dense twin."""
    src = save_drafter(tmp_path / "wide", hidden=256, intermediate=512, head_dim=64)
    path = write_dflash_gguf(src, tmp_path / "d-q4km.gguf", Q.Q4_K, {"ffn_down": Q.Q6_K},
                             reference=tmp_path / "twin")
    ref, out_ref, _ = drafts_of(wide_target, tmp_path / "twin", TRAIN_PROMPTS[:2])
    got, out, llm = drafts_of(wide_target, path, TRAIN_PROMPTS[:2])
    assert out == out_ref  # lossless either way
    layer = llm.engine.spec.proposers[0].model.w.layers[0]
    assert isinstance(layer.gate_up_weight, QuantWeight)
    assert isinstance(layer.down_weight, QuantWeight)
    assert agreement(got, ref) >= 0.8


@pytest.fixture
def no_target_load(monkeypatch):
    """Refusals must come before the target's weights are read."""
    import draftwise.models.loader as loader_mod

    def refuse(*a, **k):
        raise AssertionError("the target's weights were read before the refusal")

    monkeypatch.setattr(loader_mod, "load_model", refuse)


def refused(target: Path, drafter: Path, match: str, error: type = ModelFormatError) -> None:
    with pytest.raises(error, match=match):
        LLM(model=str(target), speculative_config=spec(drafter))


def test_gguf_refusals_by_name(target_dir, drafter_dir, tmp_path, no_target_load) -> None:
    v2 = write_dflash_gguf(drafter_dir, tmp_path / "v2.gguf", Q.BF16,
                           extra_tensor="blk.0.attn_conv_base.weight")
    refused(target_dir, v2, "are not DFlash1 tensors \\(DFlash2 tensors without "
            "selector_hidden.weight")
    bee = write_dflash_gguf(drafter_dir, tmp_path / "bee.gguf", Q.BF16, arch="dflash-draft")
    refused(target_dir, bee, "'dflash-draft' is the Bee/buun GGUF schema")
    nokey = write_dflash_gguf(drafter_dir, tmp_path / "nokey.gguf", Q.BF16,
                              drop_key="block_size")
    refused(target_dir, nokey, "metadata key 'dflash.block_size' is missing")
    dspark = write_dflash_gguf(drafter_dir, tmp_path / "dspark.gguf", Q.BF16,
                               extra_tensor="markov_w1.weight")
    refused(target_dir, dspark, "Instead: method 'dspark'")
    good = write_dflash_gguf(drafter_dir, tmp_path / "good.gguf", Q.BF16)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    refused(target_dir, cut, "truncated")


def edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_quantized_safetensors_refused_by_name(target_dir, drafter_dir, tmp_path,
                                               no_target_load) -> None:
    exl3 = edited(drafter_dir, tmp_path / "exl3", lambda c: c.update(quantization_config={
        "quant_method": "exl3", "bits": 4.0, "head_bits": 6, "codebook": "mcg"}))
    refused(target_dir, exl3, "an EXL3 drafter \\(bits=4.0, codebook=mcg\\)")
    ct = edited(drafter_dir, tmp_path / "ct", lambda c: c.update(quantization_config={
        "quant_method": "compressed-tensors", "format": "int-quantized"}))
    refused(target_dir, ct, "compressed-tensors format='int-quantized': only "
            "nvfp4-pack-quantized")
    gptq = edited(drafter_dir, tmp_path / "gptq", lambda c: c.update(quantization_config={
        "quant_method": "gptq", "bits": 4}))
    refused(target_dir, gptq, "quant_method='gptq': quantized DFlash safetensors are read "
            "only as NVFP4")


def test_broken_and_mis_declared_files_refused_by_name(target_dir, drafter_dir, tmp_path,
                                                       no_target_load) -> None:
    v2_claim = edited(drafter_dir, tmp_path / "claims-v2", lambda c: (
        c.update(architectures=["DFlash2DraftModel"]),
        c["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=32,
                                  selector_top_k=8)))
    refused(target_dir, v2_claim, "the config says DFlash2, but the DFlash2 tensors are absent")
    no_mask = edited(drafter_dir, tmp_path / "no-mask",
                     lambda c: c["dflash_config"].pop("mask_token_id"))
    refused(target_dir, no_mask, "no mask token")
    blocks = edited(drafter_dir, tmp_path / "blocks", lambda c: c.update(block_size=4))
    refused(target_dir, blocks, "dflash_config.block_size=8 and block_size=4 disagree")
    torn = tmp_path / "torn"
    shutil.copytree(drafter_dir, torn)
    data = (torn / "model.safetensors").read_bytes()
    (torn / "model.safetensors").write_bytes(data[: len(data) // 2])
    refused(target_dir, torn, "truncated")
    with pytest.raises(DFlashError, match="no such file or directory"):
        DFlashLoader().detect(str(tmp_path / "nowhere"))


def test_pair_refusals_name_what_would_work(target_dir, drafter_dir, tmp_path) -> None:
    far = edited(drafter_dir, tmp_path / "far",
                 lambda c: c["dflash_config"].update(target_layer_ids=[0, 3]))
    refused(target_dir, far, "target_layer_ids \\[0, 3\\] name layers \\[3\\] outside")
    deep = edited(drafter_dir, tmp_path / "deep", lambda c: c.update(num_target_layers=36))
    refused(target_dir, deep, "num_target_layers=36 but the target has 3 layers")
    mask = edited(drafter_dir, tmp_path / "mask",
                  lambda c: c["dflash_config"].update(mask_token_id=151669))
    refused(target_dir, mask, "mask_token_id=151669 is outside the target's vocabulary")
    by_name = edited(drafter_dir, tmp_path / "by-name", lambda c: (
        c["dflash_config"].pop("mask_token_id"), c["dflash_config"].update(mask_token="<|MASK|>")))
    llm = LLM(model=str(target_dir), speculative_config=spec(by_name))
    assert llm.engine.spec.proposers[0].mask == MASK
    wide = save_drafter(tmp_path / "wide", hidden=256, intermediate=512, head_dim=64)
    refused(target_dir, wide, "the drafter's hidden_size is 256 and the target's 128")
