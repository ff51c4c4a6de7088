"""DSpark drafters as GGUF in llama.cpp's layout: the same drafts as their safetensors.

The files are written by gguf-py's ``GGUFWriter`` the way llama.cpp's
``conversion/qwen.py`` ``DSparkModel`` writes them (``draftwise_dspark.gguf_drafter``):
the ``dflash`` body, ``markov_w1``/``markov_w2``, optional ``conf_proj``, the draft's
``token_embd``, no ``output`` (the converter drops a full-vocabulary head: the target's
is used), ``dflash.sample_from_anchor`` and ``dflash.has_confidence_head``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from draftwise import LLM, SamplingParams
from draftwise.formats.errors import ModelFormatError
from draftwise_dflash.gguf_drafter import _gguf as gguf_name
from spec_sampling import fixed_depth

from .conftest import MASK, TRAIN_PROMPTS, save_dspark
from .test_oracle import record_drafts

HEADS = {"markov_head.markov_w1.weight": "markov_w1.weight",
         "markov_head.markov_w2.weight": "markov_w2.weight",
         "confidence_head.proj.weight": "conf_proj.weight",
         "confidence_head.proj.bias": "conf_proj.bias", "embed_tokens.weight": "token_embd.weight",
         "lm_head.weight": "output.weight"}


def write_dspark_gguf(src: Path, out: Path, *, keep_head: bool = False,
                      meta: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
                      d2t: bool = False) -> Path:
    """``src`` (a DeepSpec safetensors drafter) as a llama.cpp DSpark GGUF, bf16."""
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    tensors = {k: v.float().numpy() for k, v in load_file(str(src / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(out), "dflash")
    for key, value in {
        "block_count": cfg["num_hidden_layers"], "context_length": 512,
        "embedding_length": cfg["hidden_size"], "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "attention.key_length": cfg["head_dim"], "attention.value_length": cfg["head_dim"],
        "block_size": cfg["block_size"],
    }.items():
        w.add_uint32(f"dflash.{key}", value)
    rope = cfg.get("rope_parameters") or {}
    w.add_float32("dflash.rope.freq_base", float(rope.get("rope_theta", cfg.get("rope_theta", 1e6))))
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_array("dflash.target_layers", [i + 1 for i in cfg["target_layer_ids"]])
    w.add_uint32("tokenizer.ggml.mask_token_id", MASK)
    w.add_bool("dflash.sample_from_anchor", True)
    w.add_bool("dflash.has_confidence_head", "confidence_head.proj.weight" in tensors)
    for key, value in (meta or {}).items():
        w.add_bool(key, value)
    for name, arr in tensors.items():
        if name == "lm_head.weight" and not keep_head:
            continue
        g = HEADS.get(name) or gguf_name(name)
        if g in drop:
            continue
        qt = gguf.GGMLQuantizationType.BF16 if arr.ndim == 2 else gguf.GGMLQuantizationType.F32
        w.add_tensor(g, gguf.quants.quantize(arr, qt) if arr.ndim == 2 else arr, raw_dtype=qt)
    if d2t:
        w.add_tensor("d2t", np.arange(cfg["vocab_size"], dtype=np.int64),
                     raw_dtype=gguf.GGMLQuantizationType.I64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 90))]


def drafts_of(target: Path, drafter: Path, **extra: Any) -> tuple[list, list, LLM]:
    """Drafts at fixed depth, so that two containers' runs compare step for step."""
    llm = LLM(model=str(target), dtype="bfloat16", max_num_seqs=3, speculative_config=fixed_depth({
        "method": "dspark", "model": str(drafter), "num_speculative_tokens": 7, **extra}))
    seen = record_drafts(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return seen, [o.outputs[0].token_ids for o in outs], llm


@pytest.fixture(scope="module")
def plain(target_dir: Path) -> list[list[int]]:
    llm = LLM(model=str(target_dir), dtype="bfloat16")
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


def test_gguf_drafts_exactly_what_its_safetensors_drafts(target_dir, trained_dir, plain,
                                                         tmp_path) -> None:
    """bf16 both ways, the GGUF without an output head (the target's, which the trained
    drafter's lm_head copies): every draft of every step equal, output spec-off's."""
    path = write_dspark_gguf(trained_dir, tmp_path / "d.gguf")
    want, out_st, _ = drafts_of(target_dir, trained_dir)
    got, out_gguf, llm = drafts_of(target_dir, path)
    assert got == want and len(got) > 4
    assert out_gguf == out_st == plain
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.loaded_drafts[0].format == "gguf" if hasattr(
        llm.engine, "loaded_drafts") else True


def test_gguf_confidence_head_cuts_as_its_safetensors(target_dir, tmp_path, plain) -> None:
    src = save_dspark(tmp_path / "conf", target_dir, enable_confidence_head=True,
                      confidence_head_with_markov=True, confidence_std=0.3)
    path = write_dspark_gguf(src, tmp_path / "c.gguf", keep_head=True)
    cut = {"draftwise": {"confidence_threshold": 0.5}}
    want, _, st = drafts_of(target_dir, src, **cut)
    got, out, llm = drafts_of(target_dir, path, **cut)
    assert got == want and out == plain
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["confidence_cut_tokens"] == st.engine.spec.proposer_stats()[0][
        "confidence_cut_tokens"] > 0


def test_gguf_refusals_by_name(target_dir, dspark_dir, tmp_path) -> None:
    cases = [
        ({"drop": ("markov_w1.weight", "markov_w2.weight")}, "no markov_w1.weight"),
        ({"meta": {"dflash.sample_from_anchor": False}}, "sample_from_anchor is false"),
        # the core's GGUF reader refuses the I64 table before the DSpark reader sees it
        ({"d2t": True}, r"tensor 'd2t' is stored as I64"),
        ({"drop": ("blk.0.attn_q.weight",)}, "missing tensors"),
    ]
    for i, (kw, message) in enumerate(cases):
        if "meta" in kw:  # the writer adds sample_from_anchor true: write the key once
            path = _with_anchor_false(dspark_dir, tmp_path / f"r{i}.gguf")
        else:
            path = write_dspark_gguf(dspark_dir, tmp_path / f"r{i}.gguf", **kw)
        with pytest.raises(ModelFormatError, match=message):
            LLM(model=str(target_dir), speculative_config={
                "method": "dspark", "model": str(path), "num_speculative_tokens": 7})


def _with_anchor_false(src: Path, out: Path) -> Path:
    """A GGUF whose dflash.sample_from_anchor is false (the bonus-anchor block)."""
    import draftwise_dspark.gguf_drafter  # noqa: F401  (the reader under test)

    orig = gguf.GGUFWriter.add_bool

    def add_bool(self, key, value):
        return orig(self, key, False if key == "dflash.sample_from_anchor" else value)

    gguf.GGUFWriter.add_bool = add_bool  # type: ignore[method-assign]
    try:
        return write_dspark_gguf(src, out)
    finally:
        gguf.GGUFWriter.add_bool = orig  # type: ignore[method-assign]
