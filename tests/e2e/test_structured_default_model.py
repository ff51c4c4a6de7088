"""Structured output on the embedded default model: JSON schema, greedy n-gram at several
k token-identical to speculation off, and the JSON parses and validates."""

from __future__ import annotations

import json

import pytest
from draftwise import LLM, SamplingParams
from draftwise.structured import StructuredOutputsParams

pytestmark = pytest.mark.default_model

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "population": {"type": "integer"},
                   "landmarks": {"type": "array", "maxItems": 4,
                                 "items": {"type": "string", "maxLength": 24}},
                   "capital": {"type": "boolean"}},
    "required": ["city", "population", "landmarks", "capital"],
    "additionalProperties": False,
}
CHATS = [
    [{"role": "user", "content": "Paris has 2100000 people and the Eiffel Tower, the Louvre "
      "and Notre-Dame. Paris, Paris, Paris. Answer in JSON."}],
    [{"role": "user", "content": "Describe the city of Lyon as JSON."}],
]


def params() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=128,
                          structured_outputs=StructuredOutputsParams(json=SCHEMA))


def check(text: str) -> None:
    data = json.loads(text)
    assert set(data) == set(SCHEMA["properties"])
    assert isinstance(data["city"], str) and isinstance(data["capital"], bool)
    assert isinstance(data["population"], int) and not isinstance(data["population"], bool)
    assert len(data["landmarks"]) <= 4 and all(isinstance(x, str) for x in data["landmarks"])


@pytest.fixture(scope="module")
def spec_off() -> list[list[int]]:
    outs = LLM(max_num_seqs=1).chat(CHATS, params())
    for o in outs:
        assert o.outputs[0].finish_reason == "stop"
        check(o.outputs[0].text)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_json_schema_ngram_identical_to_off(spec_off, k: int) -> None:
    # fixed depth: drafts must be accepted at every k, and adaptive depth (the default)
    # may park the lone request where this machine prices drafts out
    llm = LLM(max_num_seqs=1, speculative_config={
        "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
        "prompt_lookup_max": 4, "draftwise": {"adaptive": False}})
    outs = llm.chat(CHATS, params())
    assert [o.outputs[0].token_ids for o in outs] == spec_off
    m = llm.engine.spec.metrics
    assert m.num_accepted_tokens > 0
    assert llm.engine.kv.num_used_blocks == 0
