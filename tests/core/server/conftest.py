"""Fixtures: a fake engine served by uvicorn in a thread on a free loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from server_fakes import FakeEngine, serving


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    """One fake engine per test module (its server is shared too: startup costs ~0.2 s)."""
    return FakeEngine()


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[str]:
    with serving(engine) as url:
        yield url


@pytest.fixture(scope="module")
def openai_client(server: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=20, max_retries=0)


@pytest.fixture
def serve_fake() -> Callable[..., Any]:
    """``with serve_fake(engine, api_key=...) as url:`` for tests that vary the config."""
    return serving
