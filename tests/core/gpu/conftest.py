"""The Triton kernels' tests run on a CUDA device when there is one, and otherwise on CPU
tensors under Triton's interpreter (CI). The interpreter is chosen here, before any test
imports a ``draftwise.gpu.triton_*`` module: ``triton.jit`` reads the variable when a
kernel module is imported. ``gpu``-marked tests need a real device and skip without one.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run in this process (module doc)."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests without a CUDA device (they time or stress real kernels)."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (benchmarks/device_check.sh runs it)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
