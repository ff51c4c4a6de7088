"""Tiny random checkpoints saved by transformers, and small runners over our model.

Every checkpoint is a real ``save_pretrained`` directory (config.json + safetensors), with
all weights re-drawn (norms near 1, biases non-zero) so that no tensor is a no-op and a
wrong permutation, bias or norm shows up in the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from draftwise.models import kernels
from draftwise.models.batch import KVCache, build_forward_batch

# the checkpoints themselves are shared with the engine tests
from tiny_checkpoints import ARCHS, TINY, randomize_, save_tiny  # noqa: E402, F401
from tiny_gguf import tiny_gguf  # noqa: E402, F401


@pytest.fixture
def restore_threads():
    """``finish_backend`` applies its thread split process-wide: a module that calls it
    opts in (``pytestmark``) so later tests get the kernel and torch thread counts back."""
    kernel, torch_threads = kernels._threads, torch.get_num_threads()
    yield
    kernels.set_kernel_threads(kernel)
    torch.set_num_threads(torch_threads)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint("qwen3")`` -> a directory, saved once per session."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = save_tiny(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return made[kind]

    return get


@dataclass
class PagedRunner:
    """Drives our model row by row through a paged cache with scattered block tables."""

    model: torch.nn.Module
    block_size: int = 4
    num_blocks: int = 96

    def __post_init__(self) -> None:
        m = self.model
        self.kv = KVCache.allocate(
            m.num_layers, self.num_blocks, self.block_size, m.num_kv_heads, m.head_dim, m.dtype
        )
        # deliberately non-contiguous, interleaved block ids per row
        perm = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(1))
        self.free = perm.tolist()
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def _table(self, row: int, upto: int) -> list[int]:
        table = self.tables.setdefault(row, [])
        while len(table) * self.block_size < upto:
            table.append(self.free.pop())
        return table

    def step(
        self, chunks: dict[int, list[int]], hidden_layers: tuple[int, ...] = ()
    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Append ``chunks[row]`` tokens to each row in ONE forward; logits of every token."""
        rows = list(chunks)
        starts = [self.lengths.get(r, 0) for r in rows]
        tables = [self._table(r, s + len(chunks[r])) for r, s in zip(rows, starts)]
        batch = build_forward_batch(
            [chunks[r] for r in rows],
            starts,
            tables,
            self.block_size,
            [list(range(len(chunks[r]))) for r in rows],
            hidden_layers=hidden_layers,
        )
        out = self.model(batch, self.kv)
        logits: dict[int, torch.Tensor] = {}
        offset = 0
        for r, s in zip(rows, starts):
            n = len(chunks[r])
            logits[r] = out.logits[offset : offset + n]
            self.lengths[r] = s + n
            offset += n
        return logits, out.hidden_states


def greedy(
    model: torch.nn.Module, prompt: list[int], n: int, stop: tuple[int, ...] = ()
) -> list[int]:
    """Plain greedy decode: prefill, then one token per forward."""
    runner = PagedRunner(model, block_size=16, num_blocks=(len(prompt) + n) // 16 + 2)
    logits, _ = runner.step({0: prompt})
    out = [int(logits[0][-1].argmax())]
    while len(out) < n and out[-1] not in stop:
        logits, _ = runner.step({0: [out[-1]]})
        out.append(int(logits[0][-1].argmax()))
    return out


@pytest.fixture
def paged_runner() -> type[PagedRunner]:
    """The runner class, for tests to build over any model."""
    return PagedRunner


@pytest.fixture
def greedy_decode() -> Callable[..., list[int]]:
    """The greedy loop, for tests."""
    return greedy
