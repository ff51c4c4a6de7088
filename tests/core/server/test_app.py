"""Endpoints, OpenAI shapes and error bodies, against a fake engine (no model, fast)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from draftwise.server import ServerConfig
from prometheus_client.parser import text_string_to_metric_families
from server_fakes import MODEL, FakeEngine, serving


def test_completion_shape_and_usage(openai_client, engine):
    resp = openai_client.completions.create(model=MODEL, prompt="hello", max_tokens=7,
                                            temperature=0)
    assert resp.object == "text_completion"
    assert resp.id.startswith("cmpl-")
    assert resp.model == MODEL
    choice = resp.choices[0]
    assert choice.text == engine.greedy_text([ord(c) for c in "hello"], 7)
    assert choice.finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens,
            resp.usage.total_tokens) == (5, 7, 12)


def test_chat_shape_and_usage(openai_client):
    resp = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert len(resp.choices[0].message.content) == 5
    prompt_len = len("<user>hi<assistant>")
    assert resp.usage.prompt_tokens == prompt_len
    assert resp.usage.completion_tokens == 5


def test_chat_max_completion_tokens_and_content_parts(openai_client):
    resp = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_completion_tokens=3, temperature=0)
    assert resp.usage.completion_tokens == 3
    assert resp.usage.prompt_tokens == len("<user>hi<assistant>")


def test_chat_default_max_tokens_fills_context(openai_client, engine):
    resp = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0)
    prompt_len = len("<user>hi<assistant>")
    assert resp.usage.completion_tokens == engine.max_model_len - prompt_len


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_stream_concatenates_to_text(openai_client, include_usage):
    kwargs = {"model": MODEL, "prompt": "stream me", "max_tokens": 12, "temperature": 0}
    full = openai_client.completions.create(**kwargs).choices[0].text
    chunks = list(openai_client.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": include_usage}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == full
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.usage is None for c in chunks)


def test_chat_stream_raw_sse_format(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["usage"] is None
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    n_prompt = len("<user>x<assistant>")
    assert chunks[-1]["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 4,
                                   "total_tokens": n_prompt + 4}
    middle = chunks[1:-1]
    assert all("role" not in c["choices"][0]["delta"] for c in middle)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in middle).__len__() == 4


def test_stream_with_stop_string_spanning_steps():
    """Two tokens per step (fake speculation): streamed text still equals the final text."""
    engine = FakeEngine(speculative=True)
    with serving(engine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)
        base = client.completions.create(model=MODEL, prompt="abc", max_tokens=40,
                                          temperature=0).choices[0].text
        for start in range(3, 12):
            stop = base[start:start + 3]
            full = client.completions.create(model=MODEL, prompt="abc", max_tokens=40,
                                              temperature=0, stop=stop).choices[0].text
            streamed = "".join(
                c.choices[0].text for c in client.completions.create(
                    model=MODEL, prompt="abc", max_tokens=40, temperature=0, stop=stop,
                    stream=True))
            assert streamed == full
            assert stop not in full


def test_models_health_version(server):
    models = httpx.get(f"{server}/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL and models["data"][0]["object"] == "model"
    health = httpx.get(f"{server}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["kv_used_blocks"] == 0
    assert "version" in httpx.get(f"{server}/version").json()


def _error(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "n": 129}, "n"),
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "x", "logit_bias": {"5": 300}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"\u0663": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {" 5 ": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"5_0": 1}}, "logit_bias"),
        ({"prompt": "x", "best_of": 0}, "best_of"),
        ({"prompt": "x", "best_of": -1}, "best_of"),
        ({"prompt": "x", "min_tokens": 20, "max_tokens": 4}, "min_tokens"),
        ({"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
        ({"prompt": "x", "bad_words": [""]}, "bad_words"),
        ({"prompt": "x", "model": "nope"}, "model"),
        ({"prompt": "x", "max_tokens": 10_000}, "max_tokens"),
        ({"prompt": "x" * 300, "max_tokens": 1}, "prompt"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "max_tokenz": 3}, "max_tokenz"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": "x", "stream_options": {"include_usage": "yes"}},
         "stream_options.include_usage"),
    ],
)
def test_completion_bad_input_names_the_field(server, body, param):
    err = _error(httpx.post(f"{server}/v1/completions", json=body, timeout=10))
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert param.split(".")[0] in err["message"]


@pytest.mark.parametrize(("best_of", "words"), [(0, "at least 1"), (-3, "at least 1"),
                                             (2, "only 1 is")])
def test_best_of_says_what_is_wrong(server, best_of, words):
    """0 is invalid (OpenAI's minimum is 1), not 'best_of > 1 is not supported'."""
    err = _error(httpx.post(f"{server}/v1/completions",
                            json={"prompt": "x", "best_of": best_of}, timeout=10))
    assert err["param"] == "best_of" and words in err["message"], err
    assert f"{best_of}" in err["message"] and "> 1" not in err["message"], err


def test_logit_bias_names_the_bad_key_and_takes_good_ones(server):
    err = _error(httpx.post(f"{server}/v1/completions",
                            json={"prompt": "x", "logit_bias": {"5": 1, "\u0663": 1}},
                            timeout=10))
    assert err["param"] == "logit_bias" and "'\u0663'" in err["message"], err
    ok = httpx.post(f"{server}/v1/completions", timeout=30,
                    json={"prompt": "x", "max_tokens": 1, "logit_bias": {"5": 1, "10": -1}})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 999},
         "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
         "tools"),
    ],
)
def test_chat_bad_input_names_the_field(server, body, param):
    err = _error(httpx.post(f"{server}/v1/chat/completions", json=body, timeout=10))
    assert err["param"] == param


def test_malformed_json_and_non_object(server):
    err = _error(httpx.post(f"{server}/v1/completions", content=b'{"prompt": ',
                            headers={"content-type": "application/json"}))
    assert err["code"] == "invalid_json"
    _error(httpx.post(f"{server}/v1/completions", json=[1, 2]))


def test_openai_client_sees_bad_request_param(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    assert info.value.param == "max_tokens"


def test_unknown_route_is_openai_shaped(server):
    _error(httpx.get(f"{server}/v1/nothing"), status=404)


def test_api_key(serve_fake):
    with serve_fake(FakeEngine(), api_key="sekrit") as url:
        anon = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0, timeout=10)
        with pytest.raises(openai.AuthenticationError):
            anon.completions.create(model=MODEL, prompt="x", max_tokens=2)
        err = _error(httpx.post(f"{url}/v1/completions", json={"prompt": "x"}), status=401)
        assert err["code"] == "invalid_api_key"
        _error(httpx.get(f"{url}/v1/models"), status=401)
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="sekrit", max_retries=0, timeout=10)
        assert ok.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.total_tokens
        assert httpx.get(f"{url}/health").status_code == 200  # probes need no key


@pytest.mark.parametrize("key", ["", "two words", "caf\u00e9"])
def test_unusable_api_key_is_refused_at_construction(key):
    with pytest.raises(ValueError, match="api_key"):
        ServerConfig(served_model_names=(MODEL,), api_key=key)


DOCS = ("/docs", "/redoc", "/openapi.json")


def test_docs_are_off_by_default(server):
    for path in DOCS:
        assert httpx.get(f"{server}{path}").status_code == 404


def test_docs_with_the_flag_are_behind_the_key(serve_fake):
    with serve_fake(FakeEngine(), api_key="sekrit", enable_docs=True) as url:
        for path in DOCS:
            err = _error(httpx.get(f"{url}{path}"), status=401)
            assert err["code"] == "invalid_api_key"
            ok = httpx.get(f"{url}{path}", headers={"Authorization": "Bearer sekrit"})
            assert ok.status_code == 200, path
        schema = httpx.get(f"{url}/openapi.json",
                           headers={"Authorization": "Bearer sekrit"}).json()
        assert "/v1/completions" in schema["paths"]
    with serve_fake(FakeEngine(), enable_docs=True) as url:  # no key: open like /v1
        assert httpx.get(f"{url}/docs").status_code == 200


def test_return_spec_metrics_flag_and_field(serve_fake):
    with serve_fake(FakeEngine(speculative=True)) as url:
        body = {"prompt": "abc", "max_tokens": 6, "temperature": 0}
        plain = httpx.post(f"{url}/v1/completions", json=body).json()
        assert "metrics" not in plain
        asked = httpx.post(f"{url}/v1/completions",
                           json={**body, "return_spec_metrics": True}).json()
        assert asked["metrics"]["speculative_decoding"]["num_draft_tokens"] == 6
    with serve_fake(FakeEngine(speculative=True), return_spec_metrics=True) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}).json()
        assert "speculative_decoding" in chat["metrics"]


def test_metrics_endpoint_parses_and_counts(serve_fake):
    with serve_fake(FakeEngine()) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)
        client.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0)
        list(client.completions.create(model=MODEL, prompt="x", max_tokens=5, stream=True))
        httpx.post(f"{url}/v1/completions", json={"prompt": 1})
        text = httpx.get(f"{url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("draftwise:time_to_first_token_seconds", "draftwise:e2e_request_latency_seconds",
                 "draftwise:inter_token_latency_seconds", "draftwise:http_requests",
                 "draftwise:request_success", "draftwise:num_requests_running"):
        assert name in families, sorted(families)

    def value(family: str, sample: str, **labels: str) -> float:
        return sum(s.value for s in families[family].samples if s.name == sample
                   and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("draftwise:e2e_request_latency_seconds",
                 "draftwise:e2e_request_latency_seconds_count") == 2
    assert value("draftwise:request_success", "draftwise:request_success_total",
                 finished_reason="length") == 2
    assert value("draftwise:http_requests", "draftwise:http_requests_total",
                 path="/v1/completions", status="400") == 1
    assert value("draftwise:generation_tokens", "draftwise:generation_tokens_total") == 10


def test_spec_counters_increase(serve_fake):
    def counters(url: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            for s in fam.samples:
                if s.name.startswith("draftwise:spec_decode") and s.name.endswith("_total"):
                    key = s.name + s.labels.get("position", "")
                    out[key] = out.get(key, 0.0) + s.value
        return out

    with serve_fake(FakeEngine()) as url:
        assert counters(url) == {}  # no speculation, no spec counters
    with serve_fake(FakeEngine(speculative=True)) as url:
        before = counters(url)
        assert before["draftwise:spec_decode_num_drafts_total"] == 0
        httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 6}, timeout=10)
        after = counters(url)
    assert after["draftwise:spec_decode_num_drafts_total"] == 3
    assert after["draftwise:spec_decode_num_draft_tokens_total"] == 6
    assert after["draftwise:spec_decode_num_accepted_tokens_total"] == 3
    assert after["draftwise:spec_decode_num_accepted_tokens_per_pos_total0"] == 3


def test_zero_max_completion_tokens_is_refused_by_its_name(server):
    err = _error(httpx.post(f"{server}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0,
        "max_tokens": 5}))
    assert err["param"] == "max_completion_tokens"
