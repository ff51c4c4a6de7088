"""Property tests over the request schema against a running server (fake engine).

Hypothesis builds requests from every field of both endpoints, each value drawn from
its own type's range and extremes (int64 and float32 edges, NaN, infinities, 2**64,
huge stop lists), from wrong types, from invalid text (lone surrogates sent as JSON
escapes, latin-1 and CESU-8 bytes spliced into the body) and from 3000-deep nesting.
The properties:

- every request gets a 200 or a 4xx whose ``param`` names a field of that request,
  never a 5xx, and a 200 stream never carries an error event;
- a greedy victim stream runs back to back for the whole run and every one of its
  completions is token-identical to its solo text (a request that broke the step, as
  ``top_k: 2**63`` once did, would fail it);
- afterwards nothing is in flight and no KV block is in use.

The fake engine builds the batch's sampling tensors every step, as LLMEngine does, so a
value that passes validation but cannot be held by them fails the victim here too.
A parametrized sweep adds every numeric field at every int64 / uint64 / float32 /
float64 edge, exhaustively. Example counts are small: the module runs in ~20 s on two
loaded cores.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_fakes import MODEL, FakeEngine, serving

# markers replaced in the encoded body (JSON itself cannot carry these)
RAW = {
    "\u00abRAW-E9\u00bb": b"caf\xe9",  # latin-1, not UTF-8
    "\u00abRAW-CESU\u00bb": b"\xed\xa0\x80",  # a surrogate in CESU-8
}
DEEP = "\u00abDEEP\u00bb"  # the whole string becomes a 3000-deep array
EXAMPLES = 60

INT_EDGES = [0, 1, -1, -2, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30]
FLOAT_EDGES = [0.0, -0.0, 1e-300, 5e-324, 0.5, 1.0, 2.0, 3.4e38, 3.5e38, 1e308,
               float("inf"), float("-inf"), float("nan")]
BAD_TEXT = ["a\ud800b", "\udfff", "x\udce9", *RAW, DEEP, "", "\x00", "\U0001F4A5" * 3]

ints = st.one_of(st.integers(-5, 70), st.sampled_from(INT_EDGES),
                 st.integers(-(2**70), 2**70))
floats = st.one_of(st.floats(0, 1), st.sampled_from(FLOAT_EDGES), st.floats())
texts = st.one_of(st.text(max_size=12), st.sampled_from(BAD_TEXT))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)


def field(typed: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the field's own type, sometimes anything at all."""
    return st.one_of(typed, typed, anything)


COMMON: dict[str, st.SearchStrategy[Any]] = {
    "model": field(st.one_of(st.just(MODEL), texts)),
    "temperature": field(floats),
    "top_p": field(floats),
    "n": field(ints),
    "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({}, optional={
        "include_usage": st.booleans(), "continuous_usage_stats": st.booleans()})),
    "stop": field(st.one_of(texts, st.lists(texts, max_size=3), st.lists(st.just("s"),
                                                                         min_size=65,
                                                                         max_size=66))),
    "seed": field(ints),
    "presence_penalty": field(floats),
    "frequency_penalty": field(floats),
    "logit_bias": field(st.dictionaries(texts, floats, max_size=2)),
    "user": field(texts),
    "top_k": field(ints),
    "min_p": field(floats),
    "ignore_eos": field(st.booleans()),
    "stop_token_ids": field(st.lists(ints, max_size=3)),
    "include_stop_str_in_output": field(st.booleans()),
    "skip_special_tokens": field(st.booleans()),
    "return_spec_metrics": field(st.booleans()),
}
small_max = st.one_of(st.integers(1, 6), st.sampled_from(INT_EDGES))
COMPLETION = {
    **COMMON,
    "max_tokens": field(small_max),
    "echo": field(st.booleans()),
    "logprobs": field(ints),
    "best_of": field(ints),
    "suffix": field(texts),
}
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), texts)},
    optional={"content": st.one_of(texts, st.none(), st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": texts}), max_size=2)), "name": texts})
CHAT = {
    **COMMON,
    "max_tokens": field(small_max),
    "max_completion_tokens": field(small_max),
    "logprobs": field(st.booleans()),
    "top_logprobs": field(ints),
    "tools": field(st.lists(st.dictionaries(st.text(max_size=4), anything, max_size=2),
                            max_size=1)),
    "tool_choice": field(st.one_of(texts, st.dictionaries(st.text(max_size=4), anything))),
    "parallel_tool_calls": field(st.booleans()),
    "response_format": field(st.fixed_dictionaries({"type": st.sampled_from(
        ["text", "json_object"])})),
    "add_generation_prompt": field(st.booleans()),
}
prompts = st.one_of(texts, st.lists(st.integers(0, 300), max_size=8),
                    st.lists(texts, max_size=2), st.lists(st.lists(ints, max_size=3),
                                                          max_size=2), anything)
extra_keys = st.dictionaries(st.sampled_from(["bogus", "k\ud800", "prompt_logprobs"]),
                             anything, max_size=1)

# A request is a valid base, often at the edges of what is allowed, with 0-2 fields
# replaced by anything from the field's strategy above: about half are accepted, so
# the victim shares steps with requests as extreme as validation lets through.
VALID_COMMON: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just(MODEL),
    "temperature": st.one_of(st.just(0.0), st.floats(0.05, 2.0), st.just(3.4e38)),
    "top_p": st.one_of(st.just(1.0), st.floats(1e-300, 1.0)),
    "top_k": st.one_of(st.sampled_from([-1, 0, 1, 5, 2**31, 2**63 - 1]),
                       st.integers(1, 2**63 - 1)),
    "min_p": st.floats(0.0, 1.0),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": st.one_of(st.text(min_size=1, max_size=4),
                      st.lists(st.text(min_size=1, max_size=4), max_size=64)),
    "stop_token_ids": st.lists(st.integers(0, 2**63 - 1), max_size=4),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "return_spec_metrics": st.booleans(),
    "user": st.text(max_size=8),
}
valid_prompts = st.one_of(st.text(min_size=1, max_size=12),
                          st.lists(st.integers(0, 300), min_size=1, max_size=8))
valid_messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system", "assistant"]),
    "content": st.one_of(st.text(max_size=10), st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": st.text(max_size=5)}), max_size=2))}),
    min_size=1, max_size=3)


@st.composite
def requests(draw: st.DrawFn, required: dict[str, st.SearchStrategy[Any]],
             valid: dict[str, st.SearchStrategy[Any]],
             nasty: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A valid base (required keys plus some optional ones), then 0-2 fields replaced."""
    body = draw(st.fixed_dictionaries(required, optional=valid))
    for key in draw(st.lists(st.sampled_from(sorted(nasty)), max_size=2, unique=True)):
        body[key] = draw(nasty[key])
    body.update(draw(st.one_of(st.just({}), st.just({}), extra_keys)))
    return body


completion_requests = requests(
    {"prompt": valid_prompts},
    {**VALID_COMMON, "max_tokens": st.integers(1, 6)},
    {**COMPLETION, "prompt": prompts})
chat_requests = requests(
    {"messages": valid_messages},
    {**VALID_COMMON, "max_tokens": st.integers(1, 6),
     "max_completion_tokens": st.integers(1, 6), "add_generation_prompt": st.booleans()},
    {**CHAT, "messages": st.one_of(st.lists(message, max_size=3), anything)})


def encode(body: dict[str, Any]) -> bytes:
    """JSON with escapes for lone surrogates, then the raw-byte and deep splices."""
    raw = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
    for marker, replacement in RAW.items():
        raw = raw.replace(json.dumps(marker).strip('"').encode(), replacement)
    deep = b"[" * 3000 + b"]" * 3000
    return raw.replace(json.dumps(DEEP).encode(), deep)


def root_of(param: str) -> str:
    return re.split(r"[.\[]", param, maxsplit=1)[0]


class Victim:
    """Greedy streams back to back on their own thread; each must equal the solo text."""

    PROMPT, MAX_TOKENS = "victim", 30

    def __init__(self, url: str, engine: FakeEngine) -> None:
        self.url = url
        self.want = engine.greedy_text([ord(c) for c in self.PROMPT], self.MAX_TOKENS)
        self.results: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"prompt": self.PROMPT, "max_tokens": self.MAX_TOKENS, "temperature": 0,
                "stream": True}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                text = ""
                with client.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            event = json.loads(line[6:])
                            if "error" in event:
                                text += f"<error {event['error']['message']}>"
                            else:
                                text += event["choices"][0]["text"]
                self.results.append(text)

    def __enter__(self) -> Victim:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    # a short context keeps every accepted request short (at most 64 tokens)
    return FakeEngine(max_model_len=64, step_delay=0.002)


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[str]:
    with serving(engine) as url:
        yield url


@pytest.fixture(scope="module")
def victim(server: str, engine: FakeEngine) -> Iterator[Victim]:
    with Victim(server, engine) as v:
        yield v
    assert v.results, "the victim never finished a stream"
    assert all(text == v.want for text in v.results), [t for t in v.results if t != v.want]


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30,
                      headers={"content-type": "application/json"}) as c:
        yield c


def check(client: httpx.Client, path: str, body: dict[str, Any], record: bool = True) -> None:
    r = client.post(path, content=encode(body))
    if record:  # shown by --hypothesis-show-statistics
        event(f"status {r.status_code}")
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["param"], (body, error)
        assert root_of(error["param"]) in {*body, *(printable(k) for k in body)}, (body, error)
        return
    assert r.status_code == 200
    if "text/event-stream" in r.headers["content-type"]:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e[:10] for e in events), (body, events)
    else:
        assert r.json()["choices"]


def printable(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode()


SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(body=completion_requests)
def test_completions_never_5xx_and_name_the_field(client, victim, body):
    check(client, "/v1/completions", body)


@SETTINGS
@given(body=chat_requests)
def test_chat_never_5xx_and_name_the_field(client, victim, body):
    check(client, "/v1/chat/completions", body)


#: numeric fields and every edge of int64, uint64, float32 and float64 (and past them)
EDGE_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "n",
               "stop_token_ids", "presence_penalty", "frequency_penalty", "best_of",
               "logprobs"]
EDGE_VALUES = [*INT_EDGES, 2**63 - 1, 2**64 - 1, -(2**63), 2**64 + 1, *FLOAT_EDGES, 1e-5,
               1.0000001e-5, 0.999999999]


@pytest.mark.parametrize("name", EDGE_FIELDS)
def test_every_numeric_edge_is_accepted_safely_or_refused_by_name(client, victim, name):
    """Exhaustive where hypothesis samples: each field at each edge, next to a sampler
    (temperature 1) so the batch's sampling tensors are built with the value in them."""
    for value in EDGE_VALUES:
        item = [value] if name == "stop_token_ids" else value
        check(client, "/v1/completions",
              {"prompt": "edge", "max_tokens": 3, "temperature": 1.0, name: item},
              record=False)


def test_after_the_storm_nothing_is_in_flight(server, victim):
    deadline = time.monotonic() + 10
    victim.stop.set()
    victim.thread.join(30)
    while time.monotonic() < deadline:
        health = httpx.get(f"{server}/health", timeout=5).json()
        if health["num_requests"] == 0 and health["kv_used_blocks"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"not idle: {health}")
