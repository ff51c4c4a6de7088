"""``draftwise generate``: speed and acceptance on stderr, one JSON document with --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_checkpoints import save_tiny

from draftwise.cli import cli
from draftwise.cli.generate import summary_line

IDS = ",".join(str(t) for t in [5, 6, 7, 8] * 6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("gen-llama"), seed=5, std=0.25)


def spec(tiny: Path) -> str:
    """The target drafting for itself: every draft is accepted. Fixed depth, so the counts
    below are exact (adaptive depth, the default, would choose them)."""
    return json.dumps({"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 3,
                       "draftwise": {"adaptive": False}})


def run(tiny: Path, *extra: str):
    args = ["generate", "--model", str(tiny), "--prompt-token-ids", IDS, "--max-tokens", "12",
            "--dtype", "bfloat16", *extra]
    return CliRunner().invoke(cli, args)


def test_plain_output_ends_with_the_speed(tiny: Path) -> None:
    result = run(tiny)
    assert result.exit_code == 0, result.output
    assert "12 tokens in " in result.stderr and "tok/s)" in result.stderr
    assert "accepted" not in result.stderr


def test_speculation_reports_acceptance_per_position(tiny: Path) -> None:
    result = run(tiny, "--speculative-config", spec(tiny))
    assert result.exit_code == 0, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "drafts accepted" in line and "mean acceptance length" in line
    # one rate per draft position (vLLM's: accepted there / drafts; the last step drafts 2)
    assert line.endswith("8/8 drafts accepted (100%), mean acceptance length 3.67, "
                         "per position 1.00, 1.00, 0.67")


def test_json_is_one_document_with_acceptance_per_position(tiny: Path) -> None:
    result = run(tiny, "--speculative-config", spec(tiny), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    sd = doc["speculation"]
    assert sd["num_draft_tokens"] > 0
    assert sd["num_spec_tokens"] == 3 and len(sd["acceptance_rate_per_pos"]) == 3
    assert sd["num_draft_tokens"] == doc["metrics"]["speculative_decoding"]["num_draft_tokens"]


def test_summary_line() -> None:
    assert summary_line(10, 2.0, None) == "10 tokens in 2.00 s (5.0 tok/s)"
    assert summary_line(10, 2.0, {"num_drafts": 0}).endswith("nothing was drafted")
    spec = {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 6,
            "draft_acceptance_rate": 0.75, "mean_acceptance_length": 2.5,
            "acceptance_rate_per_pos": [1.0, 0.5]}
    assert summary_line(10, 2.0, spec) == (
        "10 tokens in 2.00 s (5.0 tok/s); 6/8 drafts accepted (75%), mean acceptance length "
        "2.50, per position 1.00, 0.50"
    )


def test_json_carries_token_provenance_that_sums_to_the_metrics(tiny: Path) -> None:
    result = run(tiny, "--speculative-config", spec(tiny), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    prov, sd = doc["token_provenance"], doc["metrics"]["speculative_decoding"]
    assert len(prov) == len(doc["token_ids"]) == 12
    assert prov.count("accepted:draft_model") == sd["num_accepted_draft_tokens"] == 8
    assert prov.count("bonus") + prov.count("recovered") == sd["num_spec_steps"]
    assert prov[0] == "plain"  # the prefill's sample verifies no drafts


def test_json_reports_startup_load_and_first_token_apart(tiny: Path) -> None:
    """The wait a user sees is start-up + load + the request's time to first token."""
    result = run(tiny, "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)["metrics"]
    parts = m["startup_seconds"], m["load_seconds"], m["time_to_first_token"]
    assert all(p >= 0 for p in parts) and m["load_seconds"] > 0
    # three disjoint intervals in this order (the chat template and admission between)
    assert m["first_token_after_start_seconds"] >= sum(parts) - 1e-6


def test_process_started_counts_from_the_process_not_the_import() -> None:
    """Time spent before ``draftwise.cli`` is imported is part of the wait."""
    import os
    import subprocess
    import sys

    code = ("import time; time.sleep(0.3); from draftwise.cli import STARTED; "
            "from draftwise.cli.common import process_started; "
            "print(STARTED - process_started())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120, check=True)
    before_import = float(out.stdout.split()[-1])
    if not sys.platform.startswith("linux"):
        assert before_import == 0.0
        return
    assert 0.3 - 0.02 <= before_import < 30  # the sleep, within a clock tick


def test_start_up_says_which_depth_rule_is_in_force(tiny: Path) -> None:
    """No ``draftwise`` key: adaptive depth, said on stderr with the switch that pins k."""
    adaptive = json.dumps({"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 3})
    result = run(tiny, "--speculative-config", adaptive)
    assert result.exit_code == 0, result.output
    assert ('speculation: draft_model, adaptive depth 0..3 per request and step '
            '("draftwise": {"adaptive": false} pins k)') in result.stderr.splitlines()
    result = run(tiny, "--speculative-config", spec(tiny))
    assert result.exit_code == 0, result.output
    assert ('speculation: draft_model, fixed depth k=3, "draftwise": {"adaptive": false}'
            in result.stderr.splitlines())
