"""``/version`` is served without the API key: it names drafters, never their paths."""

from __future__ import annotations

from typing import Any

import httpx
from draftwise.server.app import public_spec_config

from server_fakes import FakeEngine

SECRET = "/home/alice/private-mount"


class PathSpecConfig:
    """A resolved config's JSON with absolute drafter paths, top level and in a chain."""

    depth = "adaptive"  # what ``/version`` reports as ``speculative_depth``

    def to_json(self) -> dict[str, Any]:
        return {
            "method": "draft_model", "model": f"{SECRET}/SmolLM2-135M.Q8_0.gguf",
            "num_speculative_tokens": 3,
            "draftwise": {"drafter_chain": [
                {"method": "dflash", "model": f"{SECRET}/dflash-draft/"},
                {"method": "ngram", "num_speculative_tokens": 2},
            ]},
        }


def test_version_names_drafters_by_base_name_without_a_key(serve_fake) -> None:
    engine = FakeEngine(speculative=True)
    engine.spec_config = PathSpecConfig()  # type: ignore[assignment]
    with serve_fake(engine, api_key="sk-test") as url:
        resp = httpx.get(f"{url}/version", timeout=10)  # no key: still served
    assert resp.status_code == 200, resp.text
    assert SECRET not in resp.text and "alice" not in resp.text
    spec = resp.json()["speculative_config"]
    assert spec["model"] == "SmolLM2-135M.Q8_0.gguf"
    chain = spec["draftwise"]["drafter_chain"]
    assert chain[0]["model"] == "dflash-draft" and "model" not in chain[1]
    assert spec["num_speculative_tokens"] == 3  # the rest as it was
    assert resp.json()["speculative_depth"] == "adaptive"


def test_public_spec_config_keeps_bare_names_and_other_values() -> None:
    assert public_spec_config({"model": "draft.gguf", "k": [1, "/x/y"]}) == {
        "model": "draft.gguf", "k": [1, "/x/y"]}
    assert public_spec_config({"model": "/"}) == {"model": "/"}
    assert public_spec_config(None) is None
