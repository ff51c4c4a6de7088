"""The speculative config: vLLM's JSON object, checked key by key, resolved to one value.

``parse_speculative_config`` takes what ``--speculative-config`` takes in vLLM (text or
a dict) and returns a frozen :class:`ResolvedSpeculativeConfig`, or raises one
:class:`~draftwise.config.errors.ConfigError` subclass. Nothing is dropped: every key
is honoured by the core, honoured by the method's options, a vLLM field set to vLLM's
own default (a no-op), or refused with its reason. Pure Python: no torch, no files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from draftwise import jsontext
from draftwise.config.adaptive import AdaptiveConfig, parse_adaptive
from draftwise.config.core import (
    CORE_REFUSALS,
    KSchedule,
    check_structure,
    check_unused_field,
    default_k,
    defaults_k,
    k_schedule,
    refusal_for,
    validate_core,
    validate_options,
)
from draftwise.config.errors import (
    ConfigError,
    InvalidJSONError,
    InvalidValueError,
    RefusedValueError,
    UnknownKeyError,
    UnknownMethodError,
    show,
)
from draftwise.config.jsonio import load_json
from draftwise.config.keys import (
    CORE_KEYS,
    NAMESPACE,
    NAMESPACE_KEYS,
    check_namespace_keys,
    check_unknown_keys,
    normalize_keys,
)
from draftwise.config.methods import resolve_method
from draftwise.speculator import ChecksCheckpoint

if TYPE_CHECKING:
    from draftwise.plugins.registry import SpeculatorRegistry

#: top-level keys a drafter_chain config may set; members that do not set them inherit them
CHAIN_INHERITED: tuple[str, ...] = tuple(k for k in CORE_KEYS if k not in ("method", "model"))


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedSpeculativeConfig:
    """A checked speculative config: canonical method, defaults filled, options validated.

    A drafter_chain config has ``method=None`` and its members in ``chain``; iterate
    :attr:`drafters` to treat both shapes alike. ``num_speculative_tokens`` is None only
    when the draft checkpoint decides it: bootstrap's draft stage calls
    :meth:`with_checkpoint` with the config :meth:`Loader.detect` read.
    """

    method: str | None
    model: str | None = None
    num_speculative_tokens: int | None = None
    draft_sample_method: str = "greedy"
    rejection_sample_method: str = "standard"
    max_model_len: int | None = None
    enforce_eager: bool = False
    #: the method's options model instance (None for a drafter_chain)
    options: BaseModel | None = None
    #: what the user should be told (alias used, method derived from model, ...)
    notices: tuple[str, ...] = ()
    chain: tuple[ResolvedSpeculativeConfig, ...] = ()
    #: the distribution that provides the method, e.g. "draftwise-ngram 0.1.0"
    provider: str | None = None
    #: ``num_speculative_tokens_per_batch_size``: (first, last, k) by batch size, sorted
    k_schedule: KSchedule = ()
    #: ``"draftwise": {"adaptive": ...}``: acceptance-driven depth, the default (None:
    #: fixed depth, ``"adaptive": false`` or a drafter's own confidence stop).
    #: Precedence per row: the request's limit and the batch-size schedule cap k, then
    #: adaptive picks a depth in 0..cap (``draftwise.spec.adaptive``)
    adaptive: AdaptiveConfig | None = None
    #: ``"draftwise": {"confidence_threshold": t}`` (DeepSpec's ``--confidence-threshold``):
    #: verify only the drafts before the first one the drafter's confidence head scores
    #: under t; 0 verifies every draft. Only methods declaring ``confidence_head`` take it
    confidence_threshold: float = 0.0
    #: the drafters' own confidence stops that kept depth fixed by default (shown by
    #: :meth:`depth_line`), e.g. ``("min_draft_confidence=0.8",)``
    depth_stops: tuple[str, ...] = ()
    #: vLLM's key, checked against the engine's ``tensor_parallel_size`` at build
    #: (:func:`~draftwise.config.core.check_draft_tensor_parallel`)
    draft_tensor_parallel_size: int | None = None

    def k_for_batch(self, batch_size: int) -> int:
        """Draft tokens per row for a step of ``batch_size`` requests (the schedule, or k)."""
        for first, last, k in self.k_schedule:
            if first <= batch_size <= last:
                return k
        return max((m.num_speculative_tokens or 0) for m in self.drafters)

    @property
    def depth(self) -> str:
        """``"adaptive"`` (the engine picks each row's depth, k the cap) or ``"fixed"``."""
        return "adaptive" if self.adaptive is not None else "fixed"

    def depth_line(self) -> str:
        """The start-up line that says which depth rule is in force, and how to change it."""
        name = self.method or "drafter_chain"
        k = ("per batch size" if self.k_schedule
             else str(max((m.num_speculative_tokens or 0) for m in self.drafters)))
        if self.adaptive is not None:
            return (f"speculation: {name}, adaptive depth 0..{k} per request and step "
                    '("draftwise": {"adaptive": false} pins k)')
        why = (f"cut by the drafter's own stop ({', '.join(self.depth_stops)})"
               if self.depth_stops else '"draftwise": {"adaptive": false}')
        return f"speculation: {name}, fixed depth k={k}, {why}"

    @property
    def drafters(self) -> tuple[ResolvedSpeculativeConfig, ...]:
        """The chain members in preference order, or just this config."""
        return self.chain or (self,)

    def to_json(self, top: bool = True) -> dict[str, Any]:
        """vLLM-shaped JSON; parsing it again gives an equal config (``top``: False for a
        chain member, whose depth the top level sets)."""
        out: dict[str, Any] = {}
        if not self.chain:
            out["method"] = self.method
        if self.model is not None:
            out["model"] = self.model
        if self.num_speculative_tokens is not None and not self.chain:
            out["num_speculative_tokens"] = self.num_speculative_tokens
        out["draft_sample_method"] = self.draft_sample_method
        out["rejection_sample_method"] = self.rejection_sample_method
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        if self.enforce_eager:
            out["enforce_eager"] = True
        if self.draft_tensor_parallel_size is not None and not self.chain:
            out["draft_tensor_parallel_size"] = self.draft_tensor_parallel_size
        if self.k_schedule:
            out["num_speculative_tokens_per_batch_size"] = [list(e) for e in self.k_schedule]
        if self.options is not None:
            out.update(self.options.model_dump(mode="json"))
        ns: dict[str, Any] = {}
        if self.chain:
            ns["drafter_chain"] = [m.to_json(top=False) for m in self.chain]
        if self.adaptive is not None:
            ns["adaptive"] = self.adaptive.model_dump(mode="json")
        elif top:  # fixed depth is no longer what a config without the key means
            ns["adaptive"] = False
        if self.confidence_threshold:
            ns["confidence_threshold"] = self.confidence_threshold
        if ns:
            out[NAMESPACE] = ns
        return out

    def with_checkpoint(self, checkpoint_config: Mapping[str, Any]) -> ResolvedSpeculativeConfig:
        """Complete or check k from the draft's own config (the draft stage, before weights)."""
        if self.chain:
            raise ValueError("call with_checkpoint on each member of config.drafters")
        if isinstance(self.options, ChecksCheckpoint):
            k = self.options.check_checkpoint(self.num_speculative_tokens, checkpoint_config)
            return dataclasses.replace(self, num_speculative_tokens=k)
        return self

    def with_drafters(
        self, drafters: tuple[ResolvedSpeculativeConfig, ...]
    ) -> ResolvedSpeculativeConfig:
        """This config with its drafters as the draft stage completed them (every k known).

        The k schedule is checked again against the final k: a chain or a checkpoint-decided
        k could not be checked at parse time.
        """
        if len(drafters) != len(self.drafters):
            raise ValueError(f"{len(drafters)} drafters for {len(self.drafters)} members")
        missing = [m.method for m in drafters if m.num_speculative_tokens is None]
        if missing:
            raise ValueError(f"drafters {missing} still have no num_speculative_tokens")
        k = max(m.num_speculative_tokens or 0 for m in drafters)
        schedule = k_schedule(self.k_schedule or None, k)
        if self.chain:
            return dataclasses.replace(
                self, chain=drafters, num_speculative_tokens=k, k_schedule=schedule
            )
        return dataclasses.replace(drafters[0], k_schedule=schedule)


def parse_speculative_config(
    obj: str | bytes | Mapping[str, Any] | ResolvedSpeculativeConfig | None,
    registry: SpeculatorRegistry | None = None,
) -> ResolvedSpeculativeConfig | None:
    """Check and resolve a speculative config; None (or JSON ``null``) means no speculation.

    :param obj: the JSON text ``--speculative-config`` takes, the same object as a dict
        (``EngineArgs(speculative_config=...)``), or an already resolved config.
    :param registry: the installed speculators; default: :func:`load_speculators`, the
        process's cached registry, scanned again once when the config names a method or
        key it lacks (a plugin installed after the first engine is then found).
    :raises ConfigError: a subclass naming the key, quoting the value, saying why and
        what works instead.
    """
    if obj is None or isinstance(obj, ResolvedSpeculativeConfig):
        return obj
    data = load_json(obj) if isinstance(obj, (str, bytes)) else obj
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidJSONError(
            f"the speculative config must be a JSON object, got {show(data)}.",
            value=data, reason="not an object",
        )
    if jsontext.depth_of(data) > jsontext.MAX_DEPTH:  # a dict from Python: the text's limit
        raise InvalidJSONError(
            f"the speculative config is refused: nested deeper than {jsontext.MAX_DEPTH} "
            "levels", reason="too deep",
        )
    if registry is not None:
        return _resolve(data, registry, in_chain=False)
    from draftwise.plugins.manager import load_speculators, refresh_if_plugins_changed

    try:
        return _resolve(data, load_speculators(), in_chain=False)
    except (UnknownMethodError, UnknownKeyError):
        # the process's registry may predate a plugin installed since: re-scan once
        if not refresh_if_plugins_changed():
            raise
    return _resolve(data, load_speculators(), in_chain=False)


def _resolve(
    raw: Mapping[Any, Any], registry: SpeculatorRegistry, *, in_chain: bool
) -> ResolvedSpeculativeConfig:
    data = normalize_keys(raw)
    ns = data.pop(NAMESPACE, None)
    chain, adaptive = _parse_namespace(ns, in_chain)
    check_unknown_keys(data, registry)
    if chain is not None:
        resolved = _resolve_chain(data, chain, registry)
    else:
        resolved = _resolve_single(data, registry, in_chain)
    threshold = _confidence_threshold(ns, resolved, registry)
    if threshold:
        resolved = dataclasses.replace(resolved, confidence_threshold=threshold)
    if in_chain:  # depth is chosen once, for the whole config
        return resolved
    explicit = ns is not None and "adaptive" in normalize_keys(ns)
    return _depth_default(resolved, adaptive, explicit, registry)


def _depth_default(resolved: ResolvedSpeculativeConfig, adaptive: AdaptiveConfig | None,
                   explicit: bool, registry: SpeculatorRegistry) -> ResolvedSpeculativeConfig:
    """Adaptive depth unless the config says otherwise: ``num_speculative_tokens`` is then
    the cap, and the engine picks each request's depth per step within it.

    Why by default: a config pasted from vLLM at fixed depth ran at 0.61-0.81x speculation
    off on open-ended prompts of a real 1.5B target (issue 41), and "speculation made it
    slower" is the complaint users file most. ``"draftwise": {"adaptive": false}`` pins
    vLLM's fixed-k behaviour. One exception, said in a notice: a drafter whose own stop
    already prices depth (a confidence cut: draft_model's ``min_draft_confidence``,
    ``confidence_threshold`` on a confidence head) keeps fixed depth unless adaptive is
    asked for, since adaptive on top of such a stop measured worse than the stop alone
    (1.06-1.11x against 1.18-1.22x speculation off on the default model).
    """
    if explicit:
        return dataclasses.replace(resolved, adaptive=adaptive)
    stops = _own_depth_stops(resolved, registry)
    if stops:
        return dataclasses.replace(resolved, depth_stops=tuple(stops), notices=resolved.notices + (
            f"depth: fixed at num_speculative_tokens, cut by the drafter's own stop "
            f"({', '.join(stops)}); \"draftwise\": {{\"adaptive\": true}} adds adaptive depth",))
    return dataclasses.replace(resolved, adaptive=AdaptiveConfig())


def _own_depth_stops(resolved: ResolvedSpeculativeConfig,
                     registry: SpeculatorRegistry) -> list[str]:
    """The settings by which the config's drafters cut their own drafts by confidence."""
    stops = []
    for member in resolved.drafters:
        if member.confidence_threshold:
            stops.append(f"confidence_threshold={member.confidence_threshold:g}")
        if member.method is None or member.options is None:
            continue
        own = registry.get(member.method).speculator.own_depth_stop
        stop = own(member.options) if own is not None else None
        if stop:
            stops.append(stop)
    return stops


def _confidence_threshold(ns: Mapping[str, Any] | None, resolved: ResolvedSpeculativeConfig,
                          registry: SpeculatorRegistry) -> float:
    """``"draftwise": {"confidence_threshold": t}``: a number in [0, 1], for a method that
    declares a confidence head (a chain sets it on the member it is for)."""
    key = f"{NAMESPACE}.confidence_threshold"
    value = None if ns is None else normalize_keys(ns).get("confidence_threshold")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidValueError(
            f"{key}={show(value)} is invalid: it must be a number in [0, 1] (a draft's "
            "confidence score is a probability; 0 verifies every draft).",
            key=key, value=value, reason="not a number in [0, 1]",
        )
    if resolved.chain:
        raise RefusedValueError(
            f"{key}={show(value)} at the top level of a drafter_chain config is refused: it "
            "cuts one drafter's drafts. Instead: set it inside that chain member.",
            key=key, value=value, reason="belongs to a chain member",
            instead="set it inside the chain member",
        )
    method = resolved.method or ""
    caps = registry.get(method).speculator.capabilities if method else None
    if value and (caps is None or not caps.confidence_head):
        raise RefusedValueError(
            f"{key}={show(value)} is refused by method '{method}': it has no confidence "
            "head to score its drafts. Instead: drop it, or use method 'dspark' with a "
            "drafter that has one.",
            key=key, value=value, reason="no confidence head",
            instead="drop it, or use method 'dspark' with a drafter that has one",
        )
    return float(value)


def _parse_namespace(ns: Any, in_chain: bool) -> tuple[list[Any] | None, AdaptiveConfig | None]:
    """The ``"draftwise": {...}`` object: its drafter_chain and adaptive settings, if any."""
    if ns is None:
        return None, None
    if not isinstance(ns, Mapping):
        raise InvalidValueError(
            f"{NAMESPACE}={show(ns)} is invalid: it must be an object of draftwise's own "
            f"keys ({', '.join(NAMESPACE_KEYS)}).",
            key=NAMESPACE, value=ns, reason="not an object",
        )
    ns = normalize_keys(ns, prefix=f"{NAMESPACE}.")
    check_namespace_keys(ns)
    adaptive = parse_adaptive(ns.get("adaptive"))
    if adaptive is not None and in_chain:
        raise RefusedValueError(
            f"{NAMESPACE}.adaptive inside a chain member is refused: depth is chosen per "
            "request for the whole chain. Instead: set it at the top level.",
            key=f"{NAMESPACE}.adaptive", value=ns.get("adaptive"),
            reason="adaptive depth is set once per config", instead="set it at the top level",
        )
    chain = ns.get("drafter_chain")
    key = f"{NAMESPACE}.drafter_chain"
    if chain is None:
        return None, adaptive
    if in_chain:
        raise RefusedValueError(
            f"{key} inside a chain member is refused: chains do not nest. Instead: list "
            "every drafter in the top-level drafter_chain.",
            key=key, value=chain, reason="chains do not nest",
            instead="list every drafter in the top-level drafter_chain",
        )
    if not isinstance(chain, (list, tuple)) or not chain:
        raise InvalidValueError(
            f"{key}={show(chain)} is invalid: it must be a non-empty list of speculative "
            "configs, in preference order.",
            key=key, value=chain, reason="not a non-empty list",
        )
    return list(chain), adaptive


def _resolve_chain(
    data: dict[str, Any], members: list[Any], registry: SpeculatorRegistry
) -> ResolvedSpeculativeConfig:
    """A preference order of drafters: each member a full config, checked on its own."""
    top: dict[str, Any] = {}
    for key, value in data.items():
        if key in CHAIN_INHERITED:
            top[key] = value
        elif value is not None and (key in ("method", "model") or key in registry.option_keys()):
            raise RefusedValueError(
                f"'{key}' at the top level of a drafter_chain config is refused: each chain "
                f"member names its own method, model and options. Instead: move '{key}' "
                "into the chain members.",
                key=key, value=value, reason="belongs to a chain member",
                instead="move it into the chain members",
            )
        else:
            check_unused_field(key, value, registry, method=None)
    core = validate_core(top)
    resolved: list[ResolvedSpeculativeConfig] = []
    for i, member in enumerate(members):
        where = f"{NAMESPACE}.drafter_chain[{i}]"
        own: dict[str, Any] = {}
        if not isinstance(member, Mapping):
            raise InvalidValueError(
                f"{where}={show(member)} is invalid: each member must be an object (a "
                "speculative config of its own).",
                key=where, value=member, reason="not an object",
            )
        try:
            own = normalize_keys(member)
            merged = {**{k: v for k, v in top.items() if k not in own}, **member}
            cfg = _resolve(merged, registry, in_chain=True)
            if cfg.rejection_sample_method != core.rejection_sample_method:
                raise RefusedValueError(
                    f"rejection_sample_method={show(cfg.rejection_sample_method)} is refused: "
                    "verification runs once per batch, so every chain member uses the "
                    f"top-level {show(core.rejection_sample_method)}. Instead: set it at the "
                    "top level only.",
                    key="rejection_sample_method", value=cfg.rejection_sample_method,
                    reason="one verification method per batch",
                    instead="set it at the top level only",
                )
        except ConfigError as exc:
            if exc.key in top and exc.key not in own:
                exc.message += " (inherited from the top level)"
            raise exc.within(where) from exc
        resolved.append(cfg)
    ks = [m.num_speculative_tokens for m in resolved]
    chain_k = None if None in ks else max(k for k in ks if k is not None)
    schedule = k_schedule(core.num_speculative_tokens_per_batch_size, chain_k)
    notices = tuple(
        f"{NAMESPACE}.drafter_chain[{i}]: {n}" for i, m in enumerate(resolved) for n in m.notices
    )
    return ResolvedSpeculativeConfig(
        method=None,
        num_speculative_tokens=chain_k,
        k_schedule=schedule,
        draft_sample_method=core.draft_sample_method,
        rejection_sample_method=core.rejection_sample_method,
        max_model_len=core.max_model_len,
        enforce_eager=bool(core.enforce_eager),
        draft_tensor_parallel_size=core.draft_tensor_parallel_size,
        notices=notices,
        chain=tuple(resolved),
    )


def _resolve_single(
    data: dict[str, Any], registry: SpeculatorRegistry, in_chain: bool = False
) -> ResolvedSpeculativeConfig:
    resolution = resolve_method(data, registry)
    spec, dist = resolution.registration
    notices = list(resolution.notices)
    core_values: dict[str, Any] = {}
    option_values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "method":
            continue
        by_method = refusal_for(spec.refusals, key, value)
        refusal = by_method or refusal_for(CORE_REFUSALS, key, value)
        if refusal is not None:
            by = f" by method '{spec.method}'" if by_method else ""
            raise RefusedValueError(
                f"{key}={show(value)} is refused{by}: {refusal.reason}. "
                f"Instead: {refusal.instead}.",
                key=key, value=value, reason=refusal.reason, instead=refusal.instead,
            )
        if key in CORE_KEYS:
            core_values[key] = value
        elif key in spec.options.model_fields:
            option_values[key] = value
        else:
            check_unused_field(key, value, registry, method=spec.method)
    core = validate_core(core_values)
    check_structure(spec, core, notices)
    options = validate_options(spec, core, option_values)
    k = core.num_speculative_tokens
    if k is None and defaults_k(spec.options):
        k = default_k(options, notices)
    if spec.make_proposer is None:
        notices.append(
            f"method {spec.method} is registered but its proposer is not built yet: the "
            "config is valid, the engine will refuse to run it"
        )
    if core.enforce_eager:
        notices.append("enforce_eager has no effect: draftwise captures no graphs")
    # a chain checks the schedule once, against its largest k
    schedule = core.num_speculative_tokens_per_batch_size
    ks = k_schedule(schedule, None if in_chain else k)
    return ResolvedSpeculativeConfig(
        method=spec.method,
        model=core.model,
        num_speculative_tokens=k,
        k_schedule=ks,
        draft_sample_method=core.draft_sample_method,
        rejection_sample_method=core.rejection_sample_method,
        max_model_len=core.max_model_len,
        enforce_eager=bool(core.enforce_eager),
        draft_tensor_parallel_size=core.draft_tensor_parallel_size,
        options=options,
        notices=tuple(notices),
        provider=str(dist),
    )


__all__ = [
    "CHAIN_INHERITED",
    "ChecksCheckpoint",
    "ResolvedSpeculativeConfig",
    "parse_speculative_config",
]
