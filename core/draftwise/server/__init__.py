"""OpenAI-compatible HTTP server (fastapi + uvicorn) over the step-level engine.

    from draftwise.server import ServerConfig, create_app
    app = create_app(engine, ServerConfig(served_model_names=("smollm2",)))
"""

from __future__ import annotations

from draftwise.server.app import create_app
from draftwise.server.serving import ServerConfig

__all__ = ["ServerConfig", "create_app"]
