"""A tiny target, a data folder recorded on it, and a drafter trained on that folder.

The data repeats a few prompts many times (greedy, so identical answers), which a tiny
drafter can learn within a few dozen CPU steps: the held-out sequences are then
continuations the drafter has seen, and acceptance must rise well above the untrained
drafter's (a trainer that does not learn fails).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from draftwise.train.data import DataPlan, generate_data
from draftwise.train.dflash import DFlashPlan, train_dflash
from draftwise.train.dspark import DSparkPlan, train_dspark
from draftwise.train.prompts import Prompt
from tiny_checkpoints import save_tiny, write_byte_tokenizer

TAPS = (0, 2)  # the tiny target has 3 layers: the last one is tapped (its final norm)
PROMPTS = [Prompt(text=t) for t in ("abcabc", "the cat sat", "def f(x):")] * 6


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = save_tiny("llama", tmp_path_factory.mktemp("train-target"), seed=7, std=0.3)
    return str(write_byte_tokenizer(path))


@pytest.fixture(scope="session")
def tiny_data(tiny_target: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train-data") / "d"
    generate_data(DataPlan(model=tiny_target, out=out, taps=TAPS, max_tokens=32, batch=6,
                           sampled_share=0.0), PROMPTS)
    return out


def plan(target: str, data: Path, out: Path, **kw: object) -> DFlashPlan:
    """A small, fast plan (overrides by keyword)."""
    base: dict = {"data": data, "out": out, "model": target, "layers": 1, "block_size": 4,
                  "steps": 60, "batch": 2, "anchors": 8, "warmup": 5, "lr": 3e-3,
                  "held_out_share": 0.2, "seed": 0, "threads": 1}
    return DFlashPlan(**{**base, **kw})


@pytest.fixture(scope="session")
def trained(tiny_target: str, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Path:
    out = tmp_path_factory.mktemp("trained") / "drafter"
    train_dflash(plan(tiny_target, tiny_data, out, steps=80))
    return out


VOCAB = 128  # of the tiny target's 512: every label of the tiny data


def dplan(target: str, data: Path, out: Path, **kw: object) -> DSparkPlan:
    """A small, fast DSpark plan (overrides by keyword)."""
    base: dict = {"data": data, "out": out, "model": target, "layers": 1, "block_size": 4,
                  "draft_vocab": VOCAB, "markov_rank": 16, "steps": 60, "batch": 2,
                  "anchors": 8, "warmup": 5, "lr": 3e-3, "held_out_share": 0.2, "seed": 0,
                  "threads": 1}
    return DSparkPlan(**{**base, **kw})


@pytest.fixture(scope="session")
def dspark_trained(tiny_target: str, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Path:
    """A DSpark drafter with a reduced draft vocabulary (``VOCAB`` of 512)."""
    out = tmp_path_factory.mktemp("dspark") / "drafter"
    train_dspark(dplan(tiny_target, tiny_data, out, steps=80))
    return out


@pytest.fixture(scope="session")
def dspark_trained_full(tiny_target: str, tiny_data: Path,
                        tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DSpark drafter over the target's whole vocabulary (the layout saves no head)."""
    out = tmp_path_factory.mktemp("dspark-full") / "drafter"
    train_dspark(dplan(tiny_target, tiny_data, out, steps=60, draft_vocab=512))
    return out
