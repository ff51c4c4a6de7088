"""draftwise-dspark's declaration: options, the block-size check, capabilities."""

from __future__ import annotations

import pytest
from draftwise.config import MissingKeyError, RefusedValueError, parse_speculative_config
from draftwise_dspark.options import CAPABILITIES, DSparkOptions, block_size
from pydantic import ValidationError


def test_registered(installed_registry) -> None:
    spec, dist = installed_registry.get("dspark")
    assert dist.name == "draftwise-dspark" and spec.options is DSparkOptions
    assert CAPABILITIES.needs_target_hidden and CAPABILITIES.draft_probs


def test_options() -> None:
    assert DSparkOptions().model_dump() == {
        "parallel_drafting": True,
        "dspark_draft_topk": None,
        "enable_adaptive_verification": False,
    }
    assert (
        DSparkOptions(dspark_draft_topk=8, enable_adaptive_verification=True).dspark_draft_topk == 8
    )
    with pytest.raises(ValidationError):
        DSparkOptions.model_validate({"dspark_draft_topk": 0})


def test_parsed_options_and_refusals(installed_registry) -> None:
    base = {"method": "dspark", "model": "/ckpt/dspark"}
    cfg = parse_speculative_config(base, installed_registry)
    assert cfg is not None and cfg.num_speculative_tokens is None
    with pytest.raises(RefusedValueError, match="dspark_draft_topk=4 is refused by method"):
        parse_speculative_config({**base, "dspark_draft_topk": 4}, installed_registry)
    with pytest.raises(RefusedValueError, match="enable_adaptive_verification=true is refused"):
        parse_speculative_config({**base, "enable_adaptive_verification": True},
                                 installed_registry)
    assert parse_speculative_config({**base, "enable_adaptive_verification": False},
                                    installed_registry) == cfg
    with pytest.raises(
        RefusedValueError, match="parallel_drafting=false is refused by method 'dspark'"
    ):
        parse_speculative_config({**base, "parallel_drafting": False}, installed_registry)
    with pytest.raises(MissingKeyError, match="needs 'model'"):
        parse_speculative_config(
            {"method": "dspark", "num_speculative_tokens": 7}, installed_registry
        )


@pytest.mark.parametrize(
    ("config", "block"),
    [
        ({"block_size": 7}, 7),
        ({"dspark_block_size": 3, "block_size": 7}, 3),
        ({"dflash_config": {"block_size": 16}}, 16),
        ({}, None),
        ({"block_size": 0}, None),
    ],
)
def test_block_size(config: dict, block: int | None) -> None:
    assert block_size(config) == block


def test_k_at_least_block_size() -> None:
    options = DSparkOptions()
    assert options.check_checkpoint(None, {"block_size": 7}) == 7
    assert options.check_checkpoint(7, {"block_size": 7}) == 7
    with pytest.raises(RefusedValueError, match="num_speculative_tokens=14 is refused: dspark "
                       "drafts one block of 7"):
        options.check_checkpoint(14, {"block_size": 7})
    with pytest.raises(RefusedValueError) as info:
        options.check_checkpoint(6, {"block_size": 7})
    assert (info.value.key, info.value.value) == ("num_speculative_tokens", 6)
    with pytest.raises(RefusedValueError, match="declares no block size"):
        options.check_checkpoint(7, {})
