"""``draftwise train dflash``: a DFlash drafter from a ``train data`` folder, resumable.

The loop, step by step (the objective is ``dflash_objective.py``, the net
``dflash_net.py``, the saved layout ``dflash_layout.py``):

1. the target is loaded once (float32) for what the drafter shares with it and never
   trains: the embedding (block inputs, the mask slots included) and the LM head. The
   drafter starts from transformers' init, its norms at 1 (starting its final norm at the
   target's was worse on the default model: loss 7.7 against 6.3 after 80 steps, held-out
   acceptance 1.09 against 1.12);
2. a step takes the next ``batch`` training sequences from the data cursor (``epoch``,
   ``position`` in ``TrainSet.order(seed, epoch)``), draws each one's anchors with a
   generator seeded by ``(seed, step)``, runs every block of a sequence in one forward,
   and steps AdamW on the position-weighted CE (gradient clipped; linear warmup, then a
   constant rate, so that the rate of a step never depends on the run's budget);
3. every ``checkpoint_minutes`` (and at the end, a budget, or Ctrl-C between steps; a
   Ctrl-C inside a step drops that step and keeps the last checkpoint) the drafter is
   written in z-lab's layout and ``train_state.pt`` beside it: weights, AdamW's state,
   the cursor, the step (which seeds the anchors: the whole random state), the losses.
   Running the same command again resumes from it, and the loss curve and weights are
   those of an uninterrupted run (same thread count: torch's CPU kernels are
   deterministic for a fixed one);
4. a held-out acceptance estimate (``acceptance.py``) before the first step, every
   ``eval_minutes`` and at the end; ``draftwise_train.json`` in the drafter folder keeps
   the shape, the data, the steps, the losses and the estimates (what ``doctor`` reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.errors import DraftwiseError, EngineConfigError
from draftwise.train.acceptance import Acceptance, estimate_acceptance
from draftwise.train.dflash_layout import CONFIG, load_weights, save_drafter, shape_of, write_json
from draftwise.train.dflash_net import DFlashNet, DFlashShape
from draftwise.train.dflash_objective import (
    block_inputs,
    check_block_size,
    default_gamma,
    position_weights,
    sample_anchors,
    weight_sum,
    weighted_ce_sum,
)
from draftwise.train.trainset import TargetFacts, TrainSet, open_trainset

STATE = "train_state.pt"
#: every 20th usable sequence of the data folder is held out (``trainset`` rule 2)
HELD_OUT_SHARE = 0.05
REPORT = "draftwise_train.json"
#: the plan fields a resumed run must share with the run it resumes (rule 3)
FIXED = ("layers", "block_size", "intermediate_size", "mask_token_id", "lr", "warmup",
         "seed", "batch", "anchors", "gamma", "grad_clip", "held_out_share")


class TrainResumeError(DraftwiseError, ValueError):
    """``--out`` holds a run this one cannot resume (another shape, data or seed)."""


@dataclass(frozen=True, slots=True)
class DFlashPlan:
    """One ``train dflash`` run; ``steps`` counts every run into ``out``, ``minutes`` this one."""

    data: Path
    out: Path
    model: str | None = None
    layers: int = 1
    block_size: int = 8
    intermediate_size: int | None = None  # None: the target's
    mask_token_id: int | None = None  # None: the target's last vocabulary id
    steps: int | None = None
    minutes: float | None = None
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    threads: int | None = None
    batch: int = 4  # sequences per step
    anchors: int = 32  # blocks per sequence
    gamma: float | None = None  # None: the paper's for this block size
    grad_clip: float = 1.0
    held_out_share: float = HELD_OUT_SHARE
    checkpoint_minutes: float = 5.0
    eval_minutes: float = 5.0
    eval_anchors: int = 4096  # blocks the held-out walk may draft (acceptance.py)
    progress_seconds: float = 10.0


@dataclass(slots=True)
class TrainReport:
    """How the run ended: steps (all runs), why it stopped, the curve and the estimates."""

    out: Path
    step: int
    stopped: str
    losses: list[float]
    acceptance: dict[str, Any]  # the last estimate (acceptance.Acceptance.as_dict + step)
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(slots=True)
class Target:
    """The frozen pieces the drafter shares with the target (rule 1)."""

    facts: TargetFacts
    config: Any
    embed: torch.Tensor  # [V, H] float32
    head: torch.Tensor  # [V, H] float32
    #: the head the loss runs through: bf16 GEMMs ran 3.4x faster than float32 here (2-core
    #: EPYC, avx512_bf16: 86 vs 26 GFLOP/s), the head is >80% of a step's FLOPs, and the
    #: engine runs the drafter's head in bf16 by default anyway
    head_bf16: torch.Tensor  # [V, H]


def load_target(model: str | None) -> Target:
    """The target's embedding and LM head as float32 tensors (a quantized head is
    recovered as ``lm_head(I)``: the same function, whatever its storage)."""
    from draftwise.models.loader import load_model

    loaded = load_model(model, dtype="float32")
    m, cfg = loaded.model, loaded.config
    with torch.no_grad():
        embed = m.embed(torch.arange(cfg.vocab_size)).float().contiguous()
        w = m.lm_head_weight
        head = (w.detach().float().contiguous() if isinstance(w, torch.Tensor)
                else m.lm_head(torch.eye(cfg.hidden_size)).T.contiguous())
    facts = TargetFacts(str(loaded.path), int(cfg.hidden_size), int(cfg.num_hidden_layers))
    return Target(facts, cfg, embed, head, head.to(torch.bfloat16))


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


class Run:
    """The loop's state between steps (rule 2-3): net, optimizer, cursor, curve."""

    def __init__(self, plan: DFlashPlan, target: Target, data: TrainSet,
                 shape: DFlashShape) -> None:
        self.plan, self.target, self.data, self.shape = plan, target, data, shape
        self.fixed = _fixed(plan, shape, data)
        self.net = DFlashNet(shape)
        self.net.init_weights(plan.seed)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=plan.lr, weight_decay=0.0)
        self.weights = position_weights(shape.block_size, self.fixed["gamma"])
        self.step, self.epoch, self.position = 0, 0, 0
        self.order = data.order(plan.seed, 0)
        self.losses: list[float] = []
        self.history: list[dict[str, Any]] = []
        self.seconds = 0.0  # training seconds, every run
        self.mid_step = False
        self.last = target.facts.num_layers - 1

    # -- checkpoint (rule 3) -------------------------------------------------------------
    def resume(self) -> bool:
        """Load ``train_state.pt`` when there is one; refuse another run's."""
        path = self.plan.out / STATE
        if not path.is_file():
            if (self.plan.out / CONFIG).is_file():
                raise TrainResumeError(
                    f"--out {self.plan.out} holds a drafter without {STATE}: not a run this "
                    "command can resume. Instead: another --out.")
            return False
        state = torch.load(path, weights_only=False)
        diff = {k: (state["fixed"].get(k), v) for k, v in self.fixed.items()
                if state["fixed"].get(k) != v}
        if diff:
            said = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise TrainResumeError(
                f"--out {self.plan.out} holds a run with other settings ({said}). Instead: "
                "the same settings to resume it, or another --out.")
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.order = self.data.order(self.plan.seed, self.epoch)
        self.losses, self.history = list(state["losses"]), list(state["history"])
        self.seconds = float(state["seconds"])
        return True

    def save(self) -> None:
        """The drafter, then the state, then the report (each written atomically)."""
        import os

        out = self.plan.out
        save_drafter(self.net, out)
        state = {"format": 1, "fixed": self.fixed, "model": self.net.state_dict(),
                 "optimizer": self.opt.state_dict(), "step": self.step, "epoch": self.epoch,
                 "position": self.position, "losses": self.losses, "history": self.history,
                 "seconds": self.seconds,
                 "rng": {"anchors": "torch.Generator seeded by (seed, step)",
                         "order": "numpy default_rng([seed, epoch])"}}
        tmp = out / f"{STATE}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, out / STATE)
        write_json(out / REPORT, self.report_dict())

    def report_dict(self) -> dict[str, Any]:
        """``draftwise_train.json`` (rule 4)."""
        last = self.history[-1] if self.history else None
        return {
            "method": "dflash", "format": 1,
            "shape": self.shape.as_dict() | {"gamma": self.fixed["gamma"]},
            "data": {"path": self.fixed["data"], "model": self.data.model,
                     "taps": list(self.data.taps), "tokens": self.data.tokens,
                     "train_sequences": len(self.data.train),
                     "held_out_sequences": len(self.data.held_out)},
            "training": {k: self.fixed[k] for k in ("lr", "warmup", "seed", "batch", "anchors",
                                                     "grad_clip")}
            | {"steps": self.step, "epochs": round(self.epoch + self.position
                                                   / max(1, len(self.data.train)), 3),
               "seconds": round(self.seconds, 1)},
            "losses": [round(x, 5) for x in self.losses],
            "acceptance": last,
            "acceptance_history": self.history,
        }

    # -- one step (rule 2) ---------------------------------------------------------------
    def next_sequences(self) -> list[int]:
        """The cursor's next ``batch`` training sequence indices (new epochs reshuffle)."""
        picks = []
        for _ in range(self.plan.batch):
            if self.position >= len(self.order):
                self.epoch, self.position = self.epoch + 1, 0
                self.order = self.data.order(self.plan.seed, self.epoch)
            picks.append(int(self.order[self.position]))
            self.position += 1
        return picks

    def train_step(self) -> tuple[float, int]:
        """One optimizer step; returns the step's loss and its supervised positions.
        ``mid_step`` is True while the cursor, weights or step may disagree."""
        self.mid_step = True
        plan, shape, t = self.plan, self.shape, self.target
        gen = torch.Generator().manual_seed(
            int(np.random.SeedSequence([plan.seed, self.step]).generate_state(1)[0]))
        items = []
        for i in self.next_sequences():
            seq = self.data.train[i]
            ids = torch.from_numpy(np.asarray(seq.token_ids, dtype=np.int64))
            anchors = sample_anchors(len(ids), seq.response_start, plan.anchors, gen)
            blocks, labels, valid = block_inputs(ids, anchors, shape.block_size,
                                                 shape.mask_token_id)
            items.append((seq, anchors, blocks, labels, valid))
        total_w = sum(weight_sum(v, self.weights) for *_, v in items)
        lr = plan.lr * min(1.0, (self.step + 1) / max(1, plan.warmup))
        for group in self.opt.param_groups:
            group["lr"] = lr
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
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), plan.grad_clip)
        self.opt.step()
        self.step += 1
        value = loss / total_w
        self.losses.append(value)
        self.mid_step = False
        return value, labelled

    def evaluate(self) -> Acceptance:
        """Rule 4's estimate, recorded in the history."""
        self.net.eval()
        acc = estimate_acceptance(self.net, self.data.held_out,
                                  lambda s: self.data.taps_of(s, self.last),
                                  self.target.embed, self.target.head_bf16,
                                  self.plan.eval_anchors)
        self.net.train()
        self.history.append({"step": self.step, **acc.as_dict()})
        return acc


def train_dflash(plan: DFlashPlan, progress: Callable[[str], None] | None = None
                 ) -> TrainReport:
    """Run (or resume) ``plan`` until its budget; module doc for the steps."""
    say = progress or (lambda _line: None)
    check_block_size(plan.block_size)
    if plan.steps is None and plan.minutes is None:
        raise EngineConfigError("train dflash needs a budget: --steps N (all runs into --out "
                                "together) or --minutes M (this run)")
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    target = load_target(plan.model)
    data = open_trainset(plan.data, target.facts, min_response=2,
                         held_out_share=plan.held_out_share)
    shape = make_shape(plan, target, data.taps)
    run = Run(plan, target, data, shape)
    resumed = run.resume()
    say(f"dflash: {'resuming at step ' + str(run.step) if resumed else 'new run'}: "
        f"{shape.num_layers} layer(s), block {shape.block_size}, taps "
        f"{list(shape.target_layer_ids)}, mask {shape.mask_token_id}; data "
        f"{len(data.train)} train / {len(data.held_out)} held-out sequences")
    if not run.history:
        acc = run.evaluate()
        say(f"dflash: held-out acceptance before training {acc.describe()}")
    plan.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    mark_ckpt = mark_eval = mark_say = t0
    start_step, labelled_total = run.step, 0
    stopped = "steps"
    try:
        while True:
            now = time.monotonic()
            if plan.steps is not None and run.step >= plan.steps:
                stopped = "steps"
                break
            if plan.minutes is not None and now - t0 >= plan.minutes * 60:
                stopped = "minutes"
                break
            s0 = time.monotonic()
            _, labelled = run.train_step()
            run.seconds += time.monotonic() - s0
            labelled_total += labelled
            now = time.monotonic()
            if now - mark_say >= plan.progress_seconds or run.step == start_step + 1:
                mark_say = now
                say(_line(run, plan, now - t0, run.step - start_step, labelled_total))
            if now - mark_eval >= plan.eval_minutes * 60:
                mark_eval = now
                acc = run.evaluate()
                say(f"dflash: step {run.step}: held-out acceptance {acc.describe()}")
            if now - mark_ckpt >= plan.checkpoint_minutes * 60:
                mark_ckpt = now
                run.save()
    except KeyboardInterrupt:
        stopped = "interrupted"
        if run.mid_step:  # a half-done step is dropped: back to the last checkpoint
            run = Run(plan, target, data, shape)
            run.resume()
            say(f"dflash: interrupted inside a step; keeping the checkpoint at step {run.step}")
    if not run.history or run.history[-1]["step"] != run.step:
        run.evaluate()
    run.save()
    last = run.history[-1]
    say(f"dflash: stopped by {stopped} at step {run.step}; held-out acceptance "
        f"{mean_text(last)}; drafter in {plan.out}")
    return TrainReport(plan.out, run.step, stopped, run.losses, last, run.history,
                       time.monotonic() - t0)


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
    shape = shape_of(json.loads(config.read_text()))
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


def mean_text(acceptance: dict[str, Any]) -> str:
    """An estimate's mean acceptance length as printed (``none`` without greedy rows)."""
    value = acceptance.get("mean_acceptance_length")
    return "none" if value is None else f"{value:.3f}"


def _line(run: Run, plan: DFlashPlan, elapsed: float, steps: int, labelled: int) -> str:
    """A progress line: step, smoothed loss, supervised tokens/s, ETA."""
    recent = run.losses[-10:]
    rate = labelled / elapsed if elapsed > 0 else 0.0
    left = []
    if plan.steps is not None and steps:
        left.append((plan.steps - run.step) * elapsed / steps)
    if plan.minutes is not None:
        left.append(max(0.0, plan.minutes * 60 - elapsed))
    eta = f", ETA {min(left) / 60:.1f} min" if left else ""
    total = f"/{plan.steps}" if plan.steps is not None else ""
    return (f"dflash: step {run.step}{total}, loss {sum(recent) / len(recent):.4f}, "
            f"{rate:.0f} tok/s{eta}")


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
