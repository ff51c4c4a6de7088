"""``--draft-index-scope``: which requests reach suffix decoding's global index together.

Over HTTP on a tiny engine with ``suffix``: under "user" (the default) a request is keyed
by its ``user`` field, and one without it records and reads nothing globally; "server"
shares one index; "off" none. Output is the target's either way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from server_fakes import serving
from tiny_checkpoints import TINY, save_tiny, write_wordlevel_tokenizer

from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs
from draftwise.server import ServerConfig
from draftwise.server.protocol import CompletionRequest
from draftwise.server.serving import isolation_key

SUFFIX = {"method": "suffix", "num_speculative_tokens": 4}
PROMPT = [5, 9, 13, 2, 7, 11]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("llama", tmp_path_factory.mktemp("scope-llama"), seed=3)
    write_wordlevel_tokenizer(path, ["[UNK]"] + [f"w{i}" for i in range(1, TINY["vocab_size"])])
    return path


def complete(url: str, **extra) -> str:
    reply = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def user_key(user: str) -> str:
    return "user:" + hashlib.sha256(user.encode()).hexdigest()


def keys_seen(engine: LLMEngine) -> set[str]:
    return set(engine.spec.drafters[0].proposer.global_index.streams)


@pytest.mark.parametrize(("scope", "expected"), [
    ("user", {"alice", "bob"}), ("server", {"server"}), ("off", set())])
def test_scope_decides_the_keys(tiny: Path, scope: str, expected: set[str]) -> None:
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", speculative_config=SUFFIX))
    kwargs = {} if scope == "user" else {"draft_index_scope": scope}
    with serving(engine, **kwargs) as url:
        texts = {complete(url, user="alice"), complete(url, user="bob"), complete(url)}
    assert len(texts) == 1  # the same greedy output whoever drafted it
    if scope == "user":
        expected = {user_key(u) for u in expected}
    assert keys_seen(engine) == expected


def test_isolation_key_mapping() -> None:
    config = ServerConfig(served_model_names=("m",))
    assert config.draft_index_scope == "user"  # the safe default
    with_user = CompletionRequest(prompt="x", user="u1")
    without = CompletionRequest(prompt="x")
    assert isolation_key(config, with_user) == user_key("u1")
    # a digest: the same size for any user, and the name itself is not kept
    assert len(isolation_key(config, CompletionRequest(prompt="x", user="u" * 10_000))) == 69
    assert isolation_key(config, without) is None
    shared = ServerConfig(served_model_names=("m",), draft_index_scope="server")
    assert isolation_key(shared, without) == "server"
    off = ServerConfig(served_model_names=("m",), draft_index_scope="off")
    assert isolation_key(off, with_user) is None
    with pytest.raises(ValueError, match="draft_index_scope"):
        ServerConfig(served_model_names=("m",), draft_index_scope="key")  # type: ignore[arg-type]
