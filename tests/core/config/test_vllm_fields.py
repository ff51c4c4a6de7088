"""All 37 fields of vLLM 0.32's SpeculativeConfig are recognised, each with a decided fate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftwise.config import (
    CORE_KEYS,
    FIELDS_BY_NAME,
    VLLM_FIELDS,
    ConfigError,
    FieldKind,
    InternalFieldError,
    RefusedValueError,
    SpeculativeConfig,
    UnimplementedFieldError,
    UnknownKeyError,
    VllmField,
    parse_speculative_config,
)

DOCS = Path(__file__).parents[3] / "docs" / "speculative-decoding.md"

#: a value for each field other than vLLM's default, so the field is "set"
SET_VALUES: dict[str, Any] = {
    "enforce_eager": True,
    "num_speculative_tokens": 2,
    "model": "ngram",
    "method": "ngram",
    "draft_tensor_parallel_size": 1,
    "tensor_parallel_size": 2,
    "quantization": "fp8",
    "moe_backend": "triton",
    "attention_backend": "FLASH_ATTN",
    "kv_cache_dtype": "fp8",
    "max_model_len": 2048,
    "revision": "main",
    "code_revision": "main",
    "index_share_for_mtp_iteration": True,
    "disable_padded_drafter_batch": True,
    "disable_eagle_block_drop": True,
    "use_local_argmax_reduction": True,
    "use_heterogeneous_vocab": True,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
    "parallel_drafting": True,
    "target_model_config": {"model": "x"},
    "target_parallel_config": {},
    "num_speculative_tokens_per_batch_size": [[1, 8, 2]],
    "draft_model_config": {},
    "draft_parallel_config": {},
    "suffix_decoding_max_tree_depth": 12,
    "suffix_decoding_max_cached_requests": 5,
    "suffix_decoding_max_spec_factor": 2.0,
    "suffix_decoding_min_token_prob": 0.5,
    "draft_load_config": {},
    "rejection_sample_method": "block",
    "synthetic_acceptance_rates": [0.5],
    "synthetic_acceptance_length": 1.5,
    "enable_adaptive_verification": True,
    "draft_sample_method": "probabilistic",
    "dspark_draft_topk": 8,
}

#: OPTION fields whose method declares them but refuses a set value (a Refusal, by name):
#: dspark's top-k drafting and confidence-head cut are not implemented yet
REFUSED_BY_ITS_METHOD = {"dspark_draft_topk", "enable_adaptive_verification"}

#: the method whose options honour each OPTION field, with what else it needs
HOSTS: dict[str, dict[str, Any]] = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "suffix": {"method": "suffix"},
    "draft_model": {"method": "draft_model", "model": "/ckpt/draft", "num_speculative_tokens": 3},
    "dflash": {"method": "dflash", "model": "/ckpt/dflash", "num_speculative_tokens": 3},
    "dspark": {"method": "dspark", "model": "/ckpt/dspark", "num_speculative_tokens": 7},
}


def test_the_table_is_vllm_0_32() -> None:
    names = [f.name for f in VLLM_FIELDS]
    assert len(names) == 37 == len(set(names))
    lines = [f.line for f in VLLM_FIELDS]
    assert lines == sorted(lines), "declaration order, as in vllm/config/speculative.py"
    assert set(SET_VALUES) == set(names), "every field needs a sample value in this test"


def test_core_keys_are_the_core_fields() -> None:
    assert set(CORE_KEYS) == set(SpeculativeConfig.model_fields)
    assert set(CORE_KEYS) == {f.name for f in VLLM_FIELDS if f.kind is FieldKind.CORE}


def test_every_refused_field_says_why_and_what_instead() -> None:
    for f in VLLM_FIELDS:
        if f.kind in (FieldKind.UNIMPLEMENTED, FieldKind.INTERNAL, FieldKind.TRAP):
            assert f.reason and f.instead, f.name
        if f.kind is FieldKind.OPTION:
            assert f.methods and all(m in HOSTS for m in f.methods), f.name


@pytest.mark.parametrize("field", VLLM_FIELDS, ids=lambda f: f.name)
def test_field_is_recognised_when_set(installed_registry, field: VllmField) -> None:
    """Set to a non-default value, a field is honoured or refused by name: never unknown."""
    base = HOSTS[field.methods[0]] if field.kind is FieldKind.OPTION else HOSTS["ngram"]
    if field.name in ("model", "draft_sample_method"):
        base = HOSTS["draft_model"]
    cfg = {**base, field.name: SET_VALUES[field.name]}
    expected: dict[FieldKind, type[ConfigError] | None] = {
        FieldKind.CORE: None,
        FieldKind.OPTION: None,
        FieldKind.UNIMPLEMENTED: UnimplementedFieldError,
        FieldKind.INTERNAL: InternalFieldError,
        FieldKind.TRAP: RefusedValueError,
    }
    kind = expected[field.kind]
    if field.name == "quantization":  # honoured by the core: only None (see the docs)
        kind = RefusedValueError
    if field.name in REFUSED_BY_ITS_METHOD:
        kind = RefusedValueError
    if kind is None:
        resolved = parse_speculative_config(cfg, installed_registry)
        assert resolved is not None
        dumped = resolved.to_json()
        assert dumped.get(field.name, SET_VALUES[field.name]) == SET_VALUES[field.name]
        return
    with pytest.raises(ConfigError) as info:
        parse_speculative_config(cfg, installed_registry)
    assert type(info.value) is kind
    assert info.value.key == field.name
    assert f"'{field.name}'" in str(info.value) or f"{field.name}=" in str(info.value)
    if kind is UnimplementedFieldError:
        assert "a real vLLM field this engine does not implement" in str(info.value)


@pytest.mark.parametrize(
    "field",
    [f for f in VLLM_FIELDS if f.name not in ("method", "num_speculative_tokens")],
    ids=lambda f: f.name,
)
def test_field_at_vllm_default_is_accepted(installed_registry, field: VllmField) -> None:
    """A dumped vLLM config carries every field at its default: that asks for nothing."""
    cfg = {**HOSTS["ngram"], field.name: field.default}
    resolved = parse_speculative_config(cfg, installed_registry)
    assert resolved is not None and resolved.method == "ngram"


def test_a_full_vllm_default_dump_is_accepted(installed_registry) -> None:
    dump = {f.name: f.default for f in VLLM_FIELDS}
    dump.update(HOSTS["ngram"])
    resolved = parse_speculative_config(dump, installed_registry)
    assert resolved is not None
    assert resolved.options is not None
    assert resolved.options.model_dump() == {"prompt_lookup_min": 5, "prompt_lookup_max": 5}


def test_default_aliases_such_as_auto() -> None:
    assert FIELDS_BY_NAME["attention_backend"].is_default("auto")
    assert not FIELDS_BY_NAME["disable_padded_drafter_batch"].is_default(0), "0 is not False"


def test_removed_fields_are_unknown(installed_registry) -> None:
    with pytest.raises(UnknownKeyError):
        parse_speculative_config(
            {**HOSTS["ngram"], "speculative_token_tree": "[]"}, installed_registry
        )


def test_docs_cover_every_field() -> None:
    text = DOCS.read_text()
    missing = [f.name for f in VLLM_FIELDS if f"`{f.name}`" not in text]
    assert not missing, f"docs/speculative-decoding.md does not document {missing}"
