"""Method suffix's declaration: vLLM's config accepted as written, bad values refused by name."""

from __future__ import annotations

import pytest

from draftwise.config import parse_speculative_config
from draftwise.config.errors import ConfigError, InvalidValueError, NotForMethodError
from draftwise_ngram.suffix_options import SuffixOptions

VLLM = {
    "method": "suffix",
    "num_speculative_tokens": 16,
    "suffix_decoding_max_tree_depth": 32,
    "suffix_decoding_max_cached_requests": 500,
    "suffix_decoding_max_spec_factor": 2.0,
    "suffix_decoding_min_token_prob": 0.2,
}


def test_vllm_config_as_written() -> None:
    cfg = parse_speculative_config(VLLM)
    assert cfg.method == "suffix" and cfg.num_speculative_tokens == 16
    assert cfg.options == SuffixOptions(
        suffix_decoding_max_tree_depth=32, suffix_decoding_max_cached_requests=500,
        suffix_decoding_max_spec_factor=2.0, suffix_decoding_min_token_prob=0.2)
    assert cfg.provider.startswith("draftwise-ngram ")


def test_defaults_and_k_from_the_tree_depth() -> None:
    cfg = parse_speculative_config({"method": "suffix"})
    assert cfg.options == SuffixOptions()
    assert (cfg.options.suffix_decoding_max_tree_depth, cfg.num_speculative_tokens) == (24, 24)
    assert parse_speculative_config(
        {"method": "suffix", "suffix_decoding_max_tree_depth": 6}).num_speculative_tokens == 6
    # vLLM would take k = 300; verification drafts at most 128, said in a notice
    cfg = parse_speculative_config({"method": "suffix", "suffix_decoding_max_tree_depth": 300})
    assert cfg.num_speculative_tokens == 128 and "capped at 128" in " ".join(cfg.notices)
    # model "suffix" is what vLLM itself sets
    assert parse_speculative_config({"method": "suffix", "model": "suffix"}).method == "suffix"


@pytest.mark.parametrize(("key", "value", "says"), [
    ("suffix_decoding_max_tree_depth", 0, "greater than or equal to 1"),
    ("suffix_decoding_max_tree_depth", 2.5, "valid integer"),
    ("suffix_decoding_max_tree_depth", True, "valid integer"),
    ("suffix_decoding_max_cached_requests", -1, "greater than or equal to 0"),
    ("suffix_decoding_max_cached_requests", "10", "valid integer"),
    ("suffix_decoding_max_spec_factor", -0.5, "greater than or equal to 0"),
    ("suffix_decoding_min_token_prob", 1.5, "less than or equal to 1"),
    ("suffix_decoding_min_token_prob", -0.1, "greater than or equal to 0"),
])
def test_bad_values_refused_by_name(key: str, value: object, says: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        parse_speculative_config({"method": "suffix", key: value})
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}=") and says in str(info.value)


def test_other_methods_keys_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_speculative_config({"method": "suffix", "prompt_lookup_max": 3})
    assert info.value.key == "prompt_lookup_max"
    with pytest.raises(NotForMethodError) as info2:
        parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3,
                                  "suffix_decoding_min_token_prob": 0.3})
    assert "option of method 'suffix'" in str(info2.value)


def test_probabilistic_drafting_and_a_model_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        parse_speculative_config({**VLLM, "draft_sample_method": "probabilistic"})
    assert info.value.key == "draft_sample_method"
    with pytest.raises(ConfigError) as info:
        parse_speculative_config({**VLLM, "model": "/ckpt/x"})
    assert info.value.key == "model"
