"""The server on the real default model, driven by the official ``openai`` client.

Two servers per module: speculation off in this process (uvicorn in a thread, so tests
can also look at ``engine.kv``), and n-gram on as a real ``draftwise serve`` process
(the CLI path end to end; the module's last test sends it SIGTERM mid-stream). Both
load the model at the same time. Every request is greedy and short (the 135M model is
~30 tok/s on CPU).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs
from draftwise.server import ServerConfig, create_app
from draftwise.server.runner import ServerThread
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.default_model

MODEL = "smollm2"
KEY = "test-key"
# fixed depth: the server tests count drafts and accepted drafts, which adaptive depth
# (the default) may not make on a loaded machine; seeded samples are reproducible only
# at fixed depth (docs/sampling.md, [n])
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 4, "draftwise": {"adaptive": False}}
REPEAT = ("Repeat this list exactly: apple, banana, cherry, apple, banana, cherry, apple, "
          "banana, cherry.")
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "1, 2, 3, 4, 5, 6,",
    "The quick brown fox jumps over",
    "In machine learning, a tensor is",
    "Water boils at a temperature of",
    "My favourite programming language is",
    "Here is a haiku about the sea:",
    "The three primary colours are",
    "SELECT name FROM users WHERE",
    "A list of fruits: apple, banana,",
    "To make a cup of tea, first",
    "The largest planet in our solar system is",
    "import numpy as np\n",
    "Dear Sir or Madam, I am writing to",
]


#: the n-gram server's log lines (after its ready line), for failure messages
STDERR: list[str] = []


def serve_cmd(*args: str) -> list[str]:
    """The installed console script when present, else the module."""
    exe = shutil.which("draftwise")
    base = [exe, "serve"] if exe else [sys.executable, "-m", "draftwise.cli.serve"]
    return [*base, *args]


def _spawn_ngram_server() -> tuple[subprocess.Popen[str], str]:
    """``draftwise serve`` with the n-gram config; returns once the port is known."""
    proc = subprocess.Popen(
        serve_cmd("--port", "0", "--speculative-config", json.dumps(NGRAM), "--api-key", KEY,
                  "--served-model-name", MODEL, "--max-model-len", "1024",
                  "--log-level", "warning"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "draftwise serving 'smollm2' on http://127.0.0.1:PORT ..."
    assert " on http://" in line, line + proc.stderr.read()
    # keep reading its log so a chatty server never blocks on a full pipe
    threading.Thread(target=STDERR.extend, args=(proc.stderr,), daemon=True).start()
    return proc, line.split(" on ")[1].split()[0]


def _wait_up(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up in {timeout}s")


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, Any]]:
    """{"off": (url, engine), "ngram": (url, process)}; both require the API key."""
    proc, ngram_url = _spawn_ngram_server()  # loads while this process loads its engine
    thread = None
    try:
        engine = LLMEngine(EngineArgs(max_model_len=1024, num_kv_blocks=1024, max_num_seqs=32))
        app = create_app(engine, ServerConfig(served_model_names=(MODEL,), api_key=KEY))
        thread = ServerThread(app, shutdown_timeout=5)
        off_url = thread.start()
        _wait_up(ngram_url)
        yield {"off": (off_url, engine), "ngram": (ngram_url, proc)}
    finally:
        if thread is not None:
            thread.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def wait_idle(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """Poll /health until nothing is in flight and the allocator holds no block."""
    deadline = time.monotonic() + timeout
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        health = httpx.get(f"{url}/health", timeout=5).json()
        if health["num_requests"] == 0 and health["kv_used_blocks"] == 0:
            return health
        time.sleep(0.05)
    raise AssertionError(f"not idle after {timeout}s: {health}")


@pytest.mark.parametrize("mode", ["off", "ngram"])
def test_completion_stream_and_usage(served, mode):
    url, engine = served[mode][0], served["off"][1]
    c = client(url)
    kwargs = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
    full = c.completions.create(**kwargs)
    chunks = list(
        c.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == full.choices[0].text and full.choices[0].text
    n_prompt = len(engine.tokenize_prompt(PROMPTS[0])[1])
    assert full.usage.prompt_tokens == n_prompt == chunks[-1].usage.prompt_tokens
    assert full.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert full.usage.completion_tokens <= 12
    if full.choices[0].finish_reason == "length":
        assert full.usage.completion_tokens == 12


@pytest.mark.parametrize("mode", ["off", "ngram"])
def test_chat_stream_and_usage(served, mode):
    url, _ = served[mode]
    c = client(url)
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": REPEAT}],
        "max_completion_tokens": 16,
        "temperature": 0,
    }
    full = c.chat.completions.create(**kwargs)
    chunks = list(
        c.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens <= 16
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens


def test_ngram_gives_identical_greedy_text_and_counts_drafts(served):
    off_url, ng_url = served["off"][0], served["ngram"][0]

    def spec_totals() -> dict[str, float]:
        text = httpx.get(f"{ng_url}/metrics").text
        return {
            s.name: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name.startswith("draftwise:spec_decode_num_")
            and s.name.endswith("_total")
            and "position" not in s.labels
        }

    before = spec_totals()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": REPEAT}],
        "max_tokens": 24,
        "temperature": 0,
        "return_spec_metrics": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    off = httpx.post(
        f"{off_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ).json()
    ng = httpx.post(f"{ng_url}/v1/chat/completions", json=body, headers=headers, timeout=60).json()
    assert ng["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
    assert ng["usage"] == off["usage"]
    assert off["metrics"] == {"speculative_decoding": None}
    per_request = ng["metrics"]["speculative_decoding"]
    assert per_request["num_draft_tokens"] > 0
    after = spec_totals()
    drafted = "draftwise:spec_decode_num_draft_tokens_total"
    assert after[drafted] - before[drafted] == per_request["num_draft_tokens"]
    assert (
        after["draftwise:spec_decode_num_drafts_total"]
        > before["draftwise:spec_decode_num_drafts_total"]
    )
    prompt = {"model": MODEL, "prompt": "a b c a b c a b c a b", "max_tokens": 16, "temperature": 0}
    texts = [
        httpx.post(f"{u}/v1/completions", json=prompt, headers=headers, timeout=60).json()[
            "choices"
        ][0]["text"]
        for u in (off_url, ng_url)
    ]
    assert texts[0] == texts[1]


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
    "required": ["name", "age", "fruits"],
    "additionalProperties": False,
}


def test_json_schema_with_ngram_identical_to_off_and_valid(served):
    """The issue's bar: response_format json_schema through the openai client, n-gram
    speculation on, token for token what speculation off gives; the JSON validates."""
    kwargs = {
        "model": MODEL, "max_tokens": 128, "temperature": 0,
        "messages": [{"role": "user", "content": "Describe Ann, 31, who likes apple, banana, "
                      "cherry, apple, banana, cherry, as JSON."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        "extra_body": {"return_spec_metrics": True},
    }
    off = client(served["off"][0]).chat.completions.create(**kwargs)
    ng = client(served["ngram"][0]).chat.completions.create(**kwargs)
    text = off.choices[0].message.content
    assert ng.choices[0].message.content == text and ng.usage == off.usage
    assert off.choices[0].finish_reason == "stop"
    data = json.loads(text)
    assert set(data) == {"name", "age", "fruits"} and isinstance(data["age"], int)
    assert all(isinstance(f, str) for f in data["fruits"]) and len(data["fruits"]) <= 6
    assert ng.model_extra["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] > 0
    for mode in ("off", "ngram"):  # vLLM's extras, on completions too
        out = client(served[mode][0]).completions.create(
            model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=8, temperature=0,
            extra_body={"guided_choice": [" yes", " no"]})
        assert out.choices[0].text in (" yes", " no")
    with pytest.raises(openai.BadRequestError) as info:
        client(served["ngram"][0]).chat.completions.create(**{**kwargs, "response_format": {
            "type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "objectx"}}}})
    assert info.value.body["param"] == "response_format.json_schema.schema"
    wait_idle(served["ngram"][0])


@pytest.fixture(scope="module")
def one_by_one(served) -> dict[str, str]:
    """8 prompts of different lengths run alone, greedy, 8 tokens, without speculation.

    The reference for both modes: n-gram must match the plain engine anyway, and one
    reference costs 8 sequential requests instead of 16.
    """
    c = client(served["off"][0])
    return {p: c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
            .choices[0].text for p in PROMPTS[::2]}


@pytest.mark.parametrize("mode", ["off", "ngram"])
def test_32_concurrent_streams_equal_one_by_one(served, one_by_one, mode):
    url = served[mode][0]
    prompts = list(one_by_one) * 4
    max_tokens = 8

    async def one(ac: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await ac.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        return "".join([ch.choices[0].text async for ch in stream if ch.choices])

    async def run_all() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60
        ) as ac:
            return await asyncio.wait_for(asyncio.gather(*(one(ac, p) for p in prompts)), 60)

    results = asyncio.run(run_all())
    assert results == [one_by_one[p] for p in prompts]
    wait_idle(url)  # /health: no request in flight, zero KV blocks in use
    if mode == "off":
        assert served["off"][1].kv.num_used_blocks == 0


def test_disconnect_mid_stream_frees_blocks(served):
    url, engine = served["off"]
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "model": MODEL,
        "prompt": PROMPTS[2],
        "max_tokens": 300,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=30) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        first = json.loads(next(lines)[6:])
        next(lines)
        assert httpx.get(f"{url}/health").json()["kv_used_blocks"] > 0
    assert first["choices"][0]["finish_reason"] is None
    good = client(url).completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=8)
    assert good.usage.completion_tokens > 0
    wait_idle(url)
    assert engine.kv.num_used_blocks == 0


def test_malformed_request_while_a_good_one_streams(served):
    url, _ = served["off"]
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    c = client(url)
    stream = c.completions.create(
        model=MODEL, prompt=PROMPTS[3], max_tokens=16, temperature=0, stream=True
    )
    text = next(iter(stream)).choices[0].text
    bad = httpx.post(
        f"{url}/v1/completions", content=b'{"prompt": "x", "max_tokens": }', headers=headers
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    too_long = httpx.post(
        f"{url}/v1/completions", headers=headers, json={"prompt": "x", "max_tokens": 5000}
    )
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    text += "".join(ch.choices[0].text for ch in stream)
    assert (
        text
        == c.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=16, temperature=0)
        .choices[0]
        .text
    )


#: hostile requests (body bytes), the status and the field each must name
HOSTILE: list[tuple[str, bytes, int, str]] = [
    ("/v1/completions", b'{"prompt": "x", "temperature": 1, "top_k": 9223372036854775808}',
     400, "top_k"),
    ("/v1/completions", b'{"prompt": "x", "temperature": 1e39}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "x", "temperature": Infinity}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "x", "top_p": NaN}', 400, "top_p"),
    ("/v1/completions", b'{"prompt": "x", "seed": 18446744073709551616}', 400, "seed"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 9223372036854775808}', 400,
     "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "stop_token_ids": [49152]}', 400, "stop_token_ids"),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": ["s"] * 65}).encode(), 400, "stop"),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80"}', 400, "prompt"),  # CESU-8
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', 400,
     "messages[0].content"),
    ("/v1/completions", b'{"prompt": "x", "user": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400,
     "user"),
    ("/v1/completions", json.dumps({"prompt": "word " * 20_000}).encode(), 400, "prompt"),
]


def test_hostile_requests_fail_alone_by_name_and_a_greedy_stream_is_unchanged(
        served, one_by_one):
    """Each hostile request is a 4xx naming its field; a greedy stream running all the
    while is token-identical to its solo run; the largest sampler that validation
    accepts runs (its tensors built next to the greedy row); no KV block is left."""
    url, engine = served["off"]
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    prompt = next(iter(one_by_one))
    stream = client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                            temperature=0, stream=True)
    text = next(iter(stream)).choices[0].text
    for path, body, status, param in HOSTILE:
        r = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=60)
        assert r.status_code == status, (body[:80], r.text)
        assert r.json()["error"]["param"] == param, r.text
    widest = {"prompt": "Hi", "max_tokens": 3, "temperature": 3.4e38, "top_k": 2**63 - 1,
              "top_p": 1e-300, "min_p": 1.0, "seed": 2**64 - 1, "stop": ["s" * 1024] * 64}
    assert httpx.post(f"{url}/v1/completions", json=widest, headers=headers,
                      timeout=60).status_code == 200
    text += "".join(ch.choices[0].text for ch in stream)
    assert text == one_by_one[prompt]
    wait_idle(url)
    assert engine.kv.num_used_blocks == 0


def test_errors_and_auth(served):
    url, _ = served["off"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    c = client(url)
    assert [m.id for m in c.models.list().data] == [MODEL]
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert info.value.param == "model"
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, n=129)
    assert info.value.param == "n"
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, logit_bias={"99999999": 1})
    assert info.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                  max_tokens=2, top_logprobs=3)
    assert info.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                  max_tokens=2, logprobs=True, top_logprobs=21)
    assert info.value.param == "top_logprobs" and "top_logprobs" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=MODEL, prompt="word " * 1100, max_tokens=2)
    assert info.value.param == "prompt"
    families = {f.name for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    assert {
        "draftwise:time_to_first_token_seconds",
        "draftwise:e2e_request_latency_seconds",
        "draftwise:inter_token_latency_seconds",
    } <= families


def _close_logprobs(a: list[dict], b: list[dict]) -> None:
    """Chat logprobs content lists equal: same tokens, log-probabilities within 1e-4."""
    assert [e["token"] for e in a] == [e["token"] for e in b]
    for x, y in zip(a, b):
        assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)
        assert [t["token"] for t in x["top_logprobs"]] == [t["token"] for t in y["top_logprobs"]]


def test_prompt_logprobs_identical_with_ngram(served):
    """vLLM's completions extra: one entry per prompt token (the first None), the actual
    token and the top-n; n-gram speculation does not change them."""
    off_url, ng_url = served["off"][0], served["ngram"][0]
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": REPEAT, "max_tokens": 8, "temperature": 0,
            "prompt_logprobs": 2}
    off, ng = (httpx.post(f"{u}/v1/completions", json=body, headers=headers,
                          timeout=60).json() for u in (off_url, ng_url))
    assert ng["choices"][0]["text"] == off["choices"][0]["text"]
    a, b = off["choices"][0]["prompt_logprobs"], ng["choices"][0]["prompt_logprobs"]
    assert len(a) == off["usage"]["prompt_tokens"] == len(b)
    assert a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:]):
        assert list(x) == list(y) and len(x) in (2, 3)
        assert sorted(e["rank"] for e in x.values())[:2] == [1, 2]
        for t in x:
            assert x[t]["rank"] == y[t]["rank"]
            assert x[t]["logprob"] == pytest.approx(y[t]["logprob"], abs=1e-4)
    assert "prompt_logprobs" not in httpx.post(
        f"{off_url}/v1/completions", json={**body, "prompt_logprobs": None}, headers=headers,
        timeout=60).json()["choices"][0]
    # streamed (n = 2): each choice's first chunk carries the same list, no later chunk does
    for url in (off_url, ng_url):
        events = _sse(url, "/v1/completions", {**body, "stream": True, "n": 2})
        firsts = {}
        for ev in events:
            choice = ev["choices"][0]
            if choice["index"] not in firsts:
                firsts[choice["index"]] = choice.get("prompt_logprobs")
            else:
                assert "prompt_logprobs" not in choice
        assert sorted(firsts) == [0, 1]
        for got in firsts.values():
            assert got[0] is None and len(got) == len(a)
            for x, y in zip(got[1:], a[1:]):
                assert list(x) == list(y)
                assert all(x[t]["logprob"] == pytest.approx(y[t]["logprob"], abs=1e-4)
                           for t in x)
    # chat: the response's top-level prompt_logprobs (vLLM's place), the same under n-gram
    chat = {"model": MODEL, "messages": [{"role": "user", "content": REPEAT}], "max_tokens": 8,
            "temperature": 0, "prompt_logprobs": 1}
    c_off, c_ng = (httpx.post(f"{u}/v1/chat/completions", json=chat, headers=headers,
                              timeout=60).json() for u in (off_url, ng_url))
    assert c_off["choices"][0]["message"] == c_ng["choices"][0]["message"]
    pa, pb = c_off["prompt_logprobs"], c_ng["prompt_logprobs"]
    assert len(pa) == c_off["usage"]["prompt_tokens"] == len(pb) and pa[0] is None
    for x, y in zip(pa[1:], pb[1:]):
        assert list(x) == list(y)
        assert all(x[t]["logprob"] == pytest.approx(y[t]["logprob"], abs=1e-4) for t in x)
    assert "prompt_logprobs" not in httpx.post(
        f"{off_url}/v1/chat/completions", json={**chat, "prompt_logprobs": None},
        headers=headers, timeout=60).json()
    refused = httpx.post(f"{off_url}/v1/chat/completions", json={**chat, "stream": True},
                         headers=headers, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs"
    assert "/v1/completions" in refused.json()["error"]["message"]  # what works instead
    wait_idle(off_url)
    wait_idle(ng_url)


def _sse(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a streamed response (without [DONE])."""
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def test_penalties_bias_and_logprobs_are_identical_with_ngram(served):
    off_url, ng_url = served["off"][0], served["ngram"][0]
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": REPEAT}], "max_tokens": 24,
        "temperature": 0, "logprobs": True, "top_logprobs": 5, "presence_penalty": 0.4,
        "frequency_penalty": 0.2, "repetition_penalty": 1.05, "logit_bias": {"28": -3.0},
        "min_tokens": 4, "return_spec_metrics": True,
    }
    off, ng = (httpx.post(f"{u}/v1/chat/completions", json=body, headers=headers,
                          timeout=60).json() for u in (off_url, ng_url))
    assert ng["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
    assert ng["usage"] == off["usage"]
    assert ng["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] > 0
    lp_off, lp_ng = off["choices"][0]["logprobs"]["content"], ng["choices"][0]["logprobs"]["content"]
    assert len(lp_ng) == ng["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 5 for e in lp_ng)
    _close_logprobs(lp_ng, lp_off)
    # streamed: the same text, and the chunks' logprobs add up to the same list
    extras = ("return_spec_metrics", "repetition_penalty", "min_tokens")  # vLLM's extra body
    chunks = list(client(ng_url).chat.completions.create(
        **{k: v for k, v in body.items() if k not in extras}, stream=True,
        extra_body={"repetition_penalty": 1.05, "min_tokens": 4}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == off["choices"][0]["message"]["content"]
    streamed = [e.model_dump() for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    _close_logprobs(streamed, lp_off)
    # completions: logprobs is an int
    prompt = {"model": MODEL, "prompt": "a b c a b c a b c a b", "max_tokens": 16,
              "temperature": 0, "logprobs": 3, "frequency_penalty": -0.5}
    comp = [httpx.post(f"{u}/v1/completions", json=prompt, headers=headers,
                       timeout=60).json()["choices"][0] for u in (off_url, ng_url)]
    assert comp[0]["text"] == comp[1]["text"]
    assert comp[0]["logprobs"]["tokens"] == comp[1]["logprobs"]["tokens"]
    assert "".join(comp[1]["logprobs"]["tokens"]) == comp[1]["text"]
    assert comp[1]["logprobs"]["token_logprobs"] == pytest.approx(
        comp[0]["logprobs"]["token_logprobs"], abs=1e-4)
    assert all(len(t) == 3 for t in comp[1]["logprobs"]["top_logprobs"])
    wait_idle(off_url)


def test_n_choices_with_a_seed_are_reproducible_under_ngram(served):
    ng_url = served["ngram"][0]
    kwargs = {"model": MODEL, "prompt": "a b c a b c a b c a b", "max_tokens": 12,
              "temperature": 0.8, "seed": 11, "n": 3}
    first = client(ng_url).completions.create(**kwargs)
    again = client(ng_url).completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.usage.completion_tokens == 36 and first.usage.prompt_tokens > 0
    chunks = list(client(ng_url).completions.create(**kwargs, stream=True))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)}
    assert [texts[i] for i in range(3)] == [c.text for c in first.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert finishes == ["length"] * 3
    chat = client(ng_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": REPEAT}], max_tokens=8,
        temperature=0.7, seed=5, n=2)
    assert [c.index for c in chat.choices] == [0, 1]
    wait_idle(ng_url)


def test_zz_sigterm_mid_stream_drains_and_exits_0(served):
    """Last in the module: the n-gram server process gets SIGTERM mid-stream."""
    url, proc = served["ngram"]
    body = {"model": MODEL, "prompt": PROMPTS[4], "max_tokens": 24, "temperature": 0,
            "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                      timeout=60) as r:
        events = (line for line in r.iter_lines() if line.startswith("data: "))
        first = next(events)
        proc.send_signal(signal.SIGTERM)
        rest = list(events)
    assert json.loads(first[6:])["model"] == MODEL
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")
    proc.wait(timeout=30)
    assert proc.returncode == 0, "".join(STDERR[-40:])
