"""draft_model under sampling, through the whole engine: the draft's real q.

The draft is the target with its LM head scaled by 0.4: same top-3 tokens, flatter
probabilities, so q differs from p everywhere drafts are made and both acceptance and
the residual (recovered token) matter. The joint distribution of the 2nd and 3rd
generated tokens (both from the step that verifies two drafts) must match speculation
off for one-hot q (greedy drafting) and the draft's sampled q (probabilistic), under
standard and block verification; a wrong accept rule must be caught by the same test.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spec_sampling import sample_pairs
from stats import CHI2_9999, chi2_two_sample, pool_rare
from tiny_checkpoints import perturbed_copy


PROMPT = [7, 3, 11, 5, 2, 9]
N = 2500


@pytest.fixture(scope="module")
def flat_draft(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(
        target_dir, tmp_path_factory.mktemp("dm-flat") / "draft", scale=0.0, lm_head_scale=0.4
    )


def sample(target: Path, config: dict[str, Any] | None, seed: int) -> Counter:
    return sample_pairs(target, config, seed, PROMPT, N)


@pytest.fixture(scope="module")
def reference(target_dir: Path) -> Counter:
    return sample(target_dir, None, seed=1)


def config(draft: Path, **extra: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2, **extra}


@pytest.mark.parametrize(
    ("draft_sample_method", "rejection_sample_method"),
    [("greedy", "standard"), ("probabilistic", "standard"), ("probabilistic", "block")],
)
def test_sampling_distribution_matches_spec_off(
    target_dir: Path, flat_draft: Path, reference: Counter,
    draft_sample_method: str, rejection_sample_method: str,
) -> None:
    on = sample(target_dir, config(flat_draft, draft_sample_method=draft_sample_method,
                                   rejection_sample_method=rejection_sample_method), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat < CHI2_9999[dof], (stat, dof, reference, on)


def test_wrong_accept_rule_is_detected(
    target_dir: Path, flat_draft: Path, reference: Counter, wrong_accept_rule: None
) -> None:
    on = sample(target_dir, config(flat_draft, draft_sample_method="probabilistic"), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > CHI2_9999[dof], "a wrong accept rule must be caught by the distribution test"


def test_a_wrong_q_is_detected(
    target_dir: Path, flat_draft: Path, reference: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q must be the distribution the draft was sampled from: report p's instead and the
    test fails, so it checks the proposer's q, not just verify."""
    import draftwise_draft_model.proposer as proposer_mod

    real = proposer_mod.pick_draft_tokens

    def sharp_q(logits, params, generators, probabilistic, histories=None):
        tok, q = real(logits, params, generators, probabilistic, histories)
        if q is not None:  # claim the unscaled target distribution (logits / 0.4)
            _, q = real(logits / 0.4, params, [None] * len(params), probabilistic, histories)
        return tok, q

    monkeypatch.setattr(proposer_mod, "pick_draft_tokens", sharp_q)
    on = sample(target_dir, config(flat_draft, draft_sample_method="probabilistic"), seed=2)
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat > CHI2_9999[dof], "a q that is not the draft's must be caught"


def test_confidence_stops_keep_the_distribution(
    target_dir: Path, flat_draft: Path, reference: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 5 under sampling: whether a row drafts its 2nd token depends on the draft's
    confidence after the 1st token (sampled), which may be anything before that draft; the
    joint law of tokens 2 and 3 must stay spec-off's. At t = 0.02 the flat draft's
    confidence (0.018 to 0.026 here, by the sampled 1st token) stops some rows and not
    others."""
    import draftwise_draft_model.proposer as proposer_mod

    seen = {"stop": 0, "go": 0}
    real = proposer_mod.DraftModelProposer._sure

    def counted(self, logits, live):
        out = real(self, logits, live)
        seen["go"] += sum(out)
        seen["stop"] += len(out) - sum(out)
        return out

    monkeypatch.setattr(proposer_mod.DraftModelProposer, "_sure", counted)
    on = sample_pairs(target_dir, config(flat_draft, draft_sample_method="probabilistic",
                                         min_draft_confidence=0.02), 2, PROMPT, N, check=False)
    assert seen["stop"] > 100 and seen["go"] > 100, seen
    stat, dof = chi2_two_sample(*pool_rare(reference, on))
    assert stat < CHI2_9999[dof], (stat, dof, reference, on)
