"""Many requests at once, clients that leave, faults, graceful stop (fake engine)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import ExitStack

import httpx
import openai
import pytest
from draftwise.server import ServerConfig, create_app
from draftwise.server.runner import ServerThread
from server_fakes import MODEL, FakeEngine, serving


def wait_idle(url: str, timeout: float = 5.0) -> dict:
    """Poll /health until no request is in flight and no KV block is used."""
    deadline = time.monotonic() + timeout
    health: dict = {}
    while time.monotonic() < deadline:
        health = httpx.get(f"{url}/health", timeout=5).json()
        if health["num_requests"] == 0 and health["kv_used_blocks"] == 0:
            return health
        time.sleep(0.02)
    raise AssertionError(f"server not idle after {timeout}s: {health}")


def test_32_concurrent_streams_match_one_by_one():
    engine = FakeEngine(max_num_seqs=8, step_delay=0.001)
    prompts = [f"prompt number {i} " + "x" * (i % 7) for i in range(32)]
    max_tokens = 16

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int]:
        text, usage = "", 0
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return text, usage

    async def run_all(url: str) -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                                      timeout=20) as client:
            return await asyncio.wait_for(
                asyncio.gather(*(one(client, p) for p in prompts)), timeout=30)

    with serving(engine) as url:
        results = asyncio.run(run_all(url))
        wait_idle(url)
    for prompt, (text, n) in zip(prompts, results):
        assert text == engine.greedy_text([ord(c) for c in prompt], max_tokens)
        assert n == max_tokens
    assert engine.aborted == []


def test_disconnect_mid_stream_aborts_and_frees_blocks():
    engine = FakeEngine(step_delay=0.01)
    with serving(engine) as url:
        other = {}

        def bystander() -> None:
            r = httpx.post(f"{url}/v1/completions", json={
                "prompt": "bystander", "max_tokens": 40, "temperature": 0}, timeout=20)
            other["text"] = r.json()["choices"][0]["text"]

        t = threading.Thread(target=bystander)
        t.start()
        body = {"prompt": "long one", "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            request_id = json.loads(first[6:])["id"]
            next(lines)
            assert httpx.get(f"{url}/health").json()["kv_used_blocks"] > 0
        # leaving the block closed the connection mid-stream
        t.join(20)
        wait_idle(url)
    assert request_id in engine.aborted
    assert other["text"] == engine.greedy_text([ord(c) for c in "bystander"], 40)


def test_disconnect_while_waiting_for_non_streamed_result():
    engine = FakeEngine(step_delay=0.01)
    with serving(engine) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={"prompt": "slow", "max_tokens": 200},
                       timeout=0.3)
        wait_idle(url)
    assert len(engine.aborted) == 1


def test_malformed_request_while_a_good_one_streams():
    engine = FakeEngine(step_delay=0.005)
    with serving(engine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)
        stream = client.completions.create(model=MODEL, prompt="good", max_tokens=30,
                                           temperature=0, stream=True)
        text = next(iter(stream)).choices[0].text
        bad = httpx.post(f"{url}/v1/completions", content=b"{nope",
                         headers={"content-type": "application/json"})
        assert bad.status_code == 400
        text += "".join(c.choices[0].text for c in stream)
        assert text == engine.greedy_text([ord(c) for c in "good"], 30)
        wait_idle(url)


def test_step_failure_fails_in_flight_requests_not_the_loop():
    engine = FakeEngine(step_delay=0.005)
    with serving(engine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)
        stream = client.completions.create(model=MODEL, prompt="doomed", max_tokens=100,
                                           stream=True)
        next(iter(stream))
        engine.fail_next_step = True
        with pytest.raises(openai.APIError, match="injected step failure"):
            for _ in stream:
                pass
        wait_idle(url)
        after = client.completions.create(model=MODEL, prompt="fine", max_tokens=5)
        assert after.usage.completion_tokens == 5
        engine.fail_next_step = True
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 50})
        assert r.status_code == 500 and "injected" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_exception_in_one_request_fails_only_that_request():
    engine = FakeEngine(step_delay=0.005)
    with serving(engine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)
        stream = client.completions.create(model=MODEL, prompt="ok", max_tokens=30,
                                           temperature=0, stream=True)
        text = next(iter(stream)).choices[0].text
        r = httpx.post(f"{url}/v1/chat/completions",
                       json={"messages": [{"role": "explode", "content": "x"}]})
        assert r.status_code == 500
        assert "template exploded" in r.json()["error"]["message"]
        text += "".join(c.choices[0].text for c in stream)
        assert text == engine.greedy_text([ord(c) for c in "ok"], 30)


def test_graceful_stop_finishes_in_flight_stream():
    engine = FakeEngine(step_delay=0.01)
    thread = ServerThread(create_app(engine, ServerConfig(served_model_names=(MODEL,))),
                          shutdown_timeout=10)
    url = thread.start()
    body = {"prompt": "finish me", "max_tokens": 60, "temperature": 0, "stream": True}
    stopper = threading.Thread(target=thread.stop)
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=20) as r:
        lines = r.iter_lines()
        chunks = [next(line for line in lines if line.startswith("data: "))]
        stopper.start()
        time.sleep(0.1)
        # still listening while it drains: a late request gets the documented 503 body
        late = httpx.post(f"{url}/v1/completions", json={"prompt": "late"}, timeout=5)
        assert late.status_code == 503
        assert late.json()["error"] == {"message": "the server is shutting down",
                                        "type": "service_unavailable_error", "param": None,
                                        "code": "shutting_down"}
        assert httpx.get(f"{url}/health", timeout=5).json()["status"] == "draining"
        chunks += [line for line in lines if line.startswith("data: ")]
    stopper.join(15)
    assert not thread.thread.is_alive()
    assert chunks[-1] == "data: [DONE]"
    text = "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks[:-1])
    assert text == engine.greedy_text([ord(c) for c in "finish me"], 60)
    assert engine.requests == {} and engine.aborted == []


def test_shutdown_timeout_ends_every_stream_with_an_error_event_and_done():
    engine = FakeEngine(step_delay=0.01)
    thread = ServerThread(create_app(engine, ServerConfig(served_model_names=(MODEL,))),
                          shutdown_timeout=0.3)
    url = thread.start()
    body = {"prompt": "never ends", "max_tokens": 240, "stream": True}
    with ExitStack() as streams:
        readers = []
        for i in range(2):
            r = streams.enter_context(httpx.stream(
                "POST", f"{url}/v1/completions", json={**body, "prompt": f"never ends {i}"},
                timeout=20))
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            next(lines)
            readers.append(lines)
        answers: list[httpx.Response] = []
        blocking = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/v1/completions", json={"prompt": "waits", "max_tokens": 240}, timeout=20)))
        blocking.start()
        for _ in range(500):  # until the non-streamed one is in the engine too
            if len(engine.requests) == 3:
                break
            time.sleep(0.01)
        thread.stop()
        assert not thread.thread.is_alive()
        tails = [list(lines)[-2:] for lines in readers]
    blocking.join(10)
    assert answers[0].status_code == 503
    assert "shutdown timeout expired" in answers[0].json()["error"]["message"]
    for tail in tails:
        assert tail[-1] == "data: [DONE]"
        error = json.loads(tail[0][6:])["error"]
        assert error["type"] == "service_unavailable_error"
        assert "shutdown timeout expired" in error["message"]
    assert engine.requests == {}
    assert len(engine.aborted) == 3
