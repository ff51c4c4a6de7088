"""The core's share of a speculative config: its own keys, refusals and per-key checks.

:class:`SpeculativeConfig` holds the vLLM fields the core honours (names, types and
defaults as vLLM declares them). The functions here classify and validate one config's
keys; ``speculative.py`` strings them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftwise.config.errors import (
    ConfigError,
    InternalFieldError,
    InvalidValueError,
    MissingKeyError,
    NotForMethodError,
    RefusedValueError,
    UnimplementedFieldError,
    UnknownKeyError,
    show,
)
from draftwise.config.vllm_fields import FIELDS_BY_NAME, FIRST_PARTY, FieldKind
from draftwise.speculator import ANY_VALUE, Refusal, Speculator

if TYPE_CHECKING:
    from draftwise.plugins.registry import SpeculatorRegistry

#: vLLM's rejection sampler caps a draft at MAX_SPEC_LEN tokens; so does draftwise
MAX_NUM_SPECULATIVE_TOKENS = 128


class SpeculativeConfig(BaseModel):
    """The keys the core itself honours, with vLLM's names, types and defaults.

    Method-specific keys live in the method's options model; the other vLLM fields
    are handled by the table in ``vllm_fields.py``.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    method: str | None = None
    model: str | None = Field(None, min_length=1)
    num_speculative_tokens: int | None = Field(None, gt=0, le=MAX_NUM_SPECULATIVE_TOKENS)
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    rejection_sample_method: Literal["standard", "synthetic", "block"] = "standard"
    max_model_len: int | None = Field(None, ge=1)
    enforce_eager: bool | None = None
    quantization: str | None = None
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    #: vLLM's dynamic schedule: ``[[first, last, k], ...]``, batch sizes inclusive;
    #: checked by :func:`k_schedule` (JSON gives lists, Python callers may pass tuples)
    num_speculative_tokens_per_batch_size: Any = None


#: the core's own refusals, as data (checked like a method's)
CORE_REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "rejection_sample_method",
        "'synthetic' accepts drafts at preset rates without looking at the target: a "
        "benchmarking mode that is not lossless",
        "use 'standard' (or 'block'); both keep the target's distribution exactly",
        values=("synthetic",),
    ),
    Refusal(
        "quantization",
        "draftwise detects the draft's quantization from its own checkpoint "
        "(quantization_config in config.json, GGUF, EXL3), so it is not a setting",
        "drop 'quantization'",
    ),
)


def refusal_for(refusals: tuple[Refusal, ...], key: str, value: Any) -> Refusal | None:
    """The first refusal of ``key`` matching ``value``; an explicit null counts as unset."""
    for refusal in refusals:
        if refusal.key != key or (value is None and refusal.values is ANY_VALUE):
            continue
        if refusal.matches(value):
            return refusal
    return None


def check_unused_field(
    key: str, value: Any, registry: SpeculatorRegistry, *, method: str | None
) -> None:
    """A key neither the core nor the method honours: a no-op default, or refused."""
    field = FIELDS_BY_NAME.get(key)
    if field is not None and field.is_default(value):
        return
    shown = f"{key}={show(value)}"
    if field is not None and field.kind is FieldKind.TRAP:
        raise RefusedValueError(
            f"{shown} is refused: {field.reason}. Instead: {field.instead}.",
            key=key, value=value, reason=field.reason, instead=field.instead,
        )
    if field is not None and field.kind is FieldKind.INTERNAL:
        raise InternalFieldError(
            f"{shown} is refused: '{key}' is a real vLLM field, but an engine-injected "
            f"internal: {field.reason}. Instead: {field.instead}.",
            key=key, value=value, reason=field.reason, instead=field.instead,
        )
    owners = registry.methods_with_option(key)
    if owners:
        names = ", ".join(f"'{m}'" for m in owners)
        target = f"not of '{method}'" if method else "so it belongs in a chain member"
        instead = f"drop it, or use \"method\": \"{owners[0]}\""
        raise NotForMethodError(
            f"{shown} is refused: '{key}' is an option of method {names}, {target}. "
            f"Instead: {instead}.",
            key=key, value=value, reason=f"an option of {names}", instead=instead,
        )
    if field is None:  # an option of no installed method: check_unknown_keys catches it first
        raise UnknownKeyError(f"unknown key '{key}'.", key=key, value=value)
    reason, instead = field.reason, field.instead
    if field.kind is FieldKind.OPTION:
        owner = field.methods[0]
        reason = f"it is an option of method '{owner}', which is not installed"
        instead = f"pip install {FIRST_PARTY[owner]}" if owner in FIRST_PARTY else "drop it"
    raise UnimplementedFieldError(
        f"{shown} is refused: '{key}' is a real vLLM field this engine does not implement: "
        f"{reason}. Instead: {instead}.",
        key=key, value=value, reason=reason, instead=instead,
    )


def translate(exc: ValidationError, data: Mapping[str, Any], what: str) -> ConfigError:
    """The first pydantic error (in the user's key order) as a field-named ConfigError."""
    order = {k: i for i, k in enumerate(data)}
    errors = exc.errors(include_url=False)
    err = min(errors, key=lambda e: order.get(str(e["loc"][0]) if e["loc"] else "", len(order)))
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    msg = str(err["msg"]).removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    if not err["loc"]:
        return InvalidValueError(f"{what} are invalid: {msg}.", reason=msg)
    key = str(err["loc"][0])
    sub = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:])
    value = data.get(key, err.get("input"))
    at = f" (at {key}{sub})" if sub else ""
    return InvalidValueError(
        f"{key}={show(value)} is invalid{at}: {msg}.", key=key, value=value, reason=msg
    )


def validate_core(values: dict[str, Any]) -> SpeculativeConfig:
    try:
        core = SpeculativeConfig.model_validate(values)
    except ValidationError as exc:
        raise translate(exc, values, "the core keys") from None
    return core


def check_draft_tensor_parallel(
    draft_size: int | None, target_size: int, model_methods: tuple[str, ...]
) -> None:
    """``draft_tensor_parallel_size`` as vLLM defines it: 1 or the target's
    ``tensor_parallel_size``, checked once the engine's size is known (bootstrap, before
    weights). ``model_methods``: the configured methods whose loader receives the target.

    draftwise runs every drafter on rank 0, unsharded, so a draft split like the target is
    refused for a drafter with weights (a model-free one has nothing to split, and any
    drafter that reads the target is refused at ``target_size > 1``: the target's parts it
    would run are split across ranks and run only with every rank joining).
    """
    key = "draft_tensor_parallel_size"
    if draft_size is not None and draft_size not in (1, target_size):
        where = ("draftwise runs the draft on one device" if target_size == 1 else
                 f"vLLM allows 1 or the target's tensor_parallel_size ({target_size})")
        raise RefusedValueError(
            f"{key}={draft_size} is refused: {where}. Instead: drop it, or set 1.",
            key=key, value=draft_size, reason=where, instead="drop it, or set 1")
    if target_size > 1 and model_methods:
        names = ", ".join(model_methods)
        reason = (f"method {names} reads the target's embedding, LM head or layers, which at "
                  f"tensor_parallel_size={target_size} are split across ranks and run only "
                  "with every rank joining; drafters run on rank 0 alone")
        raise RefusedValueError(
            f"method={show(model_methods[0])} is refused at tensor_parallel_size="
            f"{target_size}: {reason}. Instead: a model-free method (ngram, suffix), or "
            "tensor_parallel_size=1.",
            key="method", value=model_methods[0], reason=reason,
            instead="a model-free method (ngram, suffix), or tensor_parallel_size=1")


KSchedule = tuple[tuple[int, int, int], ...]


def k_schedule(value: Any, k: int | None) -> KSchedule:
    """``num_speculative_tokens_per_batch_size`` checked: disjoint ranges, ``0 <= K <= k``.

    Batch sizes no range covers draft the full ``k``; K = 0 turns speculation off for
    that batch size. Returns the entries sorted by their first batch size.
    """
    key = "num_speculative_tokens_per_batch_size"
    if value is None:
        return ()

    def bad(reason: str) -> InvalidValueError:
        return InvalidValueError(
            f"{key}={show(value)} is invalid: {reason}. Expected a list of "
            "[first_batch_size, last_batch_size, k] entries, e.g. [[1, 4, 4], [5, 256, 0]].",
            key=key, value=value, reason=reason,
        )

    if not isinstance(value, list | tuple) or not value:
        raise bad("not a non-empty list")
    entries: list[tuple[int, int, int]] = []
    for entry in value:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry)
        ):
            raise bad(f"entry {show(entry)} is not three integers")
        first, last, kk = entry
        if first < 1 or last < first:
            raise bad(f"entry {show(entry)} needs 1 <= first <= last")
        if kk < 0:
            raise bad(f"entry {show(entry)} has a negative k")
        if k is not None and kk > k:
            raise RefusedValueError(
                f"{key}={show(value)} is refused: entry {show(entry)} asks for {kk} draft "
                f"tokens, more than num_speculative_tokens={k} (the most any step verifies). "
                f"Instead: use k <= {k} in every entry, or raise num_speculative_tokens.",
                key=key, value=value, reason="k above num_speculative_tokens",
                instead=f"use k <= {k}",
            )
        entries.append((first, last, kk))
    entries.sort()
    for (_, last, _), nxt in pairwise(entries):
        if nxt[0] <= last:
            raise bad(f"ranges overlap at batch size {nxt[0]}")
    return tuple(entries)


def check_structure(spec: Speculator, core: SpeculativeConfig, notices: list[str]) -> None:
    """What the method needs: a model or none, k or a checkpoint that decides it, probs."""
    caps, method = spec.capabilities, spec.method
    if not caps.needs_checkpoint and core.model not in (None, method, f"[{method}]"):
        raise RefusedValueError(
            f"model={show(core.model)} is refused: method '{method}' reads no checkpoint. "
            "Instead: drop 'model'.",
            key="model", value=core.model, reason="the method reads no checkpoint",
            instead="drop 'model'",
        )
    if caps.needs_checkpoint and not caps.checkpoint_in_target and core.model is None:
        raise MissingKeyError(
            f"method '{method}' needs 'model': the local path of its draft checkpoint.",
            key="model", reason="the method reads a draft checkpoint",
        )
    if core.num_speculative_tokens is None:
        reads_checkpoint = core.model is not None or caps.checkpoint_in_target
        if caps.needs_checkpoint and reads_checkpoint and completes_k(spec.options):
            where = "the draft checkpoint" if core.model is not None else "the target checkpoint"
            notices.append(f"num_speculative_tokens not given: {where}'s config decides it")
        elif not defaults_k(spec.options):
            raise MissingKeyError(
                f"method '{method}' needs 'num_speculative_tokens' (how many tokens to draft "
                "per step, e.g. 4).",
                key="num_speculative_tokens", reason="k is required",
                instead="set num_speculative_tokens",
            )
    if core.draft_sample_method == "probabilistic" and not caps.draft_probs:
        raise RefusedValueError(
            f"draft_sample_method=\"probabilistic\" is refused: method '{method}' produces no "
            "draft distribution, so verification treats its drafts as one-hot, which is "
            "already lossless. Instead: use \"greedy\" (the default).",
            key="draft_sample_method", value="probabilistic",
            reason="no draft distribution", instead="use \"greedy\"",
        )


def completes_k(options: type[BaseModel]) -> bool:
    """Whether an options model completes k from the checkpoint (``ChecksCheckpoint``)."""
    return callable(getattr(options, "check_checkpoint", None))


def defaults_k(options: type[BaseModel]) -> bool:
    """Whether an options model gives k from its own values when the config leaves it out
    (``default_num_speculative_tokens()``: vLLM's suffix takes its tree depth)."""
    return callable(getattr(options, "default_num_speculative_tokens", None))


def default_k(options: BaseModel, notices: list[str]) -> int:
    """The k an options model defaults to, capped at what verification takes."""
    k = int(options.default_num_speculative_tokens())  # type: ignore[attr-defined]
    if k > MAX_NUM_SPECULATIVE_TOKENS:
        notices.append(f"num_speculative_tokens not given: the method's default {k} is capped "
                       f"at {MAX_NUM_SPECULATIVE_TOKENS}, the most verification takes")
        return MAX_NUM_SPECULATIVE_TOKENS
    notices.append(f"num_speculative_tokens not given: the method's options give {k}")
    return k


def validate_options(
    spec: Speculator, core: SpeculativeConfig, values: dict[str, Any]
) -> BaseModel:
    """The method's options; validators see the core keys as ``info.context["core"]``."""
    try:
        return spec.options.model_validate(values, context={"core": core})
    except ValidationError as exc:
        raise translate(exc, values, f"the options of method '{spec.method}'") from None


__all__ = [
    "CORE_REFUSALS",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "SpeculativeConfig",
    "check_structure",
    "check_unused_field",
    "default_k",
    "defaults_k",
    "refusal_for",
    "translate",
    "validate_core",
    "validate_options",
]
