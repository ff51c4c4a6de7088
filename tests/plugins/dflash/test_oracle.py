"""Oracle: the drafts draftwise proposes per step equal z-lab's reference model's.

For every step the engine ran, the reference recomputes the step from scratch with
z-lab's own code (``dflash==0.1.0``): the HF target's ``output_hidden_states`` over the
committed context, ``extract_context_feature`` (z-lab's ``hidden_states[id + 1]``), then
``DFlashDraftModel.forward`` over ``[anchor, MASK x k]`` at its positions and
``compute_logits`` / argmax (DFlash1) or ``DFlash2DraftModel.propose`` (the selector's
walk). Both sides run in float32, so equal tokens are expected exactly. Drafting over
several steps exercises the context written once per committed position into the paged
draft KV: a context K/V written at the wrong slot, position or layer changes the drafts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from draftwise import LLM, SamplingParams

from .conftest import save_drafter

PROMPTS = [[7, 3, 11, 5, 2, 9], list(range(20, 47))]


def record_drafts(llm: LLM) -> list[tuple[list[int], list[int]]]:
    """Wrap the proposer: (context tokens, drafts) for every drafted row of every step."""
    proposer = llm.engine.spec.proposers[0]
    seen: list[tuple[list[int], list[int]]] = []
    original = proposer.propose

    def propose(batch: Any) -> Any:
        out = original(batch)
        for i, row in enumerate(batch.rows):
            if out.num_draft_tokens[i]:
                seen.append(([int(t) for t in row.token_ids], out.row(i).tolist()))
        return out

    proposer.propose = propose
    return seen


def reference_drafts(target: Any, drafter: Any, tokens: list[int], k: int) -> list[int]:
    """z-lab's drafts for one step: context = tokens[:-1], anchor = tokens[-1]."""
    from dflash.model import DFlash2DraftModel, _draft_value, extract_context_feature

    n = len(tokens)
    scale = float(_draft_value(drafter.config, "input_embedding_scale", 1.0))
    with torch.no_grad():
        out = target(torch.tensor([tokens[:-1]]), output_hidden_states=True)
        ctx = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
        noise = target.get_input_embeddings()(torch.tensor([[tokens[-1]] + [drafter.mask_token_id] * k])) * scale
        hidden = drafter(
            target_hidden=ctx, noise_embedding=noise,
            position_ids=torch.arange(n + k)[None], use_cache=False,
        )[:, 1:]
        if isinstance(drafter, DFlash2DraftModel):
            toks, _, _ = drafter.propose(hidden, torch.tensor([tokens[-1]]), target.lm_head, 0.0)
            return toks[0].tolist()
        return drafter.compute_logits(hidden, target.lm_head).argmax(-1)[0].tolist()


def hf_pair(target_dir: Path, drafter_dir: Path) -> tuple[Any, Any]:
    import transformers
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    arch = json.loads((drafter_dir / "config.json").read_text())["architectures"][0]
    cls = DFlash2DraftModel if arch == "DFlash2DraftModel" else DFlashDraftModel
    return target.eval(), cls.from_pretrained(drafter_dir, dtype=torch.float32).eval()


def run_engine(target_dir: Path, drafter_dir: Path, k: int, n: int = 12):
    """Drafts recorded at fixed depth: each step's k-deep block is compared with z-lab's."""
    llm = LLM(model=str(target_dir), dtype="float32", speculative_config={
        "method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": k,
        "draftwise": {"adaptive": False}})
    seen = record_drafts(llm)
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp)
    return seen


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("k", [7, 4])
def test_drafts_equal_the_reference_every_step(target_dir, drafter_dir, drafter2_dir,
                                               version: int, k: int) -> None:
    drafter = drafter_dir if version == 1 else drafter2_dir
    seen = run_engine(target_dir, drafter, k)
    target, ref = hf_pair(target_dir, drafter)
    assert len(seen) >= 10
    for tokens, drafts in seen:
        assert 1 <= len(drafts) <= k  # a shorter block near max_tokens, as z-lab's loop
        assert drafts == reference_drafts(target, ref, tokens, len(drafts)), f"ctx {tokens}"
    assert max(len(d) for _, d in seen) == k


def test_layer_ids_off_by_one_fails(target_dir, drafter_dir, tmp_path) -> None:
    """vLLM's input-capture convention (id + 1) on z-lab weights drafts other tokens: the
    comparison above would catch an off-by-one in the tap numbering."""
    shifted = tmp_path / "shifted"
    shutil.copytree(drafter_dir, shifted)
    cfg = json.loads((shifted / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [i + 1 for i in
                                                cfg["dflash_config"]["target_layer_ids"][:-1]] + [1]
    (shifted / "config.json").write_text(json.dumps(cfg))
    seen = run_engine(target_dir, shifted, 7)
    target, ref = hf_pair(target_dir, drafter_dir)  # the reference keeps z-lab's ids
    differ = sum(drafts != reference_drafts(target, ref, tokens, len(drafts))
                 for tokens, drafts in seen)
    assert differ == len(seen)


def test_fallback_layer_ids_match_the_reference(target_dir, tmp_path) -> None:
    """No target_layer_ids: z-lab's build_target_layer_ids rule, on both sides."""
    d = save_drafter(tmp_path / "fallback", target_layer_ids=None, layers=1, block_size=4)
    seen = run_engine(target_dir, d, 3, n=6)
    target, ref = hf_pair(target_dir, d)
    assert ref.target_layer_ids == [1]
    for tokens, drafts in seen:
        assert drafts == reference_drafts(target, ref, tokens, len(drafts))


@pytest.mark.parametrize("version", [1, 2])
def test_config_variants_match_the_reference(target_dir, tmp_path, version: int) -> None:
    """Sliding causal layers beside full non-causal ones, a top-level block_size, the
    embedding scale, the logit multiplier and soft-cap: every key z-lab reads."""
    d = save_drafter(
        tmp_path / f"variants{version}", version=version, layers=3, top_level_block=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=5, use_sliding_window=True,
    )
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"].update(input_embedding_scale=1.7, output_multiplier=0.8,
                                final_logit_softcapping=6.0)
    (d / "config.json").write_text(json.dumps(cfg))
    seen = run_engine(target_dir, d, 7)
    target, ref = hf_pair(target_dir, d)
    assert ref.layers[0].self_attn.is_causal and not ref.layers[1].self_attn.is_causal
    for tokens, drafts in seen:
        assert drafts == reference_drafts(target, ref, tokens, len(drafts)), f"ctx {tokens}"
