"""Turning OpenAI requests into engine requests and engine outputs into OpenAI bodies.

The split from ``app.py``: routing, auth and lifecycle there; the per-request work
(validation that needs the tokenizer, SamplingParams, streaming deltas, usage and the
per-request spec-decode metrics) here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import Request

from draftwise.errors import RequestError
from draftwise.formats.errors import ChatTemplateError
from draftwise.request import CompletionOutput, RequestOutput
from draftwise.sampling_params import SamplingParams
from draftwise.spec.params import SpeculativeParams, check_against
from draftwise.server.engine_loop import EngineLoop, LoopClosed, RequestFailed, RequestStream
from draftwise.server.errors import APIError, from_sampling_error, internal_error
from draftwise.server.grammar_worker import GrammarWorker
from draftwise.server.limits import ServerLimits
from draftwise.server.metrics import ServerMetrics
from draftwise.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    UsageInfo,
    new_id,
    now,
    unsupported_fields,
)
from draftwise.server.structured import structured_outputs
from draftwise.server.tools import ToolPlan, template_messages
from draftwise.text import invalid_text_at, printable

logger = logging.getLogger("draftwise.server")

AnyRequest = CompletionRequest | ChatCompletionRequest


@dataclass(slots=True)
class ServerConfig:
    """What the app needs besides the engine; refused at construction if unusable."""

    #: names a request's ``model`` may use; the first is echoed in responses
    served_model_names: tuple[str, ...]
    #: the bearer token /v1 (and the docs, when on) require; None = no auth. An empty
    #: string is refused: it would silently mean "no auth"
    api_key: str | None = None
    #: default of the per-request ``return_spec_metrics`` field
    return_spec_metrics: bool = False
    #: who may be drafted from whose outputs (suffix decoding's global index, keyed by
    #: ``Request.isolation_key``): "user" requests with the same ``user`` field (none
    #: without one), "server" every request, "off" nobody. The server has one API key, so
    #: keying by key would be "server"
    draft_index_scope: Literal["user", "server", "off"] = "user"
    model_root: str | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: serve /docs, /redoc and /openapi.json (behind the key when there is one)
    enable_docs: bool = False

    def __post_init__(self) -> None:
        check_api_key(self.api_key)
        if self.draft_index_scope not in ("user", "server", "off"):
            raise ValueError(f"draft_index_scope {self.draft_index_scope!r}: give 'user', "
                             "'server' or 'off'")
        if not self.served_model_names:
            raise ValueError("served_model_names: give at least one name")
        for name in self.served_model_names:
            if not name or invalid_text_at(name) is not None:
                raise ValueError(f"served model name {printable(name)!r} must be non-empty "
                                 "valid text")

    @property
    def model_name(self) -> str:
        """The name responses carry."""
        return self.served_model_names[0]


def check_api_key(key: str | None) -> None:
    """An API key is visible ASCII without spaces (what a Bearer token can carry)."""
    if key is None:
        return
    if not key:
        raise ValueError("api_key is empty, which would turn authentication off; give a key "
                         "or leave it unset")
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError("api_key must be printable ASCII without spaces (a Bearer token)")


@dataclass(slots=True)
class ServingContext:
    """Everything a handler needs, stored on ``app.state.serving``."""

    config: ServerConfig
    loop: EngineLoop
    metrics: ServerMetrics
    #: where output constraints are checked and compiled (never on the event loop)
    grammar: GrammarWorker = field(default_factory=GrammarWorker)


def check_request(ctx: ServingContext, body: AnyRequest) -> None:
    """Refusals that need no tokenizer: model name, unsupported fields, batched prompts."""
    if body.model is not None and body.model not in ctx.config.served_model_names:
        names = ", ".join(repr(n) for n in ctx.config.served_model_names)
        raise APIError(f"model: the model {body.model!r} does not exist; this server "
                       f"serves {names}", param="model", code="model_not_found")
    if isinstance(body, CompletionRequest) and body.best_of is not None and body.best_of < 1:
        # invalid, not merely unsupported: OpenAI's own minimum is 1
        raise APIError(f"best_of: must be at least 1 (OpenAI's minimum), got {body.best_of}; "
                       "only best_of=1 is supported here", param="best_of")
    for name, reason in unsupported_fields(body):
        raise APIError(f"{name}: {reason}", param=name, code="unsupported_value")
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, list):
        if body.prompt and isinstance(body.prompt[0], str | list) and len(body.prompt) != 1:
            raise APIError("prompt: batched prompts are not supported; send one request "
                           "per prompt", param="prompt", code="unsupported_value")
        if not body.prompt:
            raise APIError("prompt: the prompt is empty", param="prompt")


def _messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them (content parts joined into text)."""
    out: list[dict[str, Any]] = []
    for msg in body.messages:
        d = msg.model_dump(exclude_none=True)
        if isinstance(msg.content, list):
            d["content"] = "".join(part.text for part in msg.content)
        elif msg.content is None:
            d["content"] = ""
        out.append(d)
    return out


def sampling_params(body: AnyRequest, tools: ToolPlan | None = None) -> SamplingParams:
    """The request's SamplingParams, checked before any tokenizing: a bad value is a 400.

    A forced tool call (``tools``) is the output constraint; it cannot join another.

    The bounds are SamplingParams' own (the same for the CLI and the Python API). A chat
    request without a limit gets "as many tokens as fit", filled in once the prompt's
    length is known (:func:`make_build`); 1 stands in for it here.
    """
    max_tokens = _max_tokens(body)
    fill = max(1, body.min_tokens or 0) if isinstance(body.min_tokens, int) else 1
    fields: dict[str, Any] = {
        "n": body.n if body.n is not None else 1,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "max_tokens": fill if max_tokens is None else max_tokens,
        "stop": body.stop,
        "stop_token_ids": body.stop_token_ids,
        "seed": body.seed,
        "ignore_eos": bool(body.ignore_eos),
        "include_stop_str_in_output": bool(body.include_stop_str_in_output),
        "skip_special_tokens": body.skip_special_tokens is not False,
        "structured_outputs": _constraint(body, tools),
    }
    for name in ("top_p", "top_k", "min_p", *_PROCESSING_FIELDS):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    if isinstance(body, ChatCompletionRequest):  # logprobs: bool, top_logprobs: how many
        fields["logprobs"] = (body.top_logprobs or 0) if body.logprobs else None
    else:
        fields["logprobs"] = body.logprobs
    fields["prompt_logprobs"] = body.prompt_logprobs
    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        raise _rename(from_sampling_error(exc), body) from None


#: request fields that carry an output constraint (each compiles a grammar)
_CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice",
                      "guided_grammar", "structured_outputs")


def has_constraint(body: AnyRequest, tools: ToolPlan | None) -> bool:
    """Whether admitting ``body`` compiles a grammar (a forced tool call's included)."""
    if tools is not None and tools.constraint is not None:
        return True
    return any(getattr(body, name, None) is not None for name in _CONSTRAINT_FIELDS)


def _constrained_params(ctx: ServingContext, body: AnyRequest,
                        tools: ToolPlan | None) -> SamplingParams:
    """On a grammar thread: the params (their constraint checked and bounded) and the
    compiled grammar in the engine's cache, so the tokenizer thread only copies it."""
    params = sampling_params(body, tools)
    if params.structured_outputs is not None:
        ctx.loop.engine.grammars.prepare(params.structured_outputs)
    return params


def _constraint(body: AnyRequest, tools: ToolPlan | None) -> Any:
    """The one output constraint: the body's, or a forced tool call's."""
    own = structured_outputs(body)
    if tools is None or tools.constraint is None:
        return own
    if own is not None:
        raise APIError(f"tool_choice: {tools.choice!r} constrains the output to a tool call, "
                       "so it cannot be combined with response_format or guided_* fields",
                       param="tool_choice", code="invalid_value")
    return tools.constraint


#: request fields passed to SamplingParams under their own names (OpenAI's, then vLLM's)
_PROCESSING_FIELDS = ("presence_penalty", "frequency_penalty", "logit_bias",
                      "repetition_penalty", "min_tokens", "allowed_token_ids", "bad_words")


def _max_tokens(body: AnyRequest) -> int | None:
    """The requested limit (chat's ``max_completion_tokens`` wins), or None for "fill"."""
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens


def make_build(body: AnyRequest, params: SamplingParams,
               tools: ToolPlan | None = None) -> Callable[[Any], tuple[Any, Any]]:
    """The function a tokenizer thread runs: the prompt's ids, and the final params."""

    def build(engine: Any) -> tuple[Any, Any]:
        if isinstance(body, ChatCompletionRequest):
            text = None
            extra = {"tools": list(tools.tools)} if tools is not None else {}
            ids = list(engine.apply_chat_template(template_messages(_messages(body)),
                                                  bool(body.add_generation_prompt), **extra))
        else:
            prompt: Any = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
                prompt = prompt[0]
            text, ids = engine.tokenize_prompt(prompt)
        final = params
        if params.structured_outputs is not None:  # compile here, not on the engine thread
            engine.grammars.prepare(params.structured_outputs)
        if _max_tokens(body) is None:  # OpenAI's "as many as fit"
            final = params.model_copy(
                update={"max_tokens": max(1, engine.max_model_len - len(ids))})
            if final.min_tokens > final.max_tokens:
                raise RequestError("min_tokens", f"min_tokens ({final.min_tokens}) is more "
                                   f"than the {final.max_tokens} tokens the context has room for")
        return {"prompt_token_ids": ids, "prompt": text}, final

    return build


def _rename(err: APIError, body: AnyRequest) -> APIError:
    """Chat names settings its own way: ``max_completion_tokens``, ``top_logprobs``, and
    its prompt is ``messages``."""
    if not isinstance(body, ChatCompletionRequest):
        return err
    if err.param in ("prompt", "prompt_token_ids"):
        err.param = "messages"
        err.message = f"messages: {err.message.split(': ', 1)[-1]}"
        return err
    if err.param == "max_tokens" and body.max_completion_tokens is not None:
        err.param = "max_completion_tokens"
        err.message = err.message.replace("max_tokens", "max_completion_tokens", 1)
    elif err.param == "logprobs":
        err.param = "top_logprobs"
        err.message = err.message.replace("logprobs", "top_logprobs", 1)
    return err


def isolation_key(config: ServerConfig, body: AnyRequest) -> str | None:
    """The request's isolation key under the server's ``draft_index_scope`` (None: it
    drafts from its own tokens only and its outputs draft for nobody else)."""
    if config.draft_index_scope == "server":
        return "server"
    if config.draft_index_scope == "user" and body.user:
        # (a digest: fixed size however long the field, and no user name kept in the index)
        return "user:" + hashlib.sha256(body.user.encode("utf-8", "surrogatepass")).hexdigest()
    return None


async def start(ctx: ServingContext, body: AnyRequest, request_id: str,
                tools: ToolPlan | None = None) -> RequestStream:
    """Admit a request; every refusal becomes an OpenAI-shaped APIError."""
    check_request(ctx, body)
    speculative = speculative_params(body)
    try:
        if has_constraint(body, tools):  # seconds for a huge schema: off the event loop
            params = await ctx.grammar.run(lambda: _constrained_params(ctx, body, tools))
        else:
            params = sampling_params(body, tools)
        if speculative is not None:  # before tokenizing: the server's limits are known
            check_against(speculative, getattr(ctx.loop.engine, "spec", None))
        return await ctx.loop.submit(request_id, make_build(body, params, tools),
                                     speculative=speculative,
                                     isolation_key=isolation_key(ctx.config, body))
    except APIError as exc:
        raise _rename(exc, body) from None
    except RequestError as exc:
        raise _rename(APIError(str(exc), param=exc.field, code="invalid_value"), body) from None
    except ValidationError as exc:
        raise _rename(from_sampling_error(exc), body) from None
    except LoopClosed as exc:
        raise APIError(str(exc), status=503, code=exc.code) from None
    except ChatTemplateError as exc:  # the template's raise_exception(): bad conversation
        raise APIError(f"messages: {exc}", param="messages", code="invalid_chat") from None
    except Exception as exc:
        logger.exception("request %s failed before admission", request_id)
        raise internal_error(exc) from None


def speculative_params(body: AnyRequest) -> SpeculativeParams | None:
    """The request's ``speculative`` field, with provenance on when metrics ask for it."""
    asked = body.speculative
    if body.return_spec_metrics == "provenance":
        asked = (asked or SpeculativeParams()).model_copy(update={"return_provenance": True})
    return asked


def wants_provenance(body: AnyRequest) -> bool:
    """Whether responses carry ``token_provenance``."""
    return body.return_spec_metrics == "provenance" or bool(
        body.speculative and body.speculative.return_provenance)


def spec_metrics(ctx: ServingContext, body: AnyRequest, out: RequestOutput) -> dict | None:
    """The per-request ``metrics`` object (vLLM's shape), when asked for."""
    wanted = body.return_spec_metrics
    if wanted is None:
        wanted = ctx.config.return_spec_metrics
    if not wanted and not wants_provenance(body):
        return None
    metrics = {"speculative_decoding": out.metrics.get("speculative_decoding")}
    if wants_provenance(body):
        metrics["token_provenance"] = out.metrics.get("token_provenance")
    return metrics


def usage_of(out: RequestOutput) -> UsageInfo:
    """Token counts from the engine's own ids (not a re-tokenization); the prompt once,
    every one of the ``n`` completions' tokens."""
    return UsageInfo.of(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))


async def collect(ctx: ServingContext, stream: RequestStream, request: Request) -> RequestOutput:
    """Wait for the final output; abort the request if the client goes away first."""

    async def last() -> RequestOutput:
        final = None
        async for out in stream:
            final = out
        assert final is not None
        return final

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    result = asyncio.ensure_future(last())
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not result.done():
            result.cancel()
            stream.close()
            ctx.metrics.on_failed("abort")
    if not result.done():  # pragma: no cover - the client is gone; nobody reads this
        raise APIError("client disconnected", status=499)
    try:
        return result.result()
    except RequestFailed as exc:
        ctx.metrics.on_failed("error")
        raise APIError(str(exc), status=exc.status) from None


class TextDelta:
    """Streamed text = final text, even when a stop string spans two steps.

    The engine cuts a completed stop string from the text; a prefix of it may have been
    produced a step earlier, so until the request finishes the last ``len(stop) - 1``
    characters are held back.
    """

    def __init__(self, body: AnyRequest) -> None:
        stops = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
        self.holdback = 0 if body.include_stop_str_in_output else max(
            (len(s) - 1 for s in stops), default=0)
        self.sent = 0

    def next(self, completion: CompletionOutput) -> str:
        """The text not yet streamed that is safe to stream now."""
        text = completion.text
        finished = completion.finish_reason is not None
        limit = len(text) if finished else max(self.sent, len(text) - self.holdback)
        delta = text[self.sent:limit]
        self.sent = max(self.sent, limit)
        return delta


class _ChoiceStream:
    """One choice of a stream: its text so far, its logprobs so far, whether it ended."""

    def __init__(self, body: AnyRequest) -> None:
        self.text = TextDelta(body)
        self.tokens_sent = 0
        self.done = False

    def events(self, chunks: Chunks, completion: CompletionOutput,
               out: RequestOutput) -> list[dict[str, Any] | None]:
        """The chunks this output adds for the choice (none once it has finished)."""
        if self.done:
            return []
        offset = self.text.sent
        text = self.text.next(completion)
        end = len(completion.token_ids)
        lps = chunks.logprobs(completion, self.tokens_sent, end, offset)
        self.tokens_sent = end
        finish = completion.finish_reason
        if finish is not None:
            self.done = True
            return [chunks.delta(text, finish, out if out.finished else None,
                                 completion.index, lps)]
        if text or lps:
            return [chunks.delta(text, None, None, completion.index, lps)]
        return []


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                            separators=(",", ":"))
    return f"data: {payload}\n\n"


class Chunks(ABC):
    """Renders one request's stream events; subclasses give the endpoint's shape."""

    def __init__(self, ctx: ServingContext, body: AnyRequest, request_id: str) -> None:
        self.ctx = ctx
        self.body = body
        self.id = request_id
        self.created = now()
        self.model = ctx.config.model_name
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        #: provenance of tokens produced but not yet sent (with return_spec_metrics
        #: "provenance"), and how many tokens' provenance went out
        self.provenance = wants_provenance(body)
        self._prov_sent = 0
        self._prov_pending: list[str] = []

    def observe(self, out: RequestOutput) -> None:
        """A step's output arrived: queue the provenance of its new tokens."""
        if self.provenance:
            prov = out.metrics.get("token_provenance") or []
            self._prov_pending += prov[self._prov_sent:]
            self._prov_sent = len(prov)

    def chunk_metrics(self, final: RequestOutput | None) -> dict[str, Any] | None:
        """A chunk's ``metrics``: the final one's spec metrics, and on every chunk the
        provenance of the tokens produced since the previous chunk."""
        metrics = spec_metrics(self.ctx, self.body, final) if final else None
        if self.provenance:
            metrics = dict(metrics or {})
            metrics["token_provenance"] = self._prov_pending
            self._prov_pending = []
        return metrics

    def head(self) -> dict[str, Any] | None:
        """An event before any text (chat's role delta), or None."""
        return None

    @abstractmethod
    def delta(self, text: str, finish_reason: str | None, final: RequestOutput | None,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict | None:
        """A text event of choice ``index``; ``final`` is the finished output on the last.

        None holds the event back (tool calls buffer their text until the end).
        """

    def logprobs(self, completion: CompletionOutput, start: int, end: int,
                 offset: int) -> dict[str, Any] | None:
        """The choice's logprobs of tokens ``start:end`` (None unless they were asked for)."""
        return None

    @abstractmethod
    def usage(self, final: RequestOutput) -> dict[str, Any]:
        """The ``include_usage`` event: no choices, the request's usage."""


async def stream_events(ctx: ServingContext, stream: RequestStream,
                        chunks: Chunks) -> AsyncIterator[str]:
    """SSE body: head, one event per step with new text, the finish, usage, [DONE].

    A failure mid-stream is sent as an ``{"error": …}`` event (the 200 status line is
    already out), which the ``openai`` client raises as an APIError.
    """
    body = chunks.body
    try:
        head = chunks.head()
        if head is not None:
            yield sse(head)
        final: RequestOutput | None = None
        choices: dict[int, _ChoiceStream] = {}
        async for out in stream:
            chunks.observe(out)
            final = out if out.finished else None
            for completion in out.outputs:
                state = choices.setdefault(completion.index, _ChoiceStream(body))
                for event in state.events(chunks, completion, out):
                    if event is not None:
                        yield sse(event)
        if chunks.include_usage and final is not None:
            yield sse(chunks.usage(final))
        yield sse("[DONE]")
    except RequestFailed as exc:
        ctx.metrics.on_failed("error")
        yield sse(APIError(str(exc), status=exc.status).body())
        yield sse("[DONE]")
    except Exception as exc:
        logger.exception("stream of %s failed", stream.request_id)
        ctx.metrics.on_failed("error")
        yield sse(internal_error(exc).body())
        yield sse("[DONE]")
    finally:
        if not stream.finished:  # the client went away (cancelled) or we failed
            stream.close()
            ctx.metrics.on_failed("abort")


__all__ = [
    "Chunks",
    "ServerConfig",
    "ServingContext",
    "collect",
    "new_id",
    "spec_metrics",
    "start",
    "stream_events",
    "usage_of",
]
