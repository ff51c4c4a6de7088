"""Which method a speculative config asks for, resolved the way vLLM resolves it.

``method`` given: taken as is (aliases resolve to their canonical method, with a
notice). ``method`` absent: a dotted class path in ``model`` means vLLM's
``custom_class`` (refused: draftwise loads proposers from plugins), ``"ngram"`` or
``"[ngram]"`` means ngram, a model path naming eagle/dflash/dspark picks that method
(vLLM's path rule), anything else is ``draft_model``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftwise.config.errors import (
    InvalidValueError,
    MissingKeyError,
    UnknownMethodError,
    show,
)
from draftwise.config.vllm_fields import FIRST_PARTY, MTP_MODEL_TYPES, VLLM_ONLY_METHODS

if TYPE_CHECKING:
    from draftwise.plugins.registry import Registration, SpeculatorRegistry

#: vLLM's path rule, in vLLM's order: a substring of the lower-cased model path -> method
PATH_RULES: tuple[tuple[str, str], ...] = (
    ("eagle-", "eagle"),
    ("eagle3", "eagle3"),
    ("dflash", "dflash"),
    ("dspark", "dspark"),
)
#: file names vLLM's dotted-path test would mistake for a class path
_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".json")


@dataclass(frozen=True, slots=True)
class MethodResolution:
    """The registration a config resolves to, and what the user should be told about it."""

    registration: Registration
    notices: tuple[str, ...]


def is_custom_class_path(model: str) -> bool:
    """vLLM's ``_is_custom_proposer_path``, minus file names such as ``draft.gguf``."""
    if "/" in model or "://" in model or model.lower().endswith(_FILE_SUFFIXES):
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


def installed_methods(registry: SpeculatorRegistry) -> str:
    """"ngram (draftwise-ngram 0.1.0), ..." or how to install one."""
    regs = list(registry)
    if not regs:
        return "none (install one, e.g. pip install draftwise-ngram)"
    return ", ".join(f"{r.speculator.method} ({r.dist})" for r in regs)


def _excluded_note(registry: SpeculatorRegistry) -> str:
    if not registry.excluded:
        return ""
    names = ", ".join(str(d) for d in registry.excluded)
    return f" DRAFTWISE_PLUGINS leaves out the installed plugins: {names}."


def unknown_method_error(
    name: str, registry: SpeculatorRegistry, *, key: str = "method", origin: str = ""
) -> UnknownMethodError:
    """Refuse a method no installed plugin provides, saying which distribution would."""
    asked = f"method '{name}'{origin}"
    canonical = "mtp" if name in MTP_MODEL_TYPES else name
    installed = f" Installed methods: {installed_methods(registry)}."
    if canonical in FIRST_PARTY:
        dist = FIRST_PARTY[canonical]
        alias = f" (an alias of '{canonical}')" if canonical != name else ""
        excluded = [d for d in registry.excluded if d.name == dist]
        if excluded:
            head = f"{asked}{alias} is provided by {excluded[0]}, which is installed but not loaded"
            instead = f"add {canonical} to DRAFTWISE_PLUGINS, or unset it"
        else:
            head = f"{asked}{alias} is not installed"
            instead = f"pip install {dist}"
        return UnknownMethodError(
            f"{head}; {instead}.{installed}{_excluded_note(registry)}",
            key=key, value=name, reason=head, instead=instead,
        )
    if name in VLLM_ONLY_METHODS:
        why, instead = VLLM_ONLY_METHODS[name]
        return UnknownMethodError(
            f"{asked} is a vLLM method draftwise does not have: {why}. Instead: {instead}."
            f"{installed}",
            key=key, value=name, reason=why, instead=instead,
        )
    choices = [*registry.methods(), *registry.aliases(), *FIRST_PARTY]
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "."
    return UnknownMethodError(
        f"unknown {asked}{hint}{installed}{_excluded_note(registry)}",
        key=key, value=name, reason="no installed plugin provides it",
        instead=f"use '{close[0]}'" if close else "",
    )


def _method_from_model(model: str, registry: SpeculatorRegistry) -> tuple[str, str]:
    """vLLM's resolution when ``method`` is absent: (method, notice)."""
    if model in ("ngram", "[ngram]"):
        return "ngram", f"no 'method' given; model {show(model)} means method 'ngram'"
    if is_custom_class_path(model):
        raise unknown_method_error(
            "custom_class", registry, key="model",
            origin=f" (model {show(model)} is a dotted class path)",
        )
    lowered = model.lower()
    for needle, method in PATH_RULES:
        if needle in lowered:
            return method, (
                f"no 'method' given; model path {show(model)} contains '{needle}', so "
                f"method is '{method}' (vLLM's rule)"
            )
    return "draft_model", f"no 'method' given; model {show(model)} is run as method 'draft_model'"


def resolve_method(data: Mapping[str, Any], registry: SpeculatorRegistry) -> MethodResolution:
    """The registration ``data`` asks for; refuses absent, mistyped and unknown methods."""
    method, model = data.get("method"), data.get("model")
    notices: list[str] = []
    origin, key = "", "method"
    if method is not None:
        if not isinstance(method, str):
            raise InvalidValueError(
                f"method={show(method)} is invalid: it must be a string, one of "
                f"{', '.join(registry.methods()) or '(no method installed)'}.",
                key="method", value=method, reason="not a string",
            )
    elif model is None:
        given = data.get("num_speculative_tokens") is not None
        head = (
            "num_speculative_tokens was given without 'method' or 'model'"
            if given
            else "the speculative config names no 'method' (or 'model')"
        )
        raise MissingKeyError(
            f"{head}. Give \"method\", one of: {installed_methods(registry)}; or leave the "
            "speculative config out to run without speculation.",
            key="method", reason=head,
        )
    elif not isinstance(model, str):
        raise InvalidValueError(
            f"model={show(model)} is invalid: it must be a string (a local path).",
            key="model", value=model, reason="not a string",
        )
    else:
        method, notice = _method_from_model(model, registry)
        notices.append(notice)
        origin, key = f" (from model {show(model)})", "model"
    reg = registry.lookup(method)
    if reg is None:
        raise unknown_method_error(method, registry, key=key, origin=origin)
    canonical = reg.speculator.method
    if canonical != method:
        why = " (vLLM deprecates it in favour of 'mtp')" if method in MTP_MODEL_TYPES else ""
        notices.append(f"method '{method}' is an alias of '{canonical}'{why}; using '{canonical}'")
    return MethodResolution(reg, tuple(notices))


__all__ = [
    "PATH_RULES",
    "MethodResolution",
    "installed_methods",
    "is_custom_class_path",
    "resolve_method",
    "unknown_method_error",
]
