"""The FastAPI app factory: OpenAI routes, auth, request counting, engine-loop lifecycle.

``create_app(engine, config)`` takes a built engine (the CLI builds it first, so a bad
speculative config is refused before any socket opens) and returns an app whose
lifespan starts and stops the :class:`EngineLoop`. Each app has its own Prometheus
registry, so several can live in one process (tests do that).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import draftwise
from draftwise.request import CompletionOutput, RequestOutput
from draftwise.server.block_events import attach as attach_block_events
from draftwise.server.block_events import sse_stream as block_event_stream
from draftwise.server.body import BodyGuard
from draftwise.server.engine_loop import EngineLoop
from draftwise.server.errors import APIError, install_handlers
from draftwise.server.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs_json
from draftwise.server.metrics import ServerMetrics
from draftwise.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ModelCard,
    ModelList,
    new_id,
)
from draftwise.server.serving import (
    Chunks,
    ServerConfig,
    ServingContext,
    collect,
    spec_metrics,
    start,
    stream_events,
    usage_of,
)
from draftwise.server.tools import ToolPlan, chat_template_of, tool_plan
from draftwise.server.tools import (
    finish_reason as call_finish_reason,
)

logger = logging.getLogger("draftwise.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


#: the API routes whose bodies are JSON (vetted by the body guard before FastAPI parses)
JSON_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: FastAPI's documentation routes, served only with ``enable_docs``
DOCS_ROUTES = {"docs_url": "/docs", "redoc_url": "/redoc", "openapi_url": "/openapi.json"}


class _Gate:
    """Pure ASGI middleware: bearer-token check on /v1 (and the docs) and request counts.

    Pure ASGI (not ``BaseHTTPMiddleware``) so streaming and disconnect detection pass
    through untouched.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: ServerMetrics,
                 protected: tuple[str, ...] = ()) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics
        #: exact paths besides /v1/* that need the key (the docs, when served)
        self.protected = frozenset(protected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        status = 500

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            needs_key = path.startswith("/v1") or path in self.protected
            if self.api_key and needs_key and not self._authorized(scope):
                err = APIError("missing or invalid API key: send 'Authorization: Bearer "
                               "<key>'", status=401, code="invalid_api_key")
                await err.response()(scope, receive, send_counted)
                return
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.on_http(path, method, status)

    def _authorized(self, scope: Scope) -> bool:
        """Constant-time comparison of the bearer token."""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    token.strip().encode(), self.api_key.encode())  # type: ignore[union-attr]
        return False


def _completion_logprobs(body: CompletionRequest, completion: CompletionOutput, start: int,
                         end: int, offset: int) -> dict[str, Any] | None:
    """The completions shape of tokens ``start:end``, when ``logprobs`` was asked for."""
    if body.logprobs is None or completion.logprobs is None:
        return None
    return completion_logprobs(completion.logprobs[start:end], completion.token_ids[start:end],
                               body.logprobs, offset)


def _chat_logprobs(body: ChatCompletionRequest, completion: CompletionOutput, start: int,
                   end: int) -> dict[str, Any] | None:
    """The chat shape of tokens ``start:end``, when ``logprobs: true`` was asked for."""
    if not body.logprobs or completion.logprobs is None:
        return None
    return chat_logprobs(completion.logprobs[start:end], completion.token_ids[start:end],
                         body.top_logprobs or 0)


class CompletionChunks(Chunks):
    """``text_completion`` stream events; with ``prompt_logprobs``, each choice's first
    chunk carries them (the shape of the non-streamed choice's field)."""

    def __init__(self, ctx: ServingContext, body: CompletionRequest, request_id: str) -> None:
        super().__init__(ctx, body, request_id)
        self._prompt_logprobs: list[Any] | None = None
        self._prompt_sent: set[int] = set()

    def observe(self, out: RequestOutput) -> None:
        """Also keep the prompt's logprobs (they come once the prefill is done)."""
        super().observe(out)
        if out.prompt_logprobs is not None and self._prompt_logprobs is None:
            self._prompt_logprobs = prompt_logprobs_json(out.prompt_logprobs)

    def delta(self, text: str, finish_reason: str | None, final: RequestOutput | None,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict:
        """A completion chunk (the last one has the finish reason and optional metrics)."""
        resp = CompletionResponse(
            id=self.id, created=self.created, model=self.model,
            choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                      finish_reason=finish_reason)],
            metrics=self.chunk_metrics(final),
        )
        data = resp.to_dict(keep_null=("usage",) if self.include_usage else ())
        if self.body.prompt_logprobs is not None and index not in self._prompt_sent:
            self._prompt_sent.add(index)
            data["choices"][0]["prompt_logprobs"] = self._prompt_logprobs or []
        return data

    def logprobs(self, completion: CompletionOutput, start: int, end: int,
                 offset: int) -> dict[str, Any] | None:
        """The new tokens' logprobs in the completions shape."""
        return _completion_logprobs(self.body, completion, start, end, offset)  # type: ignore[arg-type]

    def usage(self, final: RequestOutput) -> dict[str, Any]:
        """The usage chunk: ``choices: []``."""
        resp = CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[], usage=usage_of(final))
        return resp.to_dict()


class ChatChunks(Chunks):
    """``chat.completion.chunk`` stream events."""

    def _chunk(self, delta: DeltaMessage, finish: str | None, final: RequestOutput | None,
               indexes: tuple[int, ...] = (0,), logprobs: dict[str, Any] | None = None,
               ) -> dict[str, Any]:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model,
            choices=[ChatChunkChoice(index=i, delta=delta, logprobs=logprobs,
                                     finish_reason=finish) for i in indexes],
            metrics=self.chunk_metrics(final),
        )
        data = chunk.to_dict(keep_null=("usage",) if self.include_usage else ())
        for choice in data["choices"]:  # OpenAI omits unset delta keys
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return data

    def head(self) -> dict[str, Any]:
        """The first event carries the role and empty content, for every choice."""
        return self._chunk(DeltaMessage(role="assistant", content=""), None, None,
                           tuple(range(self.body.n or 1)))

    def delta(self, text: str, finish_reason: str | None, final: RequestOutput | None,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict | None:
        """A content delta; the last has the finish reason (and no content when empty)."""
        return self._chunk(DeltaMessage(content=text or None), finish_reason, final, (index,),
                           logprobs)

    def logprobs(self, completion: CompletionOutput, start: int, end: int,
                 offset: int) -> dict[str, Any] | None:
        """The new tokens' logprobs in the chat shape."""
        return _chat_logprobs(self.body, completion, start, end)  # type: ignore[arg-type]

    def usage(self, final: RequestOutput) -> dict[str, Any]:
        """The usage chunk: ``choices: []``."""
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                    choices=[], usage=usage_of(final))
        return chunk.to_dict()


class ToolChatChunks(ChatChunks):
    """Chat chunks when the output is read for tool calls: buffered to the end.

    A ``<tool_call>`` block is only known to be one once it closes and parses, so the
    text is held back and the last event carries it all: the content outside the calls
    (if any), every parsed call as a ``tool_calls`` delta, all the tokens' logprobs, and
    the finish reason (``tool_calls`` when a call was made). The role chunk still comes
    first.
    """

    def __init__(self, ctx: ServingContext, body: ChatCompletionRequest, request_id: str,
                 plan: ToolPlan) -> None:
        super().__init__(ctx, body, request_id)
        self.plan = plan
        self._text: dict[int, str] = {}
        self._logprobs: dict[int, list[Any]] = {}

    def delta(self, text: str, finish_reason: str | None, final: RequestOutput | None,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict | None:
        """Nothing until the choice finishes; then the whole reply at once."""
        self._text[index] = self._text.get(index, "") + text
        if logprobs is not None:
            self._logprobs.setdefault(index, []).extend(logprobs["content"])
        if finish_reason is None:
            return None
        content, calls = self.plan.parse(self._text.pop(index))
        lps = self._logprobs.pop(index, None)
        data = self._chunk(DeltaMessage(content=content),
                           call_finish_reason(finish_reason, calls),
                           final, (index,),
                           {"content": lps, "refusal": None} if lps is not None else None)
        if calls:
            data["choices"][0]["delta"]["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(calls)]
        return data


def _chat_choice(body: ChatCompletionRequest, c: CompletionOutput,
                 plan: ToolPlan | None) -> ChatChoice:
    """One choice of a non-streamed reply; with tools, its calls parsed out of the text."""
    content: str | None = c.text
    calls: list[dict[str, Any]] = []
    if plan is not None and plan.parses:
        content, calls = plan.parse(c.text)
    return ChatChoice(index=c.index,
                      message=ChatResponseMessage(content=content, tool_calls=calls),
                      logprobs=_chat_logprobs(body, c, 0, len(c.token_ids)),
                      finish_reason=call_finish_reason(c.finish_reason, calls))


def _ctx(request: Request) -> ServingContext:
    """The app's serving context (engine loop, metrics, config)."""
    return request.app.state.serving  # type: ignore[no-any-return]


async def completions(body: CompletionRequest, request: Request) -> Response:
    """POST /v1/completions."""
    ctx = _ctx(request)
    request_id = new_id("cmpl")
    stream = await start(ctx, body, request_id)
    if body.stream:
        events = stream_events(ctx, stream, CompletionChunks(ctx, body, request_id))
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    out = await collect(ctx, stream, request)
    resp = CompletionResponse(
        id=request_id, model=ctx.config.model_name,
        choices=[CompletionChoice(index=c.index, text=c.text, finish_reason=c.finish_reason,
                                  logprobs=_completion_logprobs(body, c, 0, len(c.token_ids), 0))
                 for c in out.outputs],
        usage=usage_of(out), metrics=spec_metrics(ctx, body, out),
    )
    data = resp.to_dict()
    if body.prompt_logprobs is not None:  # vLLM's place: every choice carries the prompt's
        for choice in data["choices"]:
            choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs or [])
    return JSONResponse(data)


async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """POST /v1/chat/completions."""
    ctx = _ctx(request)
    request_id = new_id("chatcmpl")
    template = chat_template_of(ctx.loop.engine)
    if body.tools:  # each tool's schema is checked, maybe compiled: off the event loop
        plan = await ctx.grammar.run(lambda: tool_plan(body, template))
    else:
        plan = tool_plan(body, template)
    stream = await start(ctx, body, request_id, plan)
    if body.stream:
        chunks = (ToolChatChunks(ctx, body, request_id, plan) if plan is not None and plan.parses
                  else ChatChunks(ctx, body, request_id))
        events = stream_events(ctx, stream, chunks)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    out = await collect(ctx, stream, request)
    resp = ChatCompletionResponse(
        id=request_id, model=ctx.config.model_name,
        choices=[_chat_choice(body, c, plan) for c in out.outputs],
        usage=usage_of(out), metrics=spec_metrics(ctx, body, out),
        prompt_logprobs=(prompt_logprobs_json(out.prompt_logprobs or [])
                         if body.prompt_logprobs is not None else None),
    )
    return JSONResponse(resp.to_dict())


async def models(request: Request) -> JSONResponse:
    """GET /v1/models: the served name(s)."""
    ctx = _ctx(request)
    max_len = getattr(ctx.loop.engine, "max_model_len", None)
    cards = [ModelCard(id=name, root=ctx.config.model_root, max_model_len=max_len)
             for name in ctx.config.served_model_names]
    return JSONResponse(ModelList(data=cards).model_dump(mode="json"))


async def health(request: Request) -> JSONResponse:
    """GET /health: 200 while serving, 503 when draining or the engine loop is gone.

    The body carries the loop's snapshot (requests in flight, KV blocks in use), which
    is how tests and operators see that aborted requests returned their blocks.
    """
    loop = _ctx(request).loop
    if not loop.alive:
        status, code = "dead", 503
    elif not loop.accepting:
        status, code = "draining", 503
    else:
        status, code = "ok", 200
    return JSONResponse({"status": status, **loop.snapshot}, status_code=code)


async def metrics(request: Request) -> Response:
    """GET /metrics: Prometheus text of this app's registry."""
    registry = _ctx(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def kv_events(request: Request) -> Response:
    """GET /kv_events: the prefix blocks this server holds, then each stored/evicted one
    (``draftwise.server.block_events``), for routers in front of bare servers."""
    log = request.app.state.block_events
    if log is None:
        raise APIError("this server's engine has no prefix cache, so it has no prefix "
                       "blocks to report", status=404, code="no_prefix_cache")
    return StreamingResponse(block_event_stream(log), media_type="text/event-stream",
                             headers=SSE_HEADERS)


async def version(request: Request) -> JSONResponse:
    """GET /version: served without the API key, so drafters are named by base name."""
    engine = _ctx(request).loop.engine
    spec_config = getattr(engine, "spec_config", None)
    return JSONResponse({
        "version": draftwise.__version__,
        "speculative_config": (
            public_spec_config(spec_config.to_json()) if spec_config is not None else None
        ),
        # "adaptive" (the engine picks each request's depth, k the cap) or "fixed"
        "speculative_depth": spec_config.depth if spec_config is not None else None,
    })


def public_spec_config(value: Any) -> Any:
    """The speculative config's JSON with every drafter ``model`` (at the top and in a
    drafter chain) cut to its base name: ``/version`` needs no key, and a path says how
    the host's disk is laid out (a user name, a mount) to anyone who can reach the port.
    The name still tells which drafter runs; ``/v1/models``, behind the key, has the
    target's path."""
    if isinstance(value, dict):
        return {
            k: (os.path.basename(v.rstrip("/\\")) or v)
            if k == "model" and isinstance(v, str) else public_spec_config(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [public_spec_config(v) for v in value]
    return value


def create_app(engine: Any, config: ServerConfig) -> FastAPI:
    """An app serving ``engine``; the engine loop runs for the app's lifespan."""
    server_metrics = ServerMetrics(config.model_name, engine=engine)
    loop = EngineLoop(engine, observer=server_metrics)
    server_metrics.watch(lambda: loop.snapshot)
    block_events = attach_block_events(engine)  # before the engine thread starts

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import asyncio

        loop.start(asyncio.get_running_loop())
        logger.info("serving %s", config.model_name)
        try:
            yield
        finally:
            app.state.serving.grammar.stop()
            await asyncio.to_thread(loop.stop)

    docs: dict[str, Any] = dict(DOCS_ROUTES) if config.enable_docs else dict.fromkeys(DOCS_ROUTES)
    app = FastAPI(title="draftwise", version=draftwise.__version__, lifespan=lifespan, **docs)
    app.state.serving = ServingContext(config=config, loop=loop, metrics=server_metrics)
    app.state.block_events = block_events
    install_handlers(app)
    # the last added runs first: the gate (auth, counts), then the body guard
    app.add_middleware(BodyGuard, limits=config.limits, json_paths=JSON_ROUTES)
    protected: tuple[str, ...] = ("/kv_events",)  # block token ids are prompt text
    if config.enable_docs:
        protected += (*DOCS_ROUTES.values(), "/docs/oauth2-redirect")
    app.add_middleware(_Gate, api_key=config.api_key, metrics=server_metrics,
                       protected=protected)
    app.add_api_route("/v1/completions", completions, methods=["POST"],
                      response_model=None)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"],
                      response_model=None)
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/version", version, methods=["GET"])
    app.add_api_route("/kv_events", kv_events, methods=["GET"], response_model=None)
    return app
