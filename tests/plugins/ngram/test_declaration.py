"""draftwise-ngram's declaration: options, capabilities, and its lazy proposer factory."""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import ValidationError

from draftwise.config import InvalidValueError
from draftwise.plugins import ProposerNotBuiltError
from draftwise.speculator import ProposerContext
from draftwise_ngram.options import NgramOptions, make_ngram_proposer

CTX = ProposerContext(num_speculative_tokens=4, vocab_size=100, max_model_len=256)


def test_registered_with_its_distribution(installed_registry) -> None:
    spec, dist = installed_registry.get("ngram")
    assert (dist.name, dist.entry_point, dist.module) == (
        "draftwise-ngram",
        "ngram",
        "draftwise_ngram",
    )
    assert spec.aliases == () and spec.options is NgramOptions
    assert spec.make_proposer is make_ngram_proposer
    caps = spec.capabilities
    assert not (
        caps.needs_checkpoint or caps.draft_probs or caps.own_kv_cache or caps.needs_target_hidden
    )


@pytest.mark.parametrize(
    ("given", "bounds"),
    [
        ({}, (5, 5)),
        ({"prompt_lookup_min": 2}, (2, 2)),
        ({"prompt_lookup_max": 7}, (7, 7)),
        ({"prompt_lookup_min": 1, "prompt_lookup_max": 3}, (1, 3)),
    ],
)
def test_options_defaults(given: dict[str, int], bounds: tuple[int, int]) -> None:
    options = NgramOptions.model_validate(given)
    assert (options.prompt_lookup_min, options.prompt_lookup_max) == bounds


def test_options_refuse_min_above_max_and_extras() -> None:
    with pytest.raises(ValidationError) as info:
        NgramOptions.model_validate({"prompt_lookup_min": 4, "prompt_lookup_max": 2})
    assert isinstance(info.value.errors()[0]["ctx"]["error"], InvalidValueError)
    with pytest.raises(ValidationError):
        NgramOptions.model_validate({"k": 3})


def test_factory_refuses_while_the_proposer_is_missing(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "draftwise_ngram.proposer", None)  # import -> ImportError
    with pytest.raises(ProposerNotBuiltError) as info:
        make_ngram_proposer(NgramOptions(), CTX)
    assert str(info.value) == "method ngram is registered but its proposer is not built yet"


def test_factory_does_not_hide_other_import_errors(monkeypatch) -> None:
    broken = types.ModuleType("draftwise_ngram.proposer")

    def __getattr__(name: str) -> object:
        raise ImportError("numba is missing", name="numba")

    broken.__getattr__ = __getattr__  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "draftwise_ngram.proposer", broken)
    with pytest.raises(ImportError) as info:
        make_ngram_proposer(NgramOptions(), CTX)
    assert not isinstance(info.value, ProposerNotBuiltError)


def test_factory_builds_with_options_and_context(monkeypatch) -> None:
    fake = types.ModuleType("draftwise_ngram.proposer")

    class NgramProposer:
        def __init__(self, options: NgramOptions, ctx: ProposerContext) -> None:
            self.options, self.ctx = options, ctx

    fake.NgramProposer = NgramProposer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "draftwise_ngram.proposer", fake)
    built = make_ngram_proposer(NgramOptions(prompt_lookup_min=2), CTX)
    assert (
        isinstance(built, NgramProposer)
        and built.options.prompt_lookup_min == 2
        and built.ctx is CTX
    )
