"""OpenAI-compatible HTTP server (fastapi + uvicorn) over the step-level engine.

    from draftwise.server import ServerConfig, create_app
    app = create_app(engine, ServerConfig(served_model_names=("smollm2",)))

The names load on first use, so ``draftwise.server.limits`` (the serve command's flag
defaults) imports without fastapi or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftwise.server.app import create_app
    from draftwise.server.serving import ServerConfig

__all__ = ["ServerConfig", "create_app"]

_LAZY = {"create_app": "draftwise.server.app", "ServerConfig": "draftwise.server.serving"}


def __getattr__(name: str) -> Any:
    """Import the app only when it is used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'draftwise.server' has no attribute {name!r}")
