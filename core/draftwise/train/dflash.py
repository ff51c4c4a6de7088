"""``draftwise train dflash``: a DFlash drafter from a ``train data`` folder, resumable.

The loop, checkpoints, exact resume, progress and ``draftwise_train.json`` are the
shared ones (``loop.py``, its rules 1-4); the objective is ``dflash_objective.py``, the
net ``dflash_net.py``, the saved layout ``dflash_layout.py``. What is DFlash's here:

1. the drafter starts from transformers' init, its norms at 1 (starting its final norm
   at the target's was worse on the default model: loss 7.7 against 6.3 after 80 steps,
   held-out acceptance 1.09 against 1.12);
2. a step takes the next ``batch`` training sequences from the cursor, draws each one's
   anchors with the step's generator, runs every block of a sequence in one forward,
   and steps AdamW on the position-weighted CE (gradient clipped);
3. the held-out estimate is ``acceptance.estimate_acceptance`` (DFlash's block: slot 0
   the anchor, ``B - 1`` drafts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import EngineConfigError
from draftwise.train.acceptance import Acceptance, estimate_acceptance
from draftwise.train.dflash_layout import CONFIG, load_weights, save_drafter, shape_of
from draftwise.train.dflash_net import DFlashNet, DFlashShape
from draftwise.train.dflash_objective import (
    block_inputs,
    check_block_size,
    default_gamma,
    position_weights,
    weight_sum,
    weighted_ce_sum,
)
from draftwise.train.loop import (
    HELD_OUT_SHARE,
    REPORT,
    STATE,
    RunPlan,
    Target,
    TrainReport,
    TrainResumeError,
    TrainRun,
    check_budget,
    load_target,
    mean_text,
    run_loop,
)
from draftwise.train.trainset import TrainSet, open_trainset

#: the plan fields a resumed run must share with the run it resumes (rule 3)
FIXED = ("layers", "block_size", "intermediate_size", "mask_token_id", "lr", "warmup",
         "seed", "batch", "anchors", "gamma", "grad_clip", "held_out_share")


@dataclass(frozen=True, slots=True)
class DFlashPlan(RunPlan):
    """One ``train dflash`` run; ``steps`` counts every run into ``out``, ``minutes`` this one."""

    layers: int = 1
    block_size: int = 8
    gamma: float | None = None  # None: the paper's for this block size


def make_shape(plan: DFlashPlan, target: Target, taps: tuple[int, ...]) -> DFlashShape:
    """The drafter's shape: the target's width, heads and MLP (z-lab's drafters copy the
    target's decoder config), the plan's depth and block, the data's taps."""
    c = target.config
    mask = c.vocab_size - 1 if plan.mask_token_id is None else plan.mask_token_id
    if not 0 <= mask < c.vocab_size:
        raise EngineConfigError(f"--mask-token-id {mask} is outside the target's vocabulary "
                                f"[0, {c.vocab_size})")
    if plan.layers < 1:
        raise EngineConfigError(f"--layers {plan.layers}: a drafter needs at least 1 layer")
    return DFlashShape(
        hidden_size=c.hidden_size, num_layers=plan.layers, num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
        intermediate_size=plan.intermediate_size or c.intermediate_size,
        vocab_size=c.vocab_size, block_size=plan.block_size, target_layer_ids=taps,
        num_target_layers=c.num_hidden_layers, mask_token_id=mask,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings)


def _fixed(plan: DFlashPlan, shape: DFlashShape, data: TrainSet) -> dict[str, Any]:
    """What a resumed run must share (``FIXED``), resolved, plus the data's identity."""
    d = {k: getattr(plan, k) for k in FIXED}
    d.update(mask_token_id=shape.mask_token_id, intermediate_size=shape.intermediate_size,
             gamma=plan.gamma or default_gamma(plan.block_size),
             data=str(Path(plan.data).resolve()), taps=list(data.taps),
             train_sequences=len(data.train))
    return d


class Run(TrainRun):
    """DFlash's net, objective, layout and estimate on the shared loop (``loop.py``)."""

    method = "dflash"

    def __init__(self, plan: DFlashPlan, target: Target, data: TrainSet,
                 shape: DFlashShape) -> None:
        net = DFlashNet(shape)
        net.init_weights(plan.seed)
        opt = torch.optim.AdamW(net.parameters(), lr=plan.lr, weight_decay=0.0)
        super().__init__(plan, target, data, net, opt, _fixed(plan, shape, data), CONFIG)
        self.dplan, self.shape, self.dnet = plan, shape, net
        self.weights = position_weights(shape.block_size, self.fixed["gamma"])

    def save_drafter(self) -> None:
        """z-lab's layout (``dflash_layout.py``)."""
        save_drafter(self.dnet, self.plan.out)

    def report_dict(self) -> dict[str, Any]:
        """``draftwise_train.json`` (rule 4)."""
        last = self.history[-1] if self.history else None
        return {
            "method": "dflash", "format": 1,
            "shape": self.shape.as_dict() | {"gamma": self.fixed["gamma"]},
            "data": self.data_dict(),
            "training": {k: self.fixed[k] for k in ("lr", "warmup", "seed", "batch", "anchors",
                                                     "grad_clip")}
            | {"steps": self.step, "epochs": self.epochs(), "seconds": round(self.seconds, 1)},
            "losses": [round(x, 5) for x in self.losses],
            "acceptance": last,
            "acceptance_history": self.history,
        }

    def train_step(self) -> tuple[float, int]:
        """One optimizer step; returns the step's loss and its supervised positions.
        ``mid_step`` is True while the cursor, weights or step may disagree."""
        self.mid_step = True
        plan, shape, t = self.dplan, self.shape, self.target
        items = []
        for seq, ids, anchors in self.next_batch(self.step_generator()):
            blocks, labels, valid = block_inputs(ids, anchors, shape.block_size,
                                                 shape.mask_token_id)
            items.append((seq, anchors, blocks, labels, valid))
        total_w = sum(weight_sum(v, self.weights) for *_, v in items)
        self.set_lr()
        self.opt.zero_grad(set_to_none=True)
        loss, labelled = 0.0, 0
        for seq, anchors, blocks, labels, valid in items:
            hidden = self.net(self.data.taps_of(seq, self.last), t.embed[blocks], anchors)
            n, b, h = hidden.shape  # one 2-D GEMM: a strided 3-D matmul ran 10x slower
            rows = hidden[:, 1:].reshape(-1, h).to(torch.bfloat16)
            logits = torch.nn.functional.linear(rows, t.head_bf16).float().view(n, b - 1, -1)
            part, _ = weighted_ce_sum(logits, labels, valid, self.weights)
            (part / total_w).backward()
            loss += float(part.detach())
            labelled += int(valid.sum())
        return self.finish_step(plan.grad_clip, loss, total_w, labelled)

    def evaluate(self) -> Acceptance:
        """Rule 4's estimate, recorded in the history."""
        self.net.eval()
        acc = estimate_acceptance(self.dnet, self.data.held_out,
                                  lambda s: self.data.taps_of(s, self.last),
                                  self.target.embed, self.target.head_bf16,
                                  self.dplan.eval_anchors)
        self.net.train()
        self.history.append({"step": self.step, **acc.as_dict()})
        return acc


def train_dflash(plan: DFlashPlan, progress: Callable[[str], None] | None = None
                 ) -> TrainReport:
    """Run (or resume) ``plan`` until its budget; module doc for the steps."""
    say = progress or (lambda _line: None)
    check_block_size(plan.block_size)
    check_budget("dflash", plan.steps, plan.minutes)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    target = load_target(plan.model)
    data = open_trainset(plan.data, target.facts, min_response=2,
                         held_out_share=plan.held_out_share)
    shape = make_shape(plan, target, data.taps)
    say(f"dflash: {shape.num_layers} layer(s), block {shape.block_size}, taps "
        f"{list(shape.target_layer_ids)}, mask {shape.mask_token_id}")
    return run_loop(lambda: Run(plan, target, data, shape), plan, say)


def estimate_saved(drafter: Path, data: Path, model: str | None = None,
                   max_anchors: int = 4096) -> Acceptance:
    """The held-out estimate of a drafter already saved, on its data folder's split (the
    one its ``train_state.pt`` records, else the default), without a training step: a
    drafter trained before the estimate was the walk gets today's number."""
    import json

    config = drafter / CONFIG
    if not config.is_file():
        raise EngineConfigError(f"--drafter {drafter}: no {CONFIG}. Instead: a folder "
                                "`draftwise train dflash --out` wrote.")
    raw = json.loads(config.read_text())
    if "dflash_config" not in raw:
        raise EngineConfigError(
            f"--drafter {drafter}: architectures {raw.get('architectures')} is not a DFlash "
            "drafter `train dflash` wrote; `train estimate` reads only those. Instead: a "
            "dspark drafter's estimate is in its draftwise_train.json (every --eval-minutes "
            "and at the end of `train dspark`).")
    shape = shape_of(raw)
    share = HELD_OUT_SHARE
    if (drafter / STATE).is_file():
        share = torch.load(drafter / STATE, weights_only=False)["fixed"]["held_out_share"]
    target = load_target(model)
    data_set = open_trainset(data, target.facts, min_response=2, held_out_share=share)
    if tuple(data_set.taps) != tuple(shape.target_layer_ids):
        raise EngineConfigError(
            f"--drafter {drafter} reads taps {list(shape.target_layer_ids)}, --data {data} "
            f"records {list(data_set.taps)}. Instead: the data folder it was trained on.")
    net = DFlashNet(shape)
    load_weights(net, drafter)
    net.eval()
    last = target.facts.num_layers - 1
    return estimate_acceptance(net, data_set.held_out, lambda s: data_set.taps_of(s, last),
                               target.embed, target.head_bf16, max_anchors)


__all__ = [
    "REPORT",
    "STATE",
    "DFlashPlan",
    "TrainReport",
    "TrainResumeError",
    "estimate_saved",
    "load_target",
    "mean_text",
    "train_dflash",
]
