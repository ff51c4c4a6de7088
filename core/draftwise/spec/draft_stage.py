"""Bootstrap's draft-checkpoint stage: find each drafter's checkpoint, complete its config,
load it, and build the proposers over KV the core allocated.

Two halves, so bootstrap can refuse as early as possible:

1. :func:`detect_drafts`, before the target's weights are read: each chain member whose
   method reads a checkpoint gets ``Loader.detect`` on the DRAFT's own files (``model``,
   or the target's path for heads that live in the target), and its config is completed
   from that checkpoint (``ChecksCheckpoint``: MTP's k defaults to the head depth, as
   vLLM's n_predict rule); a loader that can (``ChecksTarget``) then checks the draft
   against the target's header (vocabulary, hidden size). A k still unknown afterwards
   is refused by name. ``check-config`` runs the same :func:`detect_member`.
2. :func:`load_drafts` after the target is loaded, then :func:`build_speculation` once
   the KV pool is sized: each loaded draft's KV layout is allocated in the core's pool
   and handed to its proposer with the hidden layers it asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftwise.config import MissingKeyError, RefusedValueError, ResolvedSpeculativeConfig
from draftwise.formats.default_model import check_checkpoint_path
from draftwise.models.batch import KVCache
from draftwise.plugins.errors import PluginRegistrationError, ProposerNotBuiltError
from draftwise.spec.speculation import Drafter, Speculation
from draftwise.speculator import (
    ChecksTarget,
    DraftCheckpoint,
    KVLayout,
    LoadedDraft,
    ProposerContext,
    TapsHidden,
    TargetHeader,
)

if TYPE_CHECKING:
    from draftwise.models.loader import LoadedModel
    from draftwise.plugins.registry import Registration, SpeculatorRegistry

logger = logging.getLogger("draftwise.bootstrap")


@dataclass(frozen=True, slots=True)
class DetectedDraft:
    """A chain member after detection: its completed config and what its loader found."""

    member: ResolvedSpeculativeConfig
    registration: Registration
    #: None: the method reads no checkpoint
    checkpoint: DraftCheckpoint | None


def detect_drafts(
    config: ResolvedSpeculativeConfig,
    registry: SpeculatorRegistry,
    target_path: str,
    target: Callable[[], TargetHeader] | None = None,
) -> tuple[ResolvedSpeculativeConfig, list[DetectedDraft]]:
    """Detect every member's checkpoint and complete the config from it (no weights read).

    ``target`` gives the target's header (read once, when some loader first asks), so
    each draft is also checked against it before the target's weights load.
    """
    detected: list[DetectedDraft] = []
    for member in config.drafters:
        reg = registry.get(member.method or "")
        spec = reg.speculator
        if spec.make_proposer is None:
            raise ProposerNotBuiltError(spec.method, str(reg.dist))
        member, checkpoint = detect_member(member, reg, target_path, target)
        if member.num_speculative_tokens is None:
            raise MissingKeyError(
                f"method '{spec.method}' needs 'num_speculative_tokens': its checkpoint does "
                "not decide it.",
                key="num_speculative_tokens", reason="k is required",
                instead="set num_speculative_tokens",
            )
        detected.append(DetectedDraft(member, reg, checkpoint))
    completed = config.with_drafters(tuple(d.member for d in detected))
    return completed, detected


def detect_member(
    member: ResolvedSpeculativeConfig,
    registration: Registration,
    target_path: str | None,
    target: Callable[[], TargetHeader] | None = None,
) -> tuple[ResolvedSpeculativeConfig, DraftCheckpoint | None]:
    """One member's draft checkpoint, detected from its own files and, when ``target`` is
    given and the loader can tell (:class:`~draftwise.speculator.ChecksTarget`), checked
    against the target's header; the member completed from it. Reads no weights.

    The one place both ``generate``/``serve`` (bootstrap) and ``check-config`` decide
    what a draft is and whether it fits. ``(member, None)``: the method reads no
    checkpoint, or it reads the target's and no target was named (``check-config``
    without ``--model``).
    """
    spec = registration.speculator
    if not spec.capabilities.needs_checkpoint or spec.loader is None:
        return member, None
    path = member.model or target_path
    if path is None:
        return member, None
    check_checkpoint_path(path)  # a FIFO or a device is refused before a plugin opens it
    checkpoint = spec.loader.detect(path)
    member = member.with_checkpoint(checkpoint.config)
    if target is not None and member.options is not None and isinstance(
        spec.loader, ChecksTarget
    ):
        spec.loader.check_target(checkpoint, member.options, target())
    return member, checkpoint


def load_drafts(detected: list[DetectedDraft], target: LoadedModel) -> list[LoadedDraft | None]:
    """``Loader.load`` for every member with a checkpoint, checked against its capabilities."""
    out: list[LoadedDraft | None] = []
    for d in detected:
        spec, dist = d.registration.speculator, d.registration.dist
        if d.checkpoint is None or spec.loader is None:
            out.append(None)
            continue
        if d.member.options is None:
            raise ValueError(f"config for method '{spec.method}' carries no options")
        loaded = spec.loader.load(d.checkpoint, d.member.options, target)
        caps = spec.capabilities
        if not isinstance(loaded, LoadedDraft):
            raise PluginRegistrationError(
                f"{dist}: the loader of method '{spec.method}' returned "
                f"{type(loaded).__name__}, not a LoadedDraft"
            )
        if caps.own_kv_cache and loaded.kv_layout is None:
            raise PluginRegistrationError(
                f"{dist}: method '{spec.method}' declares own_kv_cache but its loader "
                "reported no kv_layout"
            )
        layers = int(target.config.num_hidden_layers)
        if caps.needs_target_hidden and (
            not loaded.hidden_layers or not all(0 <= h < layers for h in loaded.hidden_layers)
        ):
            raise PluginRegistrationError(
                f"{dist}: method '{spec.method}' needs target hidden states but its loader "
                f"named layers {list(loaded.hidden_layers)} (the target has {layers})"
            )
        logger.info(
            "draft for method %s: %s (%s, %s)",
            spec.method, loaded.summary or d.checkpoint.architecture, d.checkpoint.format,
            d.checkpoint.path,
        )
        out.append(loaded)
    return out


def draft_kv_layouts(
    detected: list[DetectedDraft], loaded: list[LoadedDraft | None]
) -> list[KVLayout]:
    """The KV layouts the pool must hold besides the target's, in chain order."""
    return [
        draft.kv_layout
        for d, draft in zip(detected, loaded)
        if draft is not None and draft.kv_layout is not None
        and d.registration.speculator.capabilities.own_kv_cache
    ]


def build_speculation(
    config: ResolvedSpeculativeConfig,
    detected: list[DetectedDraft],
    loaded: list[LoadedDraft | None],
    registry: SpeculatorRegistry,
    target: LoadedModel,
    *,
    max_model_len: int,
    num_blocks: int,
    block_size: int,
) -> Speculation:
    """Allocate each own-KV draft's cache in the pool's block geometry, build the proposers."""
    drafters: list[Drafter] = []
    device = str(target.model.device)
    for d, draft in zip(detected, loaded):
        caps = d.registration.speculator.capabilities
        kv = None
        if caps.own_kv_cache and draft is not None and draft.kv_layout is not None:
            lay = draft.kv_layout
            kv = KVCache.allocate(
                lay.num_layers, num_blocks, block_size, lay.num_kv_heads, lay.head_dim,
                lay.dtype, device,
            )
        ctx = ProposerContext(
            num_speculative_tokens=d.member.num_speculative_tokens or 0,
            vocab_size=target.config.vocab_size,
            max_model_len=max_model_len,
            draft_sample_method=d.member.draft_sample_method,
            draft=None if draft is None else draft.weights,
            target=target,
            kv_cache=kv,
            block_size=block_size,
            confidence_threshold=d.member.confidence_threshold,
        )
        proposer = registry.build_proposer(d.member, ctx)
        hidden = hidden_taps(d, draft, proposer, int(target.config.num_hidden_layers))
        limit = draft_context_limit(d.member, draft, max_model_len)
        method = d.registration.speculator.method
        drafters.append(Drafter(method, proposer, kv is not None, tuple(hidden), limit,
                                sees_every_row=caps.sees_every_row))
    return Speculation(config, drafters, target.config.vocab_size)


def hidden_taps(
    d: DetectedDraft, draft: LoadedDraft | None, proposer: object, num_layers: int
) -> tuple[int, ...]:
    """The target layers a member's rows carry: its loaded draft's, or, for a method
    without a checkpoint, its proposer's own (:class:`~draftwise.speculator.TapsHidden`);
    refused by name when a reader of hidden states names none, or a layer the target lacks."""
    spec = d.registration.speculator
    if not spec.capabilities.needs_target_hidden:
        return ()
    if draft is not None:
        return tuple(draft.hidden_layers)  # checked in load_drafts
    if not isinstance(proposer, TapsHidden):
        raise PluginRegistrationError(
            f"{d.registration.dist}: method '{spec.method}' needs target hidden states and "
            "reads no checkpoint, so its proposer must name its taps (a hidden_layers "
            "property: draftwise.kit.TapsHidden)")
    taps = tuple(int(h) for h in proposer.hidden_layers)
    if not taps or not all(0 <= h < num_layers for h in taps):
        raise PluginRegistrationError(
            f"{d.registration.dist}: method '{spec.method}' named hidden layers {list(taps)} "
            f"(the target has {num_layers}: 0 .. {num_layers - 1})")
    return taps


def draft_context_limit(
    member: ResolvedSpeculativeConfig, draft: LoadedDraft | None, max_model_len: int
) -> int | None:
    """vLLM's draft ``max_model_len``: the user's (at most the draft's and the engine's
    context, else refused), or the draft's own when shorter than the engine's."""
    own = None if draft is None else draft.max_model_len
    asked = member.max_model_len
    if asked is not None:
        bound = min(max_model_len, own) if own is not None else max_model_len
        if asked > bound:
            whose = "the draft's context" if own is not None and own < max_model_len else (
                "the engine's max_model_len"
            )
            raise RefusedValueError(
                f"max_model_len={asked} is refused: it exceeds {whose} ({bound}), as vLLM "
                f"refuses. Instead: use at most {bound}, or drop it.",
                key="max_model_len", value=asked, reason=f"above {whose}",
                instead=f"use at most {bound}",
            )
        return asked if asked < max_model_len else None
    return own if own is not None and own < max_model_len else None


def uses_next_token(detected: list[DetectedDraft]) -> bool:
    """Whether some member's KV entry reads the next token (prefix hits drop a block)."""
    return any(d.registration.speculator.capabilities.kv_uses_next_token for d in detected)


def reads_target_hidden(detected: list[DetectedDraft]) -> bool:
    """Whether some member is conditioned on the target's hidden states: it cannot catch
    up over a prefix hit (those positions are not recomputed), so a hit stops at the
    first block its KV is not written for (``KVCacheManager.hit_needs_drafts_ready``)."""
    return any(d.registration.speculator.capabilities.needs_target_hidden for d in detected)


__all__ = [
    "DetectedDraft",
    "build_speculation",
    "detect_drafts",
    "detect_member",
    "draft_kv_layouts",
    "load_drafts",
    "reads_target_hidden",
    "uses_next_token",
]
