"""Tiny Qwen3 targets and z-lab DFlash drafters in the published layout.

The drafters are z-lab's own ``DFlashDraftModel`` / ``DFlash2DraftModel`` (the
``dflash==0.1.0`` test dependency), randomly initialised and written with
``save_pretrained``, so the files are exactly what z-lab publishes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_checkpoints import randomize_, save_tiny, write_wordlevel_tokenizer

TOKENS = [f"w{i}" for i in range(510)] + ["<|MASK|>", "[UNK]"]  # 512
MASK = 510
TARGET_LAYERS = 3


def save_drafter(
    directory: Path,
    *,
    block_size: int = 8,
    layers: int = 2,
    target_layer_ids: list[int] | None = (0, 2),  # type: ignore[assignment]
    version: int = 1,
    seed: int = 7,
    top_level_block: bool = False,
    **extra: Any,
) -> Path:
    """A random z-lab drafter for the tiny Qwen3 target (hidden 128, vocab 512)."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    from transformers import Qwen3Config

    dflash: dict[str, Any] = {"mask_token_id": MASK}
    if not top_level_block:
        dflash["block_size"] = block_size
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    if version == 2:
        dflash.update(conv_kernel_size=2, conv_group_size=16, selector_rank=32,
                      selector_top_k=8)
    cfg = Qwen3Config(
        hidden_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, intermediate_size=256, vocab_size=512,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1000000.0,
        tie_word_embeddings=False, num_target_layers=TARGET_LAYERS, dflash_config=dflash,
        **({"block_size": block_size} if top_level_block else {}), **extra,
    )
    cfg.architectures = ["DFlash2DraftModel" if version == 2 else "DFlashDraftModel"]
    torch.manual_seed(seed)
    model = (DFlash2DraftModel if version == 2 else DFlashDraftModel)(cfg)
    randomize_(model, seed, std=0.15)
    model.save_pretrained(directory, safe_serialization=True)
    d = json.loads((directory / "config.json").read_text())
    d["architectures"] = cfg.architectures
    (directory / "config.json").write_text(json.dumps(d, indent=1))
    return directory


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("qwen3", tmp_path_factory.mktemp("df-target"), seed=3, std=0.25,
                     num_hidden_layers=TARGET_LAYERS)
    return write_wordlevel_tokenizer(path, TOKENS)


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_drafter(tmp_path_factory.mktemp("df1") / "b8")


@pytest.fixture(scope="session")
def drafter2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_drafter(tmp_path_factory.mktemp("df2") / "b8", version=2)
