"""``draftwise serve --replicas 2`` end to end: a local Ray head on loopback, two replicas of
a tiny checkpoint with ngram speculation on, behind the Ray Serve ingress.

One Ray cluster for the module (started with its own temp dir and stopped by the fixture,
under a hard timeout): the single-process server's core cases pass through the endpoint;
greedy outputs equal the single-process server's (speculation on and off); a shared prefix
stays on the replica that holds it; a replica killed mid-stream ends the stream with an
error event and ``[DONE]`` within a bound, /health says degraded while it is down, and
the next request succeeds; a replica that cannot load its model fails the deployment
with the engine's error.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tiny_checkpoints import TINY, save_tiny, write_wordlevel_tokenizer

ray = pytest.importorskip("ray")

from draftwise.scale import ReplicaSpec, ReplicaStartError, Scaling
from draftwise.scale.app import deploy
from draftwise.scale.replica import REPLICA_HEADER
from draftwise.server import ServerConfig
from ray import serve

pytestmark = pytest.mark.slow

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
PORT = 18931
#: seconds a killed replica's stream may take to end
KILL_BOUND = 20.0
#: a shared "system prompt" of 6 blocks of 4, then per-request tails
SHARED = [5, 9, 13, 2, 7, 11, 4, 8, 12, 3, 6, 10, 5, 9, 13, 2, 7, 11, 4, 8, 12, 3, 6, 10]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("llama", tmp_path_factory.mktemp("ray-llama"), seed=3)
    write_wordlevel_tokenizer(path, ["[UNK]"] + [f"w{i}" for i in range(1, TINY["vocab_size"])])
    return path


def spec_for(model: str, speculative: str | None = NGRAM) -> ReplicaSpec:
    return ReplicaSpec(model=model, speculative_config=speculative, dtype="bfloat16",
                       engine_kwargs={"num_threads": 1, "block_size": 4},
                       config=ServerConfig(served_model_names=("tiny",), api_key=KEY))


@pytest.fixture(scope="module")
def endpoint(tiny: Path) -> Iterator[str]:
    temp = tempfile.mkdtemp(prefix="dw-ray-")
    ray.init(address="local", num_cpus=3, include_dashboard=False,  # 2 replicas + a broken one
             _node_ip_address="127.0.0.1", _temp_dir=temp, logging_level="WARNING",
             log_to_driver=False)
    try:
        deploy(spec_for(str(tiny)), Scaling(replicas=2), "127.0.0.1", PORT)
        yield f"http://127.0.0.1:{PORT}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def complete(url: str, prompt: Any, **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, **extra})


# -- the single-process server's core cases, through the endpoint --------------------------

def test_auth_models_and_error_shapes(endpoint: str) -> None:
    denied = httpx.post(f"{endpoint}/v1/completions", json={"prompt": [1], "model": "tiny"})
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_api_key"
    models = httpx.get(f"{endpoint}/v1/models", headers=AUTH)
    assert [m["id"] for m in models.json()["data"]] == ["tiny"]
    bad = complete(endpoint, [1, 2], max_tokens=-1)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    wrong = complete(endpoint, [1, 2], model="nope")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{endpoint}/version").json()["speculative_config"]["method"] == "ngram"


def test_stream_and_chat(endpoint: str) -> None:
    with httpx.stream("POST", f"{endpoint}/v1/completions", headers=AUTH, timeout=60, json={
            "model": "tiny", "prompt": [5, 9, 13], "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "stream": True}) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in reply.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in lines[:-1])
    assert text == complete(endpoint, [5, 9, 13], max_tokens=8).json()["choices"][0]["text"]


# -- lossless through the replicas ----------------------------------------------------------

async def _single_process(model: str, speculative: str | None, prompts: list[list[int]]) -> list[str]:
    """The same requests through the single-process app (in-process, lifespan run)."""
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs
    from draftwise.server.app import create_app

    engine = LLMEngine(EngineArgs(model=model, dtype="bfloat16", block_size=4,
                                  speculative_config=speculative))
    app = create_app(engine, ServerConfig(served_model_names=("tiny",)))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        texts = []
        for p in prompts:
            r = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0,
                "ignore_eos": True})
            texts.append(r.json()["choices"][0]["text"])
    return texts


def test_greedy_outputs_equal_the_single_process_server(endpoint: str, tiny: Path) -> None:
    prompts = [SHARED[:10], [3, 3, 3, 3, 3, 3], [7, 1, 7, 1, 7, 1, 7, 1, 7], SHARED + [1, 2]]
    via_ray = [complete(endpoint, p).json()["choices"][0]["text"] for p in prompts]
    assert via_ray == asyncio.run(_single_process(str(tiny), NGRAM, prompts))
    assert via_ray == asyncio.run(_single_process(str(tiny), None, prompts))  # lossless


# -- routing ------------------------------------------------------------------------------

def test_a_shared_prefix_lands_on_the_replica_holding_it(endpoint: str) -> None:
    first = complete(endpoint, SHARED + [1])
    home = first.headers[REPLICA_HEADER]
    for tail in ([2], [3, 4], [5, 6, 7], [8]):  # sequential: load never breaks the tie
        assert complete(endpoint, SHARED + tail).headers[REPLICA_HEADER] == home
    others = {complete(endpoint, [40 + i, 41, 42, 43, 44, 45, 46, 47, 48]).headers[REPLICA_HEADER]
              for i in range(4)}
    assert len(others | {home}) == 2  # new prefixes also use the other replica


# -- faults ---------------------------------------------------------------------------------

def _kill(replica: str) -> None:
    actor = ray.get_actor(f"SERVE_REPLICA::draftwise#EngineReplica#{replica}", namespace="serve")
    ray.kill(actor, no_restart=False)


def _health(url: str) -> str:
    return str(httpx.get(f"{url}/health", timeout=10).json()["status"])


def test_a_replica_killed_mid_stream_ends_its_stream_and_is_replaced(endpoint: str) -> None:
    events: list[str] = []
    with httpx.stream("POST", f"{endpoint}/v1/completions", headers=AUTH, timeout=60, json={
            "model": "tiny", "prompt": [9, 8, 7, 6], "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}) as reply:
        lines = reply.iter_lines()
        for line in lines:  # the first event: the stream is running on its replica
            if line.startswith("data: "):
                events.append(line)
                break
        _kill(reply.headers[REPLICA_HEADER])
        killed = time.monotonic()
        events.extend(ln for ln in lines if ln.startswith("data: "))
        ended = time.monotonic() - killed
    assert ended < KILL_BOUND
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "replica_unavailable"
    assert complete(endpoint, [1, 2, 3]).status_code == 200  # routed around it at once
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not ("degraded" in seen and seen[-1] == "ok"):
        seen.append(_health(endpoint))
        time.sleep(0.3)
    assert "degraded" in seen, seen  # while the replacement started
    assert seen[-1] == "ok", seen  # Ray restarted it


def test_a_replica_that_cannot_load_fails_the_deployment_with_the_engine_error(
        endpoint: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model.gguf")
    with pytest.raises(ReplicaStartError) as info:
        deploy(spec_for(missing, None), Scaling(replicas=1), "127.0.0.1", PORT,
               name="broken", route_prefix="/broken")
    assert "no-such-model.gguf" in str(info.value)
    assert "Traceback" not in str(info.value)
    serve.delete("broken")
