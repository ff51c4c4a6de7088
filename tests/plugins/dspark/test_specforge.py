"""The SpecForge DSpark layout (``DSparkDraftModel``): its own lane, DeepSpec's block.

The fixture (``conftest.save_specforge``) writes what ``specforge export --to hf`` writes:
the Markov keys under ``dflash_config``, no embedding or LM head (the target's). The
oracle recomputes every draft of every step from the equations with the TARGET's
embedding and head (SpecForge trains with them), next-token indexing (SpecForge's
DSpark labels: slot ``j`` learns ``anchor + j + 1``) and the Markov pass in plain torch.
The trained drafter, rewritten in this layout, must draft what the DeepSpec one drafts
(the same weights; DeepSpec's tables are the target's copies), be identical to
speculation off batched with prefill beside decode, and keep the sampled distribution
under the Markov-corrected q (which a wrong accept rule breaks).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM
from draftwise.formats.errors import ModelFormatError
from safetensors.torch import load_file, save_file
from spec_sampling import fixed_depth
from stats import chi2_two_sample, pool_rare

from ..conftest import greedy, run_staggered
from .conftest import MASK, TRAIN_PROMPTS, save_specforge
from .test_oracle import Reference, record_drafts
from .test_sampling import bound, config, sample

PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 97)), [100, 101, 102]]


class SpecForgeReference(Reference):
    """:class:`Reference` over a SpecForge directory: the keys read from
    ``dflash_config``, the embedding and head taken from the HF target."""

    def __init__(self, target_dir: Path, drafter_dir: Path) -> None:
        import transformers
        from dflash.model import DFlashDraftModel
        from transformers import Qwen3Config

        self.target = transformers.AutoModelForCausalLM.from_pretrained(
            target_dir, dtype=torch.float32).eval()
        raw = json.loads((drafter_dir / "config.json").read_text())
        sub = raw["dflash_config"]
        self.cfg = {"block_size": raw["block_size"], "target_layer_ids": sub["target_layer_ids"],
                    "markov_rank": sub["markov_rank"], "markov_head_type": sub["markov_head_type"],
                    "confidence_head_with_markov": sub["confidence_head_with_markov"]}
        self.t = {k: v.float() for k, v in
                  load_file(str(drafter_dir / "model.safetensors")).items()}
        self.t["embed_tokens.weight"] = self.target.get_input_embeddings().weight.detach()
        self.t["lm_head.weight"] = self.target.lm_head.weight.detach()
        body_cfg = Qwen3Config(**{k: v for k, v in raw.items() if k not in (
            "architectures", "layer_types", "block_size", "dflash_config", "auto_map")},
            dflash_config={"mask_token_id": MASK, "block_size": raw["block_size"],
                           "target_layer_ids": sub["target_layer_ids"]})
        self.body = DFlashDraftModel(body_cfg).eval()
        body = {k: v for k, v in self.t.items()
                if not k.startswith(("embed_tokens", "lm_head", "markov_head", "confidence_head"))}
        missing, unexpected = self.body.load_state_dict(body, strict=False)
        if unexpected or [m for m in missing if not m.startswith("rotary")]:
            raise AssertionError(f"body mismatch {missing} {unexpected}")


def spec(drafter: Path, **extra: Any) -> dict[str, Any]:
    """At fixed depth: drafts are checked against the equations and DeepSpec's at all B
    slots of every step, which adaptive depth (the default) would make shallower."""
    return fixed_depth({"method": "dspark", "model": str(drafter), "num_speculative_tokens": 7,
                        **extra})


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_drafts_equal_the_equations_every_step(target_dir, tmp_path, kind: str) -> None:
    drafter = save_specforge(tmp_path / kind, target_dir, kind=kind)
    llm = LLM(model=str(target_dir), dtype="float32", speculative_config=spec(drafter))
    seen = record_drafts(llm)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], greedy(12))
    ref = SpecForgeReference(target_dir, drafter)
    assert len(seen) >= 6
    corrected = 0
    for tokens, drafts in seen:
        assert drafts == ref.drafts(tokens, len(drafts)), f"ctx {tokens}"
        corrected += drafts != ref.drafts(tokens, len(drafts), markov=False)
    assert max(len(d) for _, d in seen) == 7, "next-token indexing: all B slots draft"
    assert corrected > 0, "the Markov bias must change some drafts, or this cannot fail"


def test_confidence_cut_equals_the_equations(target_dir, tmp_path) -> None:
    drafter = save_specforge(tmp_path / "conf", target_dir, kind="gated", confidence=True,
                             with_markov=True)
    widths: list[int] = []
    llm = LLM(model=str(target_dir), dtype="float32", speculative_config=spec(
        drafter, draftwise={"confidence_threshold": 0.5}))
    seen = record_drafts(llm, widths)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], greedy(24))
    ref = SpecForgeReference(target_dir, drafter)
    lengths = []
    for (tokens, drafts), w in zip(seen, widths):
        assert drafts == ref.drafts(tokens, w, threshold=0.5), f"ctx {tokens}"
        lengths.append(len(drafts))
    assert len(set(lengths)) >= 3 and min(lengths) < 7, lengths


def test_trained_drafts_what_deepspec_drafts(target_dir, trained_dir, specforge_trained_dir
                                             ) -> None:
    runs = []
    for drafter in (trained_dir, specforge_trained_dir):
        llm = LLM(model=str(target_dir), dtype="bfloat16", max_num_seqs=4,
                  speculative_config=spec(drafter))
        seen = record_drafts(llm)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(16))
        runs.append((seen, [o.outputs[0].token_ids for o in outs], llm))
    (want, out_native, _), (got, out, llm) = runs
    assert got == want and len(got) > 4
    assert out == out_native
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.spec.proposers[0].draft.cfg.lane == "DSparkDraftModel"


def staggered(target_dir: Path, drafter: Path | None) -> tuple[list[list[int]], int, LLM]:
    """Requests arriving while others decode, a small budget chunking the long prompt."""
    llm = LLM(model=str(target_dir), dtype="bfloat16", max_num_seqs=4,
              max_num_batched_tokens=24,
              speculative_config=None if drafter is None else spec(drafter))
    got, mixed = run_staggered(llm, PROMPTS, greedy())
    return got, mixed, llm


@pytest.fixture(scope="module")
def want(target_dir: Path) -> list[list[int]]:
    return staggered(target_dir, None)[0]


@pytest.mark.parametrize("kind", ["trained", "vanilla", "gated", "rnn"])
def test_greedy_identical_batched_with_prefill_beside_decode(
        target_dir, specforge_trained_dir, want, tmp_path, kind: str) -> None:
    drafter = (specforge_trained_dir if kind == "trained"
               else save_specforge(tmp_path / kind, target_dir, kind=kind))
    got, mixed, llm = staggered(target_dir, drafter)
    assert got == want
    assert mixed > 0 and llm.engine.spec.proposer_stats()[0]["markov_steps"] > 0
    if kind == "trained":
        assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.kv.num_used_blocks == 0
    llm.engine.kv.check_invariants()


@pytest.fixture(scope="module")
def reference(target_dir: Path) -> Counter:
    return sample(target_dir, None, seed=1)


@pytest.mark.parametrize("rejection_sample_method", ["standard", "block"])
def test_sampling_distribution_matches_spec_off(target_dir, specforge_trained_dir, reference,
                                                rejection_sample_method: str) -> None:
    on = sample(target_dir, config(specforge_trained_dir, draft_sample_method="probabilistic",
                                   rejection_sample_method=rejection_sample_method), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat < bound(dof), (stat, dof, reference, on)


def test_wrong_accept_rule_is_detected(target_dir, specforge_trained_dir, reference,
                                       wrong_accept_rule) -> None:
    on = sample(target_dir, config(specforge_trained_dir, draft_sample_method="probabilistic"),
                seed=2, check=False)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > bound(dof), "a wrong accept rule must be caught by the distribution test"


def _variant(src: Path, dst: Path, sub: dict[str, Any] | None = None, **top: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for where, changes in ((cfg, top), (cfg["dflash_config"], sub or {})):
        for key, value in changes.items():
            if value is None:
                where.pop(key, None)
            else:
                where[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("top", "sub", "message"), [
    ({}, {"projector_type": "domino"}, "projector_type='domino'"),
    ({}, {"attention_mode": "mla"}, "attention_mode='mla' is not implemented"),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}, {},
     "sliding-window draft layers are not implemented"),
    ({"block_size": None}, {}, "block_size is missing"),
    ({}, {"mask_token_id": None}, "dflash_config.mask_token_id is missing"),
    ({"markov_rank": 8}, {}, "markov_rank=8 at the top level contradicts"),
    ({"dflash_config": None}, {}, "dflash_config is missing"),
    ({}, {"markov_head_type": "gated"}, "missing tensors .*gate_proj"),
    ({}, {"markov_rank": 0}, "unexpected tensors .*markov_head"),
    ({}, {"enable_confidence_head": None, "confidence_head_alpha": 1.0},
     "missing tensors .*confidence_head.proj"),
])
def test_refused_by_name(target_dir, tmp_path, top, sub, message) -> None:
    src = save_specforge(tmp_path / "src", target_dir)
    if top.get("dflash_config", "keep") is None:
        bad = _variant(src, tmp_path / "bad")
        cfg = json.loads((bad / "config.json").read_text())
        del cfg["dflash_config"]
        (bad / "config.json").write_text(json.dumps(cfg))
    else:
        bad = _variant(src, tmp_path / "bad", sub, **top)
    with pytest.raises(ModelFormatError, match=message):
        LLM(model=str(target_dir), speculative_config=spec(bad))


def test_tables_it_does_not_save_are_refused_when_present(target_dir, tmp_path) -> None:
    """SpecForge saves no embedding (and no head); early exports put the heads under
    ``logit_head.``: both named, not guessed at."""
    src = save_specforge(tmp_path / "src", target_dir)
    for name, message in (("embed_tokens.weight", "unexpected tensors .*embed_tokens"),
                          ("logit_head.markov_head.markov_w1.weight", "early SpecForge export")):
        bad = tmp_path / name
        shutil.copytree(src, bad)
        t = load_file(str(bad / "model.safetensors"))
        t[name] = t["markov_head.markov_w1.weight"].clone()
        if name.startswith("logit_head"):
            del t["markov_head.markov_w1.weight"]
        save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(ModelFormatError, match=message):
            LLM(model=str(target_dir), speculative_config=spec(bad))
