"""Request bodies -> StructuredOutputsParams: each accepted shape, each refusal by field."""

from __future__ import annotations

import pytest
from draftwise.server.errors import APIError
from draftwise.server.protocol import ChatCompletionRequest, CompletionRequest
from draftwise.server.serving import sampling_params
from draftwise.server.structured import structured_outputs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(**kw):
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], **kw})


@pytest.mark.parametrize(("body", "kind"), [
    (chat(response_format={"type": "json_object"}), "json_object"),
    (chat(response_format={"type": "json_schema",
                           "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}),
     "json"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_json": SCHEMA}), "json"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_regex": "[ab]+"}), "regex"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_choice": ["yes", "no"]}), "choice"),
    (chat(guided_grammar='root ::= "a" | "b"'), "grammar"),
    (chat(structured_outputs={"regex": "x+"}), "regex"),
])
def test_accepted_shapes(body, kind):
    assert structured_outputs(body).kind == kind
    assert sampling_params(body).structured_outputs.kind == kind


def test_text_is_no_constraint():
    assert structured_outputs(chat(response_format={"type": "text"})) is None
    assert structured_outputs(chat()) is None


@pytest.mark.parametrize(("body", "param", "words"), [
    (chat(response_format={"type": "json_schema",
                           "json_schema": {"name": "a", "schema": {"type": "objectx"}}}),
     "response_format.json_schema.schema", "objectx"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
     "response_format.json_schema.schema", "required"),
    (chat(response_format={"type": "xml"}), "response_format.type", "'xml'"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA,
                                                                  "bogus": 1}}),
     "response_format.json_schema", "bogus"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_regex": "(ab"}), "guided_regex",
     "unclosed group"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_json": "{"}), "guided_json",
     "not valid JSON"),
    (CompletionRequest.model_validate({"prompt": "x", "guided_choice": []}), "guided_choice",
     "between 1"),
    (chat(structured_outputs={"regex": "a", "json": SCHEMA}), "structured_outputs",
     "exactly one"),
    (chat(structured_outputs={"bogus": 1}), "structured_outputs.bogus", "Extra"),
    (chat(guided_regex="a", response_format={"type": "json_object"}), "guided_regex",
     "one output constraint"),
])
def test_refusals_name_the_field(body, param, words):
    with pytest.raises(APIError) as info:
        structured_outputs(body)
    assert info.value.param == param and words in info.value.message, info.value.message
