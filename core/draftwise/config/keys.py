"""Key-level checks that run before any value is looked at.

Keys are normalised the way vLLM's ``create_speculative_config`` does (``-`` -> ``_``),
and a key that neither vLLM's SpeculativeConfig, the core, nor any installed method
declares is refused as unknown, with a did-you-mean and the keys that are accepted.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from draftwise.config.core import CORE_REFUSALS
from draftwise.config.errors import ConfigError, InvalidValueError, UnknownKeyError, show
from draftwise.config.vllm_fields import FIELDS_BY_NAME, REMOVED_KEYS
from draftwise.speculator import ANY_VALUE, CORE_KEYS, NAMESPACE, Refusal

if TYPE_CHECKING:
    from draftwise.plugins.registry import SpeculatorRegistry

#: the keys the engine's own namespace (``"draftwise": {...}``) holds
NAMESPACE_KEYS: tuple[str, ...] = ("drafter_chain", "adaptive", "confidence_threshold")


def normalize_keys(raw: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """``-`` -> ``_`` in every key (as vLLM does); refuses non-string and clashing keys."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise InvalidValueError(
                f"key {show(key)} is invalid: speculative config keys are strings.",
                key=prefix + str(key), value=value, reason="key is not a string",
            )
        norm = key.replace("-", "_")
        if norm in out:
            raise InvalidValueError(
                f"'{prefix}{norm}' is given twice (as '{spelled[norm]}' and '{key}'). Keep one.",
                key=prefix + norm, value=value, reason="given twice",
            )
        out[norm] = value
        spelled[norm] = key
    return out


def known_keys(registry: SpeculatorRegistry) -> frozenset[str]:
    """Every key that is not unknown: vLLM's fields, the core's, installed options."""
    return frozenset(FIELDS_BY_NAME) | frozenset(CORE_KEYS) | registry.option_keys() | {NAMESPACE}


def _always_refused(refusals: tuple[Refusal, ...]) -> set[str]:
    """Keys refused whatever their value: listing them as accepted would mislead."""
    return {r.key for r in refusals if r.values is ANY_VALUE}


def accepted_keys(data: Mapping[str, Any], registry: SpeculatorRegistry) -> tuple[str, list[str]]:
    """(who accepts them, the keys honoured) for the method ``data`` resolves to, if any.

    A key the core or the method refuses for every value is left out (issue 42, D4).
    """
    from draftwise.config.methods import resolve_method

    try:
        spec = resolve_method(data, registry).registration.speculator
    except ConfigError:
        keys = {*CORE_KEYS, NAMESPACE} - _always_refused(CORE_REFUSALS)
        return "the core", sorted(keys)
    keys = {*CORE_KEYS, *spec.options.model_fields, NAMESPACE}
    keys -= _always_refused((*CORE_REFUSALS, *spec.refusals))
    return f"method '{spec.method}'", sorted(keys)


def suggest(key: str, candidates: frozenset[str] | tuple[str, ...]) -> str | None:
    """The closest candidate to a misspelt key, or None."""
    lowered = {c.lower(): c for c in candidates}
    if key.lower() in lowered:
        return lowered[key.lower()]
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown(
    key: str, value: Any, known: frozenset[str], who: str, accepted: list[str], tail: str = ""
) -> UnknownKeyError:
    """The refusal of one unknown key: removed-key hint or did-you-mean, then the accepted keys."""
    bare = key.rpartition(".")[2]
    removed = REMOVED_KEYS.get(bare)
    close = suggest(bare, known)
    if removed:
        head = f"unknown key '{key}': {removed}."
    elif close:
        head = f"unknown key '{key}'; did you mean '{close}'?"
    else:
        head = f"unknown key '{key}'."
    return UnknownKeyError(
        f"{head} Keys accepted {who}: {', '.join(accepted)}.{tail}",
        key=key, value=value, reason=removed or "not a known key",
        instead=f"use '{close}'" if close and not removed else "",
    )


def check_unknown_keys(data: Mapping[str, Any], registry: SpeculatorRegistry) -> None:
    """Refuse the first top-level key (in the user's order) nobody declares."""
    known = known_keys(registry)
    for key, value in data.items():
        if key not in known:
            label, accepted = accepted_keys(data, registry)
            raise _unknown(
                key, value, known, f"for {label}", accepted,
                " vLLM's other SpeculativeConfig fields are recognised and refused by name.",
            )


def check_namespace_keys(ns: Mapping[str, Any]) -> None:
    """Refuse an unknown key inside ``"draftwise": {...}``."""
    known = frozenset(NAMESPACE_KEYS)
    for key, value in ns.items():
        if key not in known:
            raise _unknown(
                f"{NAMESPACE}.{key}", value, known, f"under '{NAMESPACE}'", list(NAMESPACE_KEYS)
            )


__all__ = [
    "CORE_KEYS",
    "NAMESPACE",
    "NAMESPACE_KEYS",
    "accepted_keys",
    "check_namespace_keys",
    "check_unknown_keys",
    "known_keys",
    "normalize_keys",
    "suggest",
]
