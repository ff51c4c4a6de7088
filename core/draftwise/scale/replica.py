"""One replica: one engine with its own threads, serving the single-process server's app.

The replica builds its engine in the constructor, so a model it cannot load fails the
deployment at start (Ray marks it DEPLOY_FAILED) with the engine's own error, carried in
:class:`ReplicaStartError`'s message for the CLI to print. It then runs the FastAPI app of
``draftwise.server.app`` in-process (:mod:`draftwise.scale.asgi_call`): every route,
limit, error shape and stream is the single-process server's, not a copy of it.

This module is a plain class; :mod:`draftwise.scale.app` wraps it with
``serve.deployment`` (so importing it never needs Ray).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.scale.asgi_call import HTTPRequest, call
from draftwise.server.serving import ServerConfig

#: the header each reply carries with the replica that served it (for tests, operators)
REPLICA_HEADER = "x-draftwise-replica"
#: where a replica's start-up error is quoted in Ray's DEPLOY_FAILED message
START_ERROR_MARK = "draftwise replica could not start: "


class ReplicaStartError(DraftwiseError):
    """The engine could not be built; the message quotes the engine's own error."""


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """What every replica builds: the engine's arguments and the server's config."""

    model: str | None
    speculative_config: str | None
    dtype: str
    engine_kwargs: dict[str, Any]
    config: ServerConfig


def build_engine(spec: ReplicaSpec) -> Any:
    """The replica's engine, or :class:`ReplicaStartError` naming why not."""
    try:
        from draftwise.engine import LLMEngine
        from draftwise.engine_args import EngineArgs

        return LLMEngine(EngineArgs(model=spec.model, dtype=spec.dtype,
                                    speculative_config=spec.speculative_config,
                                    **spec.engine_kwargs))
    except Exception as exc:  # noqa: BLE001 - re-raised with the engine's name and words
        raise ReplicaStartError(f"{START_ERROR_MARK}{type(exc).__name__}: {exc}") from None


class EngineReplica:
    """The Ray Serve deployment's class: build the engine, serve the app in-process."""

    def __init__(self, spec: ReplicaSpec, name: str | None = None) -> None:
        from draftwise.server.app import create_app

        self.engine = build_engine(spec)
        self.app = create_app(self.engine, spec.config)
        self.name = name or _replica_name()
        self._lifespan: AbstractAsyncContextManager[Any] | None = None
        self._started = asyncio.Lock()

    async def _start(self) -> None:
        """Start the engine loop on this replica's event loop (first call only)."""
        async with self._started:
            if self._lifespan is None:
                ctx = self.app.router.lifespan_context(self.app)
                await ctx.__aenter__()
                self._lifespan = ctx

    async def forward(self, request: HTTPRequest, route: Any = None) -> AsyncIterator[Any]:
        """Serve one HTTP request: the head (with this replica's name), then the body.

        ``route`` is read by the ingress's request router, not here."""
        await self._start()
        async for part in call(self.app, request):
            if isinstance(part, dict):
                part["headers"].append((REPLICA_HEADER, self.name))
            yield part

    def routing_info(self) -> dict[str, Any]:
        """What the ingress needs to compute route keys: the tokenizer and the cache's
        block size and capacity."""
        tok = getattr(self.engine, "tokenizer", None)
        backend = getattr(tok, "backend", None)
        pool = getattr(getattr(self.engine, "kv", None), "pool", None)
        return {
            "tokenizer_json": backend.to_str() if backend is not None else None,
            "block_size": int(pool.block_size) if pool is not None else 16,
            "capacity_blocks": int(pool.capacity) if pool is not None else 4096,
            "replica": self.name,
            "pid": os.getpid(),
        }

    async def check_health(self) -> None:
        """Ray's periodic probe: a dead engine loop takes the replica out (and restarts it)."""
        if self._lifespan is not None and not self.app.state.serving.loop.alive:
            raise RuntimeError("the engine loop stopped")

    async def shutdown(self) -> None:
        """Ray's graceful stop: end the lifespan (abort requests, join the engine thread)."""
        if self._lifespan is not None:
            await self._lifespan.__aexit__(None, None, None)
            self._lifespan = None

    async def __del__(self) -> None:  # Ray Serve calls an async __del__ on graceful stop
        await self.shutdown()


def _replica_name() -> str:
    """Ray's replica id inside a deployment, else the process id."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # noqa: BLE001 - outside Ray (tests of the plain class)
        return f"pid-{os.getpid()}"
