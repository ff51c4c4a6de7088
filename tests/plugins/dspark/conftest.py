"""Tiny Qwen3 targets and DeepSpec native DSpark drafters in the published layout.

DeepSpec's ``Qwen3DSparkModel`` (``shared/reference/drafter-formats.md`` §2.1) is the
DFlash body plus ``embed_tokens``, ``lm_head`` and ``markov_head.*``, with a config that
is a copy of the target's plus the DSpark keys at the top level. The body here is
z-lab's own ``DFlashDraftModel`` (the dflash test dependency, the same module layout),
randomly initialised; the extra tensors are drawn here; ``embed_tokens``/``lm_head``
are copies of the target's, as DeepSpec trains them frozen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import randomize_, save_tiny, write_wordlevel_tokenizer

TOKENS = [f"w{i}" for i in range(510)] + ["<|MASK|>", "[UNK]"]  # 512
MASK = 510
TARGET_LAYERS = 3


def save_dspark(
    directory: Path,
    target_dir: Path,
    *,
    kind: str = "vanilla",
    rank: int = 16,
    block_size: int = 7,
    layers: int = 2,
    target_layer_ids: tuple[int, ...] = (-1, 1),
    seed: int = 7,
    markov_std: float = 0.5,
    **overrides: Any,
) -> Path:
    """A random DeepSpec-layout drafter for the tiny target (config = target's + DSpark)."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    target_cfg = json.loads((target_dir / "config.json").read_text())
    cfg = dict(target_cfg)
    cfg.update(
        architectures=["Qwen3DSparkModel"], num_hidden_layers=layers,
        num_target_layers=target_cfg["num_hidden_layers"], block_size=block_size,
        mask_token_id=MASK, target_layer_ids=list(target_layer_ids), num_anchors=64,
        tie_word_embeddings=False, layer_types=["full_attention"] * layers,
        markov_rank=rank, markov_head_type=kind, enable_confidence_head=False,
        confidence_head_with_markov=False,
    )
    cfg.update(overrides)
    body_cfg = Qwen3Config(**{k: v for k, v in target_cfg.items()
                              if k not in ("architectures", "num_hidden_layers", "layer_types")},
                           num_hidden_layers=layers, num_target_layers=TARGET_LAYERS,
                           dflash_config={"mask_token_id": MASK, "block_size": block_size,
                                          "target_layer_ids": list(target_layer_ids)})
    torch.manual_seed(seed)
    body = DFlashDraftModel(body_cfg)
    randomize_(body, seed, std=0.15)
    tensors = {k: v.detach().clone().contiguous() for k, v in body.state_dict().items()
               if not k.startswith("rotary")}
    target = _target_tensors(target_dir)
    tensors["embed_tokens.weight"] = target["model.embed_tokens.weight"].clone()
    tensors["lm_head.weight"] = target["lm_head.weight"].clone()
    g = torch.Generator().manual_seed(seed + 1)
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]

    def draw(*shape: int, std: float = markov_std) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    if rank:
        tensors["markov_head.markov_w1.weight"] = draw(v, rank)
        tensors["markov_head.markov_w2.weight"] = draw(v, rank)
        if kind == "gated":
            tensors["markov_head.gate_proj.weight"] = draw(rank, h + rank, std=0.2)
            tensors["markov_head.gate_proj.bias"] = draw(rank, std=0.2)
        elif kind == "rnn":
            tensors["markov_head.joint_proj.weight"] = draw(3 * rank, 2 * rank + h, std=0.2)
            tensors["markov_head.joint_proj.bias"] = draw(3 * rank, std=0.2)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return directory


def _target_tensors(target_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("qwen3", tmp_path_factory.mktemp("ds-target"), seed=3, std=0.25,
                     num_hidden_layers=TARGET_LAYERS)
    return write_wordlevel_tokenizer(path, TOKENS)


@pytest.fixture(scope="session")
def dspark_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_dspark(tmp_path_factory.mktemp("ds-vanilla") / "b7", target_dir)
