"""The ``speculative`` body field over HTTP on a real (tiny) engine with n-gram on.

A request with speculation off, batched with speculating ones, gives plain output and
zero drafts; asking for more than the server was started with, a chain member it does
not have, or an unknown key is a 400 naming the field; provenance comes back in
responses and in every streamed chunk, and sums to the metrics' counts.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from server_fakes import serving
from spec_sampling import fixed_depth
from tiny_checkpoints import TINY, save_tiny, write_wordlevel_tokenizer

from draftwise import LLM, SamplingParams
from draftwise.engine import LLMEngine
from draftwise.engine_args import EngineArgs

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
PROMPTS = [[5, 9, 13, 2, 7] * 4, list(range(20, 40)) * 2, [42] * 11, [7, 8, 9] * 5]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("llama", tmp_path_factory.mktemp("specfield-llama"), seed=3)
    write_wordlevel_tokenizer(path, ["[UNK]"] + [f"w{i}" for i in range(1, TINY["vocab_size"])])
    return path


@pytest.fixture(scope="module")
def url(tiny: Path):
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16", speculative_config=NGRAM,
                                  max_num_seqs=8))
    with serving(engine) as base:
        yield base


@pytest.fixture(scope="module")
def plain(tiny: Path) -> list[str]:
    llm = LLM(model=str(tiny), dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    return [llm.generate({"prompt_token_ids": p}, params)[0].outputs[0].text for p in PROMPTS]


def body(prompt: list[int], **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": True,
            "return_spec_metrics": "provenance", **extra}


def post(url: str, payload: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=payload, timeout=60)


def test_spec_off_request_batched_with_speculating_ones(url: str, plain: list[str]) -> None:
    asks = [{"enabled": False}, None, {"num_speculative_tokens": 1}, {"enabled": False}]
    payloads = [body(p, **({"speculative": a} if a else {})) for p, a in zip(PROMPTS, asks)]
    with ThreadPoolExecutor(len(payloads)) as pool:
        replies = list(pool.map(lambda b: post(url, b), payloads))
    drafted = 0
    for reply, ask, want in zip(replies, asks, plain):
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == want
        metrics = reply.json()["metrics"]
        sd, prov = metrics["speculative_decoding"], metrics["token_provenance"]
        assert len(prov) == 20
        counts = Counter(prov)
        assert counts["accepted:ngram"] == sd["num_accepted_draft_tokens"]
        assert counts["recovered"] + counts["bonus"] == sd["num_spec_steps"]
        if ask == {"enabled": False}:
            assert sd["num_draft_tokens"] == 0 and counts == {"plain": 20}
            assert sd["request_settings"] == {"enabled": False, "return_provenance": True}
        drafted += sd["num_draft_tokens"]
    assert drafted > 0


def test_plain_metrics_without_provenance(url: str) -> None:
    reply = post(url, {**body(PROMPTS[2]), "return_spec_metrics": True,
                       "speculative": {"method": "ngram"}})
    metrics = reply.json()["metrics"]
    assert "token_provenance" not in metrics
    assert metrics["speculative_decoding"]["request_settings"] == {"method": "ngram"}


@pytest.mark.parametrize(
    ("speculative", "param"),
    [
        ({"num_speculative_tokens": 4}, "speculative.num_speculative_tokens"),
        ({"method": "mtp"}, "speculative.method"),
    ],
)
def test_over_the_server_is_a_400(url: str, speculative: dict, param: str) -> None:
    reply = post(url, body(PROMPTS[0], speculative=speculative))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


def test_adaptive_on_a_fixed_depth_server_is_a_400(tiny: Path) -> None:
    """Adaptive depth is the default, so only a server pinned at fixed depth lacks it."""
    engine = LLMEngine(EngineArgs(model=str(tiny), dtype="bfloat16",
                                  speculative_config=fixed_depth(NGRAM), max_num_seqs=2))
    with serving(engine) as base:
        reply = post(base, body(PROMPTS[0], speculative={"adaptive": True}))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "speculative.adaptive"


def test_unknown_key_is_a_400_naming_it(url: str) -> None:
    reply = post(url, body(PROMPTS[0], speculative={"enabled": False, "n_max": 3}))
    assert reply.status_code == 400
    assert "n_max" in reply.text


def test_chat_takes_the_field_too(url: str) -> None:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "speculative": {"num_speculative_tokens": 9}})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "speculative.num_speculative_tokens"


def test_streamed_chunks_carry_provenance(url: str) -> None:
    payload = body(PROMPTS[1], stream=True)
    prov: list[str] = []
    final = None
    with httpx.stream("POST", f"{url}/v1/completions", json=payload, timeout=60) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prov += chunk["metrics"]["token_provenance"]
            if chunk["choices"][0]["finish_reason"]:
                final = chunk["metrics"]["speculative_decoding"]
    assert len(prov) == 20 and final is not None
    assert Counter(prov)["accepted:ngram"] == final["num_accepted_draft_tokens"]
