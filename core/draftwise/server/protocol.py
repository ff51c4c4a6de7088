"""Request and response bodies in OpenAI's exact shapes (plus a few vLLM-style extras).

Requests are strict (``extra="forbid"``, no string-to-number coercion) so a typo or a
wrong type is a 400 that names the field instead of a silently ignored setting. Fields
OpenAI defines but this engine cannot honour are accepted only at their neutral value
(see :func:`unsupported_fields`), so a client gets told rather than ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwise.spec.params import SpeculativeParams


class _Strict(BaseModel):
    """Base of request bodies: unknown keys and coerced types are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """``stream_options``: only ``include_usage`` exists."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _SamplingFields(_Strict):
    """Fields both endpoints share; the vLLM extras follow the OpenAI ones."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool | None = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    # vLLM extras: logits processing (draftwise.logits_process), speculation-exact
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    #: draftwise extra: return per-request spec-decode metrics (default: the server flag);
    #: "provenance" also returns each output token's provenance (streamed per chunk)
    return_spec_metrics: bool | Literal["provenance"] | None = None
    # -- draftwise extra: per-request speculation (draftwise.spec.params) -----------------
    #: e.g. {"enabled": false}, {"num_speculative_tokens": 2}, {"method": "ngram"}: narrows
    #: the server's speculative config for this request only; unknown keys are a 400
    speculative: SpeculativeParams | None = None
    # -------------------------------------------------------------------------------------
    # structured output (``server/structured.py``): OpenAI's, then vLLM's names
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    #: vLLM extra: top-n log-probabilities of every prompt token (completions:
    #: ``choices[i].prompt_logprobs``, on each choice's first chunk when streamed; chat:
    #: the response's top-level ``prompt_logprobs``, as vLLM)
    prompt_logprobs: int | None = None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    """A text part of a message's content list."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One conversation turn; extra keys pass to the template.

    OpenAI's tool turns are typed: an assistant's ``tool_calls`` (each with
    ``function.arguments`` as a JSON string) and a ``tool`` message's ``tool_call_id``.
    """

    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool | None = True


def unsupported_fields(req: _SamplingFields) -> list[tuple[str, str]]:
    """Fields set to a value the engine cannot honour: (field, reason)."""
    out: list[tuple[str, str]] = []
    if isinstance(req, CompletionRequest):
        if req.echo:
            out.append(("echo", "echo is not implemented"))
        if req.best_of not in (None, 1):
            out.append(("best_of", f"best_of={req.best_of} is not supported (only 1 is); send "
                                    "several requests"))
        if req.suffix:
            out.append(("suffix", "suffix (insertion) is not implemented"))
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None \
            and not req.logprobs:
        out.append(("top_logprobs", "top_logprobs needs logprobs=true"))
    if isinstance(req, ChatCompletionRequest) and req.prompt_logprobs is not None \
            and req.stream:  # vLLM refuses it too: a chat chunk has no place for it
        out.append(("prompt_logprobs", (
            "prompt_logprobs with stream=true is not implemented for chat completions; send "
            "stream=false, or use /v1/completions (streamed there, on each choice's first "
            "chunk)")))
    return out


# -- responses -----------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """OpenAI-style ids: ``cmpl-…`` and ``chatcmpl-…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """The ``created`` timestamp (Unix seconds)."""
    return int(time.time())


class _Out(BaseModel):
    """Base of response bodies; ``_omit_if_none`` keys vanish when unset (extensions)."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ()

    def to_dict(self, keep_null: tuple[str, ...] = ()) -> dict[str, Any]:
        """JSON-ready dict keeping OpenAI's explicit nulls but dropping unset extensions.

        Streams with ``include_usage`` pass ``keep_null=("usage",)``: OpenAI then sends
        ``"usage": null`` on every chunk but the last.
        """
        data = self.model_dump(mode="json")
        for key in self._omit_if_none:
            if key not in keep_null and data.get(key) is None:
                data.pop(key, None)
        return data


class UsageInfo(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        """Usage with the total filled in."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class CompletionChoice(BaseModel):
    """A choice of a completion (or of a completion chunk)."""

    index: int = 0
    text: str
    #: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (legacy shape)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class CompletionResponse(_Out):
    """Body of a non-streamed completion, and (object aside) of each streamed chunk."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ("usage", "metrics")

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    metrics: dict[str, Any] | None = None


class ChatResponseMessage(BaseModel):
    """The assistant message of a chat completion."""

    role: Literal["assistant"] = "assistant"
    #: None when the reply is only tool calls (OpenAI's shape)
    content: str | None
    refusal: None = None
    tool_calls: list[Any] = Field(default_factory=list)


class ChatChoice(BaseModel):
    """A choice of a non-streamed chat completion."""

    index: int = 0
    message: ChatResponseMessage
    #: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": None}``
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Out):
    """Body of a non-streamed chat completion."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ("metrics", "prompt_logprobs")

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: UsageInfo
    metrics: dict[str, Any] | None = None
    #: vLLM's place for the prompt's log-probabilities (``prompt_logprobs`` asked for)
    prompt_logprobs: list[Any] | None = None


class DeltaMessage(BaseModel):
    """What a chat chunk adds; the first carries the role."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    """A choice of a streamed chat chunk."""

    index: int = 0
    delta: DeltaMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Out):
    """One ``data:`` event of a streamed chat completion."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ("usage", "metrics")

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    metrics: dict[str, Any] | None = None


class ModelCard(BaseModel):
    """An entry of GET /v1/models."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "draftwise"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    """Body of GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
