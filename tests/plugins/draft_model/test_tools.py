"""Forced tool calls under draft_model (and n-gram) speculation: greedy spec-on == off.

The tiny llama gets a byte-level tokenizer and Qwen2.5-Instruct's own chat template
(which renders tools, in the Hermes format), so the server's tool plan applies: the call
grammar (``server.tools.call_grammar``; one or more calls, or exactly one) is the
request's constraint, its mask applies at every verified position, and the parsed calls
are the same with speculation on as off. draft_model drafts without the grammar's mask,
and a call's bytes are mostly forced, so the grammar cuts its drafts before the forward
(exact, no gain); n-gram drafts copied from the template's format instructions are
accepted on the same requests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from draftwise import LLM
from draftwise.server.protocol import ChatCompletionRequest
from draftwise.server.serving import sampling_params
from draftwise.server.tools import chat_template_of, tool_plan
from spec_features import generate
from tiny_checkpoints import perturbed_copy, save_tiny, write_byte_tokenizer

TEMPLATE = Path(__file__).parents[2] / "core" / "server" / "data" / "qwen2.5_chat_template.jinja"
UNIT = {"type": "function", "function": {
    "name": "set_unit", "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"], "additionalProperties": False}}}
MODE = {"type": "function", "function": {
    "name": "set_mode", "parameters": {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["on", "off"]}},
        "required": ["mode"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tools_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with room for the template's tool prompt (about 970 byte tokens)."""
    path = save_tiny("llama", tmp_path_factory.mktemp("dm-tools") / "target", seed=5,
                     std=0.25, max_position_embeddings=2048)
    write_byte_tokenizer(path)
    shutil.copy(TEMPLATE, path / "chat_template.jinja")
    return path


@pytest.fixture(scope="module")
def tools_draft(tools_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(tools_target, tmp_path_factory.mktemp("dm-tools") / "draft",
                          scale=0.015)


ASK = [{"role": "user", "content": "Use the tools."}]


def rendered(target: Path, body: dict[str, Any]) -> tuple[list[int], Any, Any]:
    """The chat body's prompt ids, SamplingParams and tool plan, as the server makes them."""
    req = ChatCompletionRequest.model_validate(
        {"messages": ASK, "temperature": 0, "max_tokens": 160, **body})
    llm = LLM(model=str(target), dtype="bfloat16")
    plan = tool_plan(req, chat_template_of(llm.engine))
    ids = llm.engine.apply_chat_template(ASK, True, tools=list(plan.tools))
    return ids, sampling_params(req, plan), plan


@pytest.mark.parametrize(("body", "one"), [
    ({"tool_choice": "required"}, False),
    ({"tool_choice": "required", "parallel_tool_calls": False}, True),
    ({"tool_choice": {"type": "function", "function": {"name": "set_mode"}}}, True),
])
@pytest.mark.parametrize("k", [2, 4])
def test_forced_calls_are_identical_to_spec_off(tools_target: Path, tools_draft: Path,
                                                body: dict[str, Any], one: bool, k: int) -> None:
    ids, params, plan = rendered(tools_target, {"tools": [UNIT, MODE], **body})
    off, _ = generate(tools_target, None, [ids], params)
    config = {"method": "draft_model", "model": str(tools_draft), "num_speculative_tokens": k}
    on, llm = generate(tools_target, config, [ids], params)
    assert on[0].outputs[0].token_ids == off[0].outputs[0].token_ids
    # draft_model's drafts are cut by the grammar (see the module doc); n-gram's are accepted
    ng = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
          "prompt_lookup_max": 4}
    on_ng, llm = generate(tools_target, ng, [ids], params)
    assert on_ng[0].outputs[0].token_ids == off[0].outputs[0].token_ids
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    _, got = plan.parse(on[0].outputs[0].text)
    assert got, on[0].outputs[0].text
    for call in got:
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] in ("set_unit", "set_mode")
        assert set(args) == ({"unit"} if call["function"]["name"] == "set_unit" else {"mode"})
    if one:
        assert len(got) == 1 and on[0].outputs[0].finish_reason == "stop"
    if "function" in str(body["tool_choice"]):
        assert got[0]["function"]["name"] == "set_mode"
