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
    # k is checked at the draft stage, against the drafter's own block size
    cfg = parse_speculative_config({"method": "dflash", "model": "/ckpt/d"}, installed_registry)
    assert cfg is not None and cfg.num_speculative_tokens is None


def test_k_is_required_and_at_most_block_minus_one(target_dir, drafter_dir) -> None:
    from draftwise import LLM

    with pytest.raises(MissingKeyError, match='set "num_speculative_tokens": 7'):
        LLM(model=str(target_dir), speculative_config={"method": "dflash",
                                                       "model": str(drafter_dir)})
    with pytest.raises(RefusedValueError, match="num_speculative_tokens=8 is refused: the "
                       "drafter's block_size is 8"):
        LLM(model=str(target_dir), speculative_config={
            "method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 8})
