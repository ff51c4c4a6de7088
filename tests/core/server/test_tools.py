"""Tool calling, without a model: template detection, the plan, the call grammar, parsing.

The tools-capable template is Qwen2.5-Instruct's own (copied byte for byte from
qwen2.5-coder-1.5b-instruct-q4_k_m.gguf's ``tokenizer.chat_template``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import httpx
import llguidance
import pytest
from draftwise.formats.chat import ChatTemplate
from draftwise.server.errors import APIError
from draftwise.server.protocol import ChatCompletionRequest
from draftwise.server.serving import sampling_params
from draftwise.server.tools import (
    call_grammar,
    parse_calls,
    renders_tools,
    template_messages,
    tool_plan,
)

QWEN = ChatTemplate((Path(__file__).parent / "data" / "qwen2.5_chat_template.jinja").read_text())
#: ChatML without tools (the shape of SmolLM2-Instruct's template)
PLAIN = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                     "assistant\n{% endif %}")
#: mentions tools only to refuse them: a source grep would call this tools-capable
REFUSES = ChatTemplate("{% if tools %}{{ raise_exception('no tools') }}{% endif %}"
                       "{% for m in messages %}{{ m.content }}{% endfor %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}}}


def chat(**kw):
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], **kw})


def test_detection_renders_rather_than_greps():
    assert renders_tools(QWEN)
    assert not renders_tools(PLAIN)
    assert not renders_tools(REFUSES)
    assert not renders_tools(None)


def test_template_without_tools_refuses_by_name():
    with pytest.raises(APIError) as info:
        tool_plan(chat(tools=[WEATHER]), PLAIN)
    assert info.value.param == "tools"
    assert "does not render tools" in info.value.message
    assert "json_schema" in info.value.message  # what would work


def test_no_tools_no_plan():
    assert tool_plan(chat(), PLAIN) is None
    assert tool_plan(chat(tool_choice="none"), PLAIN) is None


@pytest.mark.parametrize(("kw", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "objectx"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "bogus": 1}}]},
     "tools[1].function"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
])
def test_bad_tools_name_the_field(kw, param):
    with pytest.raises(APIError) as info:
        tool_plan(chat(**kw), QWEN)
    assert info.value.param == param
    assert info.value.status == 400


@pytest.mark.parametrize(("choice", "kind", "constrained"), [
    (None, "auto", False), ("auto", "auto", False), ("none", "none", False),
    ("required", "required", True),
    ({"type": "function", "function": {"name": "get_time"}}, "function", True),
])
def test_plan_kinds(choice, kind, constrained):
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice=choice), QWEN)
    assert plan.choice == kind
    assert (plan.constraint is not None) == constrained
    assert plan.parses == (kind != "none")
    params = sampling_params(chat(tools=[WEATHER, TIME], tool_choice=choice), plan)
    assert params.structured_outputs == plan.constraint


def test_forced_call_cannot_join_another_constraint():
    body = chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    with pytest.raises(APIError) as info:
        sampling_params(body, tool_plan(body, QWEN))
    assert info.value.param == "tool_choice"


def _matches(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher (byte-level, no model) accepts ``text`` to the end."""
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    m = llguidance.LLMatcher(tok, grammar)
    for b in text.encode():
        if not m.consume_token(b):
            return False
    return m.is_accepting()


class _ByteTokenizer:
    """256 byte tokens plus EOS: enough for llguidance to match text byte by byte."""

    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids: ClassVar[list[int]] = [256]

    def __call__(self, s: bytes | str) -> list[int]:
        return list(s.encode() if isinstance(s, str) else s)


def test_call_grammar_accepts_exactly_a_valid_call():
    grammar = call_grammar([WEATHER["function"], TIME["function"]])
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", ' \
           '"unit": "celsius"}}\n</tool_call>'
    assert _matches(grammar, good)
    assert _matches(grammar, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}'
                    '\n</tool_call>')
    assert not _matches(grammar, good.replace("celsius", "kelvin"))  # the schema's enum
    assert not _matches(grammar, good.replace("get_weather", "get_wether"))
    assert not _matches(grammar, good.replace('"unit": "celsius"', '"x": 1'))


def test_parse_calls():
    names = {"get_weather", "get_time"}
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo",'
            ' "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments":'
            ' {"zone": "CET"}}\n</tool_call>')
    content, calls = parse_calls(text, names)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    only, calls = parse_calls(text[len("Let me check.\n"):], names)
    assert only is None and len(calls) == 2
    # a block that does not parse, or names an unknown function, stays text
    for bad in ('<tool_call>\n{"name": "get_weather", "arguments": {\n</tool_call>',
                '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
                '<tool_call>\n{"name": "get_time", "arguments": "zone"}\n</tool_call>'):
        assert parse_calls(bad, names) == (bad, [])
    assert parse_calls("plain text", names) == ("plain text", [])


def test_multi_turn_renders_tool_calls_and_results():
    body = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"},
    ], "tools": [WEATHER]})
    messages = template_messages([m.model_dump(exclude_none=True) for m in body.messages])
    for m in messages:
        m.setdefault("content", "")
    text = QWEN.render(messages, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": ' \
           '"celsius"}}\n</tool_call>' in text  # the arguments as an object, not a string
    assert "<tool_response>\n-3 C, snow\n</tool_response>" in text
    assert '"name": "get_weather"' in text.split("\n</tools>")[0]  # the tool is described


def test_bad_arguments_json_in_history_is_named():
    with pytest.raises(APIError) as info:
        template_messages([{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{"}}]}])
    assert info.value.param == "messages"


def test_server_without_tools_template_refuses_by_name(server):
    """The fake engine has no chat template: ``tools`` is a 400 naming it."""
    resp = httpx.post(f"{server}/v1/chat/completions", timeout=10, json={
        "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
        "tool_choice": "required"})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "tools" and "does not render tools" in err["message"]


CALL_W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": ' \
         '"celsius"}}\n</tool_call>'
CALL_T = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


@pytest.mark.parametrize(("kw", "two"), [
    ({"tool_choice": "required"}, True),  # parallel_tool_calls defaults to true (OpenAI)
    ({"tool_choice": "required", "parallel_tool_calls": True}, True),
    ({"tool_choice": "required", "parallel_tool_calls": False}, False),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, False),
])
def test_required_takes_one_or_more_calls_unless_parallel_is_off(kw, two):
    plan = tool_plan(chat(tools=[WEATHER, TIME], **kw), QWEN)
    grammar = plan.constraint.grammar
    first = CALL_T if "function" in str(kw["tool_choice"]) else CALL_W
    assert _matches(grammar, first)
    assert _matches(grammar, f"{first}\n{CALL_T}") == two
    assert _matches(grammar, f"{first}\n{CALL_T}\n{CALL_W}") == two
    assert not _matches(grammar, "")  # at least one call
    assert not _matches(grammar, f"{first}{CALL_T}")  # a newline between two


def test_parallel_off_returns_only_the_first_call():
    text = f"{CALL_W}\n{CALL_T}"
    on = tool_plan(chat(tools=[WEATHER, TIME]), QWEN)
    off = tool_plan(chat(tools=[WEATHER, TIME], parallel_tool_calls=False), QWEN)
    assert [c["function"]["name"] for c in on.parse(text)[1]] == ["get_weather", "get_time"]
    assert [c["function"]["name"] for c in off.parse(text)[1]] == ["get_weather"]
