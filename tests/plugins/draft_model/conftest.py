"""Tiny target/draft pairs in the published layout: same vocabulary, and another one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_checkpoints import perturbed_copy, save_tiny, write_wordlevel_tokenizer

TARGET_TOKENS = [f"w{i}" for i in range(511)] + ["[UNK]"]  # 512: the tiny vocab
DRAFT_VOCAB = 540
SHARED = 501  # draft ids 0..500 are target tokens (permuted), the rest the draft's own


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_tiny("llama", tmp_path_factory.mktemp("dm-target"), seed=5, std=0.25)
    return write_wordlevel_tokenizer(path, TARGET_TOKENS)


@pytest.fixture(scope="session")
def draft_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target, jittered: it agrees with the target often, not always."""
    return perturbed_copy(target_dir, tmp_path_factory.mktemp("dm") / "draft", scale=0.015)


@pytest.fixture(scope="session")
def hetero_draft_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another vocabulary (540 tokens, 501 shared with the target under other ids) over
    the jittered target's weights, so the draft agrees with the target only through a
    right mapping of ids both ways."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("dm-hetero") / "draft"
    perturbed_copy(target_dir, out, scale=0.01, seed=3)
    perm = np.random.default_rng(0).permutation(511)[:SHARED]
    tokens = [TARGET_TOKENS[p] for p in perm]
    tokens += [f"x{j}" for j in range(DRAFT_VOCAB - SHARED - 1)] + ["[UNK]"]
    tensors = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(11)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        old = tensors[name]
        new = 0.25 * torch.randn((DRAFT_VOCAB, old.shape[1]), generator=gen).to(old.dtype)
        new[:SHARED] = old[torch.from_numpy(perm)]
        new[DRAFT_VOCAB - 1] = old[511]  # [UNK]
        tensors[name] = new
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["vocab_size"] = DRAFT_VOCAB
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "tokenizer.json").unlink()
    return write_wordlevel_tokenizer(out, tokens)


@pytest.fixture(scope="session")
def no_tokenizer_draft(draft_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dm-notok") / "draft"
    shutil.copytree(draft_dir, out)
    (out / "tokenizer.json").unlink()
    return out
