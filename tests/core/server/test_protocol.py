"""Error mapping, request models and the streamed-text holdback, without a server."""

from __future__ import annotations

import pytest
from draftwise.request import CompletionOutput
from draftwise.sampling_params import SamplingParams
from draftwise.server.errors import from_sampling_error, from_validation, loc_to_param
from draftwise.server.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    CompletionResponse,
    unsupported_fields,
)
from draftwise.server.serving import TextDelta
from pydantic import ValidationError


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "max_tokens"), "max_tokens"),
        (("body", "messages", 0, "content", "str"), "messages[0].content"),
        (("body", "prompt", "list[int]", 1), "prompt"),
        (("body",), None),
        (("body", "stream_options", "include_usage"), "stream_options.include_usage"),
    ],
)
def test_loc_to_param(loc, param):
    assert loc_to_param(loc) == param


def _errors(model, data):
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return info.value.errors()


def test_strict_types_are_refused_with_the_field():
    err = from_validation(_errors(CompletionRequest, {"prompt": "x", "max_tokens": "8"}))
    assert err.param == "max_tokens" and err.status == 400
    assert '"8"' in err.message
    err = from_validation(_errors(CompletionRequest, {"prompt": "x", "temperature": True}))
    assert err.param == "temperature"


def test_unknown_field_is_refused():
    err = from_validation(_errors(ChatCompletionRequest, {
        "messages": [{"role": "user", "content": "x"}], "max_tokenz": 3}))
    assert err.param == "max_tokenz" and "unrecognized" in err.message


def test_sampling_params_errors_name_their_field():
    with pytest.raises(ValidationError) as info:
        SamplingParams(top_p=2.0)
    err = from_sampling_error(info.value)
    assert err.param == "top_p" and not err.message.startswith("top_p: Value error")


def test_unsupported_fields_are_listed():
    req = CompletionRequest.model_validate({"prompt": "x", "echo": True, "presence_penalty": 1.0,
                                            "logprobs": 3, "logit_bias": {"5": 1.0}})
    assert [f for f, _ in unsupported_fields(req)] == ["echo"]
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert [f for f, _ in unsupported_fields(chat)] == ["top_logprobs"]
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})
    assert unsupported_fields(chat) == []


def _out(text: str, finished: bool) -> CompletionOutput:
    return CompletionOutput(0, text, [], "stop" if finished else None)


def test_text_delta_holds_back_a_possible_stop_prefix():
    req = CompletionRequest.model_validate({"prompt": "x", "stop": ["STOP"]})
    delta = TextDelta(req)
    assert delta.next(_out("hello S", False)) == "hell"   # "o S" might start "STOP"
    assert delta.next(_out("hello ST", False)) == "o"
    assert delta.next(_out("hello ", True)) == " "         # the engine cut "ST" + "OP"
    assert delta.sent == len("hello ")


def test_text_delta_without_stop_streams_everything():
    delta = TextDelta(CompletionRequest.model_validate({"prompt": "x"}))
    assert delta.next(_out("ab", False)) == "ab"
    assert delta.next(_out("abc", True)) == "c"


def test_response_extensions_are_omitted_when_unset():
    resp = CompletionResponse(id="cmpl-1", model="m", choices=[])
    data = resp.to_dict()
    assert "metrics" not in data and "usage" not in data
    assert data["object"] == "text_completion" and data["system_fingerprint"] is None
    chunk = ChatCompletionChunk(id="c", created=1, model="m", choices=[])
    assert chunk.to_dict(keep_null=("usage",))["usage"] is None
    assert "usage" not in chunk.to_dict()
