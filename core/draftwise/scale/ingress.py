"""The one endpoint in front of the replicas: route key, relay, failover, /health.

The ingress parses nothing of the API: it computes the request's route key (the prompt's
chained block hashes and its isolation key), hands the raw request to the replica the
router picks (:mod:`draftwise.scale.ray_router`) and relays the replica's reply, so auth,
limits and error shapes are the replica's, i.e. the single-process server's.

Route keys: a ``prompt`` of token ids is hashed as given (the engine's own blocks); a
text prompt is tokenized with the replicas' tokenizer (fetched from a replica once), as
the engine tokenizes it; chat messages are tokenized as ``role\\ncontent\\n`` per message,
not through the chat template: the blocks differ from the engine's, but two requests
sharing a system prompt or a conversation's earlier turns share them, which is all the
router compares (its view is its own assignment history). A request without the API key
is not tokenized (the replica answers 401).

Faults: a replica that dies mid-stream ends the stream with an OpenAI error event and
``[DONE]`` (the status line is already out); one that dies before replying is a 503.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from draftwise.scale.routing import RouteKey, block_hashes
from draftwise.server.errors import APIError
from draftwise.server.serving import isolation_key, sse

logger = logging.getLogger("draftwise.scale")

#: the routes whose prompts are hashed for routing
PROMPT_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: the Ray Serve deployment name of the replicas (``/health`` reads its status)
REPLICA_DEPLOYMENT = "EngineReplica"


@dataclass(frozen=True, slots=True)
class IngressConfig:
    """What the ingress needs besides the replicas' handle."""

    api_key: str | None
    draft_index_scope: str
    #: replicas that must run for /health to say "ok" (below: "degraded")
    min_replicas: int


class PromptKeys:
    """Route keys from request bodies, with the replicas' tokenizer and block size."""

    def __init__(self, tokenizer_json: str | None, block_size: int) -> None:
        self.block_size = block_size
        self.tokenizer: Any = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_str(tokenizer_json)

    def ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """The token ids the route key hashes (module docstring)."""
        if path == "/v1/chat/completions":
            messages = body.get("messages") or []
            text = "".join(f"{m.get('role', '')}\n{_content(m.get('content'))}\n"
                           for m in messages if isinstance(m, dict))
            return self._encode(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return self._encode(prompt) if isinstance(prompt, str) else []

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:  # no tokenizer: bytes stand in for tokens
            return list(text.encode("utf-8", "surrogatepass"))
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)


def _content(content: Any) -> str:
    """A message's text (OpenAI's list-of-parts form joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class Ingress:
    """The Ray Serve ingress deployment's class (``__call__`` gets each HTTP request)."""

    def __init__(self, replicas: Any, config: IngressConfig) -> None:
        self.replicas = replicas
        self.config = config
        self._keys: PromptKeys | None = None
        self._keys_lock = asyncio.Lock()

    async def _prompt_keys(self) -> PromptKeys:
        """Fetched from a replica on first use (all replicas load the same model)."""
        async with self._keys_lock:
            if self._keys is None:
                info = await self.replicas.routing_info.remote()
                self._keys = PromptKeys(info["tokenizer_json"], info["block_size"])
        return self._keys

    def _authorized(self, request: Request) -> bool:
        if self.config.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.config.api_key.encode())

    async def route_key(self, request: Request, raw: bytes) -> RouteKey:
        """The request's route key; an unparsable or unauthorized one routes by load."""
        if request.url.path not in PROMPT_ROUTES or not self._authorized(request):
            return RouteKey()
        try:
            body = json.loads(raw)
        except ValueError:
            return RouteKey()
        if not isinstance(body, dict):
            return RouteKey()
        keys = await self._prompt_keys()
        ids = await asyncio.to_thread(keys.ids, request.url.path, body)
        user = body.get("user") if isinstance(body.get("user"), str) else None
        iso = isolation_key(SimpleNamespace(  # type: ignore[arg-type]
            draft_index_scope=self.config.draft_index_scope), SimpleNamespace(user=user))
        return RouteKey(tuple(block_hashes(ids, keys.block_size)), iso)

    async def __call__(self, request: Request) -> Response:
        """Route, forward, relay."""
        if request.url.path == "/health":
            return await self.health()
        raw = await request.body()
        key = await self.route_key(request, raw)
        forwarded = {"method": request.method, "path": request.url.path,
                     "query": request.url.query.encode(), "headers": list(request.headers.items()),
                     "body": raw}
        parts = self.replicas.options(stream=True).forward.remote(forwarded, route=key)
        try:
            head = await parts.__anext__()
        except Exception as exc:  # noqa: BLE001 - the replica died before it answered
            logger.warning("replica failed before replying: %s", exc)
            return APIError(f"the replica serving this request stopped ({type(exc).__name__}); "
                            "retry: the endpoint routes around it", status=503,
                            code="replica_unavailable").response()
        headers = {k: v for k, v in head["headers"] if k.lower() != "content-length"}
        is_sse = "text/event-stream" in headers.get("content-type", "")
        return StreamingResponse(_relay(parts, is_sse), status_code=head["status"],
                                 headers=headers)

    async def health(self) -> JSONResponse:
        """200 "ok" with every replica running; 200 "degraded" with fewer than
        ``min_replicas`` running or one starting; 503 "down" with none."""
        from ray import serve

        status = await asyncio.to_thread(serve.status)
        app = status.applications.get(serve.get_replica_context().app_name)
        dep = app.deployments.get(REPLICA_DEPLOYMENT) if app is not None else None
        states = {str(getattr(k, "value", k)): v for k, v in (dep.replica_states if dep else {}).items()}
        running = states.get("RUNNING", 0)
        healthy = dep is not None and str(getattr(dep.status, "value", dep.status)) == "HEALTHY"
        if running == 0:
            state, code = "down", 503
        elif running < self.config.min_replicas or not healthy or len(states) > 1:
            state, code = "degraded", 200
        else:
            state, code = "ok", 200
        return JSONResponse({"status": state, "replicas": states}, status_code=code)


async def _relay(parts: Any, is_sse: bool) -> AsyncIterator[bytes]:
    """The replica's body chunks; a replica lost mid-stream ends an SSE stream properly."""
    try:
        async for chunk in parts:
            yield chunk
    except Exception as exc:
        logger.warning("replica failed mid-stream: %s", exc)
        if not is_sse:
            raise
        err = APIError(f"the replica serving this stream stopped ({type(exc).__name__}); "
                       "the endpoint routes around it: retry the request", status=503,
                       code="replica_unavailable")
        yield sse(err.body()).encode()
        yield sse("[DONE]").encode()
