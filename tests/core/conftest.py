"""Targets the core's speculation tests share: tiny models with word-level tokenizers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny, write_wordlevel_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def word_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama; token ``i`` is the word ``w<i>`` (511 is ``[UNK]``)."""
    path = save_tiny("llama", tmp_path_factory.mktemp("params-llama"), seed=5, std=0.25)
    return write_wordlevel_tokenizer(path, [f"w{i}" for i in range(511)] + ["[UNK]"])


@pytest.fixture(scope="session")
def word_hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3.5 hybrid (GDN layers: rollback of recurrent state under the drafts);
    token ``i`` is the word ``w<i>`` (255 is ``[UNK]``), so bad words and stop strings apply."""
    spec = importlib.util.spec_from_file_location("build_tiny_hybrid",
                                                  ROOT / "scripts" / "build_tiny_hybrid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = mod.build(tmp_path_factory.mktemp("params-hybrid"), "qwen3_5", mtp=False)
    return write_wordlevel_tokenizer(path, [f"w{i}" for i in range(255)] + ["[UNK]"])


@pytest.fixture(scope="session")
def tools_llama(word_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama, tools-capable (``spec_features.make_tools_target``)."""
    from spec_features import make_tools_target

    return make_tools_target(word_llama, tmp_path_factory.mktemp("tools-llama") / "target")


@pytest.fixture(scope="session")
def tools_hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny hybrid with 512 tokens (room for a byte-level vocabulary), tools-capable."""
    from spec_features import make_tools_target
    from tiny_checkpoints import save_tiny_hybrid

    base = save_tiny_hybrid(tmp_path_factory.mktemp("hybrid-512") / "h", mtp=False,
                            vocab_size=512)
    return make_tools_target(base, tmp_path_factory.mktemp("tools-hybrid") / "target")
