"""A data folder opened for training: checked against the target, split, and ordered.

Why its own module: every trainer (dflash now, dspark and mtp later) needs the same three
things from ``draftwise train data``'s folder, decided once:

1. refusals before any step runs: no folder or no manifest, a manifest recorded on
   another target (its ``model``, hidden size, or taps outside the target's layers), no
   sequence with a response long enough to train on;
2. a fixed held-out split: every ``k``-th usable sequence (``k = round(1 / share)``, at
   least one held out and one kept), so the acceptance estimate never sees a training
   sequence and the split does not move when the folder is read again;
3. the order of training sequences as a pure function of (seed, epoch): a run's data
   cursor is two integers, and a resumed run reads exactly what an uninterrupted one
   would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftwise.train.shards import DataFolderError, Sequence, read_manifest, read_sequences


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What the data must agree with (read from the loaded target)."""

    path: str
    hidden_size: int
    num_layers: int


@dataclass(slots=True)
class TrainSet:
    """The folder's usable sequences, split (rule 2); arrays stay memory-mapped."""

    root: Path
    taps: tuple[int, ...]
    train: list[Sequence]
    held_out: list[Sequence]
    tokens: int  # every recorded token of the folder
    model: str

    def order(self, seed: int, epoch: int) -> np.ndarray:
        """Rule 3: the training sequences' order in ``epoch``."""
        return np.random.default_rng([seed, epoch]).permutation(len(self.train))

    def taps_of(self, seq: Sequence, last_layer: int) -> torch.Tensor:  # [T, taps * H]
        """The context input of one sequence: its taps concatenated in ``self.taps``
        order, the target's last layer after its final norm (the recorded ``final``), as
        the engine hands it to the drafter (z-lab taps HF's normed last hidden state)."""
        names = ["final" if t == last_layer else f"tap{t}" for t in self.taps]
        return torch.from_numpy(np.concatenate(
            [np.asarray(seq.states[n], dtype=np.float32) for n in names], axis=1))


def open_trainset(root: str | Path, target: TargetFacts, min_response: int,
                  held_out_share: float = 0.05) -> TrainSet:
    """Rules 1-2; ``min_response``: the fewest response tokens a usable sequence has."""
    root = Path(root)
    if not root.is_dir():
        raise DataFolderError(f"--data {root}: no such folder. Instead: make one with "
                              "`draftwise train data --out DIR`.")
    manifest = read_manifest(root)
    if manifest is None:
        raise DataFolderError(f"--data {root}: no manifest.json, not a draftwise training "
                              "data folder. Instead: `draftwise train data --out DIR`.")
    recorded = manifest.get("model")
    if recorded is not None and Path(str(recorded)).resolve() != Path(target.path).resolve():
        raise DataFolderError(
            f"--data {root} was recorded on {recorded}, not on the target {target.path}: its "
            "hidden states are another model's. Instead: --model the data's target, or data "
            "recorded on this one.")
    if manifest.get("hidden_size") != target.hidden_size:
        raise DataFolderError(
            f"--data {root} holds hidden states of width {manifest.get('hidden_size')}, the "
            f"target's is {target.hidden_size}. Instead: data recorded on this target.")
    taps = tuple(int(t) for t in manifest.get("taps") or ())
    if not taps or any(not 0 <= t < target.num_layers for t in taps):
        raise DataFolderError(
            f"--data {root} records taps {list(taps)}, not layers of the target "
            f"(0 .. {target.num_layers - 1}). Instead: data recorded on this target.")
    usable = [s for s in read_sequences(root) if len(s.token_ids) - s.response_start
              >= min_response and s.response_start >= 1]
    if len(usable) < 2:
        raise DataFolderError(
            f"--data {root} has {len(usable)} sequence(s) with a response of at least "
            f"{min_response} tokens; training needs 2 (one is held out). Instead: more "
            "data (`draftwise train data`, a longer --max-tokens) or a smaller --block-size.")
    every = max(2, round(1 / held_out_share)) if held_out_share > 0 else len(usable) + 1
    picked = {i for i in range(len(usable)) if i % every == every - 1} or {len(usable) - 1}
    held = [s for i, s in enumerate(usable) if i in picked]
    train = [s for i, s in enumerate(usable) if i not in picked]
    return TrainSet(root, taps, train, held, int(manifest.get("tokens", 0)),
                    str(recorded))


__all__ = ["TargetFacts", "TrainSet", "open_trainset"]
