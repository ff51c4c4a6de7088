"""Property: any JSON object is either accepted or refused with the project's ConfigError."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise.config import VLLM_FIELDS, ConfigError, MTP_MODEL_TYPES, parse_speculative_config
from draftwise.plugins import PluginHost, load_entry_point_plugins, load_speculators

#: loaded once at import: hypothesis does not mix with function-scoped fixtures
REGISTRY = load_speculators(load_entry_point_plugins(PluginHost(), selection=None))

KEYS = st.one_of(
    st.sampled_from([f.name for f in VLLM_FIELDS]),
    st.sampled_from(["draftwise", "num-speculative-tokens", "prompt-lookup-min", "Method"]),
    st.text(max_size=12),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=200),
    st.integers(),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "ngram",
            "mtp",
            "dflash",
            "dspark",
            "draft_model",
            "eagle3",
            "greedy",
            "probabilistic",
            "standard",
            "block",
            "synthetic",
            "auto",
            "/ckpt/x",
            "pkg.Mod",
            *MTP_MODEL_TYPES[:5],
        ]
    ),
    st.text(max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(KEYS, inner, max_size=4),
    ),
    max_leaves=12,
)
METHODS = st.sampled_from(["ngram", "mtp", "dflash", "dspark", "draft_model", "qwen3_next_mtp"])


def _check(obj: Any) -> None:
    try:
        cfg = parse_speculative_config(obj, REGISTRY)
    except ConfigError:
        return
    if cfg is None:
        return
    again = parse_speculative_config(json.dumps(cfg.to_json()), REGISTRY)
    assert again is not None
    assert again.to_json() == cfg.to_json()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=6))
def test_random_objects(obj: dict[str, Any]) -> None:
    _check(obj)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=METHODS, k=st.integers(-1, 130), extra=st.dictionaries(KEYS, VALUES, max_size=3))
def test_mostly_valid_objects(method: str, k: int, extra: dict[str, Any]) -> None:
    """Near-valid configs exercise the deeper checks, not just the unknown-key one."""
    _check({"method": method, "num_speculative_tokens": k, "model": "/ckpt/d", **extra})


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_random_text(text: str) -> None:
    _check(text)


def test_resolved_configs_are_dataclasses() -> None:
    cfg = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2}, REGISTRY)
    assert dataclasses.is_dataclass(cfg)
