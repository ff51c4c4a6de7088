"""The speculator registry: every registered method, who registered it, and proposer building.

Built once from the plugins' ``register_speculators`` calls (see ``manager.py``), or
directly from :class:`Registration` values in tests. Immutable after construction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from pydantic import BaseModel

from draftwise.plugins.errors import (
    DuplicateMethodError,
    MethodNotInstalledError,
    PluginRegistrationError,
    ProposerNotBuiltError,
)
from draftwise.speculator import CORE_KEYS, NAMESPACE, Proposer, ProposerContext, Speculator

_METHOD_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: option names a plugin may not declare: the core owns them (one list, ``CORE_KEYS``)
RESERVED_OPTION_NAMES = frozenset({*CORE_KEYS, NAMESPACE})


class MethodConfig(Protocol):
    """What building needs from a resolved config (the registry never imports config/)."""

    @property
    def method(self) -> str | None: ...

    @property
    def options(self) -> BaseModel | None: ...

    @property
    def drafters(self) -> Sequence[MethodConfig]: ...


@dataclass(frozen=True, slots=True)
class DistInfo:
    """The distribution behind a plugin: what error messages and ``draftwise plugins`` name."""

    name: str
    version: str
    #: the entry point's name in group ``draftwise`` (the plugin's short name)
    entry_point: str
    #: the entry point's target, e.g. ``draftwise_ngram``
    module: str = ""

    @property
    def plugin_name(self) -> str:
        """The name the plugin is registered under in the PluginManager."""
        return f"{self.name}:{self.entry_point}"

    def __str__(self) -> str:
        return f"{self.name} {self.version}".strip()


class Registration(NamedTuple):
    """One registered speculator and the distribution that registered it."""

    speculator: Speculator
    dist: DistInfo


def _claims(reg: Registration) -> Iterator[tuple[str, str]]:
    """(name, how it is claimed) for a method and each of its aliases."""
    spec = reg.speculator
    yield spec.method, f"as method '{spec.method}' by {reg.dist}"
    for alias in spec.aliases:
        yield alias, f"as an alias of method '{spec.method}' by {reg.dist}"


def validate_speculator(spec: object, dist: DistInfo) -> Speculator:
    """Refuse a malformed declaration at startup, naming the distribution."""
    if not isinstance(spec, Speculator):
        raise PluginRegistrationError(
            f"{dist} registered {spec!r}, which is not a draftwise.speculator.Speculator"
        )
    for name in (spec.method, *spec.aliases):
        if not isinstance(name, str) or not _METHOD_NAME.fullmatch(name):
            raise PluginRegistrationError(
                f"{dist} registered method or alias {name!r}: names must match "
                f"{_METHOD_NAME.pattern}"
            )
    if spec.method in spec.aliases:
        raise PluginRegistrationError(f"{dist}: method '{spec.method}' lists itself as an alias")
    options = spec.options
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise PluginRegistrationError(
            f"{dist}: options of method '{spec.method}' must be a pydantic BaseModel subclass"
        )
    if options.model_config.get("extra") != "forbid":
        raise PluginRegistrationError(
            f"{dist}: options model {options.__name__} of method '{spec.method}' must set "
            "model_config = ConfigDict(extra='forbid'), so unknown keys are refused"
        )
    reserved = RESERVED_OPTION_NAMES & set(options.model_fields)
    if reserved:
        raise PluginRegistrationError(
            f"{dist}: options of method '{spec.method}' declare core keys "
            f"{sorted(reserved)}; the core owns those"
        )
    _check_capabilities(spec, dist)
    return spec


def _check_capabilities(spec: Speculator, dist: DistInfo) -> None:
    """Refuse declarations the core cannot serve: each capability's input must exist."""
    caps = spec.capabilities
    where = f"{dist}: method '{spec.method}'"
    if caps.kv_uses_next_token and not caps.own_kv_cache:
        raise PluginRegistrationError(
            f"{where} declares kv_uses_next_token without own_kv_cache"
        )
    if (caps.own_kv_cache or caps.checkpoint_in_target) and not caps.needs_checkpoint:
        raise PluginRegistrationError(
            f"{where} declares own_kv_cache or checkpoint_in_target without needs_checkpoint: "
            "the KV layout comes from the loaded draft checkpoint"
        )
    if spec.make_proposer is not None and caps.needs_checkpoint and spec.loader is None:
        raise PluginRegistrationError(
            f"{where} reads a checkpoint but registers no loader: give "
            "Speculator(loader=...), whose load() also reports the KV layout and hidden layers"
        )


class SpeculatorRegistry:
    """Every installed method and alias, each attributed to its distribution."""

    def __init__(
        self,
        registrations: Iterable[Registration] = (),
        *,
        excluded: Iterable[DistInfo] = (),
    ) -> None:
        self._regs: dict[str, Registration] = {}
        self._names: dict[str, tuple[Registration, str]] = {}
        for reg in registrations:
            validate_speculator(reg.speculator, reg.dist)
            for name, how in _claims(reg):
                if name in self._names:
                    _, earlier = self._names[name]
                    raise DuplicateMethodError(
                        f"'{name}' is claimed twice: {earlier}, and {how}; uninstall one "
                        "of the two distributions, or load one with DRAFTWISE_PLUGINS"
                    )
                self._names[name] = (reg, how)
            self._regs[reg.speculator.method] = reg
        #: installed distributions that DRAFTWISE_PLUGINS left out
        self.excluded: tuple[DistInfo, ...] = tuple(excluded)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[Registration]:
        return iter(self._regs[m] for m in self.methods())

    def __len__(self) -> int:
        return len(self._regs)

    def methods(self) -> tuple[str, ...]:
        """Canonical method names, sorted."""
        return tuple(sorted(self._regs))

    def aliases(self) -> dict[str, str]:
        """alias -> canonical method."""
        return {
            a: reg.speculator.method for reg in self._regs.values() for a in reg.speculator.aliases
        }

    def lookup(self, method_or_alias: str) -> Registration | None:
        """The registration for a method or alias, or None."""
        hit = self._names.get(method_or_alias)
        return hit[0] if hit else None

    def get(self, method_or_alias: str) -> Registration:
        """The registration for a method or alias; an unknown one is a typed error.

        Configs are resolved (and unknown methods refused with install hints) by
        ``draftwise.config`` before anything asks the registry for a proposer.
        """
        reg = self.lookup(method_or_alias)
        if reg is None:
            raise MethodNotInstalledError(method_or_alias, self.methods())
        return reg

    def runnable(self, method_or_alias: str) -> bool:
        """Whether the method ships a proposer (declared-only methods are refused to run)."""
        reg = self.lookup(method_or_alias)
        return reg is not None and reg.speculator.make_proposer is not None

    def option_keys(self) -> frozenset[str]:
        """Every option name some installed method declares."""
        regs = self._regs.values()
        return frozenset(k for reg in regs for k in reg.speculator.options.model_fields)

    def methods_with_option(self, key: str) -> tuple[str, ...]:
        """The installed methods whose options declare ``key``."""
        regs = self._regs
        return tuple(m for m in self.methods() if key in regs[m].speculator.options.model_fields)

    def ensure_buildable(self, config: MethodConfig) -> None:
        """Refuse, before any weights are read, a config whose proposer is not built yet."""
        for member in config.drafters:
            reg = self.get(member.method or "")
            if reg.speculator.make_proposer is None:
                raise ProposerNotBuiltError(reg.speculator.method, str(reg.dist))

    def build_proposer(self, config: MethodConfig, ctx: ProposerContext) -> Proposer:
        """Build the proposer of a single-method config (build a chain member by member)."""
        if config.method is None:
            raise ValueError(
                "a drafter_chain config has one proposer per member: call build_proposer "
                "for each of config.drafters"
            )
        reg = self.get(config.method)
        factory = reg.speculator.make_proposer
        if factory is None:
            raise ProposerNotBuiltError(reg.speculator.method, str(reg.dist))
        if config.options is None:
            raise ValueError(f"config for method '{config.method}' carries no options")
        proposer = factory(config.options, ctx)
        if not isinstance(proposer, Proposer):
            raise PluginRegistrationError(
                f"{reg.dist}: make_proposer of method '{reg.speculator.method}' returned "
                f"{type(proposer).__name__}, which lacks propose/on_verified/release"
            )
        return proposer


__all__ = [
    "RESERVED_OPTION_NAMES",
    "DistInfo",
    "MethodConfig",
    "Registration",
    "SpeculatorRegistry",
    "validate_speculator",
]
