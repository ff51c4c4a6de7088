"""MtpProposer through the engine: spec-on == spec-off, witnesses, k defaults, long requests.

The head's KV lives in the core's block pool and its hidden states come through the
core's channel, so the proposer is tested where it runs: inside ``LLM``. bf16 weights:
the target forward is batch-invariant there, so identity is exact.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from draftwise import LLM, SamplingParams
from draftwise.config import MissingKeyError, RefusedValueError
from draftwise.models.linear import BlockedWeight
from draftwise.models.qwen3_next import load_hybrid
from draftwise_mtp.head import MtpHeadError, detect, load_head
from draftwise_mtp.options import MtpOptions
from draftwise_mtp.proposer import MtpProposer

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]


def builder():
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory) -> Path:
    return builder().build(tmp_path_factory.mktemp("hybrid-mtp"), "qwen3_5")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def run(
    path: Path, prompt: list[int], n: int, spec: dict | None = None, **kw
) -> tuple[list[int], LLM]:
    llm = LLM(model=str(path), dtype="bfloat16", speculative_config=spec, **kw)
    out = llm.generate({"prompt_token_ids": prompt}, greedy(n))[0]
    return out.outputs[0].token_ids, llm


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_speculation_on_is_token_identical_to_off(hybrid_dir, k: int) -> None:
    plain, _ = run(hybrid_dir, PROMPT, 24)
    # fixed depth: the witness counts the head's forwards at k-deep drafts
    spec, llm = run(hybrid_dir, PROMPT, 24, {"method": "mtp", "num_speculative_tokens": k,
                                             "draftwise": {"adaptive": False}})
    assert spec == plain
    w = llm.engine.spec.proposers[0].witness
    assert w.rows > 0 and w.draft_forwards > 0
    if k >= 2:
        assert w.extra_forwards > 0 and w.rows_beyond_copy > 0
    assert llm.engine.spec.num_tracked_requests == 0 and llm.engine.kv.num_used_blocks == 0


def test_control_that_pads_its_row_is_seen_by_the_witnesses(hybrid_dir, monkeypatch) -> None:
    """A drafter that runs one forward and pads its row is lossless, and the witnesses say so."""
    plain, _ = run(hybrid_dir, PROMPT, 16)
    # fixed depth: both witnesses count forwards at k-deep drafts
    spec = {"method": "mtp", "num_speculative_tokens": 4, "draftwise": {"adaptive": False}}
    real_out, real = run(hybrid_dir, PROMPT, 16, spec)

    def pad(self, rows, tok, feedback, drafts, probs, w) -> None:
        for j, r in enumerate(rows):
            drafts[r.index].extend([int(tok[j])] * (r.want - 1))

    monkeypatch.setattr(MtpProposer, "_continue", pad)
    control_out, control = run(hybrid_dir, PROMPT, 16, spec)
    assert real_out == plain and control_out == plain  # lossless either way
    rw, cw = real.engine.spec.proposers[0].witness, control.engine.spec.proposers[0].witness
    assert rw.extra_forwards > 0 and rw.rows_beyond_copy > 0
    assert cw.extra_forwards == 0 and cw.rows_beyond_copy == 0 and cw.rows > 0


def test_k_defaults_to_the_head_depth_without_model(hybrid_dir) -> None:
    """{"method": "mtp"} on a checkpoint with an mtp.* head: k = mtp_num_hidden_layers."""
    plain, _ = run(hybrid_dir, PROMPT, 12)
    out, llm = run(hybrid_dir, PROMPT, 12, {"method": "mtp"})
    assert out == plain
    assert llm.engine.spec.k == 1 and llm.engine.spec_config.num_speculative_tokens == 1
    assert llm.engine.spec.metrics.num_draft_tokens > 0


def test_no_head_count_and_no_k_is_refused(tmp_path) -> None:
    bare = builder().build(tmp_path / "bare", "qwen3_5", mtp=False)
    with pytest.raises(MtpHeadError, match="no MTP head in this checkpoint"):
        LLM(model=str(bare), speculative_config={"method": "mtp"})


def test_head_layout_and_sharing(hybrid_dir) -> None:
    target, _ = load_hybrid(str(hybrid_dir), torch.bfloat16)
    head = load_head(str(hybrid_dir), target)
    assert detect(str(hybrid_dir)) == "safetensors:qwen3_next"
    assert head.num_layers == 1 and head.lm_head is None and head.zero_centred
    assert len(head.names) == 15


def test_refusals_by_name(tmp_path, hybrid_dir) -> None:
    target, _ = load_hybrid(str(hybrid_dir), torch.bfloat16)
    bare = builder().build(tmp_path / "bare", "qwen3_5", mtp=False)
    with pytest.raises(MtpHeadError, match="no MTP head in this checkpoint"):
        detect(str(bare))
    with pytest.raises(RefusedValueError, match="divisible by the checkpoint's n_predict=2"):
        MtpOptions().check_checkpoint(3, {"mtp_num_hidden_layers": 2})
    with pytest.raises(MissingKeyError):
        MtpOptions().check_checkpoint(None, {})
    moe = builder().build(tmp_path / "moe", "qwen3_5")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(moe / "model.safetensors"))
    tensors["mtp.layers.0.mlp.experts.0.up_proj.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(moe / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MtpHeadError, match="mixture-of-experts"):
        load_head(str(moe), target)


def nextn_checkpoint(tmp_path: Path, **overrides) -> tuple[Path, Path]:
    """A tiny llama target, and a copy carrying a DeepSeek-V3-style nextn layer L."""
    from safetensors.torch import load_file, save_file
    from tiny_checkpoints import save_tiny

    plain = save_tiny("llama", tmp_path / "llama", seed=4, **overrides)
    nextn = tmp_path / "llama-nextn"
    shutil.copytree(plain, nextn)
    cfg = json.loads((nextn / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (nextn / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(nextn / "model.safetensors"))
    n, hid = cfg["num_hidden_layers"], cfg["hidden_size"]
    gen = torch.Generator().manual_seed(9)
    for name, t in list(tensors.items()):  # the nextn block: a re-drawn copy of layer 0
        if name.startswith("model.layers.0."):
            tensors[name.replace("layers.0.", f"layers.{n}.")] = t + 0.02 * torch.randn(
                t.shape, generator=gen
            )
    p = f"model.layers.{n}."
    tensors[p + "eh_proj.weight"] = 0.08 * torch.randn(hid, 2 * hid, generator=gen)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[p + norm + ".weight"] = 1 + 0.1 * torch.randn(hid, generator=gen)
    tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(nextn / "model.safetensors"), metadata={"format": "pt"})
    return plain, nextn


@pytest.fixture(scope="module")
def nextn(tmp_path_factory) -> tuple[Path, Path]:
    return nextn_checkpoint(tmp_path_factory.mktemp("nextn"))


NEXTN_PROMPT = [7, 300, 21, 9, 9, 450, 3, 18]


@pytest.mark.parametrize("k", [None, 1, 3])
def test_model_key_names_the_head_and_k_defaults_to_its_depth(nextn, k: int | None) -> None:
    """{"method": "mtp", "model": dir}: the head comes from dir; without k, k = its depth."""
    plain_dir, nextn_dir = nextn
    assert detect(str(nextn_dir)) == "safetensors:deepseek_nextn"
    # fixed depth: "the head must really draft" below, which adaptive depth (the default)
    # need not do in 16 tokens when this machine prices the head's drafts out
    spec = {"method": "mtp", "model": str(nextn_dir), "draftwise": {"adaptive": False}}
    if k is not None:
        spec["num_speculative_tokens"] = k
    plain, _ = run(plain_dir, NEXTN_PROMPT, 16)
    out, llm = run(plain_dir, NEXTN_PROMPT, 16, spec)
    assert out == plain
    assert llm.engine.spec.k == (k or 1)
    head = llm.engine.spec.proposers[0].head
    assert head.layout == "deepseek_nextn" and head.lm_head is not None
    assert head.mask_first_embedding
    # the target's kernels: packed GEMMs (fc, own LM head, the block), C attention and norms
    assert (head.attention, head.native) == ("native", True)
    assert all(isinstance(w, BlockedWeight) for w in (head.fc, head.lm_head))
    assert all(layer.native and isinstance(layer.qkv_weight, BlockedWeight)
               for layer in head.layers)
    assert llm.engine.spec.metrics.num_draft_tokens > 0, "the head must really draft"


def test_model_key_without_a_head_is_refused(nextn) -> None:
    plain_dir, _ = nextn
    with pytest.raises(MtpHeadError, match="no MTP head in this checkpoint"):
        LLM(model=str(plain_dir), speculative_config={"method": "mtp", "model": str(plain_dir)})


def test_a_request_longer_than_the_old_private_pool(tmp_path) -> None:
    """MTP's old private pool held 256 x 16 = 4,096 positions and raised past them."""
    plain_dir, nextn_dir = nextn_checkpoint(tmp_path, max_position_embeddings=8192)
    prompt = [(i * 37) % 500 + 3 for i in range(4300)]
    spec = {"method": "mtp", "model": str(nextn_dir), "num_speculative_tokens": 2}
    plain, _ = run(plain_dir, prompt, 6, max_model_len=4400)
    out, llm = run(plain_dir, prompt, 6, spec, max_model_len=4400)
    assert out == plain and llm.engine.spec.metrics.num_draft_tokens > 0


def test_prefix_cache_hits_drop_the_block_whose_head_entry_reads_the_next_token(nextn) -> None:
    """A hit keeps every block but the last matched one: the head's KV at a block's last
    position pairs it with the next token, which the block's hash does not cover."""
    plain_dir, nextn_dir = nextn
    spec = {"method": "mtp", "model": str(nextn_dir), "num_speculative_tokens": 2}
    llm = LLM(model=str(plain_dir), dtype="bfloat16", speculative_config=spec, block_size=4)
    shared = list(range(3, 23))  # five full blocks
    a = llm.generate({"prompt_token_ids": shared + [40, 41]}, greedy(8))[0]
    b = llm.generate({"prompt_token_ids": shared + [50, 51]}, greedy(8))[0]
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 16  # 5 blocks match, 4 used
    alone, _ = run(plain_dir, shared + [50, 51], 8)
    assert b.outputs[0].token_ids == alone
    assert llm.engine.kv.num_used_blocks == 0 and llm.engine.spec.num_tracked_requests == 0


def test_probabilistic_drafting_hands_verify_the_heads_q(hybrid_dir, monkeypatch) -> None:
    """draft_sample_method "probabilistic": the head samples and returns its q (the same
    pick_draft_tokens the draft_model chi-square test checks), greedy rows stay argmax."""
    import draftwise.spec.verify as verify_mod

    seen: list[object] = []
    real = verify_mod.verify

    def spy(*args, **kwargs):
        seen.append(kwargs.get("draft_probs"))
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_mod, "verify", spy)
    # fixed depth: every step hands verify the head's q, which a parked row would not
    spec = {"method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic",
            "draftwise": {"adaptive": False}}
    llm = LLM(model=str(hybrid_dir), dtype="bfloat16", speculative_config=spec)
    params = [SamplingParams(temperature=0.8, max_tokens=8, seed=i, ignore_eos=True)
              for i in range(3)] + [greedy(8)]
    llm.generate([{"prompt_token_ids": PROMPT}] * 4, params)
    qs = [q for q in seen if q is not None]
    assert qs and all(abs(float(row.sum()) - 1.0) < 1e-4 for q in qs for row in q)
    assert llm.engine.spec.metrics.num_draft_tokens > 0
