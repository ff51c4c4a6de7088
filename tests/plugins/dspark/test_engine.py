"""dspark through the whole engine: greedy identity per Markov type, batching, prefill
beside decode, the CLI, ``draftwise plugins``, and the refusals of the loader stage.

bf16 weights for identity: the target's forwards are batch-invariant, so every identity
is exact whatever shares the batch. The trained drafter (``conftest.train_dspark``)
makes acceptance far from zero, so accepted drafts and multi-position context writes run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from draftwise import LLM
from draftwise.config import RefusedValueError
from draftwise.formats.errors import ModelFormatError

from ..conftest import assert_clean, generate, greedy, run_staggered
from .conftest import TRAIN_PROMPTS, save_dspark

PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 97)), [100, 101, 102]]


def spec(drafter: Path, k: int | None = 7, **extra: Any) -> dict[str, Any]:
    out = {"method": "dspark", "model": str(drafter), **extra}
    if k is not None:
        out["num_speculative_tokens"] = k
    return out


def fixed(drafter: Path, k: int | None = 7, **extra: Any) -> dict[str, Any]:
    """``spec`` at fixed depth, for tests that compare two engines draft for draft or count
    drafts at late block slots: adaptive depth (the default) drafts each engine by its own
    timing and acceptance, and parks rows where drafts do not pay."""
    return spec(drafter, k, draftwise={"adaptive": False}, **extra)


@pytest.fixture(scope="module")
def want(target_dir: Path) -> list[list[int]]:
    """Each prompt alone, speculation off."""
    return [generate(target_dir, None, [p])[0][0] for p in PROMPTS]


def test_trained_greedy_identical_with_drafts_accepted(target_dir, trained_dir, want) -> None:
    got, llm = generate(target_dir, fixed(trained_dir), PROMPTS, max_num_seqs=4)
    assert got == want
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
    assert m.num_accepted_tokens_per_pos[5] > 0, "late block slots must be accepted too"
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["method"] == "dspark"
    assert stats["draft_forwards"] < stats["rows_drafted"], "one forward for all rows"
    assert_clean(llm)


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_every_markov_type_is_identical_batched(target_dir, want, tmp_path, kind: str) -> None:
    drafter = save_dspark(tmp_path / kind, target_dir, kind=kind)
    got, llm = generate(target_dir, spec(drafter), PROMPTS, max_num_seqs=4)
    assert got == want
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["markov_steps"] > 0 and llm.engine.spec.metrics.num_draft_tokens > 0
    assert_clean(llm)


def test_prefill_in_the_same_step_and_chunked(target_dir, trained_dir, want) -> None:
    """Requests arrive while others decode; a small token budget chunks the long prompt."""
    llm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=spec(trained_dir),
              max_num_seqs=4, max_num_batched_tokens=24)
    got, mixed = run_staggered(llm, PROMPTS, greedy())
    assert got == want
    assert mixed > 0 and llm.engine.spec.metrics.num_accepted_tokens > 0
    assert_clean(llm)


def test_small_pages_and_preemption_stay_identical(target_dir, trained_dir, want) -> None:
    # fixed: adaptive depth's cost model times batches a 24-block pool cannot hold
    llm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed(trained_dir),
              block_size=4, num_kv_blocks=24, max_model_len=64, max_num_seqs=4,
              max_num_batched_tokens=48)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    assert [o.outputs[0].token_ids for o in outs] == want
    assert llm.engine.stats.num_preemptions > 0, "the test must force a preemption"
    assert_clean(llm)


def test_cli_generate_json_and_plugins(target_dir, trained_dir) -> None:
    from draftwise.cli import cli

    ids = ",".join(str(t) for t in PROMPTS[0])
    result = CliRunner().invoke(cli, [
        "generate", "--model", str(target_dir), "--prompt-token-ids", ids, "--max-tokens", "20",
        "--dtype", "bfloat16", "--speculative-config", json.dumps(spec(trained_dir)), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    sd = doc["speculation"]
    assert sd["num_spec_tokens"] == 7 and sd["num_accepted_tokens"] > 0
    assert doc["proposers"][0]["method"] == "dspark"
    listing = CliRunner().invoke(cli, ["plugins", "--json"])
    assert listing.exit_code == 0, listing.output
    row = next(r for r in json.loads(listing.stdout) if "dspark" in r["methods"])
    assert row["status"] == {"dspark": "runs"}


def test_k_defaults_to_and_must_equal_the_block_size(target_dir, dspark_dir) -> None:
    llm = LLM(model=str(target_dir), speculative_config=spec(dspark_dir, None))
    assert llm.engine.spec.k == 7
    for k in (6, 8):
        with pytest.raises(RefusedValueError, match=f"num_speculative_tokens={k} is refused"):
            LLM(model=str(target_dir), speculative_config=spec(dspark_dir, k))


def _variant(src: Path, dst: Path, **changes: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("changes", "message"), [
    ({"architectures": None}, "has no architectures, so the DSpark layout is unknown"),
    ({"architectures": ["DeepseekV4ForCausalLM"]}, "DeepSeek-V4's self-contained DSpark"),
    ({"architectures": ["DSparkSpeculator"]}, "transformer_layer_config is missing"),
    ({"architectures": ["DSparkDraftModel"]}, "dflash_config is missing: the SpecForge layout"),
    ({"architectures": ["DFlashDraftModel"]}, "is not a DSpark drafter"),
    ({"markov_head_type": "gated"}, "missing tensors .*gate_proj"),
    ({"markov_head_type": "lstm"}, "markov_head_type='lstm' is not one of"),
    ({"target_layer_ids": [1, -1]}, "must be strictly increasing"),
    ({"target_layer_ids": [-1, 5]}, "outside the target's 0..2"),
    ({"vocab_size": 600}, "embed_tokens.weight"),
])
def test_refused_by_name(target_dir, dspark_dir, tmp_path, changes, message) -> None:
    bad = _variant(dspark_dir, tmp_path / "bad", **changes)
    with pytest.raises(ModelFormatError, match=message):
        LLM(model=str(target_dir), speculative_config=spec(bad))


def test_containers_it_does_not_read_are_refused(target_dir, dspark_dir, tmp_path) -> None:
    exl3 = _variant(dspark_dir, tmp_path / "exl3",
                    quantization_config={"quant_method": "exl3", "bits": 4})
    with pytest.raises(ModelFormatError, match="an EXL3 drafter"):
        LLM(model=str(target_dir), speculative_config=spec(exl3))
    nvfp4 = _variant(dspark_dir, tmp_path / "nvfp4", quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4"})
    with pytest.raises(ModelFormatError, match="fc is declared NVFP4 \\(modelopt\\) but has no"):
        LLM(model=str(target_dir), speculative_config=spec(nvfp4))
    gguf = tmp_path / "d.gguf"  # a GGUF goes to the GGUF reader, which names the damage
    gguf.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ModelFormatError, match="GGUF version 0 is not supported"):
        LLM(model=str(target_dir), speculative_config=spec(gguf))


def test_confidence_cut_is_identical_and_counted(target_dir, trained_dir, want, tmp_path
                                                 ) -> None:
    """The cut shortens the drafts verify sees: output identical batched, and the metrics
    keep drafted (proposer ``draft_tokens``), verified (``num_draft_tokens``) and accepted
    apart; without a threshold a drafter with the head verifies every draft."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    drafter = tmp_path / "conf"
    shutil.copytree(trained_dir, drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg.update(enable_confidence_head=True, confidence_head_with_markov=True)
    (drafter / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(drafter / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    width = cfg["hidden_size"] + cfg["markov_rank"]
    t["confidence_head.proj.weight"] = (torch.randn(1, width, generator=g) * 0.3).bfloat16()
    t["confidence_head.proj.bias"] = torch.zeros(1, dtype=torch.bfloat16)
    save_file(t, str(drafter / "model.safetensors"))
    full, llm_full = generate(target_dir, spec(drafter), PROMPTS, max_num_seqs=4)
    assert full == want
    stats = llm_full.engine.spec.proposer_stats()[0]
    assert stats["confidence_cut_tokens"] == 0
    assert stats["draft_tokens"] == llm_full.engine.spec.metrics.num_draft_tokens
    got, llm = generate(target_dir, spec(drafter, draftwise={"confidence_threshold": 0.5}),
                        PROMPTS, max_num_seqs=4)
    assert got == want
    m, stats = llm.engine.spec.metrics, llm.engine.spec.proposer_stats()[0]
    cut = stats["confidence_cut_tokens"]
    assert 0 < cut < stats["draft_tokens"]
    assert m.num_draft_tokens == stats["draft_tokens"] - cut, "verified = drafted - cut"
    assert 0 < m.num_accepted_tokens <= m.num_draft_tokens
    assert_clean(llm)


def test_confidence_threshold_refused_by_name(target_dir, dspark_dir, tmp_path) -> None:
    """A threshold needs a head: refused for a drafter without one, for a method without
    one, outside [0, 1], and at a chain's top level; vLLM's adaptive verification is
    refused by name (a different algorithm), not taken for the cut."""
    from draftwise.config import InvalidValueError, parse_speculative_config

    cut = {"draftwise": {"confidence_threshold": 0.5}}
    with pytest.raises(ModelFormatError, match="enable_confidence_head false"):
        LLM(model=str(target_dir), speculative_config=spec(dspark_dir, **cut))
    with pytest.raises(RefusedValueError, match="refused by method 'ngram': it has no conf"):
        parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3, **cut})
    with pytest.raises(InvalidValueError, match=r"confidence_threshold=1.5 is invalid"):
        parse_speculative_config(spec(dspark_dir, draftwise={"confidence_threshold": 1.5}))
    with pytest.raises(RefusedValueError, match="top level of a drafter_chain"):
        parse_speculative_config({"num_speculative_tokens": 7, "draftwise": {
            "confidence_threshold": 0.5, "drafter_chain": [spec(dspark_dir, k=None)]}})
    chained = parse_speculative_config({"num_speculative_tokens": 7, "draftwise": {
        "drafter_chain": [spec(dspark_dir, k=None, **cut)]}})
    assert chained.chain[0].confidence_threshold == 0.5
    assert parse_speculative_config(chained.chain[0].to_json()) == chained.chain[0]
    # the cut prices depth itself: without an adaptive key, depth stays fixed (and says so)
    assert chained.adaptive is None and chained.depth_stops == ("confidence_threshold=0.5",)
    alone = parse_speculative_config(spec(dspark_dir, **cut))
    assert alone.adaptive is None and "confidence_threshold=0.5" in alone.depth_line()
    assert parse_speculative_config(spec(dspark_dir)).adaptive is not None
    with pytest.raises(RefusedValueError, match="enable_adaptive_verification=true is refused"):
        LLM(model=str(target_dir), speculative_config=spec(dspark_dir,
                                                           enable_adaptive_verification=True))
    with_head = save_dspark(tmp_path / "conf", target_dir, enable_confidence_head=True,
                            confidence_head_with_markov=True)
    broken = _variant(with_head, tmp_path / "noconf", confidence_head_with_markov=False)
    with pytest.raises(ModelFormatError, match="confidence_head.proj.weight"):
        LLM(model=str(target_dir), speculative_config=spec(broken))
    rank0 = _variant(with_head, tmp_path / "r0", markov_rank=0)
    with pytest.raises(ModelFormatError, match="confidence_head_with_markov is true but"):
        LLM(model=str(target_dir), speculative_config=spec(rank0))


def test_certified_greedy_pick_drafts_what_the_full_product_drafts(
        target_dir, trained_dir, monkeypatch) -> None:
    """bf16, batched: every draft of every step is the same with the certified argmax
    as with the full W2 product forced everywhere, and the certified path did serve
    some steps (the trained drafter's bias is small against its margins)."""
    from draftwise_dspark.markov import MarkovHead

    from .test_oracle import record_drafts

    def run() -> tuple[list, dict]:
        llm = LLM(model=str(target_dir), dtype="bfloat16", max_num_seqs=4,
                  speculative_config=fixed(trained_dir))
        llm.engine.spec.proposers[0].native = None  # the torch pass's pick (test_native: C's)
        seen = record_drafts(llm)
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
        return seen, llm.engine.spec.proposer_stats()[0]

    seen, stats = run()
    assert 0 < stats["markov_certified"] <= stats["markov_steps"]
    monkeypatch.setattr(MarkovHead, "certified_argmax", lambda self, base, u: None)
    forced, forced_stats = run()
    assert forced_stats["markov_certified"] == 0
    assert seen == forced
