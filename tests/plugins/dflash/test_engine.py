"""dflash through the whole engine: greedy identity, batching, prefill beside decode,
draft KV books, the CLI, and acceptance equal to z-lab's ``dflash_generate``.

bf16 weights for identity: the target's forwards are batch-invariant, so every identity
is exact (token lists equal) whatever shares the batch. The trained drafters
(``conftest.train_drafter``) make acceptance far from zero, so accepted drafts, bonus
tokens and the context written for several accepted positions all run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from draftwise import LLM

from ..conftest import assert_clean, generate, greedy, run_staggered
from .conftest import TRAIN_PROMPTS, save_drafter

PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 97)), [100, 101, 102]]


def spec(drafter: Path, k: int, **extra: Any) -> dict[str, Any]:
    return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k, **extra}


@pytest.fixture(scope="module")
def want(target_dir: Path) -> list[list[int]]:
    """Each prompt alone, speculation off."""
    return [generate(target_dir, None, [p])[0][0] for p in PROMPTS]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("k", [7, 3])
def test_greedy_identical_to_spec_off_with_drafts_accepted(
    target_dir, trained_dir, trained2_dir, want, version: int, k: int
) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    # fixed depth: some drafts must be accepted and some rejected, and adaptive depth (the
    # default) may stop after a couple of probes on a machine that prices drafts out
    got, llm = generate(target_dir, spec(drafter, k, draftwise={"adaptive": False}),
                        PROMPTS[:2])
    assert got == want[:2]
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["method"] == "dflash" and stats["draft_forwards"] > 0
    assert_clean(llm)


@pytest.mark.parametrize("block", [2, 4, 16])
def test_other_block_sizes_are_identical(target_dir, want, block: int, tmp_path) -> None:
    drafter = save_drafter(tmp_path / f"b{block}", block_size=block, top_level_block=block == 4)
    got, llm = generate(target_dir, spec(drafter, block - 1), PROMPTS, max_num_seqs=4)
    assert got == want
    assert llm.engine.spec.metrics.num_draft_tokens > 0
    assert_clean(llm)


@pytest.mark.parametrize("version", [1, 2])
def test_batched_rows_one_forward_per_step(target_dir, trained_dir, trained2_dir, want,
                                           version: int) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    got, llm = generate(target_dir, spec(drafter, 7), PROMPTS, max_num_seqs=4)
    assert got == want
    stats = llm.engine.spec.proposer_stats()[0]
    # one block forward for every drafting row of a step
    assert stats["draft_forwards"] < stats["rows_drafted"]
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert_clean(llm)


def test_prefill_in_the_same_step_and_chunked(target_dir, trained_dir, want) -> None:
    """Requests arrive while others decode; a small token budget chunks the long prompt."""
    llm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=spec(trained_dir, 7),
              max_num_seqs=4, max_num_batched_tokens=24)
    got, mixed = run_staggered(llm, PROMPTS, greedy())
    assert got == want
    assert mixed > 0 and llm.engine.spec.metrics.num_accepted_tokens > 0
    assert_clean(llm)


def test_no_leaked_blocks_after_abort_and_preemption(target_dir, trained_dir, want) -> None:
    # fixed depth: k-deep drafts every step make the preemption; and adaptive depth's cost
    # model (the default) times batches a 24-block pool cannot hold (refused at start-up)
    fixed = spec(trained_dir, 7, draftwise={"adaptive": False})
    llm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed,
              block_size=4, num_kv_blocks=24, max_model_len=64, max_num_seqs=4,
              max_num_batched_tokens=48)
    engine = llm.engine
    ids = [engine.add_request({"prompt_token_ids": p}, greedy()) for p in PROMPTS]
    victim = engine.add_request({"prompt_token_ids": PROMPTS[0]}, greedy(), request_id="victim")
    done: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        steps += 1
        if steps == 3:
            assert engine.abort_request(victim)
        engine.kv.check_invariants()
    assert [done[i] for i in ids] == want
    assert engine.stats.num_preemptions > 0, "the test must force a preemption"
    assert_clean(llm)


def test_prefix_cache_hits_give_the_same_drafts(target_dir, trained_dir) -> None:
    """Context K/V of a cached prefix is the draft's too: a warm request drafts exactly
    what it drafts on a cold cache (at fixed depth: adaptive depth prices each engine's
    drafts by its own timing)."""
    from .test_oracle import record_drafts

    shared = list(range(30, 62))  # two full blocks of 16
    a, b = shared + [5, 6, 7], shared + [8, 9]
    fixed = spec(trained_dir, 7, draftwise={"adaptive": False})
    cold = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed)
    seen = record_drafts(cold)
    cold_out = cold.generate({"prompt_token_ids": b}, greedy(12))[0]
    cold_drafts = list(seen)
    warm = LLM(model=str(target_dir), dtype="bfloat16", speculative_config=fixed)
    warm.generate({"prompt_token_ids": a}, greedy(12))
    seen = record_drafts(warm)
    warm_out = warm.generate({"prompt_token_ids": b}, greedy(12))[0]
    assert warm_out.num_cached_tokens == 32, "b must hit a's two cached blocks"
    assert seen == cold_drafts
    assert warm_out.outputs[0].token_ids == cold_out.outputs[0].token_ids
    assert_clean(warm)


@pytest.mark.parametrize("version", [1, 2])
def test_acceptance_lengths_equal_dflash_generate(target_dir, trained_dir, trained2_dir,
                                                  version: int, monkeypatch) -> None:
    """Per step, tokens produced (accepted + 1) equal z-lab's ``return_stats`` in fp32 (at
    fixed depth, as z-lab's loop drafts)."""
    import time

    import dflash.model as zlab
    from dflash.model import dflash_generate

    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # its timer syncs CUDA

    from .test_oracle import hf_pair

    drafter = trained_dir if version == 1 else trained2_dir
    n = 24
    target, ref = hf_pair(target_dir, drafter)
    for prompt in TRAIN_PROMPTS[:2]:
        stats = dflash_generate(ref, target, torch.tensor([prompt]), n, None,
                                return_stats=True)
        llm = LLM(model=str(target_dir), dtype="float32",
                  speculative_config=spec(drafter, 7, draftwise={"adaptive": False}))
        proposer = llm.engine.spec.proposers[0]
        lengths: list[int] = []
        real = proposer.on_verified

        def on_verified(outcome, real=real, lengths=lengths):
            lengths.extend(len(t) for t in outcome.output_token_ids)
            real(outcome)

        proposer.on_verified = on_verified
        out = llm.generate({"prompt_token_ids": prompt}, greedy(n))[0]
        assert out.outputs[0].token_ids == stats.output_ids[0, len(prompt):].tolist()
        # every drafted step; a last step with room for no draft is a plain decode here
        assert len(stats.acceptance_lengths) - 1 <= len(lengths)
        assert lengths == stats.acceptance_lengths[: len(lengths)]
        assert max(lengths) > 1, "the trained drafter must get drafts accepted"


def test_cli_generate_json_reports_acceptance(target_dir, trained_dir, want) -> None:
    from draftwise.cli import cli

    ids = ",".join(str(t) for t in PROMPTS[0])
    config = json.dumps(spec(trained_dir, 7))
    result = CliRunner().invoke(cli, [
        "generate", "--model", str(target_dir), "--prompt-token-ids", ids, "--max-tokens", "20",
        "--dtype", "bfloat16", "--speculative-config", config, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    sd = doc["speculation"]
    assert sd["num_spec_tokens"] == 7 and len(sd["acceptance_rate_per_pos"]) == 7
    assert sd["num_accepted_tokens"] > 0
    assert doc["proposers"][0]["method"] == "dflash"


def test_a_hybrid_gdn_target_is_identical(tmp_path) -> None:
    """Qwen3.5-style target (linear-attention layers with recurrent state): the taps come
    through the same channel and the recurrent state is rolled back with the drafts."""
    import importlib.util

    root = Path(__file__).resolve().parents[3]
    mod_spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", root / "scripts" / "build_tiny_hybrid.py")
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    target = mod.build(tmp_path / "hybrid", "qwen3_5", mtp=False)
    drafter = save_drafter(tmp_path / "d", hidden=64, intermediate=128, head_dim=16,
                           target_layer_ids=[0, 3])
    cfg = json.loads((drafter / "config.json").read_text())
    cfg.update(vocab_size=256, num_target_layers=4)
    cfg["dflash_config"]["mask_token_id"] = 200
    (drafter / "config.json").write_text(json.dumps(cfg))
    prompts = [[7, 3, 11, 5, 2, 9], list(range(20, 47))]
    want = [generate(target, None, [p])[0][0] for p in prompts]
    got, llm = generate(target, spec(drafter, 7), prompts, max_num_seqs=2)
    assert got == want
    assert llm.engine.spec.metrics.num_draft_tokens > 0
    assert_clean(llm)
