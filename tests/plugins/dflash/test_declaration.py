"""draftwise-dflash's declaration: parallel drafting forced, capabilities."""

from __future__ import annotations

import pytest

from draftwise.config import MissingKeyError, RefusedValueError, parse_speculative_config
from draftwise_dflash.options import CAPABILITIES, REFUSALS, DFlashOptions


def test_registered(installed_registry) -> None:
    spec, dist = installed_registry.get("dflash")
    assert dist.name == "draftwise-dflash" and spec.options is DFlashOptions
    assert spec.refusals == REFUSALS


def test_capabilities() -> None:
    assert CAPABILITIES.needs_checkpoint and not CAPABILITIES.checkpoint_in_target
    assert CAPABILITIES.needs_target_hidden
    assert CAPABILITIES.own_kv_cache and CAPABILITIES.draft_probs


def test_parallel_drafting_is_forced(installed_registry) -> None:
    base = {"method": "dflash", "model": "/ckpt/dflash", "num_speculative_tokens": 15}
    cfg = parse_speculative_config(base, installed_registry)
    assert cfg is not None and cfg.options == DFlashOptions(parallel_drafting=True)
    assert parse_speculative_config({**base, "parallel_drafting": True}, installed_registry) == cfg
    with pytest.raises(
        RefusedValueError, match="parallel_drafting=false is refused by method 'dflash'"
    ):
        parse_speculative_config({**base, "parallel_drafting": False}, installed_registry)


def test_needs_model_and_k(installed_registry) -> None:
    with pytest.raises(MissingKeyError, match="needs 'model'"):
        parse_speculative_config(
            {"method": "dflash", "num_speculative_tokens": 3}, installed_registry
        )
    with pytest.raises(MissingKeyError, match="needs 'num_speculative_tokens'"):
        parse_speculative_config({"method": "dflash", "model": "/ckpt/d"}, installed_registry)
