"""Broken ``config.json`` (and its siblings) are named errors; nothing loads silently wrong.

A tiny Llama directory (the config as transformers writes it, weights from a fixed seed)
is the starting point. Named cases go through ``load_model``; generated cases mutate the
config's values and go through :func:`plan_hf_dir`'s checks, with the property: a
:class:`ModelFormatError`, or a config whose shapes are the original's (the tensors pin
them) and whose other values are exactly what the JSON says, with the JSON's type.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise.formats.errors import ConfigError, ModelFormatError
from draftwise.models.config import ModelConfig
from draftwise.models.llama import expected_shapes
from draftwise.models.loader import _check_tensors, load_model, plan_hf_dir
from draftwise.models.registry import check_hf_config, model_class
from draftwise.models.rope import inv_frequencies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "transformers_version": "4.57.0",
}
#: config keys whose value lands unchanged in one ModelConfig field
DIRECT = {
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "max_position_embeddings": "max_position_embeddings",
    "hidden_act": "hidden_act",
    "bos_token_id": "bos_token_id",
}
#: pinned by the tensors (tie_word_embeddings is not: a tied config may ship an lm_head,
#: which is then ignored, as transformers does)
SHAPES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "intermediate_size", "vocab_size", "q_size", "kv_size")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2))
    gen = torch.Generator().manual_seed(0)
    shapes = expected_shapes(ModelConfig.from_hf_dict(CONFIG))
    save_file({n: torch.randn(s, generator=gen) for n, s in shapes.items()},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def with_config(model_dir: Path, tmp_path: Path, text: str | bytes, name: str = "config.json"):
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


def edited(**changes: Any) -> str:
    cfg = {**CONFIG, **changes}
    return json.dumps({k: v for k, v in cfg.items() if v is not ...})


def test_the_good_directory_loads(model_dir: Path) -> None:
    loaded = load_model(str(model_dir), dtype="float32")
    assert loaded.config == plan_hf_dir(str(model_dir)).config
    assert loaded.config.hidden_size == 64 and loaded.eos_token_ids == (2,)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"architectures": ["LlamaForCausalLM"], "name": "caf\xe9"}'.encode("latin-1"),
         "not UTF-8 text: byte 0xe9"),
        (edited(hidden_size="sixty-four"), "'hidden_size' is \"sixty-four\", expected an integer"),
        (edited(hidden_size="64"), "'hidden_size' is \"64\", expected an integer"),
        (edited(hidden_size=64.0), "'hidden_size' is 64.0, expected an integer"),
        (edited(hidden_size=True), "'hidden_size' is true, expected an integer"),
        (edited(num_attention_heads=0), "'num_attention_heads' is 0, expected an integer from 1"),
        (edited(num_key_value_heads=0), "'num_key_value_heads' is 0"),
        (edited(num_attention_heads=3), "'num_attention_heads' is 3, expected a divisor of"),
        (edited(architectures=[["LlamaForCausalLM"]]), "'architectures' is [[\"LlamaForCausalLM\"]]"),
        (edited(architectures="LlamaForCausalLM"), "expected a list of strings"),
        (edited(hidden_size=..., ) [:-1] + ', "hidden_size": ' + "9" * 5000 + "}",
         "an integer of 5,000 digits"),
        (edited(hidden_size=2**40), "expected an integer from 1 to 2,147,483,647"),
        (edited(tie_word_embeddings="false"), "'tie_word_embeddings' is \"false\", expected true"),
        (edited(rms_norm_eps=-1), "'rms_norm_eps' is -1, expected a positive finite number"),
        (edited(rms_norm_eps=...)[:-1] + ', "rms_norm_eps": NaN}', "NaN is not a JSON value"),
        (edited(rms_norm_eps=...)[:-1] + ', "rms_norm_eps": 1e999}', "too large for a float"),
        (edited(eos_token_id=[2, "x"]), "'eos_token_id' is [2, \"x\"], expected a token id"),
        (edited(eos_token_id=96), "expected a token id from 0 to 95"),
        (edited(rope_scaling={"rope_type": "llama3", "factor": "8"}), "'rope_scaling.factor'"),
        (edited(rope_scaling=[1]), "'rope_scaling' is [1], expected an object"),
        (edited(num_hidden_layers=10**6), "declares 1,000,000 layers"),
        ("[" * 100 + "]" * 100, "nested deeper than 64"),
        ("\ufeff" + edited(), "Unexpected UTF-8 BOM"),
        (edited()[:-1] + ', "hidden_size": 64}', '"hidden_size" is given twice'),
        ("[]", "expected a JSON object"),
    ],
)
def test_broken_config_json_is_a_named_error(model_dir, tmp_path, text, fragment) -> None:
    d = with_config(model_dir, tmp_path, text)
    with pytest.raises(ModelFormatError) as err:
        load_model(str(d))
    assert fragment in str(err.value) and str(d) in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("generation_config.json", '{"eos_token_id": "2"}', "'eos_token_id' is \"2\""),
        ("generation_config.json", b'{"eos_token_id": 2, "x": "\xff"}', "not UTF-8"),
        ("tokenizer_config.json", '{"add_bos_token": "false"}', "'add_bos_token' is \"false\""),
        ("tokenizer_config.json", '{"eos_token": 5}', "'eos_token' is 5"),
        ("chat_template.json", '{"chat_template": 5}', "'chat_template' is 5"),
        ("chat_template.json", '{"chat_template": [{"name": ["x"]}]}', "not all"),
        ("chat_template.jinja", b"{{ 'caf\xe9' }}", "not UTF-8"),
        ("model.safetensors.index.json", '{"weight_map": {"a": "../x.safetensors"}}',
         "expected shard file names"),
        ("model.safetensors.index.json", '{"weight_map": {"a": ["x"]}}', "expected shard file"),
    ],
)
def test_broken_sibling_files(model_dir, tmp_path, name: str, text, fragment: str) -> None:
    d = with_config(model_dir, tmp_path, text, name)
    with pytest.raises(ModelFormatError) as err:
        load_model(str(d))
    assert fragment in str(err.value) and name in str(err.value), str(err.value)


def test_integer_weights_are_refused_not_cast(model_dir: Path, tmp_path: Path) -> None:
    d = with_config(model_dir, tmp_path, edited())
    from safetensors.torch import load_file

    tensors = load_file(d / "model.safetensors")
    tensors["model.embed_tokens.weight"] = torch.arange(96 * 64, dtype=torch.int32).view(96, 64)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="'model.embed_tokens.weight' is stored as I32"):
        load_model(str(d))


# --- generated configs -------------------------------------------------------------------

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 300), st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
    st.sampled_from(["LlamaForCausalLM", "Qwen2ForCausalLM", "silu", "gelu", "llama3", "qwen3"]),
    st.lists(st.integers(0, 200), max_size=3), st.lists(st.lists(st.text(max_size=3), max_size=2)),
    st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "x"]),
                    st.one_of(st.floats(-2, 9), st.text(max_size=6)), max_size=3),
)
keys = st.sampled_from(sorted({*CONFIG, "head_dim", "rope_parameters", "partial_rotary_factor",
                               "sliding_window", "use_sliding_window", "layer_types",
                               "num_local_experts", "text_config", "pad_token_id"}))


def plan(cfg: dict[str, Any], available: dict[str, tuple[str, tuple[int, ...]]]) -> ModelConfig:
    """plan_hf_dir's config stage, on a dict (no file writes per example)."""
    check_hf_config(cfg, "config.json")
    config = ModelConfig.from_hf_dict(cfg, "config.json")
    model_class(config, "config.json")
    _check_tensors("dir", config, available)
    return config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(keys, junk, min_size=1, max_size=2))
def test_generated_configs_are_refused_or_read_exactly(model_dir: Path, changes) -> None:
    original = ModelConfig.from_hf_dict(CONFIG)
    available = {n: (n, s) for n, s in expected_shapes(original).items()}
    cfg = {**CONFIG, **changes}
    try:
        config = plan(cfg, available)
    except ModelFormatError:
        return
    inv_freq, scale = inv_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
    )  # what the model builds from it: no KeyError, no division by zero
    assert torch.isfinite(inv_freq).all() and math.isfinite(scale), changes
    for attr in SHAPES:  # the tensors pin these
        assert getattr(config, attr) == getattr(original, attr), (attr, changes)
    for key, value in changes.items():
        if key in DIRECT and value is not None:
            got = getattr(config, DIRECT[key])
            assert got == value and type(got) is type(value) or (
                isinstance(value, int) and isinstance(got, float) and got == value
            ), (key, value, got)
        if key in ("tie_word_embeddings", "attention_bias", "mlp_bias") and value is not None:
            assert isinstance(value, bool), (key, value)  # "false", 0: refused
        if key in ("attention_bias", "mlp_bias") and value is not None:
            assert value is False  # True needs bias tensors the checkpoint lacks


def test_a_config_error_names_the_key(model_dir: Path, tmp_path: Path) -> None:
    d = with_config(model_dir, tmp_path, edited(num_attention_heads=0))
    with pytest.raises(ConfigError) as err:
        load_model(str(d))
    assert err.value.key == "num_attention_heads" and err.value.path.endswith("config.json")
