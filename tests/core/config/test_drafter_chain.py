"""The engine's own namespace: ``"draftwise": {"drafter_chain": [...]}``, checked in full."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from draftwise.config import (
    ConfigError,
    InvalidValueError,
    NotForMethodError,
    RefusedValueError,
    ResolvedSpeculativeConfig,
    UnknownKeyError,
    parse_speculative_config,
)


def chain(*members: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {**top, "draftwise": {"drafter_chain": list(members)}}


def parse(obj: Any, registry) -> ResolvedSpeculativeConfig:
    resolved = parse_speculative_config(obj, registry)
    assert resolved is not None
    return resolved


def refuse(obj: Any, registry) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_speculative_config(obj, registry)
    return info.value


def test_good_chain(installed_registry) -> None:
    cfg = parse(
        chain(
            {"method": "deepseek_mtp"},
            {"method": "ngram", "prompt_lookup_max": 3, "num_speculative_tokens": 5},
            num_speculative_tokens=3,
        ),
        installed_registry,
    )
    assert cfg.method is None and cfg.options is None
    assert [m.method for m in cfg.drafters] == ["mtp", "ngram"]
    assert [m.num_speculative_tokens for m in cfg.chain] == [3, 5]
    assert cfg.num_speculative_tokens == 5, "the most any member drafts (slots to reserve)"
    assert cfg.chain[1].options.model_dump() == {"prompt_lookup_min": 3, "prompt_lookup_max": 3}
    assert cfg.notices[0] == (
        "draftwise.drafter_chain[0]: method 'deepseek_mtp' is an alias of 'mtp' (vLLM "
        "deprecates it in favour of 'mtp'); using 'mtp'"
    )


def test_chain_of_one(installed_registry) -> None:
    cfg = parse(chain({"method": "ngram", "num_speculative_tokens": 2}), installed_registry)
    assert len(cfg.drafters) == 1 and cfg.drafters[0].method == "ngram"


def test_chain_round_trips_through_json(installed_registry) -> None:
    cfg = parse(
        chain(
            {"method": "mtp"},
            {"method": "ngram"},
            num_speculative_tokens=2,
            rejection_sample_method="block",
        ),
        installed_registry,
    )
    again = parse(json.dumps(cfg.to_json()), installed_registry)
    strip = lambda c: dataclasses.replace(  # noqa: E731
        c, notices=(), chain=tuple(dataclasses.replace(m, notices=()) for m in c.chain)
    )
    assert strip(again) == strip(cfg)
    assert again.rejection_sample_method == "block"


def test_nested_chain_refused(installed_registry) -> None:
    err = refuse(
        chain(
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "draftwise": {"drafter_chain": [{"method": "ngram"}]},
            }
        ),
        installed_registry,
    )
    assert isinstance(err, RefusedValueError)
    assert str(err) == (
        "draftwise.drafter_chain[0]: draftwise.drafter_chain inside a chain member is refused: "
        "chains do not nest. Instead: list every drafter in the top-level drafter_chain."
    )
    assert err.key == "draftwise.drafter_chain[0].draftwise.drafter_chain"


def test_bad_member_refused_naming_its_index(installed_registry) -> None:
    err = refuse(
        chain(
            {"method": "mtp"}, {"method": "ngram", "prompt_lookup_max": 0}, num_speculative_tokens=2
        ),
        installed_registry,
    )
    assert isinstance(err, InvalidValueError)
    assert str(err) == (
        "draftwise.drafter_chain[1]: prompt_lookup_max=0 is invalid: input should be greater "
        "than or equal to 1."
    )
    assert err.key == "draftwise.drafter_chain[1].prompt_lookup_max"


def test_member_with_an_unknown_key(installed_registry) -> None:
    err = refuse(chain({"method": "ngram", "num_speculatve_tokens": 2}), installed_registry)
    assert isinstance(err, UnknownKeyError)
    assert str(err).startswith(
        "draftwise.drafter_chain[0]: unknown key 'num_speculatve_tokens'; did you mean "
        "'num_speculative_tokens'?"
    )


def test_member_option_of_another_method(installed_registry) -> None:
    err = refuse(
        chain({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_min": 2}),
        installed_registry,
    )
    assert (
        isinstance(err, NotForMethodError)
        and err.key == "draftwise.drafter_chain[0].prompt_lookup_min"
    )


def test_member_that_is_not_an_object(installed_registry) -> None:
    err = refuse(
        chain({"method": "ngram", "num_speculative_tokens": 2}, "ngram"), installed_registry
    )
    assert str(err) == (
        'draftwise.drafter_chain[1]="ngram" is invalid: each member must be an object (a '
        "speculative config of its own)."
    )


@pytest.mark.parametrize("bad", [[], {}, "ngram", 3])
def test_chain_must_be_a_non_empty_list(installed_registry, bad: Any) -> None:
    err = refuse({"draftwise": {"drafter_chain": bad}}, installed_registry)
    assert isinstance(err, InvalidValueError) and err.key == "draftwise.drafter_chain"


def test_inherited_value_refused_says_so(installed_registry) -> None:
    err = refuse(
        chain(
            {"method": "mtp"},
            {"method": "ngram"},
            num_speculative_tokens=2,
            draft_sample_method="probabilistic",
        ),
        installed_registry,
    )
    assert isinstance(err, RefusedValueError)
    assert str(err).startswith('draftwise.drafter_chain[1]: draft_sample_method="probabilistic"')
    assert str(err).endswith("(inherited from the top level)")


@pytest.mark.parametrize("key", ["method", "model", "prompt_lookup_min"])
def test_member_keys_refused_at_the_top_level(installed_registry, key: str) -> None:
    value = 2 if key == "prompt_lookup_min" else "ngram"
    err = refuse(
        chain({"method": "ngram", "num_speculative_tokens": 2}, **{key: value}), installed_registry
    )
    assert isinstance(err, RefusedValueError)
    assert str(err) == (
        f"'{key}' at the top level of a drafter_chain config is refused: each chain member names "
        f"its own method, model and options. Instead: move '{key}' into the chain members."
    )


def test_one_rejection_method_per_batch(installed_registry) -> None:
    err = refuse(
        chain(
            {"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "standard"},
            rejection_sample_method="block",
        ),
        installed_registry,
    )
    assert str(err) == (
        'draftwise.drafter_chain[0]: rejection_sample_method="standard" is refused: '
        'verification runs once per batch, so every chain member uses the top-level "block". '
        "Instead: set it at the top level only."
    )


def test_unimplemented_field_at_the_top_level(installed_registry) -> None:
    err = refuse(
        chain({"method": "ngram", "num_speculative_tokens": 2}, moe_backend="x"), installed_registry
    )
    assert err.key == "moe_backend"


def test_empty_namespace_is_fine(installed_registry) -> None:
    cfg = parse(
        {"method": "ngram", "num_speculative_tokens": 2, "draftwise": {}}, installed_registry
    )
    assert cfg.chain == () and cfg.method == "ngram"


def test_namespace_must_be_an_object(installed_registry) -> None:
    err = refuse(
        {"method": "ngram", "num_speculative_tokens": 2, "draftwise": []}, installed_registry
    )
    assert (
        str(err)
        == "draftwise=[] is invalid: it must be an object of draftwise's own keys (drafter_chain, adaptive, confidence_threshold)."
    )


def test_chain_top_level_settings_round_trip(installed_registry) -> None:
    cfg = parse(
        chain(
            {"method": "mtp", "num_speculative_tokens": 2},
            {"method": "draft_model", "model": "/d", "num_speculative_tokens": 4},
            draft_sample_method="probabilistic",
            max_model_len=1024,
            enforce_eager=True,
        ),
        installed_registry,
    )
    assert [m.draft_sample_method for m in cfg.chain] == ["probabilistic"] * 2
    assert [m.max_model_len for m in cfg.chain] == [1024, 1024]
    again = parse(cfg.to_json(), installed_registry)
    assert again.to_json() == cfg.to_json()
    assert (again.draft_sample_method, again.max_model_len, again.enforce_eager) == (
        "probabilistic",
        1024,
        True,
    )


def test_k_schedule_at_the_top_is_checked_against_the_largest_member_k(installed_registry) -> None:
    members = (
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5},
    )
    cfg = parse(chain(*members, num_speculative_tokens_per_batch_size=[[1, 1, 4]]),
                installed_registry)
    assert cfg.k_schedule == ((1, 1, 4),)
    assert [cfg.k_for_batch(b) for b in (1, 2)] == [4, 4]  # uncovered: the chain's k
    err = refuse(chain(*members, num_speculative_tokens_per_batch_size=[[1, 1, 5]]),
                 installed_registry)
    assert isinstance(err, RefusedValueError)
    assert "more than num_speculative_tokens=4" in str(err)
