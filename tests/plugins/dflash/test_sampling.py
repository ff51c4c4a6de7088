"""dflash under sampling, through the whole engine, with the drafter's real q.

The trained drafter is sharp where the target (temperature 1, top-k 3) is not, so q
differs from p at every drafted slot: acceptance and the recovered token both matter.
The joint distribution of the 2nd and 3rd generated tokens (both from the first step,
which verifies two drafts) must match speculation off for one-hot q (greedy drafting),
DFlash1's sampled q (probabilistic) under standard and block verification, and DFlash2's
walk q; a wrong accept rule and a wrong q must be caught by the same test.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spec_sampling import sample_pairs
from stats import CHI2_9999, chi2_two_sample, pool_rare

from .conftest import TRAIN_PROMPTS

PROMPT = TRAIN_PROMPTS[0]
N = 2000


def sample(target: Path, config: dict[str, Any] | None, seed: int, check: bool = True
           ) -> Counter:
    return sample_pairs(target, config, seed, PROMPT, N, check)


@pytest.fixture(scope="module")
def reference(target_dir: Path) -> Counter:
    return sample(target_dir, None, seed=1)


def config(drafter: Path, **extra: Any) -> dict[str, Any]:
    return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 2, **extra}


@pytest.mark.parametrize(
    ("version", "draft_sample_method", "rejection_sample_method"),
    [(1, "greedy", "standard"), (1, "probabilistic", "standard"),
     (1, "probabilistic", "block"), (2, "probabilistic", "standard")],
)
def test_sampling_distribution_matches_spec_off(
    target_dir: Path, trained_dir: Path, trained2_dir: Path, reference: Counter,
    version: int, draft_sample_method: str, rejection_sample_method: str,
) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    on = sample(target_dir, config(drafter, draft_sample_method=draft_sample_method,
                                   rejection_sample_method=rejection_sample_method), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat < CHI2_9999[dof], (stat, dof, reference, on)


def test_gguf_q8_0_dflash2_sampling_matches_spec_off(
    target_dir: Path, trained2_dir: Path, reference: Counter, tmp_path: Path
) -> None:
    """The GGUF path (llama.cpp's DFlash2 layout, Q8_0 conv projections, selector and
    layers on the quantized kernels) keeps the walk's q honest: the q it reports is the one
    its drafts were drawn from, so the distribution is speculation off's."""
    from gguf import GGMLQuantizationType as Q

    from .test_containers import write_dflash_gguf

    drafter = write_dflash_gguf(trained2_dir, tmp_path / "d-q8.gguf", Q.Q8_0)
    on = sample(target_dir, config(drafter, draft_sample_method="probabilistic"), seed=3)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat < CHI2_9999[dof], (stat, dof, reference, on)


def test_wrong_accept_rule_is_detected(
    target_dir: Path, trained_dir: Path, reference: Counter, wrong_accept_rule: None
) -> None:
    # (the wrong rule accepts every draft here: q >= p wherever the drafter drafts)
    on = sample(target_dir, config(trained_dir, draft_sample_method="probabilistic"), seed=2,
                check=False)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > CHI2_9999[dof], "a wrong accept rule must be caught by the distribution test"


def test_a_wrong_q_is_detected(
    target_dir: Path, trained_dir: Path, reference: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q must be the distribution the drafts were sampled from: report a flatter one and
    the test fails, so it checks the proposer's q, not just verify."""
    import draftwise_dflash.proposer as proposer_mod

    real = proposer_mod.pick_draft_tokens

    def flat_q(logits, params, generators, probabilistic):
        tok, q = real(logits, params, generators, probabilistic)
        if q is not None:
            _, q = real(logits * 0.3, params, [None] * len(params), probabilistic)
        return tok, q

    monkeypatch.setattr(proposer_mod, "pick_draft_tokens", flat_q)
    on = sample(target_dir, config(trained_dir, draft_sample_method="probabilistic"), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > CHI2_9999[dof], "a q that is not the drafter's must be caught"


@pytest.mark.parametrize("container", ["safetensors", "gguf-q8_0"])
def test_a_wrong_walk_q_is_detected(
    target_dir: Path, trained2_dir: Path, reference: Counter, monkeypatch: pytest.MonkeyPatch,
    container: str, tmp_path: Path,
) -> None:
    """DFlash2: claiming uniform q over the candidates instead of softmax(S / T); the GGUF
    drafter runs the same walk, so the same mutation must be caught through it too."""
    import draftwise_dflash.proposer as proposer_mod

    drafter = trained2_dir
    if container == "gguf-q8_0":
        from gguf import GGMLQuantizationType as Q

        from .test_containers import write_dflash_gguf

        drafter = write_dflash_gguf(trained2_dir, tmp_path / "d-q8.gguf", Q.Q8_0)

    real = proposer_mod.selector_walk

    def uniform_q(sel, hidden, logits, anchors, lengths, choose, keep_q=False):
        tokens, qs = real(sel, hidden, logits, anchors, lengths, choose, keep_q)
        out = []
        for row in qs:
            fixed = []
            for q in row:
                u = (q > 0).float()
                fixed.append(u / u.sum())
            out.append(fixed)
        return tokens, out

    monkeypatch.setattr(proposer_mod, "selector_walk", uniform_q)
    on = sample(target_dir, config(drafter, draft_sample_method="probabilistic"), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > CHI2_9999[dof], "a q that is not the walk's must be caught"
