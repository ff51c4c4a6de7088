"""Every refusal kind, with its exact message: the message is the product here."""

from __future__ import annotations

from typing import Any

import pytest

from draftwise.config import (
    ConfigError,
    InternalFieldError,
    InvalidJSONError,
    InvalidValueError,
    MissingKeyError,
    NotForMethodError,
    RefusedValueError,
    UnimplementedFieldError,
    UnknownKeyError,
    UnknownMethodError,
    parse_speculative_config,
)
from draftwise.errors import DraftwiseError
from draftwise.plugins import SpeculatorRegistry

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
FIVE = (
    "dflash (draftwise-dflash 0.1.0), draft_model (draftwise-draft-model 0.1.0), "
    "dspark (draftwise-dspark 0.1.0), mtp (draftwise-mtp 0.1.0), ngram (draftwise-ngram 0.1.0), "
    "suffix (draftwise-ngram 0.1.0)"
)
NGRAM_KEYS = (
    "draft_sample_method, draft_tensor_parallel_size, draftwise, enforce_eager, max_model_len, "
    "method, model, num_speculative_tokens, num_speculative_tokens_per_batch_size, "
    "prompt_lookup_max, prompt_lookup_min, rejection_sample_method"
)


def refuse(obj: Any, registry: SpeculatorRegistry, kind: type[ConfigError]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_speculative_config(obj, registry)
    assert type(info.value) is kind, f"{type(info.value).__name__}: {info.value}"
    return info.value


def without(registry: SpeculatorRegistry, method: str) -> SpeculatorRegistry:
    return SpeculatorRegistry([r for r in registry if r.speculator.method != method])


def test_errors_are_value_errors_and_draftwise_errors() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, DraftwiseError)
    assert issubclass(InternalFieldError, UnimplementedFieldError)


def test_unknown_key_with_did_you_mean_and_accepted_keys(installed_registry) -> None:
    err = refuse(
        {"method": "ngram", "num_speculatve_tokens": 4}, installed_registry, UnknownKeyError
    )
    assert str(err) == (
        "unknown key 'num_speculatve_tokens'; did you mean 'num_speculative_tokens'? "
        f"Keys accepted for method 'ngram': {NGRAM_KEYS}. vLLM's other SpeculativeConfig "
        "fields are recognised and refused by name."
    )
    assert (err.key, err.value, err.instead) == (
        "num_speculatve_tokens",
        4,
        "use 'num_speculative_tokens'",
    )


def test_unknown_key_without_a_close_match(installed_registry) -> None:
    err = refuse({**NGRAM, "xyzzy": 1}, installed_registry, UnknownKeyError)
    assert str(err).startswith("unknown key 'xyzzy'. Keys accepted for method 'ngram': ")


def test_accepted_keys_leave_out_keys_refused_whatever_their_value(plugin_host) -> None:
    """Issue 42 (D4): a key the method (or the core) refuses for every value is not
    "accepted"; one refused only for some values still is."""
    from pydantic import BaseModel, ConfigDict

    from draftwise import hookimpl
    from draftwise.plugins import DistInfo, load_speculators
    from draftwise.speculator import Refusal, Speculator

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        heads: int = 4

    class Acme:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(Speculator(method="acme", options=Opts, refusals=(
                Refusal("draft_tensor_parallel_size", "one device", "drop it"),
                Refusal("draft_sample_method", "no draft probabilities", "use 'greedy'",
                        values=("probabilistic",)),
            )))

    plugin_host.register(Acme(), DistInfo("acme", "1.0", "acme", "acme"))
    err = refuse({"method": "acme", "xyzzy": 1}, load_speculators(plugin_host), UnknownKeyError)
    accepted = str(err).split("Keys accepted for method 'acme': ")[1].split(".")[0].split(", ")
    assert "heads" in accepted and "draft_sample_method" in accepted
    assert "draft_tensor_parallel_size" not in accepted  # the method refuses any value
    assert "quantization" not in accepted  # the core refuses any value


def test_key_differing_in_case_is_suggested(installed_registry) -> None:
    err = refuse({**NGRAM, "Method": "ngram"}, installed_registry, UnknownKeyError)
    assert str(err).startswith("unknown key 'Method'; did you mean 'method'?")


def test_key_vllm_removed_says_so(installed_registry) -> None:
    err = refuse({**NGRAM, "disable_by_batch_size": 4}, installed_registry, UnknownKeyError)
    assert str(err).startswith(
        "unknown key 'disable_by_batch_size': vLLM removed it (PR #35060; unused since V0); "
        "its successor is num_speculative_tokens_per_batch_size, e.g. [[1, 4, 4], [5, 256, 0]]."
    )


def test_unknown_key_in_namespace(installed_registry) -> None:
    err = refuse({**NGRAM, "draftwise": {"drafter_chian": []}}, installed_registry, UnknownKeyError)
    assert str(err) == (
        "unknown key 'draftwise.drafter_chian'; did you mean 'drafter_chain'? "
        "Keys accepted under 'draftwise': drafter_chain, adaptive, confidence_threshold."
    )
    assert err.key == "draftwise.drafter_chian"


def test_unimplemented_vllm_field(installed_registry) -> None:
    err = refuse({**NGRAM, "moe_backend": "triton"}, installed_registry, UnimplementedFieldError)
    assert str(err) == (
        "moe_backend=\"triton\" is refused: 'moe_backend' is a real vLLM field this engine does "
        "not implement: draftwise has a single MoE path, inherited from the target. "
        "Instead: drop it."
    )
    assert (err.key, err.value) == ("moe_backend", "triton")


def test_revision_refused_local_paths_only(installed_registry) -> None:
    err = refuse({**NGRAM, "revision": "main"}, installed_registry, UnimplementedFieldError)
    assert str(err) == (
        "revision=\"main\" is refused: 'revision' is a real vLLM field this engine does not "
        "implement: draftwise reads local checkpoints only. Instead: check out that revision "
        "yourself and pass its local path as 'model'."
    )


def test_engine_injected_internal(installed_registry) -> None:
    err = refuse({**NGRAM, "draft_model_config": {}}, installed_registry, InternalFieldError)
    assert str(err) == (
        "draft_model_config={} is refused: 'draft_model_config' is a real vLLM field, but an "
        "engine-injected internal: vLLM's engine fills it in itself; it is not a user setting. "
        "Instead: drop it; draftwise reads the draft's own config.json from 'model'."
    )


def test_tensor_parallel_size_trap(installed_registry) -> None:
    err = refuse({**NGRAM, "tensor_parallel_size": 2}, installed_registry, RefusedValueError)
    assert str(err) == (
        "tensor_parallel_size=2 is refused: 'tensor_parallel_size' is not a valid argument in "
        "the speculative_config (vLLM refuses it too). Instead: pass "
        "'draft_tensor_parallel_size' (1, or the target's tensor_parallel_size)."
    )


def test_draft_tensor_parallel_size(installed_registry) -> None:
    """Parsed and kept; checked against the engine's tensor_parallel_size at build
    (``check_draft_tensor_parallel``: vLLM's rule, 1 or the target's size)."""
    from draftwise.config.core import check_draft_tensor_parallel

    assert parse_speculative_config({**NGRAM, "draft_tensor_parallel_size": 1}, installed_registry)
    cfg = parse_speculative_config({**NGRAM, "draft_tensor_parallel_size": 2}, installed_registry)
    assert cfg is not None and cfg.draft_tensor_parallel_size == 2
    assert cfg.to_json()["draft_tensor_parallel_size"] == 2
    check_draft_tensor_parallel(2, 2, ())  # equal to the target's: model-free runs
    check_draft_tensor_parallel(1, 2, ())
    with pytest.raises(RefusedValueError) as err:
        check_draft_tensor_parallel(2, 1, ())
    assert str(err.value) == (
        "draft_tensor_parallel_size=2 is refused: draftwise runs the draft on one device. "
        "Instead: drop it, or set 1."
    )
    with pytest.raises(RefusedValueError, match=r"vLLM allows 1 or the target's "
                       r"tensor_parallel_size \(4\)"):
        check_draft_tensor_parallel(2, 4, ())
    with pytest.raises(RefusedValueError, match=r'method="mtp" is refused at '
                       r"tensor_parallel_size=2"):
        check_draft_tensor_parallel(2, 2, ("mtp",))


def test_option_of_another_method(installed_registry) -> None:
    cfg = {"model": "/ckpt/small", "num_speculative_tokens": 3, "prompt_lookup_min": 3}
    err = refuse(cfg, installed_registry, NotForMethodError)
    assert str(err) == (
        "prompt_lookup_min=3 is refused: 'prompt_lookup_min' is an option of method 'ngram', "
        'not of \'draft_model\'. Instead: drop it, or use "method": "ngram".'
    )


def test_option_of_a_method_not_installed(installed_registry) -> None:
    cfg = {"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_min": 3}
    err = refuse(cfg, without(installed_registry, "ngram"), UnimplementedFieldError)
    assert str(err).endswith(
        "it is an option of method 'ngram', which is not installed. "
        "Instead: pip install draftwise-ngram."
    )


def test_synthetic_rejection_sampling(installed_registry) -> None:
    cfg = {**NGRAM, "rejection_sample_method": "synthetic"}
    err = refuse(cfg, installed_registry, RefusedValueError)
    assert str(err) == (
        "rejection_sample_method=\"synthetic\" is refused: 'synthetic' accepts drafts at preset "
        "rates without looking at the target: a benchmarking mode that is not lossless. "
        "Instead: use 'standard' (or 'block'); both keep the target's distribution exactly."
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [("synthetic_acceptance_rates", [0.9, 0.5, 0.1]), ("synthetic_acceptance_length", 2.5)],
)
def test_synthetic_settings(installed_registry, key: str, value: Any) -> None:
    err = refuse({**NGRAM, key: value}, installed_registry, UnimplementedFieldError)
    assert "benchmarking mode that is not lossless, which draftwise refuses" in str(err)
    assert err.key == key


def test_quantization_is_detected_not_set(installed_registry) -> None:
    assert parse_speculative_config({**NGRAM, "quantization": None}, installed_registry)
    err = refuse({**NGRAM, "quantization": "gguf"}, installed_registry, RefusedValueError)
    assert str(err) == (
        'quantization="gguf" is refused: draftwise detects the draft\'s quantization from its '
        "own checkpoint (quantization_config in config.json, GGUF, EXL3), so it is not a "
        "setting. Instead: drop 'quantization'."
    )


def test_method_refusal_data(installed_registry) -> None:
    cfg = {
        "method": "dflash",
        "model": "/x",
        "num_speculative_tokens": 3,
        "parallel_drafting": False,
    }
    err = refuse(cfg, installed_registry, RefusedValueError)
    assert str(err) == (
        "parallel_drafting=false is refused by method 'dflash': dflash always drafts its whole "
        "block in one forward (vLLM forces it on). Instead: drop parallel_drafting, or set it "
        "to true."
    )


def test_probabilistic_drafting_needs_draft_probs(installed_registry) -> None:
    err = refuse(
        {**NGRAM, "draft_sample_method": "probabilistic"}, installed_registry, RefusedValueError
    )
    assert str(err) == (
        "draft_sample_method=\"probabilistic\" is refused: method 'ngram' produces no draft "
        "distribution, so verification treats its drafts as one-hot, which is already "
        'lossless. Instead: use "greedy" (the default).'
    )


def test_model_for_a_model_free_method(installed_registry) -> None:
    err = refuse({**NGRAM, "model": "/x"}, installed_registry, RefusedValueError)
    assert (
        str(err)
        == "model=\"/x\" is refused: method 'ngram' reads no checkpoint. Instead: drop 'model'."
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3", 'num_speculative_tokens="3" is invalid: input should be a valid integer.'),
        (0, "num_speculative_tokens=0 is invalid: input should be greater than 0."),
        (129, "num_speculative_tokens=129 is invalid: input should be less than or equal to 128."),
        (2.0, "num_speculative_tokens=2.0 is invalid: input should be a valid integer."),
        (True, "num_speculative_tokens=true is invalid: input should be a valid integer."),
    ],
)
def test_wrong_type_or_range_names_the_key(installed_registry, value: Any, message: str) -> None:
    err = refuse(
        {"method": "ngram", "num_speculative_tokens": value}, installed_registry, InvalidValueError
    )
    assert str(err) == message
    assert (err.key, err.value) == ("num_speculative_tokens", value)


def test_wrong_literal(installed_registry) -> None:
    err = refuse({**NGRAM, "draft_sample_method": "random"}, installed_registry, InvalidValueError)
    assert str(err) == (
        "draft_sample_method=\"random\" is invalid: input should be 'greedy' or 'probabilistic'."
    )


def test_same_key_twice_after_normalisation(installed_registry) -> None:
    cfg = {"method": "ngram", "num-speculative-tokens": 3, "num_speculative_tokens": 4}
    err = refuse(cfg, installed_registry, InvalidValueError)
    assert str(err) == (
        "'num_speculative_tokens' is given twice (as 'num-speculative-tokens' and "
        "'num_speculative_tokens'). Keep one."
    )


def test_missing_k(installed_registry) -> None:
    err = refuse({"method": "ngram"}, installed_registry, MissingKeyError)
    assert str(err) == (
        "method 'ngram' needs 'num_speculative_tokens' (how many tokens to draft per step, e.g. 4)."
    )
    assert err.key == "num_speculative_tokens"


def test_missing_model(installed_registry) -> None:
    err = refuse(
        {"method": "draft_model", "num_speculative_tokens": 3}, installed_registry, MissingKeyError
    )
    assert str(err) == "method 'draft_model' needs 'model': the local path of its draft checkpoint."


def test_missing_method(installed_registry) -> None:
    err = refuse({}, installed_registry, MissingKeyError)
    assert str(err) == (
        "the speculative config names no 'method' (or 'model'). Give \"method\", one of: "
        f"{FIVE}; or leave the speculative config out to run without speculation."
    )
    err = refuse({"num_speculative_tokens": 3}, installed_registry, MissingKeyError)
    assert str(err).startswith("num_speculative_tokens was given without 'method' or 'model'.")


def test_vllm_method_draftwise_lacks(installed_registry) -> None:
    err = refuse(
        {"method": "eagle3", "num_speculative_tokens": 3}, installed_registry, UnknownMethodError
    )
    assert str(err) == (
        "method 'eagle3' is a vLLM method draftwise does not have: EAGLE-3 drafters are not "
        f"implemented. Instead: use 'dflash' or 'draft_model'. Installed methods: {FIVE}."
    )


def test_an_installed_plugin_takes_a_vllm_only_name(plugin_host) -> None:
    """docs/speculative-decoding.md: 'medusa' is refused only while no plugin claims it."""
    from pydantic import BaseModel, ConfigDict

    from draftwise import hookimpl
    from draftwise.plugins import DistInfo, load_speculators
    from draftwise.speculator import Speculator

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class AcmeMedusa:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(Speculator(method="medusa", options=Opts))

    cfg = {"method": "medusa", "num_speculative_tokens": 3}
    refuse(cfg, load_speculators(plugin_host), UnknownMethodError)
    plugin_host.register(AcmeMedusa(), DistInfo("acme-medusa", "1.0", "medusa", "acme_medusa"))
    assert parse_speculative_config(cfg, load_speculators(plugin_host)).method == "medusa"


def test_misspelt_method(installed_registry) -> None:
    err = refuse(
        {"method": "ngarm", "num_speculative_tokens": 3}, installed_registry, UnknownMethodError
    )
    assert str(err) == f"unknown method 'ngarm'; did you mean 'ngram'? Installed methods: {FIVE}."


def test_first_party_method_not_installed(installed_registry) -> None:
    registry = without(installed_registry, "dflash")
    cfg = {"method": "dflash", "model": "/x", "num_speculative_tokens": 3}
    err = refuse(cfg, registry, UnknownMethodError)
    assert str(err).startswith("method 'dflash' is not installed; pip install draftwise-dflash.")
    assert err.instead == "pip install draftwise-dflash"


def test_alias_of_a_method_not_installed(installed_registry) -> None:
    cfg = {"method": "deepseek_mtp", "num_speculative_tokens": 3}
    err = refuse(cfg, without(installed_registry, "mtp"), UnknownMethodError)
    assert str(err).startswith(
        "method 'deepseek_mtp' (an alias of 'mtp') is not installed; pip install draftwise-mtp."
    )


def test_no_plugin_installed() -> None:
    err = refuse(NGRAM, SpeculatorRegistry(), UnknownMethodError)
    assert str(err) == (
        "method 'ngram' is not installed; pip install draftwise-ngram. Installed methods: none "
        "(install one, e.g. pip install draftwise-ngram)."
    )


def test_custom_class_points_at_plugins(installed_registry) -> None:
    cfg = {"model": "my_pkg.MyProposer", "num_speculative_tokens": 3}
    err = refuse(cfg, installed_registry, UnknownMethodError)
    assert str(err).startswith(
        "method 'custom_class' (model \"my_pkg.MyProposer\" is a dotted class path) is a vLLM "
        "method draftwise does not have"
    )
    assert "see docs/writing-a-plugin.md" in str(err)
    assert err.key == "model"


def test_bad_json_points_at_the_position(installed_registry) -> None:
    err = refuse(
        '{"method":"ngram" "num_speculative_tokens":3}', installed_registry, InvalidJSONError
    )
    assert str(err) == (
        "the speculative config is not valid JSON: Expecting ',' delimiter at line 1, column 19 "
        "(char 18):\n"
        '    {"method":"ngram" "num_speculative_tokens":3}\n'
        "                      ^\n"
        "JSON needs double quotes around keys and strings; on a shell command line put the "
        "whole object in single quotes, e.g. --speculative-config "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\''
    )


def test_shell_stripped_quotes_get_the_quoting_reminder(installed_registry) -> None:
    err = refuse("{method:ngram}", installed_registry, InvalidJSONError)
    assert "Expecting property name enclosed in double quotes at line 1, column 2" in str(err)
    assert (
        "The double quotes seem lost: a shell strips them unless the whole object is "
        "inside single quotes."
        in str(err)
    )
    err = refuse("{'method': 'ngram'}", installed_registry, InvalidJSONError)
    assert "JSON strings use double quotes, not single ones." in str(err)
    assert "put the whole object in single quotes" in str(err)


def test_long_line_snippet_is_windowed(installed_registry) -> None:
    text = '{"method": "ngram", ' + '"prompt_lookup_max": 5, ' * 6 + '"num_speculative_tokens": 4,}'
    err = refuse(text, installed_registry, InvalidJSONError)
    snippet, caret = str(err).splitlines()[1:3]
    assert snippet.startswith("    …") and len(snippet) < 80
    assert snippet[caret.index("^")] == "}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"method":"ngram","method":"mtp"}', "the speculative config gives key 'method' twice;"),
        ('{"method":"ngram","num_speculative_tokens":NaN}', "NaN is not a JSON value."),
        ("[1, 2]", "the speculative config must be a JSON object, got [1, 2]."),
        ("  ", "the speculative config is empty."),
    ],
)
def test_json_that_is_refused(installed_registry, text: str, message: str) -> None:
    err = refuse(text, installed_registry, InvalidJSONError)
    assert message in str(err)


@pytest.mark.parametrize(
    ("schedule", "error", "fragment"),
    [
        ([[1, 4, 5]], RefusedValueError, "more than num_speculative_tokens=4"),
        ([[1, 4, 4], [4, 8, 2]], InvalidValueError, "ranges overlap at batch size 4"),
        ([[0, 4, 4]], InvalidValueError, "needs 1 <= first <= last"),
        ([[3, 2, 1]], InvalidValueError, "needs 1 <= first <= last"),
        ([[1, 4]], InvalidValueError, "is not three integers"),
        ([[1, 4, True]], InvalidValueError, "is not three integers"),
        ([[1, 4, -1]], InvalidValueError, "negative k"),
        ([], InvalidValueError, "not a non-empty list"),
        ("1-4:4", InvalidValueError, "not a non-empty list"),
    ],
)
def test_k_schedule_is_checked_entry_by_entry(
    installed_registry, schedule, error, fragment
) -> None:
    cfg = {**NGRAM, "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": schedule}
    err = refuse(cfg, installed_registry, error)
    assert fragment in str(err)
    assert err.key == "num_speculative_tokens_per_batch_size"


def test_k_schedule_resolves_and_round_trips(installed_registry) -> None:
    from draftwise.config import parse_speculative_config

    cfg = {
        **NGRAM,
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [(5, 256, 0), [1, 4, 3]],  # tuples are fine
    }
    resolved = parse_speculative_config(cfg, installed_registry)
    assert resolved.k_schedule == ((1, 4, 3), (5, 256, 0))
    # uncovered batch sizes draft the full k
    assert [resolved.k_for_batch(b) for b in (1, 4, 5, 256, 257)] == [3, 3, 0, 0, 4]
    again = parse_speculative_config(resolved.to_json(), installed_registry)
    assert again == resolved
