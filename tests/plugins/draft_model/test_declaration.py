"""draftwise-draft-model's declaration: options, PARD refused, heterogeneous vocab."""

from __future__ import annotations

import json

import pytest

from draftwise.config import (
    InvalidValueError,
    MissingKeyError,
    RefusedValueError,
    parse_speculative_config,
)
from draftwise_draft_model.options import CAPABILITIES, DraftModelOptions

BASE = {"method": "draft_model", "model": "/ckpt/qwen3-0.6b", "num_speculative_tokens": 4}


def test_registered(installed_registry) -> None:
    spec, dist = installed_registry.get("draft_model")
    assert (dist.name, dist.entry_point) == ("draftwise-draft-model", "draft_model")
    assert spec.options is DraftModelOptions
    assert CAPABILITIES.needs_checkpoint and CAPABILITIES.own_kv_cache and CAPABILITIES.draft_probs
    assert not CAPABILITIES.needs_target_hidden and not CAPABILITIES.kv_uses_next_token


def test_needs_model_and_k(installed_registry) -> None:
    with pytest.raises(MissingKeyError, match="needs 'model'"):
        parse_speculative_config(
            {"method": "draft_model", "num_speculative_tokens": 4}, installed_registry
        )
    with pytest.raises(MissingKeyError, match="needs 'num_speculative_tokens'"):
        parse_speculative_config({"method": "draft_model", "model": "/x"}, installed_registry)


def test_heterogeneous_vocab_needs_greedy(installed_registry) -> None:
    cfg = parse_speculative_config({**BASE, "use_heterogeneous_vocab": True}, installed_registry)
    assert cfg is not None and cfg.options == DraftModelOptions(use_heterogeneous_vocab=True)
    with pytest.raises(RefusedValueError) as info:
        parse_speculative_config(
            {**BASE, "use_heterogeneous_vocab": True, "draft_sample_method": "probabilistic"},
            installed_registry,
        )
    assert str(info.value) == (
        'use_heterogeneous_vocab=true is refused with draft_sample_method="probabilistic": draft '
        "probabilities over another vocabulary cannot be compared with the target's. "
        'Instead: use draft_sample_method "greedy".'
    )


def test_probabilistic_drafting_is_allowed(installed_registry) -> None:
    cfg = parse_speculative_config(
        {**BASE, "draft_sample_method": "probabilistic"}, installed_registry
    )
    assert cfg is not None and cfg.draft_sample_method == "probabilistic"


def test_parallel_drafting_refused(installed_registry) -> None:
    with pytest.raises(RefusedValueError, match="vLLM's PARD path"):
        parse_speculative_config({**BASE, "parallel_drafting": True}, installed_registry)
    assert parse_speculative_config({**BASE, "parallel_drafting": False}, installed_registry)


def test_lm_head_tokens_is_a_positive_count(installed_registry) -> None:
    cfg = parse_speculative_config({**BASE, "lm_head_tokens": 32768}, installed_registry)
    assert cfg is not None and cfg.options == DraftModelOptions(lm_head_tokens=32768)
    for bad in (0, -5, "32768", 1.5):
        with pytest.raises(InvalidValueError, match=f"lm_head_tokens={json.dumps(bad)} is invalid"):
            parse_speculative_config({**BASE, "lm_head_tokens": bad}, installed_registry)


def test_min_draft_confidence_is_a_probability(installed_registry) -> None:
    cfg = parse_speculative_config({**BASE, "min_draft_confidence": 0.6}, installed_registry)
    assert cfg is not None and cfg.options == DraftModelOptions(min_draft_confidence=0.6)
    assert DraftModelOptions().min_draft_confidence == 0.0  # off unless asked: k drafts
    for bad in (-0.1, 1.5, "0.6", True):
        with pytest.raises(InvalidValueError,
                           match=f"min_draft_confidence={json.dumps(bad)} is invalid"):
            parse_speculative_config({**BASE, "min_draft_confidence": bad}, installed_registry)
