"""One request's state as it moves through the engine, and the vLLM-shaped outputs."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

    from draftwise.logprobs import PositionLogprobs
    from draftwise.metrics import RequestSpecDecodeMetrics
    from draftwise.sampling_params import SamplingParams
    from draftwise.structured.matcher import GrammarMatcher


class AskedSpeculation(Protocol):
    """What the engine reads of one request's speculative settings
    (``draftwise.spec.params.SpeculativeParams`` is the one implementation).

    Why a protocol here and not that class: ``spec/`` sits above this record (it imports
    the request, the scheduler and the runner), so naming its class, even under
    ``TYPE_CHECKING``, made the dependency run both ways."""

    @property
    def method(self) -> str | None:
        """Draft only with this member of the chain (None: any)."""

    @property
    def adaptive(self) -> bool | None:
        """False: fixed depth even under adaptive depth."""

    @property
    def drafts(self) -> bool:
        """Whether the request may draft at all."""

    def cap(self, k: int) -> int:
        """The most drafts per step under a step cap of ``k``."""

    def model_dump(self, *, exclude_defaults: bool = False) -> dict[str, Any]:
        """The settings as asked (the request's final metrics report them)."""


class RequestStatus(enum.Enum):
    """Where a request is; finished states carry the finish reason."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    #: failed inside a step on its own account (the others in that step went on)
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        """True for the four terminal states."""
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_ERROR,
        )


@dataclass(slots=True)
class Request:
    """A sequence being generated. Token ids live in one preallocated buffer."""

    req_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_model_len: int
    generator: torch.Generator | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    #: tokens whose K/V is in the cache (verified tokens only, after each step)
    num_computed_tokens: int = 0
    #: of the prefix hit on admission, the leading tokens whose own-KV drafters' KV is
    #: written too (``KVCacheManager.num_drafts_ready_tokens``): where a draft model's
    #: frontier starts, catching up from tokens over the rest
    num_drafts_ready_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    #: why the request failed (status FINISHED_ERROR): "<ExceptionType>: message"
    error: str | None = None
    #: the request field at fault when its own input failed it (a grammar past the
    #: library's limits mid-output, say); None when the engine failed it
    error_field: str | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    #: text produced so far (stop strings already cut off)
    text: str = ""
    detok_state: Any = None
    #: per generated token, when ``params.logprobs`` is set (None otherwise)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    #: per prompt token when ``params.prompt_logprobs`` is set (token 0's is None;
    #: ``draftwise.prompt_logprobs``), filled as prefill chunks run
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    #: ``n > 1``: the request this one is sample ``index`` of (None: a request of its own)
    parent: ParentRequest | None = None
    index: int = 0
    #: ``params.bad_words`` tokenized (``logits_process.bad_words_token_ids``)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    #: speculation record; None when the engine runs without a speculative config
    spec: RequestSpecDecodeMetrics | None = None
    #: structured output: the grammar state after the committed tokens; None: no grammar
    grammar: GrammarMatcher | None = None
    # -- per-request speculation control (draftwise.spec.params) ------------------------
    #: what the request asked of speculation (None: the server's settings as they are);
    #: adaptive depth's running estimate of the request is the policy's
    #: (``DepthPolicy.estimates``), not a field here: a request is plain data
    speculative: AskedSpeculation | None = None
    #: per output token: "accepted:<method>", "recovered", "bonus" or "plain" (None:
    #: not asked for)
    provenance: list[str] | None = None
    #: who may share drafts with whom: requests with the same key may be drafted from
    #: each other's outputs (suffix decoding's global index); None: from nothing but the
    #: request's own tokens. Opaque to the engine; the server sets it (``--draft-index-scope``)
    isolation_key: str | None = None
    # -------------------------------------------------------------------------------
    token_buf: np.ndarray = field(init=False)
    num_tokens: int = field(init=False)
    num_prompt_tokens: int = field(init=False)
    #: tokens appended by the last step (for streaming)
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.token_buf = np.zeros(self.max_model_len, dtype=np.int64)
        self.token_buf[: self.num_prompt_tokens] = self.prompt_token_ids
        self.num_tokens = self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """Generated token ids."""
        return self.token_buf[self.num_prompt_tokens : self.num_tokens].tolist()

    @property
    def all_token_ids(self) -> np.ndarray:
        """Prompt + output as a view (int64)."""
        return self.token_buf[: self.num_tokens]

    @property
    def is_decoding(self) -> bool:
        """Every token but the last has K/V: the next step feeds one token (+ drafts)."""
        return self.num_computed_tokens == self.num_tokens - 1

    def append(self, token_id: int) -> None:
        """Commit one generated token."""
        self.token_buf[self.num_tokens] = token_id
        self.num_tokens += 1


@dataclass(slots=True)
class CompletionOutput:
    """One completion of a request (vLLM's shape); ``index`` is its place among ``n``."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    #: per generated token: token id -> Logprob (the chosen token, then the top-n)
    logprobs: list[PositionLogprobs] | None = None

    def finished(self) -> bool:
        """Whether a finish reason is set."""
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """What the engine returns for a request after a step (cumulative), vLLM-shaped."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    #: tokens and text added by the step that produced this output (for streaming)
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    num_cached_tokens: int = 0
    #: set when this request failed inside a step (finish_reason "error"); the others in
    #: that step were unaffected
    error: str | None = None
    #: the request field at fault when the request's own input failed it (the server's
    #: 4xx), None when the engine did (its 500)
    error_field: str | None = None
    #: ``prompt_logprobs``: per prompt token (the first is None), once prefill is done
    prompt_logprobs: list[PositionLogprobs | None] | None = None


@dataclass(slots=True, eq=False)
class ParentRequest:
    """The request the user sent, over its children (in index order)."""

    req_id: str
    children: list[Request] = field(default_factory=list)
    #: children not yet scheduled: they wait for child 0's prompt K/V to be cached
    pending: list[Request] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """Every child finished (a pending child has not)."""
        return not self.pending and all(c.status.finished for c in self.children)

    @property
    def error(self) -> str | None:
        """The first child failure, which is the request's."""
        return next((c.error for c in self.children if c.error is not None), None)

    @property
    def error_field(self) -> str | None:
        """The field at fault of the first failed sample (see ``Request.error_field``)."""
        return next((c.error_field for c in self.children if c.error is not None), None)

