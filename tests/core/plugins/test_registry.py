"""The speculator registry: look-ups and building proposers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict

from draftwise.config import parse_speculative_config
from draftwise.plugins import (
    DistInfo,
    PluginRegistrationError,
    ProposerNotBuiltError,
    Registration,
    SpeculatorRegistry,
)
from draftwise.speculator import DraftInput, Drafts, ProposerContext, Speculator, VerifyOutcome

DIST = DistInfo(name="acme-echo", version="1.0", entry_point="echo", module="acme_echo")
CTX = ProposerContext(num_speculative_tokens=2, vocab_size=10, max_model_len=64)


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: int = 7


@dataclasses.dataclass
class EchoProposer:
    """Drafts ``token`` k times for every row."""

    options: EchoOptions
    ctx: ProposerContext

    def propose(self, batch: DraftInput) -> Drafts:
        return Drafts.from_lists([[self.options.token] * row.max_draft for row in batch.rows])

    def on_verified(self, outcome: VerifyOutcome) -> None:
        pass

    def release(self, req_id: str) -> None:
        pass


def registry(**kwargs) -> SpeculatorRegistry:
    spec = Speculator(method="echo", options=EchoOptions, aliases=("parrot",), **kwargs)
    return SpeculatorRegistry([Registration(spec, DIST)])


def test_lookups() -> None:
    reg = registry()
    assert reg.methods() == ("echo",) and len(reg) == 1
    assert "parrot" in reg and "echo" in reg and "nope" not in reg
    assert reg.lookup("parrot") == reg.get("echo")
    assert reg.lookup("nope") is None
    assert reg.option_keys() == {"token"}
    assert reg.methods_with_option("token") == ("echo",)


def test_build_proposer_calls_the_factory_with_options_and_context() -> None:
    reg = registry(make_proposer=EchoProposer)  # type: ignore[arg-type]
    cfg = parse_speculative_config(
        {"method": "parrot", "num_speculative_tokens": 2, "token": 3}, reg
    )
    assert cfg is not None and cfg.method == "echo"
    reg.ensure_buildable(cfg)
    proposer = reg.build_proposer(cfg, CTX)
    assert isinstance(proposer, EchoProposer) and proposer.options.token == 3
    from draftwise.speculator import DraftRow

    drafts = proposer.propose(DraftInput([DraftRow("r", np.zeros(3, dtype=np.int64), 2)]))
    assert drafts.row(0).tolist() == [3, 3]


def test_not_built_yet() -> None:
    reg = registry()
    cfg = parse_speculative_config({"method": "echo", "num_speculative_tokens": 2}, reg)
    assert cfg is not None
    with pytest.raises(ProposerNotBuiltError) as info:
        reg.build_proposer(cfg, CTX)
    assert str(info.value) == (
        "method echo is registered but its proposer is not built yet (declared by acme-echo 1.0)"
    )
    with pytest.raises(ProposerNotBuiltError):
        reg.ensure_buildable(cfg)
    assert isinstance(info.value, NotImplementedError)


def test_factory_returning_a_non_proposer() -> None:
    reg = registry(make_proposer=lambda options, ctx: object())
    cfg = parse_speculative_config({"method": "echo", "num_speculative_tokens": 2}, reg)
    with pytest.raises(
        PluginRegistrationError, match="returned object, which lacks propose/on_verified/release"
    ):
        reg.build_proposer(cfg, CTX)  # type: ignore[arg-type]


def test_a_chain_is_built_member_by_member() -> None:
    reg = registry(make_proposer=EchoProposer)  # type: ignore[arg-type]
    cfg = parse_speculative_config(
        {"draftwise": {"drafter_chain": [{"method": "echo", "num_speculative_tokens": 2}]}}, reg
    )
    assert cfg is not None
    with pytest.raises(ValueError, match="build_proposer for each of config.drafters"):
        reg.build_proposer(cfg, CTX)
    assert [type(reg.build_proposer(m, CTX)) for m in cfg.drafters] == [EchoProposer]


def test_first_party_methods_build_or_refuse_by_name(installed_registry) -> None:
    """Until a method ships its proposer, asking for one is the typed "not built yet" error."""
    configs = {
        "ngram": {"num_speculative_tokens": 2},
        "mtp": {"num_speculative_tokens": 1},
        "dflash": {"model": "/d", "num_speculative_tokens": 3},
        "dspark": {"model": "/d", "num_speculative_tokens": 7},
        "draft_model": {"model": "/d", "num_speculative_tokens": 3},
    }
    for method, extra in configs.items():
        cfg = parse_speculative_config({"method": method, **extra}, installed_registry)
        assert cfg is not None
        if installed_registry.get(method).speculator.make_proposer is None:
            with pytest.raises(ProposerNotBuiltError, match=f"method {method} is registered"):
                installed_registry.ensure_buildable(cfg)
            with pytest.raises(ProposerNotBuiltError):
                installed_registry.build_proposer(cfg, CTX)
        else:
            installed_registry.ensure_buildable(cfg)


@pytest.mark.parametrize(
    ("caps", "loader", "message"),
    [
        (dict(own_kv_cache=True), True, "own_kv_cache or checkpoint_in_target without needs_"),
        (dict(kv_uses_next_token=True), True, "kv_uses_next_token without own_kv_cache"),
        (dict(needs_checkpoint=True), False, "reads a checkpoint but registers no loader"),
    ],
)
def test_capabilities_the_core_cannot_serve_are_refused(caps, loader, message) -> None:
    from draftwise.speculator import Capabilities

    class Loader:
        def detect(self, path):  # pragma: no cover - never called
            raise AssertionError

        def load(self, checkpoint, options, target):  # pragma: no cover
            raise AssertionError

    with pytest.raises(PluginRegistrationError, match=message):
        registry(make_proposer=EchoProposer, capabilities=Capabilities(**caps),
                 loader=Loader() if loader else None)


def test_a_declared_only_method_may_omit_its_loader() -> None:
    from draftwise.speculator import Capabilities

    reg = registry(capabilities=Capabilities(needs_checkpoint=True, own_kv_cache=True))
    assert not reg.runnable("echo") and "echo" in reg


def test_the_core_key_list_is_one_list() -> None:
    """Plugins may not declare any key the config honours, the newest included."""
    from draftwise.config import CORE_KEYS, SpeculativeConfig
    from draftwise.plugins.registry import RESERVED_OPTION_NAMES

    assert set(SpeculativeConfig.model_fields) == set(CORE_KEYS)
    assert RESERVED_OPTION_NAMES == {*CORE_KEYS, "draftwise"}
    assert "num_speculative_tokens_per_batch_size" in RESERVED_OPTION_NAMES


def test_the_registry_does_not_import_config() -> None:
    import subprocess
    import sys

    code = (
        "import sys, draftwise.plugins.registry, draftwise.plugins.manager; "
        "print(sorted(m for m in sys.modules if m.startswith('draftwise.config')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
