"""The contract between the core and a speculator plugin.

A plugin registers one frozen :class:`Speculator` per method. The core checks the
user's config against it (options model, refusals) before any weights are read. A
method that reads a checkpoint also gives a :class:`Loader`; bootstrap's draft stage
runs it in this order, so the cheapest refusal comes first:

    ckpt = loader.detect(path)                     # the DRAFT's own files, no weights
    k = options.check_checkpoint(k, ckpt.config)   # optional: the checkpoint decides k
    loader.check_target(ckpt, options, header)     # optional: fits the target's header?
    ... the target is loaded ...
    draft = loader.load(ckpt, options, target)     # weights; its KV layout, hidden layers
    ... the KV pool is sized for the target and every draft, allocated once ...
    proposer = make_proposer(options, ProposerContext(..., draft=draft.weights, kv_cache=...))

On the per-step path the engine calls the proposer directly (never through pluggy):

    drafts = proposer.propose(DraftInput(rows))    # up to max_draft tokens per row
    ... one target forward, verification, commit ...
    proposer.on_verified(VerifyOutcome(...))       # what was accepted

Vocabulary follows vLLM: *draft* tokens are proposed, *accepted* ones matched, the
*recovered* token replaces the first rejected draft, the *bonus* token follows a fully
accepted draft; *output* tokens = accepted + (recovered or bonus).

Draft KV (``own_kv_cache``): the core allocates the proposer's KV tensors in its own
block pool. Block ids are the request's target block table (``DraftRow.block_table``),
so prefix caching, rollback on rejection and release on finish/abort/preemption are the
target's. The core tracks how many leading positions of that KV are right
(``DraftRow.num_kv_computed``): the proposer writes from there on, and says in
``Drafts.kv_valid`` how far its writes would be right if every draft were accepted;
the core keeps ``min(kv_valid, tokens committed)`` after verify. Proposing changes no
state the core cannot take back: a failed step can be run again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

    from draftwise.logits_process import TokenHistory
    from draftwise.models.batch import KVCache
    from draftwise.sampling_params import SamplingParams
    from draftwise.target import LoadedTarget

#: the speculative-config keys the core itself honours (vLLM's names). The one list:
#: config/ validates them (``SpeculativeConfig`` must declare exactly these) and a
#: plugin's options may not declare them.
CORE_KEYS: tuple[str, ...] = (
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "quantization",
    "max_model_len",
    "num_speculative_tokens_per_batch_size",
    "rejection_sample_method",
    "draft_sample_method",
)
#: the engine's own extension namespace in the speculative config (``"draftwise": {...}``)
NAMESPACE = "draftwise"


class _AnyValue:
    """Sentinel: a refusal that applies to any explicitly set value of its key."""

    def __repr__(self) -> str:
        return "ANY_VALUE"


ANY_VALUE = _AnyValue()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A key (or one value of a key) a speculator cannot honour, as data.

    ``values`` is ``ANY_VALUE`` when any explicitly set value is refused, else the
    tuple of refused values. Messages quote the user's value, the reason, and
    ``instead`` (what would work).
    """

    key: str
    reason: str
    instead: str
    values: tuple[Any, ...] | _AnyValue = ANY_VALUE

    def matches(self, value: Any) -> bool:
        """Whether an explicitly set ``value`` of ``key`` is refused."""
        if isinstance(self.values, _AnyValue):
            return True
        return value in self.values


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a proposer needs from the core, declared instead of sniffed by name.

    Each field has one effect, named here. When plugins load, the registry refuses, for
    every command, combinations the core cannot serve: ``own_kv_cache`` or
    ``checkpoint_in_target`` without ``needs_checkpoint`` (the KV layout comes from the
    loaded checkpoint), ``needs_checkpoint`` with a proposer but no ``loader``, and
    ``kv_uses_next_token`` without ``own_kv_cache``. ``needs_target_hidden`` needs no
    loader: a method without a checkpoint names its layers on its proposer
    (:class:`TapsHidden`); those are checked when an engine running the method builds it
    (a proposer that names none, or a layer the target lacks, is refused by name there).
    """

    #: reads a draft checkpoint: ``model`` is required (unless ``checkpoint_in_target``),
    #: and bootstrap runs the speculator's :class:`Loader` on it
    needs_checkpoint: bool = False
    #: the draft weights may live inside the target checkpoint (MTP heads): without
    #: ``model`` the loader reads the target's own path
    checkpoint_in_target: bool = False
    #: ``propose`` can return draft probabilities; without it ``draft_sample_method:
    #: "probabilistic"`` is refused
    draft_probs: bool = False
    #: the core allocates the proposer's KV in its block pool (layout from
    #: :attr:`LoadedDraft.kv_layout`) and hands it over as ``ProposerContext.kv_cache``
    own_kv_cache: bool = False
    #: rows carry the target's hidden states of the layers :attr:`LoadedDraft.hidden_layers`
    #: names (a method without a checkpoint names them on its proposer: :class:`TapsHidden`),
    #: for every committed position from ``num_kv_computed`` on. With ``own_kv_cache`` that
    #: is the member's KV frontier; without, it is where the rows it was last handed ended,
    #: so each row carries the positions committed since (the last one is the newest)
    needs_target_hidden: bool = False
    #: the proposer's KV entry at position p also depends on token p+1 (MTP pairs h_p with
    #: x_{p+1}): a prefix-cache hit gives up its last block, as vLLM's EAGLE block drop
    kv_uses_next_token: bool = False
    #: the drafter scores each draft's chance of acceptance (DSpark's confidence head), so
    #: ``"draftwise": {"confidence_threshold": t}`` may cut its drafts; refused otherwise
    confidence_head: bool = False
    #: the proposer keeps state over every row's tokens, not only its drafts' (suffix
    #: decoding's global index of outputs): rows adaptive depth keeps at k = 0 are handed
    #: too, each step, with ``max_draft`` 0 (return no drafts for them); without it such
    #: rows are not shown, and an index fed in ``propose`` misses their outputs
    sees_every_row: bool = False


@dataclass(frozen=True, slots=True)
class DraftCheckpoint:
    """What :meth:`Loader.detect` found, before any weight is read."""

    path: str
    #: ``safetensors``, ``gguf``, ...
    format: str
    #: the draft's architecture as the loader names it (``Qwen2ForCausalLM``, ``mtp:qwen3_next``)
    architecture: str
    #: the draft's own config (``config.json``, or GGUF metadata): what
    #: :meth:`ChecksCheckpoint.check_checkpoint` reads
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TargetHeader:
    """The target as its header (GGUF metadata or ``config.json``) describes it: what a
    draft's compatibility depends on, known before any of the target's weights load."""

    path: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The shape of a proposer's own KV, per block position: the core sizes and allocates it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """K and V of one position over all layers."""
        import torch

        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


@dataclass(frozen=True, slots=True)
class LoadedDraft:
    """What :meth:`Loader.load` returns: the weights and what the core must provide for them."""

    #: handed to ``make_proposer`` as ``ProposerContext.draft``
    weights: Any
    #: required with ``own_kv_cache``: the KV the core allocates for it
    kv_layout: KVLayout | None = None
    #: required (non-empty) with ``needs_target_hidden``: target layers whose output
    #: (pre-final-norm) the proposer conditions on
    hidden_layers: tuple[int, ...] = ()
    #: the longest context the draft handles (its max_position_embeddings); rows past it
    #: (or past the config's ``max_model_len``, which may not exceed it) are not drafted
    max_model_len: int | None = None
    #: one line for the startup log ("Qwen2ForCausalLM from draft.gguf, 24 layers")
    summary: str = ""


class Loader(Protocol):
    """Detects and loads a draft checkpoint, or refuses it by name (typed errors)."""

    def detect(self, path: str) -> DraftCheckpoint:
        """Format and architecture from the draft's own files; reads no weights."""
        ...

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """Read the weights for ``target`` (a ``LoadedModel``: its device, dtype, tokenizer)."""
        ...


@runtime_checkable
class ChecksTarget(Protocol):
    """A :class:`Loader` that can tell from headers alone whether a draft fits a target.

    The draft stage calls it right after :meth:`Loader.detect`, before the target's
    weights load (``generate``, ``serve``) or instead of loading anything
    (``check-config --model``), so a vocabulary or hidden-size mismatch is refused in
    a header read rather than after minutes of loading. ``load`` still checks what
    only the loaded target knows (its tokenizer).
    """

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """Raise a typed, named refusal if the draft cannot serve ``target``; read no weights."""
        ...


class LazyLoader:
    """A :class:`Loader` named ``"module:Class"``, imported when a draft is first detected.

    Registration runs in every command (``check-config``, ``plugins``, ``--help``), and a
    loader module that builds drafters imports torch and model code (~0.8 s of the
    ~1 s ``check-config`` took); only a config that uses the method needs it. The module
    is looked up (not imported) here, so a misspelt name still fails at registration; an
    error inside it is a :class:`~draftwise.plugins.errors.PluginImportError` raised at
    ``detect``, which the draft stage calls before any weight is read.
    """

    __slots__ = ("target", "_loader")

    def __init__(self, target: str) -> None:
        import importlib.util

        module, _, attr = target.partition(":")
        if not module or not attr:
            raise ValueError(f"LazyLoader({target!r}): give 'package.module:Class'")
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"LazyLoader({target!r}): no module named {module!r}")
        self.target = target
        self._loader: Loader | None = None

    def _resolve(self) -> Loader:
        """The loader instance, imported and built once."""
        if self._loader is None:
            import importlib

            module, _, attr = self.target.partition(":")
            try:
                self._loader = getattr(importlib.import_module(module), attr)()
            except Exception as exc:
                from draftwise.plugins.errors import PluginImportError

                raise PluginImportError(
                    f"loader {self.target!r} failed to import: {type(exc).__name__}: {exc}"
                ) from exc
        return self._loader

    def detect(self, path: str) -> DraftCheckpoint:
        """The named loader's :meth:`Loader.detect`."""
        return self._resolve().detect(path)

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The named loader's :meth:`Loader.load`."""
        return self._resolve().load(checkpoint, options, target)

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """The named loader's :meth:`ChecksTarget.check_target`, where it has one."""
        loader = self._resolve()
        if isinstance(loader, ChecksTarget):
            loader.check_target(checkpoint, options, target)

    def __repr__(self) -> str:
        return f"LazyLoader({self.target!r})"


@runtime_checkable
class ChecksCheckpoint(Protocol):
    """An options model that completes or checks k from the draft's config (draft stage)."""

    def check_checkpoint(
        self, num_speculative_tokens: int | None, checkpoint_config: Mapping[str, Any]
    ) -> int:
        """The k to use given the checkpoint's config; raises a ConfigError if it conflicts."""
        ...


@dataclass(frozen=True, slots=True)
class ProposerContext:
    """The narrow view of the engine a proposer gets: never the engine itself.

    Attributes:
        num_speculative_tokens: k, the most drafts per row per step.
        vocab_size: the target's vocabulary: draft ids and ``draft_probs`` columns live
            in it.
        max_model_len: the longest sequence the engine runs.
        draft_sample_method: ``"greedy"`` or ``"probabilistic"`` (vLLM's name).
        draft: :attr:`LoadedDraft.weights` for a method with a ``loader``; else None.
        target: the loaded target, a :class:`~draftwise.target.LoadedTarget` (its
            ``model`` is the :class:`~draftwise.target.TargetModel` surface: ``embed``,
            ``final_norm``, ``lm_head``, ``layers``...). The engine sets it for every
            method it builds, with or without a loader; None only in a context a test
            builds by hand.
        kv_cache: ``own_kv_cache``: this proposer's KV in the core's pool, indexed by
            block tables; else None.
        block_size: tokens per KV block (slot of position p: ``table[p // block_size]``).
        confidence_threshold: ``"draftwise": {"confidence_threshold": t}``: verify only
            the drafts before the first one the drafter's confidence head scores under t
            (0: verify every draft).
    """

    num_speculative_tokens: int
    vocab_size: int
    max_model_len: int
    draft_sample_method: str = "greedy"
    draft: Any = None
    target: LoadedTarget | None = None
    kv_cache: KVCache | None = None
    block_size: int = 16
    confidence_threshold: float = 0.0


def _default_params() -> SamplingParams:
    """Greedy settings (``SamplingParams`` imported when first needed, as before)."""
    from draftwise.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0)


@dataclass(slots=True)
class DraftRow:
    """One running request as the proposer sees it at the start of a step.

    Attributes:
        req_id: the request's id (the key of any per-request state; see ``release``).
        token_ids: every token so far, prompt then output, ``[num_tokens]`` int64 (a
            view: copy what you keep). The last one has no target KV yet: the target
            computes it this step.
        max_draft: the most draft tokens this row may get this step (budget and length
            already applied).
        params: the request's sampling settings (probabilistic drafting processes logits
            with them); greedy defaults when a test builds a row by hand.
        generator: the request's own generator (None: greedy or unseeded); verification
            draws after you.
        history: the committed history its logits are processed with (penalties, bias,
            masks), when ``params`` asks for any; pass ``history.after(drafts_so_far)``
            to ``draftwise.kit.pick_draft_tokens`` so drafts follow the target's
            processing.
        num_kv_computed: ``own_kv_cache``: leading positions whose entries in your KV are
            right. A ``needs_target_hidden`` reader without KV: the first position of
            ``hidden``'s rows (where the rows it was last handed ended; at a request's
            first row, its prefix-cache hit, a whole number of blocks, else 0).
        block_table: ``own_kv_cache``: the request's block ids; covers every position up
            to ``len(token_ids) - 1 + max_draft``.
        hidden: ``needs_target_hidden``: layer -> ``[n, hidden_size]`` in the target's
            dtype, ``n = len(token_ids) - 1 - num_kv_computed``: the target's hidden
            states (pre-``final_norm``) at positions ``num_kv_computed ..
            len(token_ids) - 2``, the newest last, for every layer the method named;
            without own KV ``n >= 1``. None only for methods that read no hidden states.
        num_prompt_tokens: how many leading ``token_ids`` are the prompt (None: not
            known, e.g. a hand-built row).
        isolation_key: the request's isolation key: a proposer may draft a row from
            other requests' tokens only when they carry the same key; None: from its own.
        stop_below: adaptive depth's price of one more draft, as an acceptance
            probability: a drafter that knows how sure it is of each draft (its
            probability of the token it drafts) may stop the row once the product of
            those probabilities falls below this, since a deeper draft is accepted at
            most that often and below it costs more time than it saves (0: no such
            stop, as at fixed depth). Read only the drafts already made (never the
            token about to be drawn), so the stop is lossless under sampling too.
    """

    req_id: str
    token_ids: np.ndarray  # [num_tokens] int64
    max_draft: int
    params: SamplingParams = field(default_factory=lambda: _default_params())
    generator: torch.Generator | None = None
    history: TokenHistory | None = None
    num_kv_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    hidden: dict[int, torch.Tensor] | None = None  # layer -> [n, hidden_size]
    num_prompt_tokens: int | None = None
    isolation_key: str | None = None
    stop_below: float = 0.0


@dataclass(slots=True)
class DraftInput:
    """The batch handed to :meth:`Proposer.propose`: the rows still without a draft."""

    rows: list[DraftRow]


@dataclass(slots=True, eq=False)
class Drafts:
    """Flat draft tokens for a batch: row ``i`` owns ``token_ids[cu[i]:cu[i+1]]``.

    Equality compares the values (arrays element by element), so tests can write
    ``assert drafts == Drafts.from_lists([[5, 6], []])``; a dataclass's generated
    ``__eq__`` would compare the ndarrays with ``==`` and raise.

    Attributes:
        token_ids: ``[total_draft_tokens]`` int64 ids in the target's vocabulary, the
            rows' drafts one after another, in ``DraftInput.rows`` order.
        num_draft_tokens: ``[num_rows]``: how many of ``token_ids`` each row owns, at
            most its ``max_draft``; 0 means no speculation for that row.
        draft_probs: ``[total_draft_tokens, vocab_size]`` float32 draft probabilities q,
            or None (one-hot q at each draft token: lossless either way).
        kv_valid: ``own_kv_cache``: per row, how many leading positions of your KV are
            right if every draft of the row is accepted (None: nothing written,
            ``num_kv_computed`` stands).
        evidence: per row, how strong the drafter's reason for the draft is, as a small
            integer (n-gram: the length of the suffix match it followed; draft_model: its
            confidence in the row's first draft, in bands), or None: no such signal.
            Adaptive depth keeps acceptance per value, so a draft on strong evidence is
            verified deeper than one on weak evidence (rows without a draft: any value).
            It must be fixed before the row's tokens are drawn (from the context, as
            n-gram's match length is): the drafts verified are cut on it, and a cut that
            reads a sampled draft's own value changes the output distribution.
    """

    token_ids: np.ndarray  # [total_draft_tokens] int64, target vocabulary
    num_draft_tokens: list[int]  # [num_rows]
    draft_probs: torch.Tensor | None = None  # [total_draft_tokens, vocab_size] float32
    kv_valid: list[int] | None = None
    evidence: list[int] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Drafts):
            return NotImplemented
        if (list(self.num_draft_tokens), self.kv_valid, self.evidence) != (
            list(other.num_draft_tokens), other.kv_valid, other.evidence
        ) or not np.array_equal(self.token_ids, other.token_ids):
            return False
        if self.draft_probs is None or other.draft_probs is None:
            return self.draft_probs is other.draft_probs
        import torch

        return bool(torch.equal(self.draft_probs, other.draft_probs))

    __hash__ = None  # type: ignore[assignment]  # mutable: compare, never hash

    @property
    def cu_num_draft_tokens(self) -> list[int]:
        """Prefix sums of ``num_draft_tokens``, starting at 0."""
        return prefix_sums(self.num_draft_tokens)

    @classmethod
    def empty(cls, num_rows: int) -> Drafts:
        """No drafts for any row."""
        return cls(np.zeros(0, dtype=np.int64), [0] * num_rows)

    @classmethod
    def from_lists(cls, rows: list[list[int]]) -> Drafts:
        """Build from per-row token lists (convenient for simple proposers and tests)."""
        flat = [t for r in rows for t in r]
        return cls(np.asarray(flat, dtype=np.int64), [len(r) for r in rows])

    def row(self, i: int) -> np.ndarray:
        """The draft tokens of row ``i``."""
        cu = self.cu_num_draft_tokens
        return self.token_ids[cu[i] : cu[i + 1]]


def prefix_sums(counts: list[int]) -> list[int]:
    """``[0, c0, c0+c1, ...]``: where each row's run starts in a flat per-row array."""
    out = [0]
    for n in counts:
        out.append(out[-1] + n)
    return out


@dataclass(slots=True)
class VerifyOutcome:
    """What verification decided for each row this proposer drafted for."""

    req_ids: list[str]
    num_draft_tokens: list[int]
    num_accepted: list[int]
    #: tokens committed this step per row: accepted drafts + recovered or bonus token
    output_token_ids: list[list[int]]


@runtime_checkable
class Proposer(Protocol):
    """One protocol for every method; the engine calls it once per step."""

    def propose(self, batch: DraftInput) -> Drafts:
        """Up to ``row.max_draft`` tokens per row; fewer or none is always allowed."""
        ...

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Feedback after commit (a request that finished this step is already released)."""
        ...

    def release(self, req_id: str) -> None:
        """The request finished, was aborted or preempted: drop any per-request state."""
        ...


@runtime_checkable
class TapsHidden(Protocol):
    """A proposer that names its own hidden-state taps: how a method with
    ``needs_target_hidden`` but no draft checkpoint (heads computed from the target
    alone, e.g. from ``ctx.target``'s last layer) says which target layers its rows carry.
    Layer numbers are 0-based outputs of decoder layers (``help(TargetModel)``). Read
    once, right after ``make_proposer``, when an engine running the method builds; none,
    or one outside ``0 .. num_hidden_layers - 1``, is a ``PluginRegistrationError``
    naming the distribution."""

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Target layers whose hidden states this proposer's rows carry (non-empty)."""
        ...


@runtime_checkable
class ReportsStats(Protocol):
    """A proposer that reports about itself: ``draftwise generate --json``'s
    ``proposers``, bench reports, and in the library ``llm.engine.spec.proposer_stats()``
    (one dict per chain member: ``{"method": ..., **stats()}``)."""

    def stats(self) -> dict[str, Any]:
        """JSON-able counters, e.g. draft forwards run."""
        ...


ProposerFactory = Callable[[BaseModel, ProposerContext], Proposer]


@dataclass(frozen=True, slots=True)
class Speculator:
    """One method's declaration, registered by a plugin through ``register_speculators``.

    Attributes:
        method: the name configs use (``"method": "..."``): lower case, ``[a-z][a-z0-9_]*``.
        options: pydantic model of the method-specific keys it honours; must use
            ``extra="forbid"``, and may not declare a core key (``CORE_KEYS``).
        make_proposer: ``(options, ctx: ProposerContext) -> Proposer``; ``None`` means the
            method is declared but not built yet (its config is checked; the engine and
            ``draftwise plugins`` say it cannot run).
        aliases: other names that resolve to ``method`` (with a notice).
        refusals: keys or values the method cannot honour, as :class:`Refusal` data,
            checked before any value is validated; also left out of check-config's
            "Keys accepted" when refused for any value.
        loader: detects and loads the draft checkpoint (required with
            ``needs_checkpoint`` once ``make_proposer`` is set; ``own_kv_cache`` needs a
            checkpoint for its KV layout).
        capabilities: what the proposer needs from the core (:class:`Capabilities`).
        description: one line, shown by ``draftwise plugins``.
        own_depth_stop: given the method's options, the setting by which the drafter
            cuts its own drafts by confidence (e.g. ``"min_draft_confidence=0.8"``), or
            None. Such a stop already prices depth, so a config that sets it keeps fixed
            depth unless it asks for adaptive depth.
    """

    method: str
    options: type[BaseModel]
    make_proposer: ProposerFactory | None = None
    aliases: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    loader: Loader | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    description: str = ""
    own_depth_stop: Callable[[BaseModel], str | None] | None = None
