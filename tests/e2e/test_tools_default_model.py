"""Tool calling through the server on the real default model, with the openai client.

SmolLM2-Instruct's own template does not render tools (checked first: the server refuses
``tools`` by name for it). Its vocabulary is ChatML, so the test then gives the engine
Qwen2.5-Instruct's template (which does render tools, in the Hermes format) and checks
forced calls: valid ``tool_calls`` whose arguments validate against the schema, and
n-gram speculation on vs off (per request, ``speculative: {"enabled": false}``) token-
identical under greedy, streamed and not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from spec_sampling import fixed_depth
from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs
from draftwise.formats.chat import ChatTemplate
from draftwise.server import ServerConfig, create_app
from draftwise.server.runner import ServerThread
from draftwise.server.tools import renders_tools

pytestmark = pytest.mark.default_model

MODEL = "smollm2"
#: fixed depth: the tests assert speculation ran, and adaptive depth drafts by the clock
NGRAM = fixed_depth({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 4})
QWEN = (Path(__file__).parents[1] / "core" / "server" / "data"
        / "qwen2.5_chat_template.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                               "maxLength": 24}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days, in "
        "celsius? Paris, France. Use get_weather."}]
OFF = {"speculative": {"enabled": False}}


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, Any]]:
    engine = LLMEngine(EngineArgs(max_model_len=2048, num_kv_blocks=512, max_num_seqs=4,
                                  speculative_config=NGRAM))
    own = engine.loaded.chat_template
    app = create_app(engine, ServerConfig(served_model_names=(MODEL,)))
    thread = ServerThread(app, shutdown_timeout=5)
    url = thread.start()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300, max_retries=0)
    try:
        yield {"engine": engine, "client": client, "own": own}
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def qwen(served) -> dict[str, Any]:
    """The same server, its engine now rendering chat with Qwen2.5's template."""
    engine = served["engine"]
    assert renders_tools(served["own"]) is False  # the default model's own template
    engine.loaded.chat_template = ChatTemplate(QWEN, served["own"].special_tokens)
    return served


def test_default_template_refuses_tools(served):
    if served["engine"].loaded.chat_template is not served["own"]:
        pytest.skip("ran after the template was swapped")
    with pytest.raises(openai.BadRequestError) as info:
        served["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                 tool_choice="required", max_tokens=8)
    assert info.value.param == "tools"
    assert "does not render tools" in info.value.message


def _valid_weather(args: dict[str, Any]) -> None:
    assert set(args) == {"city", "unit", "days"}
    assert isinstance(args["city"], str) and len(args["city"]) <= 24
    assert args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7


def _call(client: Any, choice: Any, extra: dict | None = None, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=kw.pop("messages", ASK), tools=[WEATHER, TIME],
        tool_choice=choice, temperature=0, max_tokens=kw.pop("max_tokens", 120), logprobs=True,
        extra_body=extra, **kw)


def _tokens(resp: Any) -> list[str]:
    return [t.token for t in resp.choices[0].logprobs.content]


@pytest.mark.parametrize(("choice", "parallel"), [
    ({"type": "function", "function": {"name": "get_weather"}}, None), ("required", False),
    ("required", None)])
def test_forced_call_valid_and_identical_to_spec_off(qwen, choice, parallel):
    """A named function and ``required`` with parallel_tool_calls false: exactly one call.
    ``required`` by default (OpenAI's parallel_tool_calls true): one or more calls, which
    SmolLM2 under a foreign template keeps making until max_tokens."""
    client, engine = qwen["client"], qwen["engine"]
    before = engine.spec.metrics.num_accepted_tokens
    kw = {} if parallel is None else {"parallel_tool_calls": parallel}
    on = _call(client, choice, **kw)
    off = _call(client, choice, OFF, **kw)
    one = isinstance(choice, dict) or parallel is False
    for resp in (on, off):
        msg = resp.choices[0].message
        if one:
            assert resp.choices[0].finish_reason == "tool_calls"
            assert len(msg.tool_calls) == 1 and msg.content is None
        else:  # a call cut by max_tokens stays text, as the model wrote it
            assert resp.choices[0].finish_reason in ("tool_calls", "length")
            assert len(msg.tool_calls) >= 1
            assert msg.content is None or msg.content.startswith("<tool_call>")
        for call in msg.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            if call.function.name == "get_weather":
                _valid_weather(json.loads(call.function.arguments))
    assert _tokens(on) == _tokens(off)
    assert on.choices[0].message.tool_calls[0].function.model_dump() == \
        off.choices[0].message.tool_calls[0].function.model_dump()
    assert engine.spec.metrics.num_accepted_tokens > before  # speculation did run
    assert engine.kv.num_used_blocks == 0


def test_streamed_forced_call_equals_unstreamed(qwen):
    client = qwen["client"]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = _call(client, choice)
    chunks = list(_call(client, choice, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.choices[0].finish_reason == "tool_calls"
    (call,) = last.choices[0].delta.tool_calls
    assert call.index == 0 and call.function.name == "get_weather"
    assert call.function.arguments == whole.choices[0].message.tool_calls[0].function.arguments
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert streamed == _tokens(whole)


def test_multi_turn_with_tool_result(qwen):
    client = qwen["client"]
    first = _call(client, {"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny, all 3 days"}]
    on = _call(client, "none", messages=messages, max_tokens=24)
    off = _call(client, "none", OFF, messages=messages, max_tokens=24)
    assert on.choices[0].message.tool_calls in (None, [])
    assert isinstance(on.choices[0].message.content, str)
    assert _tokens(on) == _tokens(off)
    # the tool result reached the prompt: it is longer than the first turn's
    assert on.usage.prompt_tokens > first.usage.prompt_tokens


def test_auto_is_unconstrained_and_parsed(qwen):
    client = qwen["client"]
    on = _call(client, "auto", max_tokens=48)
    off = _call(client, "auto", OFF, max_tokens=48)
    assert _tokens(on) == _tokens(off)
    msg = on.choices[0].message
    if msg.tool_calls:  # the model chose to call: a parsed call, finished as one
        assert on.choices[0].finish_reason == "tool_calls"
        assert msg.tool_calls[0].function.name in ("get_weather", "get_time")
    else:  # nothing parsed: the text is the content, untouched
        assert isinstance(msg.content, str) and msg.content
