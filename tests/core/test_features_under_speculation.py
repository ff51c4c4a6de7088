"""The core's columns of the feature matrix the parameter tables do not cover: logprobs,
stops inside an accepted block, seeded ``n > 1`` and a regex grammar, for the oracle
drafter on the tiny llama and the tiny Qwen3.5 GDN hybrid, and the n-gram drafter.

Each case binds ``tests/spec_features.py``'s checks to one (target, drafter) pair; the
oracle drafts speculation-off's own output for the request's settings (wrong at every
fifth position), so accepted drafts sit inside verified blocks.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from draftwise import SamplingParams
from oracle_drafter import install_oracle, oracle_spec
from spec_features import (
    LOGPROB_EXTRA,
    STOP_KINDS,
    TOOL_CHOICES,
    assert_forced_calls_identical,
    assert_grammar_identical,
    assert_logprobs_match,
    assert_seeded_samples,
    assert_stop_inside_accepted_block,
    generate,
    greedy,
    tool_request,
    write_byte_level_words,
)

PROMPTS = [[7, 3, 11, 5, 2, 9], [4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23, 42, 4, 8]]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}

@dataclass(frozen=True)
class Drafter:
    """One drafter on one target: the config for given params and prompts, the sampling
    fields under which its drafts are accepted, and a prompt whose blocks a stop can hit."""

    target: Path
    config: Callable[[SamplingParams, list[list[int]]], dict[str, Any]]
    extra: dict[str, Any]
    stop_prompt: list[int]


#: the tiny llama repeats itself under these: n-gram drafts hit
LOOPING = {"frequency_penalty": -2.0, "repetition_penalty": 0.5}


#: the tiny llama under these penalties, its vocabulary cut to four tokens, continues this
#: prompt's cycle (found by trying every order of the four): n-gram drafts the cycle from
#: the prompt, so tokens new to the output sit inside an accepted block
CYCLE = [40, 41, 43, 42]
FORCED_CYCLE = {"allowed_token_ids": CYCLE, "frequency_penalty": 2.0, "presence_penalty": 2.0}


@pytest.fixture(params=["oracle-llama", "oracle-hybrid", "ngram-llama"])
def drafter(request: pytest.FixtureRequest, make_dist: Any, tmp_path: Path) -> Drafter:
    """One drafter and target; the oracle drafts spec-off's output for the same settings."""
    name = request.param
    target = request.getfixturevalue("word_hybrid" if "hybrid" in name else "word_llama")
    if name == "ngram-cycle":
        return Drafter(target, lambda params, prompts: NGRAM, FORCED_CYCLE, [5, 9] + CYCLE * 3)
    if name.startswith("ngram"):
        return Drafter(target, lambda params, prompts: NGRAM, LOOPING,
                       [(i * 37) % 500 + 3 for i in range(23)])
    install_oracle(make_dist)

    def config(params: SamplingParams, prompts: list[list[int]]) -> dict[str, Any]:
        off, _ = generate(target, None, prompts, params)
        return oracle_spec(tmp_path, prompts, off, 3)

    return Drafter(target, config, {}, PROMPTS[1])


#: n-gram drafts repeat earlier text: a token new to the output inside an accepted block
#: needs drafts from the prompt (the forced cycle); a run of words new to the text does not
@pytest.mark.parametrize(("drafter", "kind"), [
    *((d, k) for d in ("oracle-llama", "oracle-hybrid") for k in STOP_KINDS),
    ("ngram-llama", "stop_string"), ("ngram-cycle", "stop_token_ids"), ("ngram-cycle", "eos")],
    indirect=["drafter"])
def test_a_stop_inside_an_accepted_block_truncates_there(
    drafter: Drafter, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, prompt = drafter, drafter.stop_prompt
    assert_stop_inside_accepted_block(d.target, d.config(greedy(**d.extra), [prompt]), prompt,
                                      kind, monkeypatch, **d.extra)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_equal_spec_off(drafter: Drafter, mode: str) -> None:
    d = drafter
    params = greedy(**{**LOGPROB_EXTRA, **d.extra})
    assert_logprobs_match(d.target, d.config(params, PROMPTS), PROMPTS, mode, extra=d.extra)


def test_seeded_samples_are_reproducible(drafter: Drafter) -> None:
    """The oracle drafts the greedy output: sampled rows (temperature 0.3) accept while
    they follow it."""
    d = drafter
    extra = d.extra or {"frequency_penalty": -1.0}
    assert_seeded_samples(d.target, d.config(greedy(n=1, max_tokens=12, **extra), PROMPTS[1:]),
                          PROMPTS[1], temperature=0.3, **extra)


@pytest.fixture(scope="module")
def byte_words(word_llama: Path, word_hybrid: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """Both targets with their words as a byte-level BPE (what llguidance reads: ids 0-10
    become the digits and "w") and ``[UNK]`` as EOS: target and token texts by name."""
    out = {}
    for name, src in (("llama", word_llama), ("hybrid", word_hybrid)):
        vocab = 512 if name == "llama" else 256
        texts = [str(i) for i in range(10)] + ["w"] + [f"w{i}" for i in range(11, vocab - 1)]
        texts.append("[UNK]")
        path = tmp_path_factory.mktemp(f"so-{name}") / "target"
        shutil.copytree(src, path)
        out[name] = (write_byte_level_words(path, texts, eos=vocab - 1), texts)
    return out


@pytest.mark.parametrize("name", ["llama", "hybrid"])
def test_oracle_greedy_identical_with_grammar(byte_words: dict, make_dist: Any, tmp_path: Path,
                                              name: str) -> None:
    """A grammar of words that bans each output's 4th token: the mask applies after the
    oracle's accepted drafts and the matcher rolls back with its rejected ones."""
    from draftwise.structured import StructuredOutputsParams

    target, texts = byte_words[name]
    free, _ = generate(target, None, PROMPTS, greedy())
    banned = {o.outputs[0].token_ids[3] for o in free} | set(range(11))
    grammar = "(" + "|".join(t for i, t in enumerate(texts[:-1]) if i not in banned) + ")+"
    params = greedy(ignore_eos=False, structured_outputs=StructuredOutputsParams(regex=grammar))
    off, _ = generate(target, None, PROMPTS, params)
    install_oracle(make_dist)
    assert_grammar_identical(target, oracle_spec(tmp_path, PROMPTS, off, 3), PROMPTS, grammar,
                             eos_text="[UNK]")


@pytest.mark.parametrize(("choice", "one"), TOOL_CHOICES)
@pytest.mark.parametrize("name", ["tools_llama", "tools_hybrid"])
def test_oracle_forced_tool_calls_are_identical(request: pytest.FixtureRequest, make_dist: Any,
                                                tmp_path: Path, name: str,
                                                choice: dict[str, Any], one: bool) -> None:
    """The oracle drafts the constrained call itself, so the call grammar's mask applies
    inside accepted blocks (a drafter without the grammar has its drafts cut)."""
    target = request.getfixturevalue(name)
    ids, params, _ = tool_request(target, choice)
    off, _ = generate(target, None, [ids], params)
    install_oracle(make_dist)
    assert_forced_calls_identical(target, oracle_spec(tmp_path, [ids], off, 3), choice,
                                  one, accepted=True)
