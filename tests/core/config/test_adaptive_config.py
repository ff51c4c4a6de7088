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


# -- the default: adaptive depth unless the config says otherwise (issue 41) --


def test_no_key_is_adaptive_with_every_default(installed_registry) -> None:
    cfg = parse_speculative_config(NGRAM, installed_registry)
    assert cfg.adaptive == AdaptiveConfig() and cfg.depth == "adaptive"
    assert parse_speculative_config({**NGRAM, "draftwise": {}}, installed_registry).adaptive
    assert "adaptive depth 0..3" in cfg.depth_line()


def test_false_pins_fixed_depth_and_survives_the_round_trip(installed_registry) -> None:
    fixed = parse({"adaptive": False}, installed_registry)
    assert fixed.adaptive is None and fixed.depth == "fixed"
    assert fixed.to_json()["draftwise"] == {"adaptive": False}
    assert parse_speculative_config(fixed.to_json(), installed_registry) == fixed
    default = parse_speculative_config(NGRAM, installed_registry)
    assert parse_speculative_config(default.to_json(), installed_registry) == default


def test_chain_default_is_adaptive_at_the_top_and_members_stay_clean(installed_registry) -> None:
    chain = [{"method": "ngram", "num_speculative_tokens": 2},
             {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}]
    cfg = parse_speculative_config({"draftwise": {"drafter_chain": chain}}, installed_registry)
    assert cfg.adaptive == AdaptiveConfig() and all(m.adaptive is None for m in cfg.chain)
    members = cfg.to_json()["draftwise"]["drafter_chain"]
    assert all("draftwise" not in m for m in members)
    assert parse_speculative_config(cfg.to_json(), installed_registry) == cfg


def test_a_drafters_own_confidence_stop_keeps_fixed_depth_and_says_so(installed_registry) -> None:
    """draft_model's min_draft_confidence already prices depth: adaptive on top measured
    worse than the stop alone, so the default keeps fixed depth, in a notice and the
    start-up line; asking for adaptive still gets it."""
    dm = {"method": "draft_model", "model": "draft.gguf", "num_speculative_tokens": 8,
          "min_draft_confidence": 0.8}
    cfg = parse_speculative_config(dm, installed_registry)
    assert cfg.adaptive is None and cfg.depth_stops == ("min_draft_confidence=0.8",)
    assert any("min_draft_confidence=0.8" in n for n in cfg.notices)
    assert cfg.depth_line() == ("speculation: draft_model, fixed depth k=8, cut by the "
                                "drafter's own stop (min_draft_confidence=0.8)")
    asked = parse_speculative_config({**dm, "draftwise": {"adaptive": True}}, installed_registry)
    assert asked.adaptive == AdaptiveConfig() and asked.depth_stops == ()
    plain = parse_speculative_config({**dm, "min_draft_confidence": 0.0}, installed_registry)
    assert plain.adaptive == AdaptiveConfig()
