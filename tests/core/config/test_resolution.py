"""Method resolution (vLLM's rules), aliases with notices, defaults, and the resolved value."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import BaseModel, ConfigDict

from draftwise.config import (
    MTP_MODEL_TYPES,
    InvalidValueError,
    MissingKeyError,
    RefusedValueError,
    ResolvedSpeculativeConfig,
    UnknownMethodError,
    parse_speculative_config,
)
from draftwise.config.methods import is_custom_class_path
from draftwise.plugins import DistInfo, Registration, SpeculatorRegistry
from draftwise.speculator import Speculator


def parse(obj, registry) -> ResolvedSpeculativeConfig:
    resolved = parse_speculative_config(obj, registry)
    assert resolved is not None
    return resolved


def lookup(cfg: ResolvedSpeculativeConfig) -> tuple[int, int]:
    assert cfg.options is not None
    return cfg.options.prompt_lookup_min, cfg.options.prompt_lookup_max  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", MTP_MODEL_TYPES)
def test_every_vllm_mtp_type_resolves_to_mtp(installed_registry, name: str) -> None:
    cfg = parse({"method": name, "num_speculative_tokens": 1}, installed_registry)
    assert cfg.method == "mtp"
    alias_notices = [n for n in cfg.notices if "is an alias of" in n]
    if name == "mtp":
        assert alias_notices == []
    else:
        assert alias_notices == [
            f"method '{name}' is an alias of 'mtp' (vLLM deprecates it in favour of 'mtp'); "
            "using 'mtp'"
        ]


def test_mtp_type_count() -> None:
    assert len(MTP_MODEL_TYPES) == 27 and "mtp" in MTP_MODEL_TYPES


def test_ngram_defaults_to_five_and_five(installed_registry) -> None:
    cfg = parse('{"method":"ngram","num_speculative_tokens":4}', installed_registry)
    assert (cfg.method, cfg.num_speculative_tokens, lookup(cfg)) == ("ngram", 4, (5, 5))
    assert cfg.draft_sample_method == "greedy" and cfg.rejection_sample_method == "standard"
    assert cfg.provider == "draftwise-ngram 0.1.0"
    assert cfg.notices == ()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"prompt_lookup_min": 2}, (2, 2)),
        ({"prompt_lookup_max": 3}, (3, 3)),
        ({"prompt_lookup_min": 1, "prompt_lookup_max": 4}, (1, 4)),
        ({"prompt_lookup_min": None, "prompt_lookup_max": None}, (5, 5)),
        ({"prompt_lookup_min": None, "prompt_lookup_max": 2}, (2, 2)),
    ],
)
def test_one_lookup_bound_copies_the_other(installed_registry, given, expected) -> None:
    cfg = parse({"method": "ngram", "num_speculative_tokens": 4, **given}, installed_registry)
    assert lookup(cfg) == expected


def test_lookup_min_above_max_refused(installed_registry) -> None:
    with pytest.raises(InvalidValueError) as info:
        parse(
            {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 7,
                "prompt_lookup_max": 3,
            },
            installed_registry,
        )
    assert str(info.value) == (
        "prompt_lookup_min=7 is invalid: it is larger than prompt_lookup_max=3. "
        "Instead: set prompt_lookup_min <= prompt_lookup_max."
    )
    assert (info.value.key, info.value.value) == ("prompt_lookup_min", 7)


def test_missing_k_refused_for_ngram(installed_registry) -> None:
    with pytest.raises(MissingKeyError):
        parse({"method": "ngram", "prompt_lookup_min": 2}, installed_registry)


@pytest.mark.parametrize("model", ["ngram", "[ngram]"])
def test_model_ngram_means_method_ngram(installed_registry, model: str) -> None:
    cfg = parse({"model": model, "num_speculative_tokens": 2}, installed_registry)
    assert cfg.method == "ngram" and cfg.model == model
    assert cfg.notices == (f"no 'method' given; model \"{model}\" means method 'ngram'",)


@pytest.mark.parametrize(
    ("model", "method"),
    [
        ("/ckpt/Qwen3-4B-DFlash-b16", "dflash"),
        ("/ckpt/dspark_qwen3_4b_block7", "dspark"),
        ("/ckpt/Qwen3-0.6B", "draft_model"),
        ("draft.gguf", "draft_model"),
        ("./Qwen2.5-0.5B", "draft_model"),
    ],
)
def test_method_from_model_path(installed_registry, model: str, method: str) -> None:
    cfg = parse({"model": model, "num_speculative_tokens": 7}, installed_registry)
    assert cfg.method == method
    assert cfg.notices[0].startswith("no 'method' given;")


def test_eagle_path_resolves_to_a_method_draftwise_lacks(installed_registry) -> None:
    with pytest.raises(UnknownMethodError) as info:
        parse(
            {"model": "/ckpt/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3},
            installed_registry,
        )
    assert str(info.value).startswith(
        "method 'eagle' (from model \"/ckpt/EAGLE-LLaMA3-Instruct-8B\") is a vLLM method"
    )
    assert info.value.key == "model"


def test_explicit_method_wins_over_the_path_rule(installed_registry) -> None:
    cfg = parse(
        {"method": "draft_model", "model": "/ckpt/dflash-lookalike", "num_speculative_tokens": 3},
        installed_registry,
    )
    assert cfg.method == "draft_model"


@pytest.mark.parametrize(
    ("model", "custom"),
    [
        ("pkg.Proposer", True),
        ("a.b.C", True),
        ("org/model", False),
        ("x.gguf", False),
        ("Qwen2.5-0.5B", False),
        ("plain", False),
        ("https://x.y/z", False),
    ],
)
def test_custom_class_path_rule(model: str, custom: bool) -> None:
    assert is_custom_class_path(model) is custom


def test_dashes_in_keys_are_normalised(installed_registry) -> None:
    cfg = parse(
        {"method": "ngram", "num-speculative-tokens": 3, "prompt-lookup-max": 2}, installed_registry
    )
    assert cfg.num_speculative_tokens == 3 and lookup(cfg) == (2, 2)


@pytest.mark.parametrize("empty", [None, "null", b"null"])
def test_no_config_means_no_speculation(installed_registry, empty) -> None:
    assert parse_speculative_config(empty, installed_registry) is None


def test_text_dict_and_resolved_inputs_agree(installed_registry) -> None:
    as_dict = {"method": "ngram", "num_speculative_tokens": 3}
    a = parse(json.dumps(as_dict), installed_registry)
    b = parse(as_dict, installed_registry)
    assert a == b
    assert parse_speculative_config(a, installed_registry) is a


def test_resolved_config_is_frozen(installed_registry) -> None:
    cfg = parse({"method": "ngram", "num_speculative_tokens": 3}, installed_registry)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.method = "mtp"  # type: ignore[misc]
    assert cfg.drafters == (cfg,)


@pytest.mark.parametrize(
    "obj",
    [
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 2,
            "max_model_len": 512,
        },
        {"method": "qwen3_next_mtp", "num_speculative_tokens": 2, "enforce_eager": True},
        {
            "method": "dspark",
            "model": "/d",
            "num_speculative_tokens": 7,
        },
        {
            "model": "/ckpt/draft",
            "num_speculative_tokens": 5,
            "draft_sample_method": "probabilistic",
        },
        {
            "method": "dflash",
            "model": "/x",
            "num_speculative_tokens": 15,
            "rejection_sample_method": "block",
        },
    ],
)
def test_to_json_round_trips(installed_registry, obj) -> None:
    cfg = parse(obj, installed_registry)
    again = parse(json.dumps(cfg.to_json()), installed_registry)
    assert dataclasses.replace(again, notices=()) == dataclasses.replace(cfg, notices=())


def test_not_built_yet_is_a_notice_not_an_error() -> None:
    class Later(BaseModel):
        model_config = ConfigDict(extra="forbid")

    dist = DistInfo("acme-later", "0.1", "later")
    registry = SpeculatorRegistry([Registration(Speculator(method="later", options=Later), dist)])
    cfg = parse({"method": "later", "num_speculative_tokens": 1}, registry)
    assert cfg.notices == (
        "method later is registered but its proposer is not built yet: the config is valid, "
        "the engine will refuse to run it",
    )


def test_mtp_k_is_left_to_the_checkpoint_with_or_without_model(installed_registry) -> None:
    """vLLM: k defaults to the head depth; the draft stage reads it from the checkpoint
    (the ``model`` dir, or the target's own), and refuses if it declares none."""
    cfg = parse({"method": "mtp"}, installed_registry)
    assert cfg.num_speculative_tokens is None
    assert "num_speculative_tokens not given: the target checkpoint's config decides it" in (
        cfg.notices
    )
    cfg = parse({"method": "mtp", "model": "/ckpt/mtp"}, installed_registry)
    assert cfg.num_speculative_tokens is None
    assert (
        "num_speculative_tokens not given: the draft checkpoint's config decides it" in cfg.notices
    )
    completed = cfg.with_drafters((cfg.with_checkpoint({"n_predict": 2}),))
    assert completed.num_speculative_tokens == 2
    with pytest.raises(ValueError, match="still have no num_speculative_tokens"):
        cfg.with_drafters((cfg,))


def test_a_checkpoint_decided_k_is_checked_against_the_schedule(installed_registry) -> None:
    cfg = parse(
        {"method": "mtp", "num_speculative_tokens_per_batch_size": [[1, 4, 3]]},
        installed_registry,
    )
    with pytest.raises(RefusedValueError, match="more than num_speculative_tokens=2"):
        cfg.with_drafters((cfg.with_checkpoint({"n_predict": 2}),))


class TestWithCheckpoint:
    """Checks that need the draft's config.json: run by the loader, still before weights."""

    def test_dspark_k_defaults_to_block_size(self, installed_registry) -> None:
        cfg = parse({"method": "dspark", "model": "/d"}, installed_registry)
        assert cfg.num_speculative_tokens is None
        assert cfg.with_checkpoint({"block_size": 7}).num_speculative_tokens == 7
        assert (
            cfg.with_checkpoint({"dflash_config": {"block_size": 16}}).num_speculative_tokens == 16
        )

    def test_dspark_k_below_block_size_refused(self, installed_registry) -> None:
        cfg = parse(
            {"method": "dspark", "model": "/d", "num_speculative_tokens": 4}, installed_registry
        )
        with pytest.raises(RefusedValueError) as info:
            cfg.with_checkpoint({"dspark_block_size": 7})
        assert str(info.value) == (
            "num_speculative_tokens=4 is refused: dspark drafts whole blocks and the "
            "checkpoint's block size is 7. Instead: set it to at least 7, or leave it out to "
            "use the block size."
        )
        assert cfg.with_checkpoint({"block_size": 4}).num_speculative_tokens == 4
        with pytest.raises(RefusedValueError, match="num_speculative_tokens=4 is refused: "
                           "dspark drafts one block of 3 tokens per step"):
            cfg.with_checkpoint({"block_size": 3})

    def test_dspark_checkpoint_without_block_size_refused(self, installed_registry) -> None:
        cfg = parse({"method": "dspark", "model": "/d"}, installed_registry)
        with pytest.raises(RefusedValueError) as info:
            cfg.with_checkpoint({"model_type": "qwen3"})
        assert info.value.key == "model"

    def test_mtp_n_predict_rule(self, installed_registry) -> None:
        cfg = parse({"method": "mtp", "model": "/m"}, installed_registry)
        assert cfg.with_checkpoint({"num_nextn_predict_layers": 1}).num_speculative_tokens == 1
        assert (
            cfg.with_checkpoint(
                {"text_config": {"mtp_num_hidden_layers": 2}}
            ).num_speculative_tokens
            == 2
        )
        with pytest.raises(MissingKeyError):
            cfg.with_checkpoint({})
        three = parse({"method": "mtp", "num_speculative_tokens": 3}, installed_registry)
        with pytest.raises(
            RefusedValueError, match="must be divisible by the checkpoint's n_predict=2"
        ):
            three.with_checkpoint({"n_predict": 2})
        assert three.with_checkpoint({"n_predict": 1}).num_speculative_tokens == 3

    def test_methods_without_checkpoint_checks_are_unchanged(self, installed_registry) -> None:
        cfg = parse({"method": "ngram", "num_speculative_tokens": 3}, installed_registry)
        assert cfg.with_checkpoint({"block_size": 99}) is cfg
