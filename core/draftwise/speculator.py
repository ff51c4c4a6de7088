"""The contract between the core and a speculator plugin.

A plugin registers one frozen :class:`Speculator` per method. The core checks the
user's config against it (options model, refusal list) before any weights are read,
then builds a :class:`Proposer` through ``make_proposer``. On the per-step path the
engine calls the proposer directly (never through pluggy):

    drafts = proposer.propose(DraftInput(...))   # up to k tokens per row
    ... one target forward, verification ...
    proposer.on_verified(VerifyOutcome(...))     # what was accepted

Vocabulary follows vLLM: *draft* tokens are proposed, *accepted* ones matched, the
*recovered* token replaces the first rejected draft, the *bonus* token follows a fully
accepted draft; *output* tokens = accepted + (recovered or bonus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

if TYPE_CHECKING:
    import torch


class _AnyValue:
    """Sentinel: a refusal that applies to any explicitly set value of its key."""

    _instance: _AnyValue | None = None

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
    """What a proposer needs from the core, declared instead of sniffed by name."""

    #: the proposer needs a draft checkpoint (``model`` key or the target's own heads)
    needs_checkpoint: bool = False
    #: target layers whose hidden states the proposer conditions on (empty: none)
    target_hidden_layers: tuple[int, ...] = ()
    #: the proposer keeps its own KV cache allocated through the core
    own_kv_cache: bool = False
    #: drafts a block of tokens in one forward (DFlash, DSpark)
    parallel_drafting: bool = False
    #: can return draft probabilities (needed for ``draft_sample_method="probabilistic"``)
    draft_probs: bool = False
    #: the draft weights may live inside the target checkpoint (MTP heads), so the
    #: ``model`` key may be omitted; otherwise ``needs_checkpoint`` makes ``model`` required
    checkpoint_in_target: bool = False
    #: conditions on target hidden states; the layers are ``target_hidden_layers`` when the
    #: method fixes them, else the loader reads them from the checkpoint (DFlash
    #: ``target_layer_ids``; MTP: the target's last layer)
    needs_target_hidden: bool = False


@dataclass(frozen=True, slots=True)
class ProposerContext:
    """The narrow view of the engine a proposer gets: never the engine itself."""

    num_speculative_tokens: int  # k
    vocab_size: int
    max_model_len: int
    device: str = "cpu"
    dtype: str = "bfloat16"
    #: "greedy" or "probabilistic" (vLLM's draft_sample_method)
    draft_sample_method: str = "greedy"
    #: model-based methods: the loaded draft weights (whatever their loader returned)
    draft: Any = None
    #: model-based methods: a view of the target (embedding, LM head, hidden size)
    target: Any = None


@dataclass(slots=True)
class DraftRow:
    """One running request as the proposer sees it at the start of a step."""

    req_id: str
    #: every accepted token so far, prompt + output, ``[num_tokens]`` int64 (a view: do not keep)
    token_ids: np.ndarray
    #: the most draft tokens this row may get this step (budget and length already applied)
    max_draft: int
    #: the request's sampling temperature (0 = greedy), for probabilistic drafting
    temperature: float = 0.0


@dataclass(slots=True)
class DraftInput:
    """The batch handed to :meth:`Proposer.propose`."""

    rows: list[DraftRow]
    #: target hidden states by layer for the tokens committed last step (model-based methods)
    hidden_states: dict[int, torch.Tensor] | None = None


@dataclass(slots=True)
class Drafts:
    """Flat draft tokens for a batch: row ``i`` owns ``token_ids[cu[i]:cu[i+1]]``."""

    token_ids: np.ndarray  # [total_draft_tokens] int64
    num_draft_tokens: list[int]  # [num_rows]; 0 means no speculation for that row
    #: ``[total_draft_tokens, vocab]`` float32 draft probabilities q, or None (one-hot q)
    draft_probs: torch.Tensor | None = None

    @property
    def cu_num_draft_tokens(self) -> list[int]:
        """Prefix sums of ``num_draft_tokens``, starting at 0."""
        out = [0]
        for n in self.num_draft_tokens:
            out.append(out[-1] + n)
        return out

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


@dataclass(slots=True)
class VerifyOutcome:
    """What verification decided for each row that the proposer drafted for."""

    req_ids: list[str]
    num_draft_tokens: list[int]
    num_accepted: list[int]
    #: tokens committed this step per row: accepted drafts + recovered or bonus token
    output_token_ids: list[list[int]]
    #: target hidden states at the committed positions, by layer (model-based methods)
    hidden_states: dict[int, torch.Tensor] | None = field(default=None)


@runtime_checkable
class Proposer(Protocol):
    """One protocol for every method; the engine calls it once per step."""

    def propose(self, batch: DraftInput) -> Drafts:
        """Up to ``row.max_draft`` tokens per row; fewer or none is always allowed."""
        ...

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Feedback after verification, so the next proposal starts in the right place."""
        ...

    def release(self, req_id: str) -> None:
        """The request finished, was aborted or preempted: drop any per-request state."""
        ...


@runtime_checkable
class HiddenStateConsumer(Protocol):
    """A proposer that conditions on target hidden states (MTP): the engine hands it, for
    every scheduled row, the hidden states of the positions committed that step."""

    #: target layers it needs (output of that decoder layer, pre-final-norm)
    hidden_layers: tuple[int, ...]

    def add_hidden(self, req_id: str, start: int, hidden: torch.Tensor) -> None:
        """Hidden states ``[n, hidden]`` of committed positions ``start .. start+n-1``."""
        ...


class Loader(Protocol):
    """Detects and loads a draft checkpoint, or refuses it by name."""

    def detect(self, path: str) -> str:
        """The format name (``safetensors``, ``gguf``, ``nvfp4``, ``exl3``); raises if unusable."""
        ...

    def load(self, path: str, options: BaseModel, device: str, dtype: str) -> Any:
        """Read the weights; called only after the config passed every check."""
        ...


ProposerFactory = Callable[[BaseModel, ProposerContext], Proposer]


@dataclass(frozen=True, slots=True)
class Speculator:
    """One method's declaration, registered by a plugin through ``register_speculators``."""

    method: str
    #: pydantic model of the method-specific keys it honours; must use ``extra="forbid"``
    options: type[BaseModel]
    #: builds the proposer; ``None`` means the method is declared but not built yet
    make_proposer: ProposerFactory | None = None
    aliases: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    loader: Loader | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    description: str = ""
