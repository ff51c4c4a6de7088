"""``draftwise doctor`` prints pairing, the per-k table and a recommendation."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from tiny_checkpoints import save_tiny

from draftwise.cli import cli

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1})


def test_doctor_table_and_json(tmp_path: Path) -> None:
    model = save_tiny("llama", tmp_path / "m", seed=3)
    work = tmp_path / "w.jsonl"
    work.write_text("\n".join(json.dumps({"id": str(i), "kind": "t", "prompt_token_ids": p})
                              for i, p in enumerate([[5, 9, 13] * 5, [42] * 9])))
    args = ["doctor", "--model", str(model), "--dtype", "bfloat16", "--speculative-config",
            NGRAM, "--workload", str(work), "--max-tokens", "12", "--ignore-eos"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "pairing:" in out and "acceptance per position (k=2)" in out
    assert "predicted" in out and "measured" in out and "recommended:" in out
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json", "--no-measure"]).stdout)
    assert [row["k"] for row in doc["per_k"]] == [1, 2]
    assert all(row["measured_speedup"] is None for row in doc["per_k"])
    assert doc["cost_model"]["rows"] == [1]


def test_doctor_refuses_without_speculation(tmp_path: Path) -> None:
    model = save_tiny("llama", tmp_path / "m", seed=3)
    work = tmp_path / "w.jsonl"
    work.write_text(json.dumps({"prompt_token_ids": [1, 2, 3]}))
    result = CliRunner().invoke(cli, ["doctor", "--model", str(model), "--speculative-config",
                                      "null", "--workload", str(work)])
    assert result.exit_code != 0 and "nothing to check" in result.output
