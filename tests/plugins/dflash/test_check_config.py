"""``check-config --model``: a DFlash drafter's fit with the target, from headers alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftwise.cli import CliState, cli
from draftwise.plugins import PluginHost, load_entry_point_plugins

from .conftest import save_drafter


@pytest.fixture(scope="module")
def state() -> CliState:
    return CliState(load_entry_point_plugins(PluginHost(), selection=None))


@pytest.fixture
def no_tensor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading any tensor's data, or loading a model, fails the test."""
    from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
    from draftwise.models import loader

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(SafetensorsCheckpoint, "iter_tensors", refuse)
    monkeypatch.setattr(SafetensorsCheckpoint, "iter_raw", refuse)
    monkeypatch.setattr(loader, "load_model", refuse)


@pytest.mark.usefixtures("no_tensor_reads")
def test_hidden_size_mismatch_is_refused_by_check_config(
    state: CliState, target_dir: Path, tmp_path: Path
) -> None:
    narrow = save_drafter(tmp_path / "narrow", hidden=64, intermediate=128, head_dim=16)
    config = json.dumps({"method": "dflash", "model": str(narrow), "num_speculative_tokens": 7})
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["check-config", "--model", str(target_dir), config],
                                obj=state)
    seconds = time.perf_counter() - start
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        f"error: {narrow}: the drafter's hidden_size is 64 and the target's 128")
    assert "Instead: the DFlash drafter trained for this target." in result.stderr
    assert seconds < 1.0
    # the drafter alone is fine: only the pair is refused
    alone = CliRunner().invoke(cli, ["check-config", config], obj=state)
    assert alone.exit_code == 0, alone.output


@pytest.mark.usefixtures("no_tensor_reads")
def test_a_fitting_drafter_passes_with_its_target(
    state: CliState, target_dir: Path, drafter_dir: Path
) -> None:
    config = json.dumps({"method": "dflash", "model": str(drafter_dir),
                         "num_speculative_tokens": 7})
    result = CliRunner().invoke(cli, ["check-config", "--model", str(target_dir), config],
                                obj=state)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == str(drafter_dir)
