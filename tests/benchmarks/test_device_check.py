"""``benchmarks/device_check.sh``: its dry run (and any run without CUDA) prints the plan
and runs nothing; the plan holds every step of the check within the 8-minute budget."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
STEPS = ("install", "gpu_tests", "kernels", "engine_off", "engine_ngram",
         "engine_draft_model", "cuda_engine")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def plan_steps(stdout: str) -> dict[str, tuple[int, str]]:
    """step -> (timeout, command), from the printed plan."""
    found = {}
    for line in stdout.splitlines():
        m = re.match(r"^  (\w+)\s+(\d+)  (.*)$", line)
        if m:
            found[m.group(1)] = (int(m.group(2)), m.group(3))
    return found


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    report = tmp_path / "report.json"
    result = run("--dry-run", "--out", str(report), "--wheels", "/carried/wheels")
    assert result.returncode == 0, result.stderr
    steps = plan_steps(result.stdout)
    assert tuple(steps) == STEPS
    assert str(report) in result.stdout and "/carried/wheels" in result.stdout
    assert "DRAFTWISE_KEEP_TORCH=1 bash" in steps["install"][1]
    assert "tests/core/gpu" in steps["gpu_tests"][1]
    assert "benchmarks/device_engine.py" in steps["cuda_engine"][1]
    assert "ngram" in steps["engine_ngram"][1] and "draft_config" in steps["engine_draft_model"][1]
    assert sum(limit for limit, _ in steps.values()) < 8 * 60
    assert not report.exists()


def test_device_engine_compares_tokens_per_configuration():
    """The CUDA step's script: speculation off, n-gram and draft_model, and where two
    runs' greedy tokens first differ (it runs only on a GPU; its helpers run here)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import device_engine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert tuple(device_engine.configs("m.gguf")) == ("off", "ngram", "draft_model")
    assert device_engine.first_mismatch([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == (1, 1)
    assert device_engine.first_mismatch([[1, 2]], [[1]]) == (0, 1)


def test_out_defaults_to_the_device_tools_folder(tmp_path):
    result = run("--dry-run", env={"OUT": str(tmp_path)})
    assert f"would write {tmp_path}/device_check.json" in result.stdout


def test_without_cuda_it_runs_nothing(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the check for real")
    report = tmp_path / "report.json"
    result = run("--out", str(report))  # this interpreter's torch: no CUDA here
    assert result.returncode == 0
    assert "no CUDA device here" in result.stdout and "install" in result.stdout
    assert not report.exists()


def test_unknown_argument_is_a_usage_error():
    result = run("--fast")
    assert result.returncode == 2 and "unknown argument --fast" in result.stderr
