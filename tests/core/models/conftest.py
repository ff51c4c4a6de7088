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
from draftwise.models.batch import KVCache, build_forward_batch

TINY = {
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}

ARCHS = {
    "llama": ("LlamaConfig", {"rope_theta": 10000.0}),
    "qwen2": ("Qwen2Config", {"rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", {"head_dim": 48, "rope_theta": 1000000.0}),
    "mistral": ("MistralConfig", {"sliding_window": None, "rope_theta": 10000.0}),
    "mistral_swa": ("MistralConfig", {"sliding_window": 6, "rope_theta": 10000.0}),
    "llama_tied_scaled": (
        "LlamaConfig",
        {
            "tie_word_embeddings": True,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
}


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.08) -> None:
    """Re-draw every parameter: matrices N(0, std), norms 1 + N(0, 0.1), biases N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(std * noise)


def save_tiny(kind: str, directory: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny ``kind`` model with transformers."""
    import transformers

    cls_name, extra = ARCHS[kind]
    config = getattr(transformers, cls_name)(**{**TINY, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(directory, safe_serialization=True)
    return directory


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
