"""``draftwise bench`` end to end on a tiny random llama (no peers): the JSON report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from tiny_checkpoints import save_tiny

from draftwise.cli import cli
from draftwise.cli.bench import _paired_ratios
from draftwise.models.attention import choose_backend
from draftwise.models.linear import can_pack


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("bench-llama"), seed=2)


def test_bench_writes_report_with_spec_and_off(tiny: Path, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    rows = [{"id": f"p{i}", "kind": "grounded" if i % 2 else "open",
             "prompt_token_ids": [3 + i, 5, 7, 3 + i, 5, 7, 3 + i]} for i in range(3)]
    workload.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.json"
    spec = '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":1,"prompt_lookup_max":3}'
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny), "--max-tokens", "6",
        "--speculative-config", spec, "--compare-off", "--concurrency", "2", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["draftwise"]["summary"]["all"]["num_prompts"] == 3
    assert report["draftwise"]["spec_decode"]["num_spec_tokens"] == 2
    assert report["identical_to_spec_off"] == 3  # greedy: speculation is lossless
    assert set(report["draftwise"]["summary"]) == {"all", "grounded", "open"}
    assert report["ratios"]["spec_on_vs_off"]["all"] > 0
    # at concurrency 2 the wall throughput ratio stands beside the request-time one
    walls = [report[k]["summary"]["all"]["wall_tok_per_s"]
             for k in ("draftwise", "draftwise_spec_off")]
    assert report["ratios"]["throughput_spec_on_vs_off"] == {"all": walls[0] / walls[1]}
    assert "ratio throughput_spec_on_vs_off:" in result.output
    # the report says which fast paths produced the numbers (bf16 default on CPU)
    assert report["draftwise"]["packed_weights"] is can_pack(torch.empty(2, 2, dtype=torch.bfloat16))
    assert report["draftwise"]["attention_backend"] == choose_backend(torch.bfloat16, 32, "cpu")


def test_bench_refuses_bad_config_with_exit_2(tiny: Path, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt_token_ids": [1, 2, 3]}))
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny),
        "--speculative-config", '{"method":"ngramm"}', "--out", str(tmp_path / "r.json"),
    ])
    assert result.exit_code == 2
    assert "ngramm" in result.output


def bench_adaptive_ngram(tiny: Path, tmp_path: Path, k: int, *flags: str) -> tuple[dict, str]:
    """``draftwise bench`` of adaptive n-gram at depth ``k`` plus ``flags`` over two repetitive
    prompts (6 tokens each); the JSON report and the printed output."""
    workload = tmp_path / "w.jsonl"
    rows = [{"id": f"p{i}", "kind": "open", "prompt_token_ids": [3 + i, 5, 7] * 3}
            for i in range(2)]
    workload.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.json"
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                       "draftwise": {"adaptive": True}})
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny), "--max-tokens", "6",
        "--speculative-config", spec, *flags, "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_bench_adaptive_runs_fixed_depth_and_off_side_by_side(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    report, _ = bench_adaptive_ngram(tiny, tmp_path, 2, "--compare-off", "--repeat", "2")
    # the fixed twin says so: without the key a config is adaptive (the default)
    assert report["draftwise_fixed_k"]["speculative_config"].get("draftwise") == {
        "adaptive": False}
    assert report["identical_to_spec_off"] == report["identical_fixed_k_to_spec_off"] == 2
    assert {"spec_on_vs_off", "fixed_k_vs_off", "adaptive_vs_fixed_k"} <= set(report["ratios"])
    assert "throughput_spec_on_vs_off" not in report["ratios"]  # one at a time: the same figure
    assert set(report["per_prompt_vs_off"]["draftwise"]["per_prompt"]) == {"p0", "p1"}
    paired = report["per_prompt_vs_off"]["draftwise"]["paired"]  # two rounds: each paired
    assert set(paired) == {"p0", "p1"}
    assert all(v["min"] <= v["median"] <= v["max"] for v in paired.values())
    cost = report["draftwise"]["adaptive"]["cost_model"]
    assert cost["rows"] == [1] and len(cost["forward_seconds"][0]) == 3


def test_bench_compare_k_runs_every_fixed_depth_side_by_side(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    report, output = bench_adaptive_ngram(tiny, tmp_path, 3, "--compare-k", "2,1")
    for k in (1, 2):
        cfg = report[f"draftwise_k{k}"]["speculative_config"]
        assert cfg["num_speculative_tokens"] == k and cfg["draftwise"] == {"adaptive": False}
        assert f"draftwise_k{k}_vs_off" in report["ratios"]
    assert report["identical_to_spec_off"] == 2
    assert report["identical_to_spec_off_by_k"] == {"draftwise_k1": 2, "draftwise_k2": 2}
    assert report["best_fixed_k"] in {"draftwise_k1", "draftwise_k2"}
    assert "vs_best_fixed_k" in report["ratios"] and "draftwise_fixed_k" not in report
    assert set(report["per_prompt_vs_off"]) == {"draftwise", "draftwise_k1", "draftwise_k2"}
    assert "per prompt, tok/s over spec off" in output


@pytest.mark.parametrize("ks", ["0,1", "a"])
def test_bench_compare_k_refuses_a_bad_list(tiny: Path, tmp_path: Path, ks: str) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt_token_ids": [1, 2, 3]}))
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny), "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":2}', "--compare-k", ks,
        "--out", str(tmp_path / "r.json"),
    ])
    assert result.exit_code == 2 and "--compare-k" in result.output


def test_bench_cpu_clock(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--clock cpu: every time is this process's CPU time (what a loaded machine leaves)."""
    import time

    calls: list[int] = []
    real = time.process_time
    monkeypatch.setattr(time, "process_time", lambda: calls.append(1) or real())
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt_token_ids": [3, 5, 7, 3, 5]}))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny), "--max-tokens", "4",
        "--clock", "cpu", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["clock"] == "cpu" and calls  # the run read the CPU clock
    assert report["draftwise"]["summary"]["all"]["tok_per_s"] > 0


@pytest.mark.parametrize("concurrency", [1, 2])
def test_bench_interleaves_prompt_by_prompt_at_concurrency_one(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """At concurrency 1 every engine runs a prompt before any engine runs the next, so a
    prompt's ratios compare runs seconds apart, in reversed engine order every other round
    (which engine ran just before moves a ratio); batched, the workload is the unit."""
    import draftwise.bench.run as run_mod

    real = run_mod.run_engine
    calls: list[tuple[int, tuple[str, ...]]] = []

    def spy(engine, items, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((id(engine), tuple(i.id for i in items)))
        return real(engine, items, *args, **kwargs)

    monkeypatch.setattr(run_mod, "run_engine", spy)
    workload = tmp_path / "w.jsonl"
    rows = [{"id": f"p{i}", "kind": "open", "prompt_token_ids": [3 + i, 5, 7] * 3}
            for i in range(2)]
    workload.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, [
        "bench", "--workload", str(workload), "--model", str(tiny), "--max-tokens", "4",
        # fixed depth: two engines (an adaptive config, the default, adds its fixed twin)
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":2,"draftwise":{"adaptive":false}}',
        "--compare-off", "--repeat", "2", "--concurrency", str(concurrency),
        "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    runs = calls  # (warm-up steps the engine itself, not through run_engine)
    engines = list(dict.fromkeys(e for e, _ in runs))
    assert len(engines) == 2
    if concurrency == 1:  # p0 on both engines, then p1 on both, twice
        assert [p for _, p in runs] == [("p0",), ("p0",), ("p1",), ("p1",)] * 2
        a, b = engines
        assert [e for e, _ in runs] == [a, b, a, b, b, a, b, a]
    else:
        assert [p for _, p in runs] == [("p0", "p1")] * 4
    report = json.loads(out.read_text())
    assert [r["id"] for r in report["draftwise"]["per_prompt"]] == ["p0", "p1"]


def test_paired_ratios_compare_runs_of_the_same_round() -> None:
    """Round 1: 10 against 5 tok/s (2.0x); round 2: 6 against 6 (1.0x). Best of each
    config would read 10 / 6 = 1.67x, from different rounds; the paired ratios are the
    rounds' own: median 1.5, [1.0, 2.0]. One round: nothing to pair."""

    def run(*tok_per_s: float) -> tuple[list[SimpleNamespace], float]:
        return [SimpleNamespace(id=f"p{i}", tok_per_s=t) for i, t in enumerate(tok_per_s)], 0.0

    runs = {"draftwise": [run(10.0, 3.0), run(6.0, 3.0)],
            "draftwise_spec_off": [run(5.0, 4.0), run(6.0, 2.0)]}
    report: dict = {"per_prompt_vs_off": {"draftwise": {}}}
    _paired_ratios(report, runs, ["draftwise"])
    got = report["per_prompt_vs_off"]["draftwise"]
    assert got["paired"]["p0"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert got["paired"]["p1"] == {"median": 1.125, "min": 0.75, "max": 1.5}
    assert got["paired_min_median"] == 1.125
    one: dict = {"per_prompt_vs_off": {"draftwise": {}}}
    _paired_ratios(one, {k: v[:1] for k, v in runs.items()}, ["draftwise"])
    assert "paired" not in one["per_prompt_vs_off"]["draftwise"]
