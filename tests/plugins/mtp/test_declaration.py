"""draftwise-mtp's declaration: 26 aliases, capabilities, the n_predict check."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from draftwise.config import MTP_MODEL_TYPES, MissingKeyError, RefusedValueError
from draftwise_mtp.options import ALIASES, MtpOptions, head_count


def test_registered_with_every_vllm_mtp_type_as_alias(installed_registry) -> None:
    spec, dist = installed_registry.get("mtp")
    assert dist.name == "draftwise-mtp"
    assert spec.aliases == ALIASES
    assert set(spec.aliases) == set(MTP_MODEL_TYPES) - {"mtp"} and len(spec.aliases) == 26


def test_capabilities() -> None:
    from draftwise_mtp.options import CAPABILITIES as caps

    assert caps.needs_checkpoint and caps.checkpoint_in_target and caps.needs_target_hidden
    assert caps.own_kv_cache and caps.draft_probs and caps.kv_uses_next_token


def test_no_options_of_its_own() -> None:
    with pytest.raises(ValidationError):
        MtpOptions.model_validate({"index_share_for_mtp_iteration": True})


@pytest.mark.parametrize(
    ("config", "n"),
    [
        ({"num_nextn_predict_layers": 1}, 1),
        ({"mtp_num_hidden_layers": 2}, 2),
        ({"n_predict": 3}, 3),
        ({"text_config": {"mtp_num_hidden_layers": 1}}, 1),
        ({}, None),
        ({"n_predict": True}, None),
    ],
)
def test_head_count(config: dict, n: int | None) -> None:
    assert head_count(config) == n


def test_check_checkpoint() -> None:
    options = MtpOptions()
    assert options.check_checkpoint(None, {"n_predict": 2}) == 2
    assert options.check_checkpoint(4, {"n_predict": 2}) == 4
    assert options.check_checkpoint(1, {"n_predict": 2}) == 1
    with pytest.raises(RefusedValueError) as info:
        options.check_checkpoint(3, {"n_predict": 2})
    assert str(info.value) == (
        "num_speculative_tokens=3 is refused: it must be divisible by the checkpoint's "
        "n_predict=2 (vLLM's rule). Instead: use a multiple of 2."
    )
    with pytest.raises(MissingKeyError):
        options.check_checkpoint(None, {})
    assert options.check_checkpoint(5, {}) == 5
