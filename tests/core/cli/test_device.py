"""``--device`` on generate, bench and serve, and ``EngineArgs(device=...)``: ``cpu`` runs
the C kernels; ``cuda`` runs the same engine on the Triton kernels where torch sees a CUDA
device and triton imports, and is refused by name at start-up elsewhere, exit 2 with what
would work, before the model is resolved or any weights are read (no traceback). The
engine on the Triton kernels itself is tested in ``tests/core/gpu/test_engine.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from draftwise.cli.bench import bench
from draftwise.cli.common import prefault_from_argv
from draftwise.cli.generate import generate
from draftwise.cli.serve import serve
from draftwise.gpu.device import DeviceUnavailableError
from draftwise.models import backend

WORKLOAD = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads" / "cpu-smoke-8.jsonl"
#: a model path that does not exist: a refusal that came after resolving it would name it
MISSING = "/nonexistent/model.gguf"


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def weights_never_read(monkeypatch):
    """Any weight load fails the test."""
    import draftwise.models.loader as loader

    def load_model(*args, **kwargs):
        raise AssertionError("weights were read before the device was refused")

    monkeypatch.setattr(loader, "load_model", load_model)


@pytest.mark.parametrize(("command", "args"), [
    (generate, ["--prompt", "hi"]),
    (bench, ["--workload", str(WORKLOAD), "--out", "/dev/null"]),
    (serve, ["--port", "0"]),
])
def test_cuda_without_a_device_is_refused_by_name(no_cuda, weights_never_read, command, args):
    result = CliRunner().invoke(command, ["--model", MISSING, "--device", "cuda", *args])
    assert result.exit_code == 2, result.output
    assert "--device cuda cannot run on this machine: no CUDA device" in result.output
    assert "Use --device cpu" in result.output
    assert "Traceback" not in result.output and "nonexistent" not in result.output


def test_engine_args_refuse_cuda_without_a_device(no_cuda, weights_never_read):
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs

    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        LLMEngine(EngineArgs(model=MISSING, device="cuda"))


def test_cuda_without_triton_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("draftwise.gpu.device.triton_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="triton is not installed"):
        backend.check_device("cuda")


def test_cuda_with_a_device_and_triton_runs_the_triton_kernels(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("draftwise.gpu.device.triton_available", lambda: True)
    monkeypatch.delenv(backend.KERNELS_ENV, raising=False)
    backend.check_device("cuda")  # accepted
    assert backend.choose_kernels("cuda") == "triton"
    monkeypatch.setenv(backend.KERNELS_ENV, "cpu")
    with pytest.raises(DeviceUnavailableError, match="the C kernels run on the CPU only"):
        backend.choose_kernels("cuda")


def test_triton_kernels_on_cpu_need_the_interpreter(monkeypatch):
    """``DRAFTWISE_KERNELS=triton`` (tests) runs the Triton kernels on CPU tensors only
    under Triton's interpreter; without it, or without triton, refused by name."""
    monkeypatch.setenv(backend.KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(DeviceUnavailableError, match="set TRITON_INTERPRET=1 too"):
        backend.choose_kernels("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr("draftwise.gpu.device.triton_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="triton is not installed"):
        backend.choose_kernels("cpu")
    monkeypatch.setenv(backend.KERNELS_ENV, "gpu")
    with pytest.raises(ValueError, match="DRAFTWISE_KERNELS='gpu': use auto, cpu or triton"):
        backend.choose_kernels("cpu")
    monkeypatch.delenv(backend.KERNELS_ENV)
    assert backend.choose_kernels("cpu") == "cpu"


def test_unknown_device_and_cpu():
    with pytest.raises(DeviceUnavailableError, match="'tpu' is not one of cpu, cuda"):
        backend.check_device("tpu")
    backend.check_device("cpu")  # the engine: no refusal


def test_click_refuses_an_unknown_device_as_a_usage_error():
    result = CliRunner().invoke(generate, ["--prompt", "hi", "--device", "tpu"])
    assert result.exit_code == 2 and "'tpu' is not one of 'cpu', 'cuda'" in result.output


def test_no_cpu_weight_memory_is_prefaulted_for_cuda():
    assert prefault_from_argv(["generate", "--device", "cuda"])[2] is None
