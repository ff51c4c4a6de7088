"""The embedded default model end to end: the README's commands and n-gram losslessness.

Greedy n-gram speculation must be token-identical to speculation off on the workload
prompts at k = 1, 2, 4, 8, one request at a time, and also with all prompts batched
(bf16: linear layers and attention are bitwise batch-invariant on CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftwise import LLM, SamplingParams
from draftwise.cli import cli
from spec_sampling import fixed_depth

pytestmark = pytest.mark.default_model

WORKLOAD = Path(__file__).parents[2] / "benchmarks" / "workloads" / "cpu-smoke-8.jsonl"
MAX_TOKENS = 48


def ngram(k: int) -> dict[str, int | str]:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
            "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in WORKLOAD.read_text().splitlines()]


@pytest.fixture(scope="module")
def spec_off(conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    llm = LLM(max_num_seqs=1)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [llm.chat(c, params)[0].outputs[0].token_ids for c in conversations]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ngram_greedy_identical_one_at_a_time(
    conversations: list[list[dict[str, str]]], spec_off: list[list[int]], k: int
) -> None:
    llm = LLM(speculative_config=ngram(k), max_num_seqs=1)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    got = [llm.chat(c, params)[0].outputs[0].token_ids for c in conversations]
    assert got == spec_off
    assert llm.engine.spec.metrics.num_accepted_tokens > 0
    assert llm.engine.kv.num_used_blocks == 0


def test_ngram_greedy_identical_batched(
    conversations: list[list[dict[str, str]]], spec_off: list[list[int]]
) -> None:
    llm = LLM(speculative_config=ngram(4), max_num_seqs=8)
    outs = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.outputs[0].token_ids for o in outs] == spec_off


def test_k_schedule_by_batch_size_stays_identical(
    conversations: list[list[dict[str, str]]], spec_off: list[list[int]]
) -> None:
    """num_speculative_tokens_per_batch_size: 1 draft slot per row while 3+ requests run,
    4 once the batch drains to 2; same tokens as speculation off."""
    # fixed depth: the per-position counts below check the schedule's k, which adaptive
    # depth (the default) would lower further where drafts do not pay
    config = fixed_depth(
        {**ngram(4), "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 8, 1]]})
    lengths = [12] * 6 + [MAX_TOKENS] * 2  # six finish early: the last two run as a pair
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
    llm = LLM(speculative_config=config, max_num_seqs=8)
    outs = llm.chat(conversations, params)
    assert [o.outputs[0].token_ids for o in outs] == [t[:n] for t, n in zip(spec_off, lengths)]
    per_pos = llm.engine.spec.metrics.num_draft_tokens_per_pos
    assert per_pos[0] > per_pos[1] > 0  # drafts were cut to one token while 3+ ran...
    assert per_pos[3] > 0  # ...and the pair drafted four
    off = LLM(
        speculative_config={**ngram(4), "num_speculative_tokens_per_batch_size": [[1, 8, 0]]},
        max_num_seqs=8,
    )
    outs = off.chat(conversations, params)
    assert [o.outputs[0].token_ids for o in outs] == [t[:n] for t, n in zip(spec_off, lengths)]
    assert off.engine.spec.metrics.num_drafts == 0  # k = 0 at every batch size


def test_generate_command_streams_text() -> None:
    result = CliRunner().invoke(
        cli, ["generate", "--prompt", "Explain speculative decoding in one paragraph.",
              "--max-tokens", "24"]
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip()) > 20  # the text; stderr has the backend and speed lines
    assert result.stderr.startswith("backend: attention=")


def test_generate_json_with_ngram_matches_plain() -> None:
    prompt = "Rewrite with type hints: def add(a, b):\n    return a + b"
    args = ["generate", "--prompt", prompt, "--max-tokens", "32", "--json"]
    plain = CliRunner().invoke(cli, args)
    spec = CliRunner().invoke(cli, [*args, "--speculative-config", json.dumps(ngram(4))])
    assert plain.exit_code == 0 and spec.exit_code == 0, (plain.output, spec.output)
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)  # stderr: the backend line
    assert a["token_ids"] == b["token_ids"]
    sd = b["metrics"]["speculative_decoding"]
    assert sd["num_draft_tokens"] > 0 and sd["mean_acceptance_length"] >= 1.0


def test_refused_config_exits_2_before_loading() -> None:
    result = CliRunner().invoke(
        cli, ["generate", "--prompt", "x", "--speculative-config",
              '{"method":"ngram","num_speculatve_tokens":4}']
    )
    assert result.exit_code == 2
    assert "num_speculatve_tokens" in result.output
