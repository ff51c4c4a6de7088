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
    hidden: int = 128,
    intermediate: int = 256,
    head_dim: int = 32,
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
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, intermediate_size=intermediate, vocab_size=512,
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


#: prompts the trained drafters memorise the target's continuation of (equal lengths, so
#: training batches them)
TRAIN_PROMPTS = [[7, 3, 11, 5, 2, 9, 14, 1], [20, 21, 22, 23, 24, 25, 26, 27],
                 [100, 101, 102, 40, 41, 42, 43, 44], [310, 47, 12, 9, 9, 81, 6, 250]]


def train_drafter(target_dir: Path, directory: Path, *, version: int = 1, steps: int = 150,
                  block_size: int = 8, seed: int = 0, new_tokens: int = 40) -> Path:
    """A z-lab drafter trained briefly on the tiny target's greedy continuations of
    :data:`TRAIN_PROMPTS` (z-lab's model; context = target hidden states before the
    anchor, block = ``[anchor, MASK x (B-1)]``, labels = the next B-1 tokens), so that
    acceptance is far from zero and the engine's accepted-draft paths run."""
    import transformers
    from dflash.model import DFlash2DraftModel, DFlashDraftModel, extract_context_feature

    save_drafter(directory, version=version, block_size=block_size, seed=seed + 11)
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target.eval().requires_grad_(False)
    cls = DFlash2DraftModel if version == 2 else DFlashDraftModel
    drafter = cls.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        seqs = target.generate(torch.tensor(TRAIN_PROMPTS), max_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
        feats = extract_context_feature(
            target(seqs, output_hidden_states=True).hidden_states, drafter.target_layer_ids)
        embed = target.get_input_embeddings()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    drafter.train()
    p = len(TRAIN_PROMPTS[0])
    for _ in range(steps):
        start = int(torch.randint(p - 1, seqs.shape[1] - block_size, (1,), generator=gen))
        block = seqs[:, start : start + block_size].clone()
        block[:, 1:] = MASK
        hidden = drafter(target_hidden=feats[:, :start], noise_embedding=embed(block),
                         position_ids=torch.arange(start + block_size)[None],
                         use_cache=False)[:, 1:]
        logits = drafter.compute_logits(hidden, target.lm_head)
        labels = seqs[:, start + 1 : start + block_size].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    drafter.save_pretrained(directory, safe_serialization=True)
    d = json.loads((directory / "config.json").read_text())
    d["architectures"] = [cls.__name__]
    (directory / "config.json").write_text(json.dumps(d, indent=1))
    return directory


@pytest.fixture(scope="session")
def trained_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_drafter(target_dir, tmp_path_factory.mktemp("df1-trained") / "b8",
                         steps=100, new_tokens=24)


@pytest.fixture(scope="session")
def trained2_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_drafter(target_dir, tmp_path_factory.mktemp("df2-trained") / "b8",
                         version=2, steps=100, new_tokens=24)
