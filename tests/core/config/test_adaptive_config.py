"""``"draftwise": {"adaptive": ...}``: every key checked and refused by name."""

from __future__ import annotations

import pytest

from draftwise.config import (
    InvalidValueError,
    RefusedValueError,
    UnknownKeyError,
    parse_speculative_config,
)
from draftwise.config.adaptive import AdaptiveConfig

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def parse(ns, registry):
    return parse_speculative_config({**NGRAM, "draftwise": ns}, registry)


def test_true_takes_the_defaults(installed_registry) -> None:
    cfg = parse({"adaptive": True}, installed_registry)
    assert cfg.adaptive == AdaptiveConfig()
    assert parse({"adaptive": False}, installed_registry).adaptive is None


def test_settings_round_trip(installed_registry) -> None:
    cfg = parse({"adaptive": {"probe_interval": 4, "ew-weight": 0.5}}, installed_registry)
    assert cfg.adaptive.probe_interval == 4 and cfg.adaptive.ew_weight == 0.5
    again = parse_speculative_config(cfg.to_json(), installed_registry)
    assert again == cfg


def test_objective_takes_its_three_names(installed_registry) -> None:
    for name in ("auto", "throughput", "fair"):
        assert parse({"adaptive": {"objective": name}}, installed_registry).adaptive.objective == name
    assert AdaptiveConfig().objective == "auto"


def test_unknown_key_is_named(installed_registry) -> None:
    with pytest.raises(UnknownKeyError) as err:
        parse({"adaptive": {"probe_intervall": 4}}, installed_registry)
    assert err.value.key == "draftwise.adaptive.probe_intervall"
    assert "did you mean 'probe_interval'" in str(err.value)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"ew_weight": 0}, "draftwise.adaptive.ew_weight"),
        ({"prior": 1.5}, "draftwise.adaptive.prior"),
        ({"probe_interval": "8"}, "draftwise.adaptive.probe_interval"),
        ({"cost_cache": 1}, "draftwise.adaptive.cost_cache"),
        ({"objective": "latency"}, "draftwise.adaptive.objective"),
    ],
)
def test_bad_values_are_named(installed_registry, settings, key) -> None:
    with pytest.raises(InvalidValueError) as err:
        parse({"adaptive": settings}, installed_registry)
    assert err.value.key == key and str(err.value).startswith(key)


def test_not_an_object(installed_registry) -> None:
    with pytest.raises(InvalidValueError) as err:
        parse({"adaptive": "yes"}, installed_registry)
    assert err.value.key == "draftwise.adaptive"


def test_chain_takes_it_at_the_top_only(installed_registry) -> None:
    chain = [{"method": "ngram", "num_speculative_tokens": 2}]
    cfg = parse_speculative_config(
        {"draftwise": {"drafter_chain": chain, "adaptive": True}}, installed_registry
    )
    assert cfg.adaptive is not None and cfg.chain
    inner = [{"method": "ngram", "num_speculative_tokens": 2, "draftwise": {"adaptive": True}}]
    with pytest.raises(RefusedValueError) as err:
        parse_speculative_config({"draftwise": {"drafter_chain": inner}}, installed_registry)
    assert err.value.key == "draftwise.drafter_chain[0].draftwise.adaptive"
